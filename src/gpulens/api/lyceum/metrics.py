"""`GET /api/v2/external/execution/{execution_id}/metrics`: Lyceum's 12 series, streamed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from itertools import compress
from operator import itemgetter
from typing import Annotated, ClassVar

import numpy as np
import orjson
from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, create_model

from gpulens import native
from gpulens.api import archived
from gpulens.api.deps import Caller, Ctx
from gpulens.api.lyceum.params import Window, parse_param
from gpulens.api.responses import DURATION_PATTERN, EXECUTION_READ, lyceum_errors
from gpulens.domain import catalog as c
from gpulens.domain.models import GridPoints, GridSamples, Sample, finite_inside
from gpulens.domain.models import Window as Grid
from gpulens.domain.timeparse import format_rfc3339_ms, parse_duration_ms
from gpulens.service.metrics import ExecutionMetrics
from gpulens.shaping.gridtime import LAST_GRID_MS, GridCache, grid_texts
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


def _make_joiners(key: tuple[int, int, int]) -> list[bytes]:
    """The joiners of a grid (first_ms, step_ms, n), as `TimestampText.joiners` hands them out."""
    first_ms, step_ms, n = key
    if first_ms >= 0 and first_ms + (n - 1) * step_ms <= LAST_GRID_MS:
        texts = grid_texts(first_ms, step_ms, n)
    else:  # before 1970 or after 9999: numpy's formatting, `.fff` only when not zero
        times = np.arange(n, dtype=np.int64) * step_ms + first_ms
        raw = np.datetime_as_string(times.astype("datetime64[ms]"), unit="ms").tolist()
        texts = [(t[:-4] if t.endswith(".000") else t) + "Z" for t in raw]
    out = [f'}},{{"timestamp":"{t}","value":'.encode() for t in texts]
    if out:
        out[0] = out[0][2:]
    return out


class TimestampText:
    """RFC 3339 text for grid timestamps, formatted by arithmetic (dates cached per day).

    For a run of contiguous grid points it hands out ready `{"timestamp":"..","value":` joiners,
    formatted for the whole run at once (shaping/gridtime.py) and shared by every request (a
    dashboard asks for the same grids again and again), at most 400,000 kept.
    """

    __slots__ = ("_days", "_step_ms")
    _joiners: ClassVar[GridCache[tuple[int, int, int], list[bytes]]] = GridCache(400_000, _make_joiners)

    def __init__(self, step_ms: int) -> None:
        self._step_ms = step_ms
        self._days: dict[int, str] = {}

    @property
    def step_ms(self) -> int:
        return self._step_ms

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

    def joiners(self, first_ms: int, n: int) -> list[bytes]:
        """What precedes each value of n contiguous grid points from first_ms: the first point's
        `{"timestamp":"..","value":`, each later one's `},{"timestamp":"..","value":`."""
        return type(self)._joiners.get((first_ms, self._step_ms, n))


def _interleave(joiners: list[bytes], texts: Sequence[bytes]) -> bytes:
    """joiners[0] texts[0] joiners[1] texts[1] ... `}`: one C join, no object per point."""
    out: list[bytes] = [b""] * (2 * len(texts))
    out[0::2] = joiners
    out[1::2] = texts
    return b"".join(out) + b"}"


def encode_points(samples: Sequence[Sample], ts: TimestampText, lo_ms: int, hi_ms: int) -> bytes:
    """`{"timestamp":..,"value":..}` items, comma-joined; the backend's decimal text is the JSON number."""
    n = len(samples)
    compiled = native.gridjson
    if (
        compiled is not None
        and isinstance(samples, GridSamples | GridPoints)
        and samples.blob is not None
        and samples.step_ms == ts.step_ms
    ):  # packed by the compiled grid path: written by it too (None: a time it does not write)
        offsets = samples.packed_offsets if isinstance(samples, GridPoints) else None
        text: bytes | None = compiled.items(
            samples.first_ms, samples.step_ms, samples.blob, n, offsets, lo_ms, hi_ms
        )
        if text is not None:
            return text
    if isinstance(samples, GridSamples):  # checked finite JSON numbers on a gap-free grid
        if samples.step_ms == ts.step_ms and lo_ms <= samples.first_ms and samples.last_ms <= hi_ms:
            return _interleave(ts.joiners(samples.first_ms, n), samples.texts)
    elif isinstance(samples, GridPoints):  # on a grid with gaps or NaN: decoded as such already
        if samples.step_ms == ts.step_ms:
            return _picked(ts, samples.first_ms, samples.offsets, samples.texts, samples.bad, lo_ms, hi_ms)
    elif n > 1:
        first, last = round(samples[0][0] * 1000), round(samples[-1][0] * 1000)
        if lo_ms <= first and last <= hi_ms and last - first == (n - 1) * ts.step_ms:
            # the common case of a gap-free run, through C callables (no Python frame per point)
            values = list(map(str.encode, map(_VALUE, samples)))
            text = _interleave(ts.joiners(first, n), values)
            if b"N" not in text and b"f" not in text:  # no NaN, no Inf: finite decimals hold neither letter
                return text
            return _finite_only(ts.joiners(first, n), values)  # a run with NaN (a scrape's NaN burst)
        on_grid = _on_grid(samples, ts, lo_ms, hi_ms)
        if on_grid is not None:
            return on_grid
    return ",".join(
        [
            f'{{"timestamp":"{ts(ms)}","value":{v}}}'
            for t, v in samples
            if lo_ms <= (ms := round(t * 1000)) <= hi_ms and is_finite(v)
        ]
    ).encode()


def _on_grid(samples: Sequence[Sample], ts: TimestampText, lo_ms: int, hi_ms: int) -> bytes | None:
    """Samples on the grid with gaps (missed scrapes a backend does not bridge, series that stop and
    start) through `_picked`; None when a time is off the grid or out of order."""
    n, step = len(samples), ts.step_ms
    ms = np.rint(np.fromiter(map(itemgetter(0), samples), dtype=np.float64, count=n) * 1000.0).astype(
        np.int64
    )
    first = int(ms[0])
    offsets = ms - first
    if (offsets % step).any() or (np.diff(ms) <= 0).any():
        return None
    values = list(map(str.encode, map(_VALUE, samples)))
    bad = list(compress(range(n), map(_not_finite, values)))
    return _picked(ts, first, (offsets // step).tolist(), values, bad, lo_ms, hi_ms)


def _picked(
    ts: TimestampText,
    first_ms: int,
    offsets: list[int],
    values: list[bytes],
    bad: list[int],
    lo_ms: int,
    hi_ms: int,
) -> bytes:
    """The items of values at grid points `first_ms + offsets[k] * step` (ascending), those inside
    [lo_ms, hi_ms] and not `bad` (NaN, +/-Inf): the grid's joiners picked at the points (C calls, no
    Python frame per point)."""
    at, texts = finite_inside(first_ms, ts.step_ms, offsets, values, bad, lo_ms, hi_ms)
    if not at:
        return b""
    joiners = ts.joiners(first_ms, offsets[-1] + 1)
    picked = [joiners[at[0]]] if len(at) == 1 else list(itemgetter(*at)(joiners))
    picked[0] = picked[0].removeprefix(b"},")  # the first item opens the array: no `},` before it
    return _interleave(picked, texts)


def _not_finite(text: bytes) -> bool:
    return text[0] == 78 or text[-1] == 102  # `N`aN, +In`f`, -In`f`: the API's only other spellings


def _finite(text: bytes) -> bool:
    return not _not_finite(text)


def _finite_only(joiners: list[bytes], values: list[bytes]) -> bytes:
    """`_interleave` of the finite values only (their points left out, as the general path does)."""
    keep = list(map(_finite, values))
    kept_joiners = list(compress(joiners, keep))
    if not kept_joiners:
        return b""
    if not keep[0]:  # the first point kept is not the run's first: no `},` before it
        kept_joiners[0] = kept_joiners[0][2:]
    return _interleave(kept_joiners, list(compress(values, keep)))


def lyceum_points(window: Grid, samples: Sequence[Sample]) -> bytes:
    """A chunk's points as the body's array items (the shape the service applies per chunk)."""
    return encode_points(samples, TimestampText(window.step_ms), window.start_ms, window.end_ms)


# what one send of a streamed body carries at least: each send passes every middleware (a day
# around a restart was 61 sends of 60 KB, ~3 ms of the read's CPU); a piece this big goes on its own
SEND_AT_LEAST = 256 * 1024


async def stream_body(answer: ExecutionMetrics[bytes], execution_id: str) -> AsyncIterator[bytes]:
    window = answer.window
    head = {
        "executionId": execution_id,
        "hostname": answer.execution.hostname,
        "timeRange": {"start": format_rfc3339_ms(window.start_ms), "end": format_rfc3339_ms(window.end_ms)},
    }
    pending = [orjson.dumps(head)[:-1]]
    size = len(pending[0])
    keys = [m.lyceum for m in answer.metrics]
    current = -1
    first_in_array = True
    try:
        async for index, text in answer.chunks():
            while current < index:  # close the previous array(s), open the next
                if current >= 0:
                    pending.append(b"]")
                current += 1
                pending.append(f',"{keys[current]}":['.encode())
                first_in_array = True
            if text and not first_in_array:
                pending.append(b",")
            first_in_array = first_in_array and not text
            if len(text) >= SEND_AT_LEAST:  # on its own: not copied into a joined one (a month: 110 MB)
                if pending:
                    yield b"".join(pending)
                yield text
                pending, size = [], 0
                continue
            pending.append(text)
            size += len(text)  # the brackets and commas between are a few bytes a chunk
            if size >= SEND_AT_LEAST:
                yield b"".join(pending)
                pending, size = [], 0
        while current < len(keys) - 1:
            if current >= 0:
                pending.append(b"]")
            current += 1
            pending.append(f',"{keys[current]}":['.encode())
        pending.append(b"]}" if keys else b"}")
        yield b"".join(pending)
    finally:
        answer.cancel()


async def step_param(
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
    execution = await ctx.executions.get_for(caller, execution_id, recent=True)  # once a request
    slot = await archived.lyceum_slot(ctx, execution, (start_ms, end_ms, step_ms))
    if slot is not None and (hit := slot.hit()) is not None:
        return hit  # an archived execution's answer, already made
    answer = await ctx.metrics.read(execution, start_ms, end_ms, step_ms, lyceum_points)
    body = stream_body(answer, execution_id)
    if slot is not None:
        body = slot.recording(answer.execution, "application/json", body)
    elif answer.in_hand:  # nothing left to wait for: one body with its length, no chunked framing
        return Response(b"".join([part async for part in body]), media_type="application/json")
    return StreamingResponse(body, media_type="application/json")
