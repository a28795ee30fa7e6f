"""Text cells that a spreadsheet cannot run: the one rule every CSV answer of gpulens follows.

A cell that begins with `=`, `+`, `-`, `@`, a tab or a carriage return is read by spreadsheets as a
formula (`=HYPERLINK(...)`, `@SUM(...)`, `-2+3`...) when the CSV is opened. OWASP's rule: such a cell,
unless it is a number, gets a leading `'`, which spreadsheets show as text. Numbers (`-1.5`, `+2e3`)
are left as they are, so a negative value still reads as a number.
"""

from __future__ import annotations

import re
from typing import Final

FORMULA_STARTS: Final = ("=", "+", "-", "@", "\t", "\r")
_NUMBER: Final = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def csv_cell(value: object) -> str:
    """`value` as the text of a CSV cell (None: empty) that no spreadsheet runs as a formula."""
    text = "" if value is None else str(value)
    if text[:1] in FORMULA_STARTS and not _NUMBER.fullmatch(text):
        return "'" + text
    return text
