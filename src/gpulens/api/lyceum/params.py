"""The parameters every Lyceum execution route takes: the id in the path, `start` and `end`."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Path, Query

from gpulens.api.responses import TIME_QUERY
from gpulens.domain.errors import InvalidParameter, NotFound
from gpulens.domain.models import EXECUTION_ID_RE
from gpulens.domain.timeparse import parse_timestamp_ms

_ID = re.compile(EXECUTION_ID_RE)


def parse_param(name: str, raw: str | None, parser: Callable[[str], int]) -> int | None:
    """A query parameter through `parser`; a bad value is the dialect's 422 naming the parameter."""
    if raw is None:
        return None
    try:
        return parser(raw)
    except ValueError as exc:
        raise InvalidParameter("query", name, raw, str(exc)) from None


@dataclass(frozen=True, slots=True)
class ExecutionWindow:
    """An execution id that can exist, and the requested bounds (None: the execution's own)."""

    execution_id: str
    start_ms: int | None
    end_ms: int | None


async def execution_window(
    execution_id: str = Path(..., title="Execution Id"),
    start: str | None = Query(
        None,
        description="ISO 8601 start timestamp (defaults to execution start_time)",
        json_schema_extra=TIME_QUERY,
    ),
    end: str | None = Query(
        None,
        description="ISO 8601 end timestamp (defaults to execution end_time or current time)",
        json_schema_extra=TIME_QUERY,
    ),
) -> ExecutionWindow:
    """Bad bounds are a 422 naming the parameter; an id no execution can have is the same 404 as an
    unknown one (checked before anything is looked up)."""
    start_ms = parse_param("start", start, parse_timestamp_ms)
    end_ms = parse_param("end", end, parse_timestamp_ms)
    if not _ID.fullmatch(execution_id):
        raise NotFound("Execution not found")
    return ExecutionWindow(execution_id, start_ms, end_ms)


Window = Annotated[ExecutionWindow, Depends(execution_window)]
