"""The archive of finished executions and pods: made from the live backend, then served instead of it.

* `Archiver` copies the raw samples a finished object's plans could read (planning/archive.py) over
  its window from the live backend into the registry (storage/archive.py), one transaction per
  archive. `run_pass` archives what finished since the last pass (`serve` runs it every
  GPULENS_ARCHIVE_INTERVAL seconds), rebuilds archives whose registration changed (a PATCH of the
  window, the host or the GPUs) or whose settings changed, and re-counts young archives' samples in
  the backend to rebuild those that late samples have grown.
* `ArchiveService` is the `ArchiveLookup` of the metric services: for an object with a fresh archive
  (made for its current registration and the current settings) an `EmbeddedBackend` over the decoded
  archive, kept in a memory-bounded LRU; a stale archive is never served.
* `AnswerCache` keeps whole response bodies of archived objects (they cannot change while the archive
  generation is the same), for the API's routes.

Windows. An execution's archive holds [start - lookback - lead, end], lead = max(margin, duration /
50): reads are clamped to the execution, an instant selector looks back at most the 5-minute
lookback, and a rate window (a step, for coarse steps) up to lookback + lead at the first grid point
still starts inside it (15 minutes by default, more for long runs). A pod's holds [start - lookback -
lead, end + lookback]: Run:ai windows are not clamped, and the pod's series are visible for a lookback
after their last sample. An object may be archived once now >= end + lookback + grace (late scrapes).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from operator import itemgetter

import anyio
import numpy as np

from gpulens.backends.base import MetricsBackend
from gpulens.backends.embedded import EmbeddedBackend
from gpulens.domain import catalog as c
from gpulens.domain.catalog import Exporter
from gpulens.domain.errors import BackendBadResponse, BackendError
from gpulens.domain.models import Execution, GridPoints, GridSamples, Series, TimedSamples
from gpulens.domain.timeparse import datetime_to_ms, ms_to_datetime
from gpulens.domain.workloads import Pod, PodPhase
from gpulens.planning.archive import (
    Selection,
    execution_selections,
    lyceum_series,
    node_uname_selector,
    pod_selections,
    pod_series,
)
from gpulens.planning.hosts import HostPlanOptions, HostTarget
from gpulens.planning.pods import PodPlanOptions
from gpulens.planning.slurm import is_slurm_namespace
from gpulens.storage.archive import (
    EXECUTION,
    POD,
    ArchiveInfo,
    ArchiveSource,
    ArchiveStore,
    ArchiveTotals,
    EncodedSeries,
    Times,
    Values,
    encode_series,
)
from gpulens.storage.registry import Registry
from gpulens.storage.samples import canonical_labels

log = logging.getLogger(__name__)

LOOKBACK_MS = c.LOOKBACK_MS
FORMAT = 1  # what an archive holds and how; a change makes every archive stale (rebuilt)


@dataclass(frozen=True, slots=True)
class ArchiveOptions:
    host: HostPlanOptions = field(default_factory=HostPlanOptions)
    pod: PodPlanOptions = field(default_factory=PodPlanOptions)
    margin_ms: int = 600_000  # before start - lookback: rate windows of steps up to this are exact ...
    margin_points: int = 50  # ... and of steps up to the object's duration / this (coarse reads)
    grace_ms: int = 300_000  # after end + lookback before archiving (late scrapes)
    recheck_ms: int = 86_400_000  # archives younger than this are re-counted for late samples ...
    recheck_every_ms: int = 3_600_000  # ... at most this often
    batch: int = 50  # archives built per pass of the serve loop

    def lead_ms(self, start_ms: int, end_ms: int) -> int:
        """How much before start - lookback an archive starts: the longest rate window it serves
        exactly (a step's), the margin or, for long objects, 1/margin_points of their duration."""
        return max(self.margin_ms, (end_ms - start_ms) // self.margin_points)

    @property
    def digest(self) -> str:
        """The settings an archive depends on (and the catalog's series): a change makes it stale."""
        dcgm, app = pod_series((*c.POD_METRICS, *c.WORKLOAD_METRICS), self.pod.metric_names)
        return digest(
            {
                "format": FORMAT,
                "lookback_ms": LOOKBACK_MS,
                "margin_ms": self.margin_ms,
                "margin_points": self.margin_points,
                "host_labels": list(self.host.host_labels),
                "node_match": self.host.node_match,
                "dcgm": lyceum_series(Exporter.DCGM, self.host.metric_names),
                "node": lyceum_series(Exporter.NODE, self.host.metric_names),
                "uname": node_uname_selector("", self.host),
                "pod_dcgm": sorted(dcgm),
                "pod_app": sorted(app),
            }
        )


def digest(payload: object) -> str:
    """A stable digest of a JSON-able payload (what a stored archive or summary was made for)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Spec:
    """What an object's archive is made for: the registration fields its data depends on, its
    window, and the settings (a pod's node and GPUs do not change which series it reads, except a
    Slurm job node's pod's: planning/slurm.py)."""

    kind: str
    object_id: str
    hostname: str | None  # the execution's host; a pod's node (kept for people, not in the digest)
    namespace: str | None
    name: str | None
    gpus: tuple[str, ...]
    start_ms: int
    end_ms: int
    from_ms: int
    to_ms: int
    ready_ms: int  # archived once now >= this
    options_digest: str

    @property
    def digest(self) -> str:
        if self.kind == EXECUTION:
            made_of: list[object] = [self.hostname, list(self.gpus)]
        else:
            made_of = [self.namespace, self.name]
            if self.namespace is not None and is_slurm_namespace(self.namespace):
                made_of += [self.hostname, list(self.gpus)]  # its reads select its node's GPUs
        return digest(
            [
                self.kind,
                self.object_id,
                *made_of,
                self.start_ms,
                self.end_ms,
                self.from_ms,
                self.to_ms,
                self.options_digest,
            ]
        )


def execution_spec(execution: Execution, options: ArchiveOptions, digest: str | None = None) -> Spec | None:
    """None while the execution is active, or without a start, an end or a host."""
    e = execution
    if e.status.is_active or e.start_time is None or e.end_time is None or not e.hostname:
        return None
    start, end = datetime_to_ms(e.start_time), datetime_to_ms(e.end_time)
    end = max(end, start)
    return Spec(
        EXECUTION,
        e.execution_id,
        e.hostname,
        None,
        None,
        tuple(e.gpus),
        start,
        end,
        start - LOOKBACK_MS - options.lead_ms(start, end),
        end,
        end + LOOKBACK_MS + options.grace_ms,
        digest or options.digest,
    )


def pod_spec(pod: Pod, options: ArchiveOptions, digest: str | None = None) -> Spec | None:
    """None while the pod is Pending or Running, or without a start or an end."""
    if pod.phase in (PodPhase.PENDING, PodPhase.RUNNING) or pod.start_time is None or pod.end_time is None:
        return None
    start, end = datetime_to_ms(pod.start_time), datetime_to_ms(pod.end_time)
    end = max(end, start)
    return Spec(
        POD,
        pod.pod_id,
        pod.node,
        pod.namespace,
        pod.name,
        tuple(pod.gpus),
        start,
        end,
        start - LOOKBACK_MS - options.lead_ms(start, end),
        end + LOOKBACK_MS,
        end + LOOKBACK_MS + options.grace_ms,
        digest or options.digest,
    )


def _arrays(series: Series) -> tuple[dict[str, str], Times, Values]:
    """A raw series as Prometheus' JSON has it -> (labels, ms timestamps, float values)."""
    samples = series.samples
    n = len(samples)
    if isinstance(samples, GridSamples):
        t = np.arange(n, dtype=np.int64) * samples.step_ms + samples.first_ms
        return series.labels, t, np.array(samples.numbers, dtype=np.float64)
    if isinstance(samples, GridPoints):
        t = np.array(samples.offsets, dtype=np.int64) * samples.step_ms + samples.first_ms
        return series.labels, t, np.array(samples.numbers, dtype=np.float64)
    if isinstance(samples, TimedSamples):  # parsed already: two C conversions
        t = np.rint(np.array(samples.seconds, dtype=np.float64) * 1000).astype(np.int64)
        return series.labels, t, np.array(samples.numbers, dtype=np.float64)
    # through C callables (a million samples an archive): numpy parses the decimal texts itself
    seconds = np.fromiter(map(itemgetter(0), samples), dtype=np.float64, count=n)
    v = np.array(list(map(itemgetter(1), samples)), dtype=np.float64)
    return series.labels, np.rint(seconds * 1000).astype(np.int64), v


def encode_source(source: ArchiveSource) -> list[EncodedSeries]:
    """Every series of `source` as stored rows, in label order."""
    out = [
        EncodedSeries(canonical_labels(labels), len(t), encode_series(t, v))
        for labels, t, v in source.items()
    ]
    out.sort(key=lambda s: s.labels)
    return out


# -- making archives -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Built:
    info: ArchiveInfo
    seconds: float


@dataclass(slots=True)
class PassReport:
    executions: int = 0  # archives built
    pods: int = 0
    unchanged: int = 0  # registry rows that changed without changing what their archive holds
    late: int = 0  # archives rebuilt because the backend holds more samples now
    samples: int = 0  # in the archives built
    bytes: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)  # (object id, why)


@dataclass(frozen=True, slots=True)
class Target:
    """One object to archive (or whose archive to check)."""

    kind: str
    object_id: str
    org: str
    spec: Spec
    updated_at: datetime
    current: ArchiveInfo | None = None

    @property
    def fresh(self) -> bool:
        return self.current is not None and self.current.spec_digest == self.spec.digest


class Archiver:
    """Builds archives from `backend` (the live one) into `store`."""

    def __init__(
        self,
        registry: Registry,
        store: ArchiveStore,
        backend: MetricsBackend,
        options: ArchiveOptions,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.registry = registry
        self.store = store
        self.backend = backend
        self.options = options
        self.clock = clock
        self._digest = options.digest
        self._failed: dict[str, float] = {}  # object id -> monotonic time of its last failure

    # -- one object ------------------------------------------------------------------------------------
    async def selections(self, spec: Spec) -> list[Selection]:
        if spec.kind == POD:
            assert spec.namespace is not None and spec.name is not None
            pod = self.options.pod
            return pod_selections(
                spec.namespace, spec.name, pod.metric_names, spec.hostname, spec.gpus, pod.host_labels
            )
        assert spec.hostname is not None
        instances: tuple[str, ...] = ()
        if self.options.host.node_match in ("auto", "nodename"):
            instances = tuple(
                await self.backend.series_labels(
                    node_uname_selector(spec.hostname, self.options.host),
                    c.LABEL_INSTANCE,
                    spec.from_ms,
                    spec.to_ms,
                )
            )
        target = HostTarget(spec.hostname, spec.gpus, instances)
        return execution_selections(target, self.options.host)

    async def build(self, target: Target) -> Built:
        """Copy the target's samples into a new archive that replaces its old one (one transaction)."""
        started = time.perf_counter()
        spec = target.spec
        selections = await self.selections(spec)
        answers = await asyncio.gather(
            *(self.backend.query_raw(s.match, spec.from_ms, spec.to_ms) for s in selections)
        )
        raw_count = sum(len(s.samples) for answer in answers for s in answer)

        def encode() -> tuple[list[EncodedSeries], int]:
            source = ArchiveSource(_arrays(s) for answer in answers for s in answer)
            return encode_source(source), source.sample_count

        encoded, samples = await anyio.to_thread.run_sync(encode)
        now = self.clock()
        info = ArchiveInfo(
            id=str(uuid.uuid4()),
            kind=spec.kind,
            object_id=spec.object_id,
            org=target.org,
            spec_digest=spec.digest,
            options_digest=spec.options_digest,
            hostname=spec.hostname,
            namespace=spec.namespace,
            name=spec.name,
            gpus=spec.gpus,
            start_time=ms_to_datetime(spec.start_ms),
            end_time=ms_to_datetime(spec.end_ms),
            from_ms=spec.from_ms,
            to_ms=spec.to_ms,
            source_updated_at=target.updated_at,
            series_count=len(encoded),
            sample_count=samples,
            raw_count=raw_count,
            byte_count=sum(len(s.data) + len(s.labels) for s in encoded),
            created_at=now,
            checked_at=now,
        )
        await anyio.to_thread.run_sync(self.store.replace, info, encoded)
        return Built(info, time.perf_counter() - started)

    async def live_count(self, info: ArchiveInfo) -> int:
        """How many samples the backend holds now for what `info` copied (as its `raw_count` counts)."""
        spec = Spec(
            info.kind,
            info.object_id,
            info.hostname,
            info.namespace,
            info.name,
            info.gpus,
            datetime_to_ms(info.start_time),
            datetime_to_ms(info.end_time),
            info.from_ms,
            info.to_ms,
            0,
            info.options_digest,
        )
        total = 0
        for selection in await self.selections(spec):
            window = f"{info.to_ms - info.from_ms}ms"
            expr = " + ".join(
                f"(sum(count_over_time({sel}[{window}])) or vector(0))" for sel in selection.per_name()
            )
            try:
                answer = await self.backend.query(expr, info.to_ms)
                total += sum(round(float(s.samples[0][1])) for s in answer if s.samples)
            except BackendBadResponse:  # a backend without count_over_time (the embedded one): read them
                raw = await self.backend.query_raw(selection.match, info.from_ms, info.to_ms)
                total += sum(len(s.samples) for s in raw)
        return total

    # -- what to do ------------------------------------------------------------------------------------
    def execution_target(self, execution_id: str, updated_at: datetime | None = None) -> Target | None:
        """What archiving the execution means now (None: unknown, or not finished). `updated_at` is
        its registry row's, read before the execution itself (so a change in between is seen again)."""
        if updated_at is None:
            updated_at = self.store.updated_at(EXECUTION, execution_id)
        execution = self.registry.get_execution(execution_id)
        if execution is None or updated_at is None:
            return None
        spec = execution_spec(execution, self.options, self._digest)
        if spec is None:
            return None
        current = self.store.get(EXECUTION, execution_id)
        return Target(EXECUTION, execution_id, execution.org, spec, updated_at, current)

    def pod_target(self, pod_id: str, updated_at: datetime | None = None) -> Target | None:
        """As `execution_target`, for a pod."""
        if updated_at is None:
            updated_at = self.store.updated_at(POD, pod_id)
        pod = self.registry.get_pod(pod_id)
        org = self.store.pod_org(pod_id)
        if pod is None or org is None or updated_at is None:
            return None
        spec = pod_spec(pod, self.options, self._digest)
        if spec is None:
            return None
        return Target(POD, pod_id, org, spec, updated_at, self.store.get(POD, pod_id))

    def target(self, object_id: str) -> Target | None:
        """An execution or a pod by id (an execution first)."""
        return self.execution_target(object_id) or self.pod_target(object_id)

    def pending(self, limit: int | None = None) -> list[Target]:
        """Finished objects without a fresh archive (and those whose registry row changed: `fresh`
        tells which of them only need their row's timestamp recorded), newest first."""
        now = self.clock()
        ready = ms_to_datetime(datetime_to_ms(now) - LOOKBACK_MS - self.options.grace_ms)
        skip = self._recent_failures()
        out: list[Target] = []
        for kind, found, make in (
            (
                EXECUTION,
                self.store.pending_executions(ready, self._digest, limit, skip),
                self.execution_target,
            ),
            (POD, self.store.pending_pods(ready, self._digest, limit, skip), self.pod_target),
        ):
            for p in found:
                target = make(p.object_id, p.updated_at)
                if target is not None and target.spec.ready_ms <= datetime_to_ms(now):
                    out.append(target)
                elif target is None:
                    log.debug("%s %s vanished or is not archivable", kind, p.object_id)
        return out

    def _recent_failures(self) -> list[str]:
        """Objects that failed in the last hour: left out, so one bad object cannot hold up the rest."""
        horizon = time.monotonic() - 3600
        self._failed = {k: t for k, t in self._failed.items() if t > horizon}
        return list(self._failed)

    async def archive(self, target: Target, report: PassReport) -> ArchiveInfo | None:
        """Build the target's archive unless it is fresh (then record its row's timestamp); failures
        are counted in the report, logged, and skipped for an hour by the loop."""
        current = target.current
        if current is not None and target.fresh:
            mark = partial(self.store.mark, current.id, source_updated_at=target.updated_at)
            await anyio.to_thread.run_sync(mark)
            report.unchanged += 1
            return current
        try:
            built = await self.build(target)
        except (BackendError, ValueError) as exc:
            message = exc.message if isinstance(exc, BackendError) else str(exc)
            log.warning("archiving %s %s failed: %s", target.kind, target.object_id, message)
            self._failed[target.object_id] = time.monotonic()
            report.failed.append((target.object_id, message))
            return None
        info = built.info
        if target.kind == EXECUTION:
            report.executions += 1
        else:
            report.pods += 1
        report.samples += info.sample_count
        report.bytes += info.byte_count
        log.info(
            "archived %s %s: %d series, %d samples, %d bytes (%.2f bytes/sample) in %.2f s",
            target.kind,
            target.object_id,
            info.series_count,
            info.sample_count,
            info.byte_count,
            info.byte_count / max(info.sample_count, 1),
            built.seconds,
        )
        return info

    async def recheck(self, report: PassReport, limit: int | None = None) -> None:
        """Re-count the samples of young archives in the backend; rebuild those that grew."""
        now = self.clock()
        now_ms = datetime_to_ms(now)
        due = await anyio.to_thread.run_sync(
            self.store.due_for_check,
            ms_to_datetime(now_ms - self.options.recheck_ms),
            ms_to_datetime(now_ms - self.options.recheck_every_ms),
            limit,
        )
        for info in due:
            try:
                live = await self.live_count(info)
            except (BackendError, ValueError) as exc:
                log.warning("checking the archive of %s %s failed: %s", info.kind, info.object_id, exc)
                continue
            if live > info.raw_count:
                make = self.execution_target if info.kind == EXECUTION else self.pod_target
                target = await anyio.to_thread.run_sync(make, info.object_id, info.source_updated_at)
                if target is not None:
                    log.info(
                        "%s %s: %d samples now, %d archived: rebuilding",
                        info.kind,
                        info.object_id,
                        live,
                        info.raw_count,
                    )
                    if await self.archive(replace(target, current=None), report) is not None:
                        report.late += 1
                    continue
            await anyio.to_thread.run_sync(partial(self.store.mark, info.id, checked_at=now))

    async def run_pass(
        self,
        limit: int | None = None,
        on_target: Callable[[Target], Awaitable[None] | None] | None = None,
    ) -> PassReport:
        """Archive what finished (at most `limit` of each kind), then re-check young archives."""
        report = PassReport()
        targets = await anyio.to_thread.run_sync(self.pending, limit)
        for target in targets:
            await self.archive(target, report)
            if on_target is not None:
                done = on_target(target)
                if done is not None:
                    await done
        await self.recheck(report, limit)
        return report


async def archive_task(
    archiver: Archiver, *, interval_s: float, on_pass: Callable[[PassReport | None], None] | None = None
) -> None:
    """An archive pass every `interval_s` (the first one after `interval_s`) until cancelled; serve's
    lifespan runs it when configured. Failures are logged and retried at the next tick. `on_pass` sees
    each pass's report (None: the pass failed as a whole)."""
    while True:
        await anyio.sleep(interval_s)
        try:
            report = await archiver.run_pass(archiver.options.batch)
        except Exception:
            log.exception("archive pass failed")
            if on_pass is not None:
                on_pass(None)
            continue
        if on_pass is not None:
            on_pass(report)
        if report.executions or report.pods or report.late:
            log.info(
                "archive pass: %d executions, %d pods (%d for late samples), %d samples, %d bytes",
                report.executions,
                report.pods,
                report.late,
                report.samples,
                report.bytes,
            )


# -- serving archives ------------------------------------------------------------------------------------


class ByteLru:
    """An LRU of values with a size each, bounded by their total size (event-loop use only)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[Hashable, tuple[object, int]] = OrderedDict()

    def get(self, key: Hashable) -> object | None:
        hit = self._items.get(key)
        if hit is None:
            return None
        self._items.move_to_end(key)
        return hit[0]

    def put(self, key: Hashable, value: object, size: int) -> None:
        if size > self.max_bytes:
            return
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self._items[key] = (value, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, dropped) = self._items.popitem(last=False)
            self.bytes -= dropped

    def __len__(self) -> int:
        return len(self._items)


class ArchiveService:
    """`ArchiveLookup`: backends over fresh archives, decoded once and kept while they fit."""

    def __init__(self, store: ArchiveStore, options: ArchiveOptions, *, cache_bytes: int = 256 << 20) -> None:
        self.store = store
        self.options = options
        self._digest = options.digest
        self._sources = ByteLru(cache_bytes)
        self._loading: dict[tuple[str, ...], anyio.Lock] = {}

    async def fresh(self, kind: str, specs: Sequence[Spec | None]) -> tuple[str, ...] | None:
        """The archive ids (generations) of the objects, when every one has a fresh archive."""
        if not specs or any(s is None for s in specs):
            return None
        ids = [s.object_id for s in specs if s is not None]
        found = await anyio.to_thread.run_sync(self.store.get_many, kind, ids)
        out = []
        for spec in specs:
            assert spec is not None
            info = found.get(spec.object_id)
            if info is None or info.spec_digest != spec.digest:
                return None
            out.append(info.id)
        return tuple(out)

    async def execution_generation(self, execution: Execution) -> tuple[str, ...] | None:
        return await self.fresh(EXECUTION, [execution_spec(execution, self.options, self._digest)])

    async def pods_generation(self, pods: Sequence[Pod]) -> tuple[str, ...] | None:
        return await self.fresh(POD, [pod_spec(p, self.options, self._digest) for p in pods])

    async def for_execution(self, execution: Execution) -> MetricsBackend | None:
        ids = await self.execution_generation(execution)
        return None if ids is None else await self.backend(ids)

    async def for_pods(self, pods: Sequence[Pod]) -> MetricsBackend | None:
        ids = await self.pods_generation(pods)
        return None if ids is None else await self.backend(ids)

    async def backend(self, ids: tuple[str, ...]) -> MetricsBackend:
        """An embedded backend over the union of the archives `ids` (decoded once, then cached)."""
        key = tuple(sorted(set(ids)))
        hit = self._sources.get(key)
        if isinstance(hit, EmbeddedBackend):
            return hit
        lock = self._loading.setdefault(key, anyio.Lock())
        async with lock:
            hit = self._sources.get(key)
            if isinstance(hit, EmbeddedBackend):
                return hit

            def load() -> ArchiveSource:
                return ArchiveSource.union([self.store.load(i) for i in key])

            source = await anyio.to_thread.run_sync(load)
            name = "gpulens archive " + hashlib.sha256("/".join(key).encode()).hexdigest()[:12]
            # one worker thread: threads of one in-memory source only contend for the GIL
            backend = EmbeddedBackend(source, name=name, concurrency=1)
            self._sources.put(key, backend, source.nbytes)
        self._loading.pop(key, None)
        return backend

    def totals(self) -> ArchiveTotals:
        return self.store.totals()


@dataclass(frozen=True, slots=True)
class CachedAnswer:
    status: int
    media_type: str
    body: bytes


class AnswerCache:
    """Whole response bodies for reads of archived objects, keyed by route, object, archive generation
    and normalised parameters; bounded by their total size."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self._lru = ByteLru(max_bytes)
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> CachedAnswer | None:
        hit = self._lru.get(key)
        if isinstance(hit, CachedAnswer):
            self.hits += 1
            return hit
        self.misses += 1
        return None

    def put(self, key: Hashable, answer: CachedAnswer) -> None:
        self._lru.put(key, answer, len(answer.body) + 256)

    def __len__(self) -> int:
        return len(self._lru)
