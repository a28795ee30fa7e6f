"""PromQL building with escaping: the only place a request value becomes PromQL text.

Values go through `quote` (PromQL's Go string-literal escapes: backslash, double quote, newline,
carriage return and tab by name, other control characters in hex); regex values through `regex_escape`.
Label and metric names are validated, never escaped. No template is ever `str.format`ted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_PLAIN = re.compile(r'[^\\"\x00-\x1f\x7f]*')  # no backslash, double quote or control character
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def quote(value: str) -> str:
    """A double-quoted PromQL string literal that reads back as exactly `value`."""
    if _PLAIN.fullmatch(value):  # nothing to escape (most label values): as it is
        return '"' + value + '"'
    out = []
    for ch in value:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def regex_escape(value: str) -> str:
    """An RE2 pattern matching `value` literally (only ASCII punctuation is escaped)."""
    return "".join("\\" + ch if ch in r"\.+*?()|[]{}^$-#&~" else ch for ch in value)


def check_label_name(name: str) -> str:
    if not _LABEL_NAME.fullmatch(name):
        raise ValueError(f"not a label name: {name!r}")
    return name


def check_metric_name(name: str) -> str:
    if not _METRIC_NAME.fullmatch(name):
        raise ValueError(f"not a metric name: {name!r}")
    return name


@dataclass(frozen=True, slots=True)
class Matcher:
    label: str
    op: str  # "=", "!=", "=~", "!~"
    value: str

    def render(self) -> str:
        if self.op not in ("=", "!=", "=~", "!~"):
            raise ValueError(f"bad matcher op {self.op!r}")
        return f"{check_label_name(self.label)}{self.op}{quote(self.value)}"


def eq(label: str, value: str) -> Matcher:
    return Matcher(label, "=", value)


def one_of(label: str, values: Iterable[str]) -> Matcher:
    """`label=~"a|b"` with every alternative matched literally."""
    return Matcher(label, "=~", "|".join(regex_escape(v) for v in values))


def selector(metric: str, matchers: Sequence[Matcher] = ()) -> str:
    inner = ",".join(m.render() for m in matchers)
    return f"{check_metric_name(metric)}{{{inner}}}"


def any_of(metric: str, alternatives: Sequence[Sequence[Matcher]]) -> str:
    """Series of `metric` matching any alternative: `(m{a} or m{b})`."""
    parts = [selector(metric, alt) for alt in alternatives]
    return parts[0] if len(parts) == 1 else "(" + " or ".join(parts) + ")"


def by(labels: Sequence[str]) -> str:
    return "by (" + ", ".join(check_label_name(lbl) for lbl in labels) + ")"


def first_of(exprs: Sequence[str]) -> str:
    """One expression, or the alternatives joined by `or` (the first that has a series wins)."""
    return exprs[0] if len(exprs) == 1 else " or ".join(f"({e})" for e in exprs)


def scaled(expr: str, scale: float) -> str:
    return expr if scale == 1.0 else f"{format_number(scale)} * {expr}"


def format_number(value: float) -> str:
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def rename(metric: str, overrides: Mapping[str, str]) -> str:
    return check_metric_name(overrides.get(metric, metric))


def series_match(matchers: Sequence[Matcher]) -> str:
    """A metric-less selector `{a="b",...}` (for series look-ups such as `__name__=~...`)."""
    if not matchers:
        raise ValueError("a series match needs at least one matcher")
    return "{" + ",".join(m.render() for m in matchers) + "}"


def over_range(function: str, metric: str, alternatives: Sequence[Sequence[Matcher]], window: str) -> str:
    """`function(m{a}[w]) or function(m{b}[w])`: a range applies to one selector, so `or` goes outside."""
    parts = [f"{function}({selector(metric, alt)}[{window}])" for alt in alternatives]
    return parts[0] if len(parts) == 1 else "(" + " or ".join(parts) + ")"
