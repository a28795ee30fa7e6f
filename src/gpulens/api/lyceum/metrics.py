"""`GET /api/v2/external/execution/{execution_id}/metrics`: Lyceum's 12 series, streamed."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from operator import itemgetter
from typing import Annotated, ClassVar

import numpy as np
import orjson
from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, create_model

from gpulens.api import archived
from gpulens.api.deps import Caller, Ctx
from gpulens.api.lyceum.params import Window, parse_param
from gpulens.api.responses import DURATION_PATTERN, EXECUTION_READ, lyceum_errors
from gpulens.domain import catalog as c
from gpulens.domain.models import Sample
from gpulens.domain.timeparse import format_rfc3339_ms, parse_duration_ms
from gpulens.service.metrics import ExecutionMetrics
from gpulens.shaping.merge import is_finite

router = APIRouter()

_VALUE = itemgetter(1)


DESCRIPTION = (
    "Get GPU and system metrics from Prometheus for a specific execution.\n\n"
    "The series of the execution's host (only its own GPUs when it lists them), on the grid "
    "`start + k*step` from the effective start; by default the whole execution at 15-second "
    "resolution. Windows beyond the backend's per-query limit are fetched in step-aligned chunks "
    "and streamed.\n\n"
    + "\n".join(f"- {m.lyceum}: {m.description} [{c.UNIT_LABELS[m.unit]}]" for m in c.LYCEUM_METRICS)
)


class MetricDataPoint(BaseModel):
    """Single metric data point with timestamp and value."""

    timestamp: str
    value: float


class TimeRange(BaseModel):
    """Time range for the metrics query."""

    start: str
    end: str


# The vendor's schema, its twelve arrays taken from the catalog.
ExecutionMetricsResponse = create_model(
    "ExecutionMetricsResponse",
    __doc__="Response model for execution metrics (GPU and system).",
    executionId=(str, ...),
    hostname=(str, ...),
    timeRange=(TimeRange, ...),
    **{m.lyceum: (list[MetricDataPoint], ...) for m in c.LYCEUM_METRICS},  # type: ignore[call-overload]
)


class TimestampText:
    """RFC 3339 text for grid timestamps, formatted by arithmetic (dates cached per day).

    For a chunk of contiguous grid points it hands out ready `{"timestamp":"..","value":` prefixes,
    formatted by numpy for the whole chunk at once and shared by every request (a dashboard asks for
    the same grids again and again), bounded by LIMIT strings.
    """

    __slots__ = ("_days", "_step_ms")
    LIMIT = 400_000
    _prefixes: ClassVar[OrderedDict[tuple[int, int, int], list[str]]] = OrderedDict()
    _size: ClassVar[int] = 0

    def __init__(self, step_ms: int) -> None:
        self._step_ms = step_ms
        self._days: dict[int, str] = {}

    def __call__(self, ms: int) -> str:
        seconds, milli = divmod(ms, 1000)
        day, second_of_day = divmod(seconds, 86_400)
        date = self._days.get(day)
        if date is None:
            date = self._days[day] = format_rfc3339_ms(day * 86_400_000)[:10]
        hours, rest = divmod(second_of_day, 3600)
        minutes, secs = divmod(rest, 60)
        if milli:
            return f"{date}T{hours:02d}:{minutes:02d}:{secs:02d}.{milli:03d}Z"
        return f"{date}T{hours:02d}:{minutes:02d}:{secs:02d}Z"

    def prefixes(self, first_ms: int, last_ms: int, n: int) -> list[str] | None:
        """Prefixes for n grid points first..last, or None when they are not n contiguous steps."""
        if n < 2 or (last_ms - first_ms) != (n - 1) * self._step_ms:
            return None
        cls = type(self)
        key = (first_ms, self._step_ms, n)
        out = cls._prefixes.get(key)
        if out is not None:
            cls._prefixes.move_to_end(key)
            return out
        times = np.arange(n, dtype=np.int64) * self._step_ms + first_ms
        whole = first_ms % 1000 == 0 and self._step_ms % 1000 == 0
        texts = np.datetime_as_string(times.astype("datetime64[ms]"), unit="s" if whole else "ms").tolist()
        if not whole:  # `.fff` only when the milliseconds are not zero
            texts = [t[:-4] if t.endswith(".000") else t for t in texts]
        out = [f'{{"timestamp":"{t}Z","value":' for t in texts]
        while cls._prefixes and cls._size + n > cls.LIMIT:
            _, dropped = cls._prefixes.popitem(last=False)
            cls._size -= len(dropped)
        cls._prefixes[key] = out
        cls._size += n
        return out


def encode_points(samples: Sequence[Sample], ts: TimestampText, lo_ms: int, hi_ms: int) -> str:
    """`{"timestamp":..,"value":..}` items, comma-joined; the backend's decimal text is the JSON number."""
    n = len(samples)
    if n > 1:
        first, last = round(samples[0][0] * 1000), round(samples[-1][0] * 1000)
        pre = ts.prefixes(first, last, n) if lo_ms <= first and last <= hi_ms else None
        if pre is not None:  # the common case: a gap-free chunk
            # map over C callables: no Python frame per point (a 24 h read has 69,132 of them)
            text = "},".join(map(str.__add__, pre, map(_VALUE, samples))) + "}"
            if "N" not in text and "f" not in text:  # no NaN, no Inf: finite decimals hold neither letter
                return text
    return ",".join(
        [
            f'{{"timestamp":"{ts(ms)}","value":{v}}}'
            for t, v in samples
            if lo_ms <= (ms := round(t * 1000)) <= hi_ms and is_finite(v)
        ]
    )


async def stream_body(answer: ExecutionMetrics, execution_id: str) -> AsyncIterator[bytes]:
    window = answer.window
    head = {
        "executionId": execution_id,
        "hostname": answer.execution.hostname,
        "timeRange": {"start": format_rfc3339_ms(window.start_ms), "end": format_rfc3339_ms(window.end_ms)},
    }
    yield orjson.dumps(head)[:-1]
    keys = [m.lyceum for m in answer.metrics]
    ts = TimestampText(window.step_ms)
    current = -1
    first_in_array = True
    try:
        async for index, samples in answer.chunks():
            parts: list[str] = []
            while current < index:  # close the previous array(s), open the next
                if current >= 0:
                    parts.append("]")
                current += 1
                parts.append(f',"{keys[current]}":[')
                first_in_array = True
            text = encode_points(samples, ts, window.start_ms, window.end_ms)
            if text:
                if not first_in_array:
                    parts.append(",")
                parts.append(text)
                first_in_array = False
            yield "".join(parts).encode()
        tail = []
        while current < len(keys) - 1:
            if current >= 0:
                tail.append("]")
            current += 1
            tail.append(f',"{keys[current]}":[')
        tail.append("]}" if keys else "}")
        yield "".join(tail).encode()
    finally:
        answer.cancel()


def step_param(
    step: str = Query(
        "15s",
        description="Query resolution (e.g., '5s', '15s', '1m')",
        json_schema_extra={"pattern": DURATION_PATTERN},
    ),
) -> int:
    """`step` in milliseconds (a dependency, so the document lists it after the window's parameters)."""
    step_ms = parse_param("step", step, parse_duration_ms)
    assert step_ms is not None
    return step_ms


Step = Annotated[int, Depends(step_param)]


@router.get(
    "/api/v2/external/execution/{execution_id}/metrics",
    tags=["Observability – GPU Metrics"],
    summary="Get execution metrics",
    description=DESCRIPTION,
    response_class=StreamingResponse,
    responses={
        200: {"model": ExecutionMetricsResponse, "description": "Successful Response"},
        **lyceum_errors(*EXECUTION_READ),
    },
)
async def get_execution_metrics(
    ctx: Ctx,
    caller: Caller,
    window: Window,
    step_ms: Step,
) -> Response:
    execution_id, start_ms, end_ms = window.execution_id, window.start_ms, window.end_ms
    slot = await archived.lyceum_slot(ctx, caller, execution_id, (start_ms, end_ms, step_ms))
    if slot is not None and (hit := slot.hit()) is not None:
        return hit  # an archived execution's answer, already made
    answer = await ctx.metrics.execution_metrics(caller, execution_id, start_ms, end_ms, step_ms)
    body = stream_body(answer, execution_id)
    if slot is not None:
        body = slot.recording(answer.execution, "application/json", body)
    return StreamingResponse(body, media_type="application/json")
