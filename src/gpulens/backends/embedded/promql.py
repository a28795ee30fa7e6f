"""A parser for the PromQL subset gpulens' planners write (and a little more), into a small AST.

Grammar (Prometheus precedence: `* /` above `+ -` above `or`, all left-associative):
    expr    := or
    or      := add ("or" add)*
    add     := mul (("+" | "-") mul)*
    mul     := unary (("*" | "/") unary)*
    unary   := ("-" | "+") unary | primary
    primary := number | string | "(" expr ")" | aggregation | call | selector ["[" duration "]"]
    aggregation := AGG [by] "(" expr ")" [by]          by := "by" "(" label, ... ")"
    selector := name ["{" matchers "}"] | "{" matchers "}"
Anything else is a `PromQLError` (a ValueError) naming the position.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gpulens.domain import catalog as c

AGGREGATIONS = frozenset({"sum", "avg", "max", "min", "count"})
FUNCTIONS = frozenset({"rate", "increase", "histogram_quantile", "label_replace"})
MATCH_OPS = ("=~", "!~", "!=", "=")


class PromQLError(ValueError):
    pass


# -- AST ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NumberLiteral:
    value: float


@dataclass(frozen=True, slots=True)
class StringLiteral:
    value: str


@dataclass(frozen=True, slots=True)
class VectorSelector:
    name: str  # "" when only matchers are given
    matchers: tuple[tuple[str, str, str], ...]  # (label, op, value), without the name


@dataclass(frozen=True, slots=True)
class MatrixSelector:
    vector: VectorSelector
    range_ms: int


@dataclass(frozen=True, slots=True)
class Binary:
    op: str  # "or", "+", "-", "*", "/"
    lhs: Expr
    rhs: Expr


@dataclass(frozen=True, slots=True)
class Aggregate:
    op: str
    by: tuple[str, ...] | None  # None: no grouping clause (everything in one group)
    expr: Expr


@dataclass(frozen=True, slots=True)
class Call:
    func: str
    args: tuple[Expr, ...]


Expr = NumberLiteral | StringLiteral | VectorSelector | MatrixSelector | Binary | Aggregate | Call

# -- lexer ----------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<number>(?:0[xX][0-9a-fA-F]+)|(?:[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)|(?i:inf|nan)(?![a-zA-Z0-9_:]))
  | (?P<duration>(?:[0-9]+(?:ms|[smhdwy]))+)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`[^`]*`)
  | (?P<op>=~|!~|!=|==|[=(){}\[\],+\-*/])
    """,
    re.VERBOSE,
)
_DURATION = re.compile(r"(?:[0-9]+(?:ms|[smhdwy]))+(?![a-zA-Z0-9_:])")
_DURATION_PART = re.compile(r"([0-9]+)(ms|[smhdwy])")
_UNIT_MS = {
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
    "w": 604_800_000,
    "y": 31_536_000_000,
}


@dataclass(frozen=True, slots=True)
class Token:
    kind: str
    text: str
    pos: int


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise PromQLError(f"unexpected character {text[pos]!r} at position {pos}")
        kind = m.lastgroup or ""
        # "5m" lexes as a duration, "5" followed by "m..." never as a number then a name
        if kind == "number":
            dm = _DURATION.match(text, pos)
            if dm is not None and dm.end() > m.end():
                tokens.append(Token("duration", dm.group(), pos))
                pos = dm.end()
                continue
        if kind != "ws":
            tokens.append(Token(kind, m.group(), pos))
        pos = m.end()
    tokens.append(Token("eof", "", pos))
    return tokens


def parse_duration(text: str) -> int:
    if not text or "".join(p.group() for p in _DURATION_PART.finditer(text)) != text:
        raise PromQLError(f"bad duration {text!r}")
    return sum(int(n) * _UNIT_MS[u] for n, u in _DURATION_PART.findall(text))


_SIMPLE_ESCAPES = {
    "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
    "\\": "\\", '"': '"', "'": "'",
}  # fmt: skip


def unquote(literal: str) -> str:
    """A Go string literal's value (double or single quotes with escapes, or backquoted raw)."""
    quote, body = literal[0], literal[1:-1]
    if quote == "`":
        return body
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        esc = body[i + 1] if i + 1 < len(body) else ""
        if esc in _SIMPLE_ESCAPES and (esc != "'" or quote == "'") and (esc != '"' or quote == '"'):
            out.append(_SIMPLE_ESCAPES[esc])
            i += 2
        elif esc in "xuU" and esc:
            width = {"x": 2, "u": 4, "U": 8}[esc]
            digits = body[i + 2 : i + 2 + width]
            if len(digits) != width or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise PromQLError(f"bad escape in {literal!r}")
            out.append(chr(int(digits, 16)))
            i += 2 + width
        elif esc and esc in "01234567":
            digits = body[i + 1 : i + 4]
            if len(digits) != 3 or not all(c in "01234567" for c in digits) or int(digits, 8) > 255:
                raise PromQLError(f"bad escape in {literal!r}")
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            raise PromQLError(f"unknown escape sequence in {literal!r}")
    return "".join(out)


def _number(text: str) -> float:
    low = text.lower()
    if low == "inf":
        return math.inf
    if low == "nan":
        return math.nan
    if low.startswith("0x"):
        return float(int(text, 16))
    return float(text)


# -- parser ---------------------------------------------------------------------------------------


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0

    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def next(self) -> Token:
        t = self.tokens[self.i]
        self.i += 1
        return t

    def fail(self, what: str) -> PromQLError:
        t = self.tok
        found = repr(t.text) if t.kind != "eof" else "end of input"
        return PromQLError(f"{what} at position {t.pos}, found {found} in {self.text!r}")

    def expect(self, text: str) -> Token:
        if self.tok.text != text or self.tok.kind == "string":
            raise self.fail(f"expected {text!r}")
        return self.next()

    def at(self, *texts: str) -> bool:
        return self.tok.kind in ("op", "ident") and self.tok.text in texts

    def parse(self) -> Expr:
        expr = self.parse_or()
        if self.tok.kind != "eof":
            raise self.fail("unexpected token")
        return expr

    def parse_or(self) -> Expr:
        lhs = self.parse_add()
        while self.tok.kind == "ident" and self.tok.text == "or":
            self.next()
            lhs = Binary("or", lhs, self.parse_add())
        return lhs

    def parse_add(self) -> Expr:
        lhs = self.parse_mul()
        while self.at("+", "-") and self.tok.kind == "op":
            op = self.next().text
            lhs = Binary(op, lhs, self.parse_mul())
        return lhs

    def parse_mul(self) -> Expr:
        lhs = self.parse_unary()
        while self.at("*", "/") and self.tok.kind == "op":
            op = self.next().text
            lhs = Binary(op, lhs, self.parse_unary())
        return lhs

    def parse_unary(self) -> Expr:
        if self.tok.kind == "op" and self.tok.text in ("-", "+"):
            op = self.next().text
            inner = self.parse_unary()
            if op == "+":
                return inner
            if isinstance(inner, NumberLiteral):
                return NumberLiteral(-inner.value)
            return Binary("*", NumberLiteral(-1.0), inner)
        return self.parse_primary()

    def parse_primary(self) -> Expr:
        t = self.tok
        if t.kind == "number":
            self.next()
            return NumberLiteral(_number(t.text))
        if t.kind == "string":
            self.next()
            return StringLiteral(unquote(t.text))
        if t.kind == "op" and t.text == "(":
            self.next()
            inner = self.parse_or()
            self.expect(")")
            return self._maybe_range(inner)
        if t.kind == "op" and t.text == "{":
            return self._maybe_range(self.parse_selector(""))
        if t.kind == "ident":
            name = t.text
            if name in AGGREGATIONS and self.tokens[self.i + 1].text in ("(", "by"):
                return self.parse_aggregation()
            if name in FUNCTIONS and self.tokens[self.i + 1].text == "(":
                return self.parse_call()
            self.next()
            return self._maybe_range(self.parse_selector(name))
        raise self.fail("expected an expression")

    def _maybe_range(self, expr: Expr) -> Expr:
        if not (self.tok.kind == "op" and self.tok.text == "["):
            return expr
        if not isinstance(expr, VectorSelector):
            raise self.fail("a range needs a vector selector (subqueries are not supported)")
        self.next()
        t = self.next()
        if t.kind not in ("duration", "number"):
            raise PromQLError(f"bad range duration at position {t.pos} in {self.text!r}")
        range_ms = parse_duration(t.text)
        self.expect("]")
        return MatrixSelector(expr, range_ms)

    def parse_selector(self, name: str) -> VectorSelector:
        matchers: list[tuple[str, str, str]] = []
        if self.tok.kind == "op" and self.tok.text == "{":
            self.next()
            while not (self.tok.kind == "op" and self.tok.text == "}"):
                label = self.next()
                if label.kind != "ident":
                    raise PromQLError(f"expected a label name at position {label.pos} in {self.text!r}")
                op = self.next()
                if op.text not in MATCH_OPS:
                    raise PromQLError(f"expected a matcher operator at position {op.pos} in {self.text!r}")
                value = self.next()
                if value.kind != "string":
                    raise PromQLError(f"expected a string at position {value.pos} in {self.text!r}")
                matchers.append((label.text, op.text, unquote(value.text)))
                if self.tok.kind == "op" and self.tok.text == ",":
                    self.next()
                elif not (self.tok.kind == "op" and self.tok.text == "}"):
                    raise self.fail("expected ',' or '}'")
            self.next()
        if not name:
            names = [m for m in matchers if m[0] == c.LABEL_METRIC_NAME and m[1] == "="]
            if names and len(names) == 1:
                name = names[0][2]
                matchers.remove(names[0])
            if not name and not any(
                not re_matches_empty(op, value) for _, op, value in matchers
            ):  # Prometheus' rule: a selector must not match the empty label set
                raise PromQLError(
                    f"vector selector must contain at least one non-empty matcher: {self.text!r}"
                )
        return VectorSelector(name, tuple(matchers))

    def parse_grouping(self) -> tuple[str, ...]:
        self.expect("by")
        self.expect("(")
        labels: list[str] = []
        while not (self.tok.kind == "op" and self.tok.text == ")"):
            t = self.next()
            if t.kind != "ident":
                raise PromQLError(f"expected a label name at position {t.pos} in {self.text!r}")
            labels.append(t.text)
            if self.tok.kind == "op" and self.tok.text == ",":
                self.next()
        self.next()
        return tuple(labels)

    def parse_aggregation(self) -> Aggregate:
        op = self.next().text
        by = self.parse_grouping() if self.at("by") else None
        self.expect("(")
        inner = self.parse_or()
        self.expect(")")
        if self.at("by") and self.tok.kind == "ident":
            if by is not None:
                raise self.fail("two grouping clauses")
            by = self.parse_grouping()
        return Aggregate(op, by, inner)

    def parse_call(self) -> Call:
        func = self.next().text
        self.expect("(")
        args: list[Expr] = []
        while not (self.tok.kind == "op" and self.tok.text == ")"):
            args.append(self.parse_or())
            if self.tok.kind == "op" and self.tok.text == ",":
                self.next()
            elif not (self.tok.kind == "op" and self.tok.text == ")"):
                raise self.fail("expected ',' or ')'")
        self.next()
        call = Call(func, tuple(args))
        _check_call(call, self.text)
        return call


def re_matches_empty(op: str, value: str) -> bool:
    if op == "=":
        return value == ""
    if op == "!=":
        return value != ""
    try:
        hit = re.fullmatch(value, "", re.DOTALL) is not None
    except re.error:
        return False
    return hit if op == "=~" else not hit


_SIGNATURES: dict[str, tuple[type, ...]] = {
    "rate": (MatrixSelector,),
    "increase": (MatrixSelector,),
    "histogram_quantile": (object, object),
    "label_replace": (object, StringLiteral, StringLiteral, StringLiteral, StringLiteral),
}


def _check_call(call: Call, text: str) -> None:
    want = _SIGNATURES[call.func]
    if len(call.args) != len(want) or not all(isinstance(a, w) for a, w in zip(call.args, want, strict=True)):
        raise PromQLError(f"bad arguments to {call.func}() in {text!r}")


def parse(text: str) -> Expr:
    """The AST of `text`; PromQLError when it is outside the supported subset."""
    return _Parser(text).parse()
