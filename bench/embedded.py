"""The `embedded` section (issue 4): the local agent's collector and SampleStore, and the embedded
backend's query latency against Prometheus on the same data.

1. Collector CPU per pass: `Collector(default_readers(host, fake_gpus=8), sinks)` run back to back,
   `time.process_time()` around the passes; readers alone, then readers + the `gpulens local` StoreSink
   writing to a SampleStore. No NVML here (fake GPUs), so this is the collector's own cost.
2. Store ingest: the last 24 h (+ a lookback margin) of the Lyceum bench scenario's 147 series written to
   a fresh SampleStore in batches; samples/s, then bytes per sample on disk after a WAL checkpoint.
3. Query: the 12 Lyceum plans over the last 24 h @ 15 s through `EmbeddedBackend` on that store vs
   `PrometheusBackend` on the Lyceum bench TSDB (same data), 12 queries in flight as the service sends
   them; p50 of each, ratio, and a value check (once, outside the timing).
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console
from rich.table import Table

from bench.cases import percentile, planned
from bench.data import prepare
from bench.measure import Figure
from gpulens.agent.collector import Collector
from gpulens.agent.readers import default_readers
from gpulens.agent.samples import Sample
from gpulens.backends.embedded import EmbeddedBackend
from gpulens.backends.prometheus import PrometheusBackend, make_client
from gpulens.cli.local import StoreSink
from gpulens.config import Settings
from gpulens.demo.history import generate
from gpulens.domain import catalog as c
from gpulens.domain.models import RangeQuery, Series, Window
from gpulens.planning.promql import eq, rename, selector
from gpulens.service.metrics import LOOKBACK_MS
from gpulens.storage.samples import SampleStore
from gpulens_testkit.promload import MissingBinary, find_binary, start_prometheus

NAME = "Embedded"
FAKE_GPUS = 8
COLLECTOR_PASSES = 300
STORE_PASSES = 3660  # an hour at 1 s and a minute: every series' hour gets sealed
WAL_PASSES = 1200  # then 20 minutes more, counting the pages written to the WAL
COLLECTOR_INTERVAL_S = 1.0
BATCH = 10_000
DAY_S = 86_400
STEP_MS = 15_000
MARGIN_S = 900  # stored before the window: the 5 min lookback and the rate window reach back
QUERY_REPEATS = 7

TARGET_CORE_PCT = 1.0  # % of one core at a 1 s interval
TARGET_INGEST = 100_000.0  # samples/s in batch
TARGET_BYTES = 16.0  # per stored sample on disk
REL_TOL = ABS_TOL = 1e-9


@dataclass
class EmbeddedResult:
    passes: int = 0
    store_passes: int = 0
    store_sealed: int = 0  # samples the store passes sealed into chunks
    wal_bytes_per_pass: float = math.nan  # written to the WAL (and later checkpointed) per pass
    samples_per_pass: int = 0
    readers_ms: float = math.nan  # CPU ms per pass
    readers_store_ms: float = math.nan
    ingest_samples: int = 0
    ingest_series: int = 0
    ingest_s: float = math.nan
    file_bytes: int = 0
    free_bytes: int = 0  # pages freed by sealing (reused by later writes, not data)
    head_samples: int = 0  # still in the head (the open hour), not sealed
    sealed_samples: int = 0
    query_window: str = ""
    embedded_s: list[float] = field(default_factory=list)
    prometheus_s: list[float] = field(default_factory=list)
    prometheus_error: str | None = None
    checks: list[str] = field(default_factory=list)  # problems found in the value check
    compared_points: int = 0

    @property
    def store_ms(self) -> float:
        return self.readers_store_ms - self.readers_ms

    def core_pct(self, ms: float) -> float:
        return ms / (COLLECTOR_INTERVAL_S * 1000) * 100

    @property
    def ingest_rate(self) -> float:
        return self.ingest_samples / self.ingest_s if self.ingest_s else math.nan

    @property
    def bytes_per_sample(self) -> float:
        """The file's size over the samples in it, the pages that sealing freed counted too."""
        return self.file_bytes / self.ingest_samples if self.ingest_samples else math.nan

    @property
    def live_bytes_per_sample(self) -> float:
        """Without the free pages: what the data takes once later writes reuse them."""
        return (self.file_bytes - self.free_bytes) / self.ingest_samples if self.ingest_samples else math.nan

    @property
    def embedded_p50(self) -> float:
        return percentile(self.embedded_s, 0.5)

    @property
    def prometheus_p50(self) -> float:
        return percentile(self.prometheus_s, 0.5)

    @property
    def ratio(self) -> float:
        return self.embedded_p50 / self.prometheus_p50 if self.prometheus_s else math.nan

    def figures(self) -> list[Figure]:
        ratio = self.ratio if self.prometheus_s else None
        return [
            Figure(
                "Embedded: collector CPU at 1 s (readers + store)",
                self.core_pct(self.readers_store_ms),
                TARGET_CORE_PCT,
                "% of a core",
            ),
            Figure("Embedded: store ingest", self.ingest_rate, TARGET_INGEST, "samples/s", higher=True),
            Figure("Embedded: store bytes per sample", self.bytes_per_sample, TARGET_BYTES, "B"),
            Figure("Embedded: 24 h query, embedded vs Prometheus (own plan both)", ratio, None),
        ]

    def missed(self) -> list[str]:
        out = []
        if not self.core_pct(self.readers_store_ms) < TARGET_CORE_PCT:
            out.append(
                f"collector: {self.core_pct(self.readers_store_ms):.2f} % of a core at 1 s "
                f"(readers + store) >= {TARGET_CORE_PCT} %"
            )
        if not self.ingest_rate >= TARGET_INGEST:
            out.append(f"store ingest: {self.ingest_rate:,.0f} samples/s < {TARGET_INGEST:,.0f}")
        if not self.bytes_per_sample <= TARGET_BYTES:
            out.append(f"store size: {self.bytes_per_sample:.1f} bytes/sample > {TARGET_BYTES:.0f}")
        return out

    def as_json(self) -> dict[str, object]:
        return {
            "collector": {
                "fake_gpus": FAKE_GPUS,
                "passes": self.passes,
                "store_passes": self.store_passes,
                "store_sealed_samples": self.store_sealed,
                "wal_bytes_per_pass": self.wal_bytes_per_pass,
                "samples_per_pass": self.samples_per_pass,
                "cpu_ms_per_pass_readers": self.readers_ms,
                "cpu_ms_per_pass_readers_and_store": self.readers_store_ms,
                "cpu_ms_per_pass_store": self.store_ms,
                "core_pct_at_1s": self.core_pct(self.readers_store_ms),
                "target_core_pct": TARGET_CORE_PCT,
            },
            "ingest": {
                "series": self.ingest_series,
                "samples": self.ingest_samples,
                "batch": BATCH,
                "seconds": self.ingest_s,
                "samples_per_s": self.ingest_rate,
                "target_samples_per_s": TARGET_INGEST,
                "file_bytes": self.file_bytes,
                "bytes_per_sample": self.bytes_per_sample,
                "live_bytes_per_sample": self.live_bytes_per_sample,
                "free_bytes": self.free_bytes,
                "head_samples": self.head_samples,
                "sealed_samples": self.sealed_samples,
                "target_bytes_per_sample": TARGET_BYTES,
            },
            "query": {
                "window": self.query_window,
                "embedded_seconds": self.embedded_s,
                "prometheus_seconds": self.prometheus_s,
                "embedded_p50_s": self.embedded_p50,
                "prometheus_p50_s": self.prometheus_p50 if self.prometheus_s else None,
                "ratio_p50": self.ratio if self.prometheus_s else None,
                "prometheus_error": self.prometheus_error,
                "compared_points": self.compared_points,
                "verified": bool(self.prometheus_s) and not self.checks,
                "problems": self.checks,
            },
            "missed": self.missed(),
        }


# -- 1. collector --------------------------------------------------------------------------------------


def _cpu_per_pass_ms(collector: Collector, passes: int) -> float:
    collector.collect()  # warm-up: first pass creates the series, primes psutil
    t0 = time.process_time()
    for _ in range(passes):
        collector.collect()
    return (time.process_time() - t0) / passes * 1000


def _stepping_clock(start: float, step: float) -> Callable[[], float]:
    """One interval later on every call: the passes look like a 1 s schedule to the store."""
    state = [start]

    def clock() -> float:
        state[0] += step
        return state[0]

    return clock


def measure_collector(result: EmbeddedResult, work: Path, hostname: str) -> None:
    readers = default_readers(hostname, fake_gpus=FAKE_GPUS)
    start = float(int(time.time()))
    try:
        bare = Collector(readers, [], interval_s=COLLECTOR_INTERVAL_S, clock=_stepping_clock(start, 1.0))
        result.samples_per_pass = len(bare.collect())
        result.readers_ms = _cpu_per_pass_ms(bare, COLLECTOR_PASSES)
        store = SampleStore.from_path(work / "collector.db")
        try:
            sink = StoreSink(store, hostname)
            # a whole hour and a minute, from an hour boundary: the cost of sealing the head into
            # hourly chunks every 10 minutes is in the figure
            hour = (int(start) // 3600 + 1) * 3600
            full = Collector(
                readers, [sink], interval_s=COLLECTOR_INTERVAL_S, clock=_stepping_clock(hour - 1.0, 1.0)
            )
            result.readers_store_ms = _cpu_per_pass_ms(full, STORE_PASSES)
            result.store_passes = STORE_PASSES
            result.store_sealed = store.stats().sealed_samples
            # disk writes: WAL frames (pages) per pass over 20 more minutes, sealing included
            conn = store._conn
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.execute("PRAGMA wal_autocheckpoint=0")
            for _ in range(WAL_PASSES):
                full.collect()
            _, frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            (page,) = conn.execute("PRAGMA page_size").fetchone()
            result.wal_bytes_per_pass = frames * page / WAL_PASSES
        finally:
            store.close()
        result.passes = COLLECTOR_PASSES
    finally:
        for reader in readers:
            reader.close()


# -- 2. ingest -------------------------------------------------------------------------------------------


def ingest(result: EmbeddedResult, path: Path, scenario: Any) -> None:
    """The last 24 h + MARGIN_S of the bench scenario (as Prometheus holds it) into a fresh store."""
    dataset = generate(scenario)
    k1 = dataset.sample_count
    k0 = max(0, k1 - (DAY_S + MARGIN_S) // dataset.interval_s - 1)
    samples: list[Sample] = []
    for s in dataset.series:
        for k, v in enumerate(dataset.values(s, k0, k1), start=k0):
            samples.append(Sample(s.name, s.labels, float(v), dataset.time_of(k) * 1000))
    store = SampleStore.from_path(path)
    try:
        t0 = time.perf_counter()
        for i in range(0, len(samples), BATCH):
            store.write(samples[i : i + BATCH])
        store.flush()  # the last 10-minute span too (a live store seals it once the next one starts)
        result.ingest_s = time.perf_counter() - t0
        stats = store.stats()
        result.head_samples, result.sealed_samples = stats.head_samples, stats.sealed_samples
        store._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (result.free_bytes,) = store._conn.execute(
            "SELECT freelist_count * page_size FROM pragma_freelist_count, pragma_page_size"
        ).fetchone()
    finally:
        store.close()
    result.ingest_samples = len(samples)
    result.ingest_series = len(dataset.series)
    wal = path.with_name(path.name + "-wal")
    result.file_bytes = path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


# -- 3. query ---------------------------------------------------------------------------------------------


async def _run_plan(backend: Any, queries: Sequence[RangeQuery]) -> tuple[float, list[list[Series]]]:
    out: list[list[Series]] = [[] for _ in queries]

    async def one(i: int, q: RangeQuery) -> None:
        out[i] = await backend.query_range(q)

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i, q in enumerate(queries):
            tg.start_soon(one, i, q)
    return time.perf_counter() - t0, out


def _compare(
    names: Sequence[str], ours: list[list[Series]], theirs: list[list[Series]]
) -> tuple[list[str], int]:
    problems: list[str] = []
    points = 0
    for name, a, b in zip(names, ours, theirs, strict=True):
        if len(a) != len(b):
            problems.append(f"{name}: {len(a)} series embedded, {len(b)} Prometheus")
            continue
        for sa, sb in zip(
            sorted(a, key=lambda s: sorted(s.labels.items())),
            sorted(b, key=lambda s: sorted(s.labels.items())),
            strict=True,
        ):
            if dict(sa.labels) != dict(sb.labels):
                problems.append(f"{name}: labels {sa.labels} vs {sb.labels}")
            if [float(t) for t, _ in sa.samples] != [float(t) for t, _ in sb.samples]:
                problems.append(f"{name}: {len(sa.samples)} vs {len(sb.samples)} points or other timestamps")
                continue
            bad = sum(
                not math.isclose(float(x), float(y), rel_tol=REL_TOL, abs_tol=ABS_TOL)
                for (_, x), (_, y) in zip(sa.samples, sb.samples, strict=True)
            )
            points += len(sa.samples)
            if bad:
                problems.append(f"{name}: {bad} values differ by more than 1e-9")
    return problems, points


async def _query_bench(
    result: EmbeddedResult,
    store_path: Path,
    prom_url: str | None,
    settings: Settings,
    hostname: str,
    end_s: int,
    progress: Callable[[str], None],
) -> None:
    window = Window((end_s - DAY_S) * 1000, end_s * 1000, STEP_MS)
    result.query_window = f"24 h @ {STEP_MS // 1000} s, {window.points:,} points/series, 12 queries in flight"
    store = SampleStore.from_path(store_path)
    embedded = EmbeddedBackend(store)
    prom: PrometheusBackend | None = None
    if prom_url is not None:
        client = make_client(settings.backend_timeout, False, settings.query_concurrency)
        prom = PrometheusBackend(prom_url, client, concurrency=settings.query_concurrency)
    try:
        # node instances as MetricsService finds them (node_uname_info{nodename=host}); same on both sides
        match = selector(rename(c.NODE_UNAME_INFO, settings.metric_names), [eq(c.LABEL_NODENAME, hostname)])
        source = prom or embedded
        instances = tuple(
            await source.series_labels(match, c.LABEL_INSTANCE, window.start_ms - LOOKBACK_MS, window.end_ms)
        )
        plan = planned(settings, hostname, instances, STEP_MS)
        plan = [p for p in plan if p.expr is not None]
        queries = [RangeQuery(p.expr, window) for p in plan if p.expr is not None]
        progress(f"{NAME}: query warm-up and value check")
        _, ours = await _run_plan(embedded, queries)
        if prom is not None:
            _, theirs = await _run_plan(prom, queries)
            result.checks, result.compared_points = _compare([p.metric.lyceum for p in plan], ours, theirs)
        del ours
        for i in range(QUERY_REPEATS):
            progress(f"{NAME}: query run {i + 1}/{QUERY_REPEATS}")
            order: list[Any] = [embedded, prom] if i % 2 == 0 else [prom, embedded]
            for backend in order:
                if backend is None:
                    continue
                seconds, _ = await _run_plan(backend, queries)
                (result.embedded_s if backend is embedded else result.prometheus_s).append(seconds)
    finally:
        if prom is not None:
            await prom.aclose()
        await embedded.aclose()
        store.close()


# -- the section ------------------------------------------------------------------------------------------


def run_section(
    data_dir: Path,
    add_cleanup: Callable[[Callable[[], None]], None],
    err: Console,
    progress: Callable[[str], None],
) -> EmbeddedResult:
    result = EmbeddedResult()
    work = Path(tempfile.mkdtemp(prefix="gpulens-bench-embedded-"))
    add_cleanup(lambda: shutil.rmtree(work, ignore_errors=True))
    data = prepare(data_dir, log=err.print)
    scenario = data.scenario
    hostname = scenario.hosts[0].hostname

    progress(f"{NAME}: collector, {COLLECTOR_PASSES} passes, then {STORE_PASSES} with the store")
    t0 = time.monotonic()
    measure_collector(result, work, hostname)
    err.print(
        f"{NAME} collector: {result.readers_ms:.3f} ms CPU/pass readers, "
        f"{result.readers_store_ms:.3f} ms with the store ({time.monotonic() - t0:.0f} s)"
    )

    progress(f"{NAME}: ingesting 24 h of the bench scenario")
    store_path = work / "samples.db"
    t0 = time.monotonic()
    ingest(result, store_path, scenario)
    err.print(
        f"{NAME} ingest: {result.ingest_samples:,} samples in {result.ingest_s:.2f} s, "
        f"{result.bytes_per_sample:.1f} bytes/sample ({time.monotonic() - t0:.0f} s)"
    )

    prom_url: str | None = None
    try:
        find_binary("prometheus")
        prom = start_prometheus(data.tsdb, block_s=data.block_s, scrape_interval_s=scenario.scrape_interval_s)
        add_cleanup(prom.stop)
        prom_url = prom.url
    except (MissingBinary, OSError) as exc:
        result.prometheus_error = f"no Prometheus: {exc}"
        err.print(f"{NAME}: {result.prometheus_error}; timing the embedded backend alone")
    settings = Settings(prometheus_url=prom_url or "http://127.0.0.1:1", data_dir=work)
    t0 = time.monotonic()
    anyio.run(_query_bench, result, store_path, prom_url, settings, hostname, scenario.end_s, progress)
    err.print(
        f"{NAME} query: embedded p50 {result.embedded_p50:.3f} s, Prometheus p50 "
        f"{result.prometheus_p50:.3f} s, ratio {result.ratio:.2f} ({time.monotonic() - t0:.0f} s)"
    )
    return result


def _mark(ok: bool, text: str) -> str:
    return f"[{'green' if ok else 'red'}]{text}[/]"


def print_embedded(console: Console, r: EmbeddedResult) -> None:
    table = Table(title="Embedded agent, store and backend (issue 4)")
    for name in ("measure", "value", "target", "note"):
        table.add_column(name, justify="right" if name in ("value", "target") else "left")
    pct = r.core_pct(r.readers_store_ms)
    table.add_row(
        "collector CPU / pass, readers",
        f"{r.readers_ms:.3f} ms",
        "-",
        f"{FAKE_GPUS} fake GPUs + host reader, {r.samples_per_pass} samples/pass, {r.passes} passes",
    )
    table.add_row(
        "collector CPU / pass, store write",
        f"{r.store_ms:.3f} ms",
        "-",
        f"StoreSink, 1 txn/pass, {r.store_passes} passes incl. sealing {r.store_sealed:,} samples",
    )
    table.add_row(
        "collector WAL writes / pass",
        f"{r.wal_bytes_per_pass / 1024:.1f} KiB",
        "-",
        f"{WAL_PASSES} passes, sealing included; {r.wal_bytes_per_pass * 86_400 / 1e9:.2f} GB/day at 1 s",
    )
    table.add_row(
        "collector CPU / pass, readers + store",
        f"{r.readers_store_ms:.3f} ms",
        "-",
        "time.process_time(); no NVML",
    )
    table.add_row(
        "  = % of one core at 1 s",
        _mark(pct < TARGET_CORE_PCT, f"{pct:.3f} %"),
        f"< {TARGET_CORE_PCT:g} %",
        f"readers alone {r.core_pct(r.readers_ms):.3f} %",
    )
    table.add_row(
        "store ingest",
        _mark(r.ingest_rate >= TARGET_INGEST, f"{r.ingest_rate:,.0f} /s"),
        f">= {TARGET_INGEST:,.0f} /s",
        f"{r.ingest_samples:,} samples, {r.ingest_series} series, batches of {BATCH:,}, {r.ingest_s:.2f} s",
    )
    table.add_row(
        "bytes / stored sample",
        _mark(r.bytes_per_sample <= TARGET_BYTES, f"{r.bytes_per_sample:.2f}"),
        f"<= {TARGET_BYTES:g}",
        f"{r.file_bytes / 1e6:.1f} MB after wal_checkpoint(TRUNCATE); {r.sealed_samples:,} sealed in"
        f" hourly chunks, {r.head_samples:,} in the head (the open 10 minutes)",
    )
    table.add_row(
        "  without free pages",
        f"{r.live_bytes_per_sample:.2f}",
        "-",
        f"{r.free_bytes / 1e6:.1f} MB freed by sealing, reused by later writes",
    )
    table.add_row(
        "query p50, embedded",
        f"{r.embedded_p50:.3f} s",
        "-",
        f"{r.query_window}; {len(r.embedded_s)} runs, p95 {percentile(r.embedded_s, 0.95):.3f} s",
    )
    if r.prometheus_s:
        table.add_row(
            "query p50, Prometheus",
            f"{r.prometheus_p50:.3f} s",
            "-",
            f"same plans on the Lyceum TSDB; p95 {percentile(r.prometheus_s, 0.95):.3f} s",
        )
        table.add_row("  = ratio embedded / Prometheus", f"{r.ratio:.2f}", "-", "")
        check = "ok" if not r.checks else "; ".join(r.checks[:3])
        table.add_row(
            "values agree (1e-9)",
            _mark(not r.checks, "yes" if not r.checks else "NO"),
            "-",
            f"{r.compared_points:,} points compared" if not r.checks else check,
        )
    else:
        table.add_row("query p50, Prometheus", "-", "-", r.prometheus_error or "not run")
    console.print(table)
