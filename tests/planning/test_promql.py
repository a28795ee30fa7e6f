"""Escaping of values into PromQL string literals and regexes."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulens.planning.promql import Matcher, eq, one_of, quote, regex_escape, selector

_GO_ESCAPES = {
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "\\": "\\",
    '"': '"',
    "'": "'",
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "v": "\v",
}


def go_unquote(literal: str) -> str:
    """Go's strconv.Unquote for double-quoted literals (what PromQL's lexer applies)."""
    assert literal[0] == '"' and literal[-1] == '"'
    body, out, i = literal[1:-1], [], 0
    while i < len(body):
        ch = body[i]
        assert ch != '"', "unescaped quote inside literal"
        assert ch != "\n", "raw newline inside literal"
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in _GO_ESCAPES:
            out.append(_GO_ESCAPES[nxt])
            i += 2
        elif nxt == "x":
            out.append(chr(int(body[i + 2 : i + 4], 16)))
            i += 4
        else:
            raise AssertionError(f"invalid escape \\{nxt}")
    return "".join(out)


@given(st.text())
def test_quote_round_trips_through_go_unquote(value: str) -> None:
    assert go_unquote(quote(value)) == value


@given(st.text())
def test_quoted_literal_cannot_close_early(value: str) -> None:
    lit = quote(value)
    # the only unescaped quotes are the delimiters
    inner = lit[1:-1]
    assert re.search(r'(?<!\\)(\\\\)*"', inner) is None


@given(st.text(min_size=1), st.text())
def test_regex_escape_matches_exactly_the_value(value: str, other: str) -> None:
    pattern = regex_escape(value)
    assert re.fullmatch(pattern, value, flags=re.DOTALL)
    for different in (other, value + "x", "x" + value, value[:-1]):
        if different != value:
            assert re.fullmatch(pattern, different, flags=re.DOTALL) is None, (value, different)


@pytest.mark.parametrize(
    "payload",
    [
        'x"} or vector(1) or up{a="',
        'x"}) or sum(up) by (job) or (up{a="',
        "gpu-node-1\n} or vector(1)",
        "\\",
        "é中文🚀",
        "`backtick`",
        "a'b",
    ],
)
def test_injection_payloads_stay_inside_one_matcher(payload: str) -> None:
    sel = selector("DCGM_FI_DEV_GPU_UTIL", [eq("Hostname", payload)])
    assert sel.startswith('DCGM_FI_DEV_GPU_UTIL{Hostname="') and sel.endswith('"}')
    assert go_unquote(sel[len("DCGM_FI_DEV_GPU_UTIL{Hostname=") : -1]) == payload
    alt = one_of("gpu", [payload, "3"]).render()
    assert go_unquote(alt[len("gpu=~") :]) == regex_escape(payload) + "|3"


def test_names_are_validated_not_escaped() -> None:
    with pytest.raises(ValueError):
        selector('up{a="b"}')
    with pytest.raises(ValueError):
        Matcher('a"b', "=", "x").render()
    with pytest.raises(ValueError):
        Matcher("a", "==", "x").render()
