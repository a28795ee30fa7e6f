"""Full-resolution export of an execution: every sample at the scrape interval, per GPU, long format.

Rows are `timestamp, hostname, gpu, uuid, metric, value` (metric: the Lyceum name; the 9 GPU series
once per GPU, the 3 host series with an empty gpu and uuid). The window is the one the metrics route
uses (same look-up, tenant rules, backend and archive choice), on the grid `start + k*scrape interval`.
It is read one chunk of time at a time (an hour by default): a chunk's queries run together, its
rows come out sorted by time, GPU, then metric, and nothing of it is kept after it is handed on, so
memory stays flat however long the execution. The chunks are made as they are read (nothing
proportional to the window happens before the first byte), and a chunk's rows are built, sorted and
encoded in a worker thread, so the event loop serves other requests meanwhile. The encoders turn those
batches into CSV (cells that a spreadsheet would run as formulas neutralised: shaping/cells.py), JSON
lines or Parquet (one row group per chunk), each as a stream of bytes.
"""

from __future__ import annotations

import asyncio
import csv
import io
import logging
import math
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
import orjson

from gpulens.domain import catalog as c
from gpulens.domain.catalog import MetricDef
from gpulens.domain.errors import InvalidRequest, NotFound
from gpulens.domain.models import GPU_INDEX_RE, GPU_UUID_RE, Execution, Principal, RangeQuery, Window
from gpulens.domain.timeparse import format_rfc3339_ms
from gpulens.planning.chunking import time_chunk_count, time_chunks
from gpulens.planning.hosts import HostPlanOptions, HostTarget, PlannedMetric, plan_host
from gpulens.planning.layout import HostLayout
from gpulens.planning.promql import eq, rename, selector
from gpulens.planning.segments import Run, runs_per_item
from gpulens.service.layouts import per_piece
from gpulens.service.metrics import MetricsService
from gpulens.shaping.cells import csv_cell
from gpulens.shaping.merge import single

COLUMNS = ("timestamp", "hostname", "gpu", "uuid", "metric", "value")
FORMATS = ("csv", "parquet", "json")
MEDIA_TYPES = {"csv": "text/csv", "parquet": "application/vnd.apache.parquet", "json": "application/x-ndjson"}
CHUNK_MS = 3_600_000
GPU_METRICS = tuple(m for m in c.LYCEUM_METRICS if m.exporter is c.Exporter.DCGM)
HOST_METRICS = tuple(m for m in c.LYCEUM_METRICS if m.exporter is c.Exporter.NODE)
_GPU_INDEX = re.compile(GPU_INDEX_RE)
_GPU_UUID = re.compile(GPU_UUID_RE)
log = logging.getLogger("gpulens.export")


@dataclass(frozen=True, slots=True)
class Row:
    timestamp_ms: int
    gpu: str  # "" for a host series
    uuid: str
    metric: str  # Lyceum name
    value: float


@dataclass(frozen=True, slots=True)
class Gpu:
    index: str  # dcgm-exporter's `gpu` label ("" when only the UUID is known)
    uuid: str
    selector: str  # what plan_host selects it by (the execution's own spelling)


@dataclass(slots=True)
class Export:
    """An opened export: the execution, its window and GPUs; `batches()` reads it chunk by chunk."""

    execution: Execution
    window: Window
    gpus: list[Gpu]
    chunk_ms: int
    _plans: list[tuple[Gpu | None, list[Planned]]]  # per GPU (None: the host), each metric's runs
    _service: ExportService
    _backend: Any

    @property
    def hostname(self) -> str:
        return self.execution.hostname or ""

    @property
    def chunk_count(self) -> int:
        """How many chunks `batches()` yields (counted, not made)."""
        return time_chunk_count(self.window, self.chunk_ms)

    async def batches(self) -> AsyncIterator[list[Row]]:
        """One sorted list of rows per chunk of time (possibly empty), in time order. The chunks are
        made as they are read: nothing proportional to the window happens before the first one."""
        for part in time_chunks(self.window, self.chunk_ms):
            yield await self._chunk(part)

    async def _chunk(self, part: Window) -> list[Row]:
        limit = asyncio.Semaphore(self._service.in_flight)
        jobs: list[tuple[int, int, Gpu | None, MetricDef, RangeQuery]] = []
        for gi, (gpu, plan) in enumerate(self._plans):
            for mi, (metric, runs) in enumerate(plan):
                for run in runs:  # the runs of this metric that overlap the chunk, each on its part
                    lo, hi = max(part.start_ms, run.window.start_ms), min(part.end_ms, run.window.end_ms)
                    if run.value is not None and lo <= hi:
                        jobs.append(
                            (gi, mi, gpu, metric, RangeQuery(run.value, Window(lo, hi, part.step_ms)))
                        )

        async def one(job: tuple[int, int, Gpu | None, MetricDef, RangeQuery]) -> Sequence[Sequence[Any]]:
            async with limit:
                return single(await self._backend.query_range(job[4]))

        found = await asyncio.gather(*(one(job) for job in jobs))
        # the rows are made and sorted in a worker thread: an hour of a large host is tens of
        # thousands of rows, which the event loop (every other request) should not wait for
        return await anyio.to_thread.run_sync(_rows, part, jobs, found)


def _rows(
    part: Window,
    jobs: Sequence[tuple[int, int, Gpu | None, MetricDef, RangeQuery]],
    found: Sequence[Sequence[Sequence[Any]]],
) -> list[Row]:
    """A chunk's finite samples inside it as rows, sorted by time, GPU, then metric."""
    keyed: list[tuple[int, int, int, Row]] = []
    for (gi, mi, gpu, metric, _), samples in zip(jobs, found, strict=True):
        name = metric.lyceum
        index, uuid = (gpu.index, gpu.uuid) if gpu is not None else ("", "")
        for t, v in samples:
            ms, value = round(float(t) * 1000), float(v)
            if part.start_ms <= ms <= part.end_ms and math.isfinite(value):
                keyed.append((ms, gi, mi, Row(ms, index, uuid, name, value)))
    keyed.sort(key=lambda k: (k[0], k[1], k[2]))
    return [k[3] for k in keyed]


Planned = tuple[MetricDef, list[Run[str | None]]]


def whole_window(window: Window, plan: list[PlannedMetric]) -> list[Planned]:
    """A plan asked as it is over the whole window (one run per metric)."""
    return [(p.metric, [Run(window, p.expr)]) for p in plan]


class ExportService:
    def __init__(
        self, metrics: MetricsService, chunk_ms: int = CHUNK_MS, in_flight: int | None = None
    ) -> None:
        self.metrics = metrics
        self.chunk_ms = chunk_ms
        self.in_flight = in_flight or metrics.limits.in_flight

    async def open(
        self, principal: Principal, execution_id: str, start_ms: int | None, end_ms: int | None
    ) -> Export:
        """Look the execution up (404 for another org's), resolve its window, GPUs and plans."""
        execution = await self.metrics.executions.get_for(principal, execution_id)
        if execution.start_time is None or not execution.hostname:
            raise NotFound("No metrics available for this execution yet")
        step = self.metrics.options.scrape_interval_ms
        window = self.metrics.effective_window(execution, start_ms, end_ms, step)
        backend = await self.metrics.backend_for(execution)
        gpus = await self._gpus(backend, execution, window)
        options = self.metrics.options
        plans: list[tuple[Gpu | None, list[Planned]]] = []
        # guards only where the data is irregular: the pieces of all the execution's GPUs (a guard one
        # GPU needs is kept for all, which is exact), each GPU's plan per piece
        every = HostTarget(execution.hostname, tuple(g.selector for g in gpus))
        leaves = await self.metrics.layouts.leaves(backend, GPU_METRICS, every, window, step)
        for gpu in gpus:
            target = HostTarget(execution.hostname, (gpu.selector,))
            pieces = per_piece(leaves, partial(expressions, GPU_METRICS, target, step, options))
            plans.append((gpu, list(zip(GPU_METRICS, runs_per_item(window, pieces), strict=True))))
        instances: tuple[str, ...] = ()
        if options.node_match in ("auto", "nodename"):
            # the metrics route's own look-up (cached), so both select the same node-exporter instances
            instances = await self.metrics.node_instances(backend, execution.hostname, window)
        host = HostTarget(execution.hostname, (), instances)
        host_leaves = await self.metrics.layouts.leaves(backend, HOST_METRICS, host, window, step)
        pieces = per_piece(host_leaves, partial(expressions, HOST_METRICS, host, step, options))
        plans.append((None, list(zip(HOST_METRICS, runs_per_item(window, pieces), strict=True))))
        return Export(execution, window, gpus, self.chunk_ms, plans, self, backend)

    async def _gpus(self, backend: Any, execution: Execution, window: Window) -> list[Gpu]:
        """The execution's GPUs (every GPU of the host when it lists none) with their index and UUID,
        from dcgm-exporter's labels (MIG instances are read with their parent GPU)."""
        assert execution.hostname
        options = self.metrics.options
        seen: dict[tuple[str, str], None] = {}
        for name in (c.DCGM_GPU_UTIL, c.DCGM_GR_ENGINE_ACTIVE, c.DCGM_FB_USED):
            for label in options.host_labels:
                match = selector(rename(name, options.metric_names), [eq(label, execution.hostname)])
                for labels in await backend.series(match, window.start_ms - c.LOOKBACK_MS, window.end_ms):
                    seen[(labels.get(c.LABEL_GPU, ""), labels.get(c.LABEL_UUID, ""))] = None
            if seen:
                break
        known = sorted(seen, key=lambda g: (len(g[0]), g))
        if not execution.gpus:
            return [gpu for index, uuid in known if (gpu := _found_gpu(execution, index, uuid)) is not None]
        out = []
        for wanted in execution.gpus:
            hit = next(((i, u) for i, u in known if wanted in (i, u)), None)
            if hit is None:
                index, uuid = (wanted, "") if wanted.isdigit() else ("", wanted)
            else:
                index, uuid = hit
            out.append(Gpu(index, uuid, wanted))
        return out


def _found_gpu(execution: Execution, index: str, uuid: str) -> Gpu | None:
    """A GPU found in the backend's labels, selected by its index, else by its UUID. A `gpu` label that
    is not an index is exported as the label says (the GPU selected by its UUID); a GPU with neither a
    usable index nor a UUID cannot be selected alone, and is left out with a warning."""
    if _GPU_INDEX.fullmatch(index):
        return Gpu(index, uuid, index)
    if _GPU_UUID.fullmatch(uuid):
        return Gpu(index, uuid, uuid)
    if index or uuid:
        log.warning(
            "export of %s: GPU series with gpu=%r and UUID=%r on %r left out (neither an index nor a UUID)",
            execution.execution_id,
            index,
            uuid,
            execution.hostname,
        )
    return None


def expressions(
    metrics: Sequence[MetricDef],
    target: HostTarget,
    step_ms: int,
    options: HostPlanOptions,
    layout: HostLayout,
) -> list[str | None]:
    """`plan_host`'s expressions for one layout (a piece's)."""
    return [p.expr for p in plan_host(metrics, target, step_ms, options, layout)]


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise InvalidRequest(f"format must be one of {', '.join(FORMATS)}")
    return fmt


# -- encoders: batches of rows -> bytes -------------------------------------------------------------


def _times(rows: list[Row]) -> dict[int, str]:
    """RFC 3339 text of each distinct timestamp of a batch (every GPU and metric shares it)."""
    return {t: format_rfc3339_ms(t) for t in {r.timestamp_ms for r in rows}}


def _value_text(value: float) -> str:
    return repr(value) if not value.is_integer() or abs(value) >= 1e16 else str(int(value))


async def encode(fmt: str, hostname: str, batches: AsyncIterator[list[Row]]) -> AsyncIterator[bytes]:
    """The rows of `batches` as `fmt`, one piece per batch (a header first; Parquet's footer last)."""
    if fmt == "csv":
        yield (",".join(COLUMNS) + "\n").encode()
        host = csv_cell(hostname)
        async for rows in batches:
            yield await anyio.to_thread.run_sync(_csv_rows, host, rows)
    elif fmt == "json":
        async for rows in batches:
            yield await anyio.to_thread.run_sync(_json_rows, hostname, rows)
    elif fmt == "parquet":
        async for piece in _parquet(hostname, batches):
            yield piece
    else:
        raise InvalidRequest(f"format must be one of {', '.join(FORMATS)}")


def _csv_rows(host: str, rows: list[Row]) -> bytes:
    """A batch as CSV lines. A cell a spreadsheet would read as a formula (a `gpu` or `uuid` label, a
    hostname starting with = + - @ tab or CR) gets a leading `'` (shaping/cells.py); times, metric names
    and numbers never need one. `host` is the hostname's cell already."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    ts = _times(rows)
    cells: dict[str, str] = {}  # a batch holds few distinct labels: each is checked once

    def cell(text: str) -> str:
        safe = cells.get(text)
        if safe is None:
            safe = cells[text] = csv_cell(text)
        return safe

    writer.writerows(
        (ts[r.timestamp_ms], host, cell(r.gpu), cell(r.uuid), r.metric, _value_text(r.value)) for r in rows
    )
    return buf.getvalue().encode()


def _json_rows(hostname: str, rows: list[Row]) -> bytes:
    """A batch as JSON lines (the labels as they are: JSON is not read as formulas)."""
    ts = _times(rows)
    return b"".join(
        orjson.dumps(
            {
                "timestamp": ts[r.timestamp_ms],
                "hostname": hostname,
                "gpu": r.gpu,
                "uuid": r.uuid,
                "metric": r.metric,
                "value": r.value,
            }
        )
        + b"\n"
        for r in rows
    )


class _Drain(io.RawIOBase):
    """A write-only file that hands out what was written since the last `take()`."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._pos = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        b = bytes(data)
        self._parts.append(b)
        self._pos += len(b)
        return len(b)

    def tell(self) -> int:
        return self._pos

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


def parquet_schema() -> Any:
    import pyarrow as pa  # type: ignore[import-untyped]

    return pa.schema(
        [
            ("timestamp", pa.timestamp("ms", tz="UTC")),
            ("hostname", pa.string()),
            ("gpu", pa.string()),
            ("uuid", pa.string()),
            ("metric", pa.string()),
            ("value", pa.float64()),
        ]
    )


async def _parquet(hostname: str, batches: AsyncIterator[list[Row]]) -> AsyncIterator[bytes]:
    import pyarrow as pa
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    schema = parquet_schema()
    sink = _Drain()
    writer = pq.ParquetWriter(pa.PythonFile(sink, mode="w"), schema, compression="zstd")

    def row_group(rows: list[Row]) -> bytes:
        """A batch written as one row group (in a worker thread, one batch at a time); its bytes."""
        if rows:
            table = pa.table(
                {
                    "timestamp": pa.array([r.timestamp_ms for r in rows], pa.timestamp("ms", tz="UTC")),
                    "hostname": pa.array([hostname] * len(rows), pa.string()),
                    "gpu": pa.array([r.gpu for r in rows], pa.string()),
                    "uuid": pa.array([r.uuid for r in rows], pa.string()),
                    "metric": pa.array([r.metric for r in rows], pa.string()),
                    "value": pa.array([r.value for r in rows], pa.float64()),
                },
                schema=schema,
            )
            writer.write_table(table)
        return sink.take()

    try:
        async for rows in batches:
            piece = await anyio.to_thread.run_sync(row_group, rows)
            if piece:
                yield piece
    finally:
        writer.close()
    yield sink.take()
