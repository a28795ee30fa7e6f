"""CSV cells a spreadsheet cannot run: OWASP's rule, one test per character that starts a formula."""

from __future__ import annotations

import pytest

from gpulens.shaping.cells import FORMULA_STARTS, csv_cell

# each character that makes a spreadsheet read a cell as a formula, with a payload starting with it
PAYLOADS = {
    "=": '=HYPERLINK("http://x","click")',
    "+": "+cmd|' /C calc'!A0",
    "-": "-2+3+cmd|' /C calc'!A0",
    "@": "@SUM(1+9)*cmd|' /C calc'!A0",
    "\t": '\t=HYPERLINK("http://x")',
    "\r": '\r=HYPERLINK("http://x")',
}


def test_every_formula_start_has_a_payload() -> None:
    assert set(PAYLOADS) == set(FORMULA_STARTS)


@pytest.mark.parametrize("start", FORMULA_STARTS, ids=repr)
def test_a_formula_gets_a_leading_quote(start: str) -> None:
    payload = PAYLOADS[start]
    assert csv_cell(payload) == "'" + payload
    assert csv_cell(start) == "'" + start  # the character alone too


@pytest.mark.parametrize("number", ["-1", "-1.5", "+2", "-0.25e-3", "+1E6", "-.5", "-7."])
def test_numbers_stay_numbers(number: str) -> None:
    assert csv_cell(number) == number


@pytest.mark.parametrize("text", ["0", "GPU-5d3f", "gpu-node-1", "nvidia0", "", "a=b", "x@y"])
def test_other_text_is_unchanged(text: str) -> None:
    assert csv_cell(text) == text


def test_not_numbers_that_start_like_one() -> None:
    for text in ("-Inf", "-NaN", "-1-1", "+1+cmd", "-", "--1", "-1 ", "- 1"):
        assert csv_cell(text) == "'" + text, text
    assert csv_cell(None) == ""
    assert csv_cell(-3) == "-3"
