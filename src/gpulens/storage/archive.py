"""Archives of finished executions and pods in the registry database, and a sample source over one.

An archive is one `archives` row (what it was made from, its size) and one `archive_series` row per
series: its labels as canonical JSON (`__name__` included) and its samples as the sample store's
compressed chunks (gpulens.storage.chunks), one chunk per UTC day, each framed by its length. Living
in the registry database, archives are shared by every replica on one PostgreSQL registry and covered
by its backups.

Writing one archive is one transaction: the object's old archive (rows and series) is deleted and the
new one inserted, so a reader sees the old or the new archive, never a mix. Every archive gets a new
`id`, which therefore also serves as its generation (caches key on it).

`ArchiveSource` holds decoded archives in memory and answers the embedded evaluator's reads
(`select`, `select_arrays`, `series_names`), so an `EmbeddedBackend` over it answers like the live
backend did. Several archives make one source (a workload's pods); equal label sets are merged.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime

import numpy as np
import numpy.typing as npt
from sqlalchemy import and_, delete, func, insert, or_, select, update
from sqlalchemy.orm import InstrumentedAttribute, Session
from sqlalchemy.sql import ColumnElement

from gpulens.domain import catalog as c
from gpulens.domain.models import ExecutionStatus
from gpulens.domain.workloads import PodPhase
from gpulens.storage import chunks
from gpulens.storage.registry import RegistryTables
from gpulens.storage.samples import canonical_labels, matches
from gpulens.storage.tables import ArchiveRow, ArchiveSeriesRow, ExecutionRow, PodRow, WorkloadRow

Times = npt.NDArray[np.int64]
Values = npt.NDArray[np.float64]
Labels = dict[str, str]

EXECUTION = "execution"
POD = "pod"
DAY_MS = 86_400_000  # one chunk per series per UTC day
MATCHED_MAX = 1_024  # selectors whose matching series an ArchiveSource remembers
_FRAME = struct.Struct("<I")
_NO_TIMES: Times = np.empty(0, dtype=np.int64)
_NO_VALUES: Values = np.empty(0, dtype=np.float64)
ACTIVE_STATUSES = tuple(s.value for s in ExecutionStatus if s.is_active)
ACTIVE_PHASES = (PodPhase.PENDING.value, PodPhase.RUNNING.value)


# -- the series codec ------------------------------------------------------------------------------


def encode_series(times: Times, values: Values, block_ms: int = DAY_MS) -> bytes:
    """One series' samples (strictly increasing times) as length-framed chunks, one per aligned block."""
    if not len(times):
        return b""
    blocks = times // block_ms
    edges = np.flatnonzero(np.diff(blocks)) + 1
    out = []
    for lo, hi in zip([0, *edges.tolist()], [*edges.tolist(), len(times)], strict=True):
        blob = chunks.encode(times[lo:hi], values[lo:hi])
        out.append(_FRAME.pack(len(blob)))
        out.append(blob)
    return b"".join(out)


def decode_series(data: bytes) -> tuple[Times, Values]:
    """`encode_series` undone: (timestamps in ms, values)."""
    times: list[Times] = []
    values: list[Values] = []
    at = 0
    while at < len(data):
        try:
            (size,) = _FRAME.unpack_from(data, at)
        except struct.error as exc:
            raise chunks.CorruptChunk(f"archive series frame at byte {at}: {exc}") from exc
        at += _FRAME.size
        if at + size > len(data):
            raise chunks.CorruptChunk(f"archive series frame at byte {at} runs past the end")
        t, v = chunks.decode(data[at : at + size])
        times.append(t)
        values.append(v)
        at += size
    if not times:
        return _NO_TIMES, _NO_VALUES
    if len(times) == 1:
        return times[0], values[0]
    return np.concatenate(times), np.concatenate(values)


def merge_samples(parts: Sequence[tuple[Times, Values]]) -> tuple[Times, Values]:
    """Samples of one series from several reads as one time-ordered run, each timestamp once."""
    if len(parts) == 1:
        return parts[0]
    t = np.concatenate([p[0] for p in parts])
    v = np.concatenate([p[1] for p in parts])
    order = np.argsort(t, kind="stable")
    t, v = t[order], v[order]
    keep = np.ones(len(t), dtype=bool)
    keep[1:] = t[1:] != t[:-1]
    return t[keep], v[keep]


# -- reading: an in-memory sample source -------------------------------------------------------------


class ArchiveSource:
    """Decoded series (labels with `__name__`, times, values), read like a `SampleStore`."""

    in_memory = True  # reads do no I/O: the embedded backend may evaluate small ones without a thread

    def __init__(self, series: Iterable[tuple[Labels, Times, Values]]) -> None:
        parts: dict[str, tuple[Labels, list[tuple[Times, Values]]]] = {}
        for labels, t, v in series:
            if len(t):
                parts.setdefault(canonical_labels(labels), (labels, []))[1].append((t, v))
        self._series: list[tuple[Labels, Times, Values]] = []
        self._by_name: dict[str, list[int]] = {}
        # one array per distinct run of timestamps: the series of one scrape target share theirs, so
        # they take memory once and the evaluator places each grid on them once (it memoises by array)
        shared: dict[bytes, Times] = {}
        for labels, runs in parts.values():
            t, v = merge_samples(runs)
            t = shared.setdefault(t.tobytes(), t)
            self._by_name.setdefault(labels.get(c.LABEL_METRIC_NAME, ""), []).append(len(self._series))
            self._series.append((labels, t, v))
        self.nbytes = sum(t.nbytes for t in shared.values()) + sum(
            v.nbytes + 64 * (len(lb) + 1) for lb, _, v in self._series
        )
        self.sample_count = sum(len(t) for _, t, _ in self._series)
        self._matched: dict[tuple[str, tuple[tuple[str, str, str], ...]], list[int]] = {}

    @classmethod
    def union(cls, sources: Sequence[ArchiveSource]) -> ArchiveSource:
        if len(sources) == 1:
            return sources[0]
        return cls(item for source in sources for item in source._series)

    def __len__(self) -> int:
        return len(self._series)

    def items(self) -> list[tuple[Labels, Times, Values]]:
        """Every series: (labels with `__name__`, times, values); not copies, do not change them."""
        return list(self._series)

    def series_names(self) -> list[str]:
        return sorted(self._by_name)

    def _matching(self, metric: str, matchers: Sequence[tuple[str, str, str]]) -> list[int]:
        """Indices of the series of `metric` ("" = any) that satisfy every matcher, remembered per
        selector (a read asks the same few again at every query, window and step)."""
        key = (metric, tuple(matchers))
        hit = self._matched.get(key)
        if hit is None:
            candidates = self._by_name.get(metric, ()) if metric else range(len(self._series))
            hit = [
                i
                for i in candidates
                if all(matches(self._series[i][0].get(name, ""), op, value) for name, op, value in matchers)
            ]
            if len(self._matched) >= MATCHED_MAX:
                self._matched.clear()
            self._matched[key] = hit
        return hit

    def select_arrays(
        self, metric: str, matchers: Sequence[tuple[str, str, str]], start_ms: int, end_ms: int
    ) -> list[tuple[Labels, Times, Values]]:
        """The series of `metric` ("" = any) matching every matcher, with their samples in
        [start_ms, end_ms] (series without any are left out); labels include `__name__`."""
        out = []
        for i in self._matching(metric, matchers):
            labels, t, v = self._series[i]
            lo = int(np.searchsorted(t, start_ms, side="left"))
            hi = int(np.searchsorted(t, end_ms, side="right"))
            if hi > lo:
                out.append((dict(labels), t[lo:hi], v[lo:hi]))
        return out

    def select_labels(
        self, metric: str, matchers: Sequence[tuple[str, str, str]], start_ms: int, end_ms: int
    ) -> list[Labels]:
        """The labels of the series `select_arrays` would return (a series look-up: no samples copied)."""
        out = []
        for i in self._matching(metric, matchers):
            labels, t, _ = self._series[i]
            lo = int(np.searchsorted(t, start_ms, side="left"))
            if lo < len(t) and t[lo] <= end_ms:
                out.append(dict(labels))
        return out

    def select(
        self, metric: str, matchers: Sequence[tuple[str, str, str]], start_ms: int, end_ms: int
    ) -> list[tuple[Labels, list[tuple[int, float]]]]:
        return [
            (labels, list(zip(t.tolist(), v.tolist(), strict=True)))
            for labels, t, v in self.select_arrays(metric, matchers, start_ms, end_ms)
        ]


# -- the rows ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ArchiveInfo:
    """An `archives` row."""

    id: str
    kind: str
    object_id: str
    org: str
    spec_digest: str
    options_digest: str
    hostname: str | None
    namespace: str | None
    name: str | None
    gpus: tuple[str, ...]
    start_time: datetime
    end_time: datetime
    from_ms: int
    to_ms: int
    source_updated_at: datetime
    series_count: int
    sample_count: int
    raw_count: int
    byte_count: int
    created_at: datetime
    checked_at: datetime


_INFO_FIELDS = tuple(f.name for f in fields(ArchiveInfo))


def _info(row: ArchiveRow) -> ArchiveInfo:
    values = {name: getattr(row, name) for name in _INFO_FIELDS}
    values["gpus"] = tuple(row.gpus or ())
    return ArchiveInfo(**values)


@dataclass(frozen=True, slots=True)
class EncodedSeries:
    labels: str  # canonical JSON, `__name__` included
    sample_count: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Pending:
    """A finished object whose archive is missing, or may be stale (its registration or the settings
    changed since): `archive` is the current one, if any."""

    object_id: str
    updated_at: datetime  # the registry row's
    archive: ArchiveInfo | None


@dataclass(frozen=True, slots=True)
class ArchiveTotals:
    executions: int
    pods: int
    series: int
    samples: int
    bytes: int


class ArchiveStore(RegistryTables):
    """The archive tables of a registry (it shares the registry's engine and transaction rules)."""

    # -- writing --------------------------------------------------------------------------------------
    def replace(self, info: ArchiveInfo, series: Sequence[EncodedSeries]) -> None:
        """Make `info` (with its series) the object's archive, in one transaction."""

        def write(session: Session) -> None:
            old = session.scalars(
                select(ArchiveRow.id).where(
                    ArchiveRow.kind == info.kind, ArchiveRow.object_id == info.object_id
                )
            ).all()
            if old:
                session.execute(delete(ArchiveSeriesRow).where(ArchiveSeriesRow.archive_id.in_(old)))
                session.execute(delete(ArchiveRow).where(ArchiveRow.id.in_(old)))
                session.flush()
            row = ArchiveRow(**{name: getattr(info, name) for name in _INFO_FIELDS})
            row.gpus = list(info.gpus)
            session.add(row)
            session.flush()
            if series:
                session.execute(
                    insert(ArchiveSeriesRow),
                    [
                        {
                            "archive_id": info.id,
                            "seq": i,
                            "labels": s.labels,
                            "sample_count": s.sample_count,
                            "data": s.data,
                        }
                        for i, s in enumerate(series)
                    ],
                )

        self.registry.write_retrying(
            write, f"the archive of {info.kind} {info.object_id} is being written concurrently; retry"
        )

    def mark(
        self,
        archive_id: str,
        *,
        source_updated_at: datetime | None = None,
        checked_at: datetime | None = None,
    ) -> None:
        """Record that the archive still matches its object's registry row, or was checked for late data."""
        values: dict[str, datetime] = {}
        if source_updated_at is not None:
            values["source_updated_at"] = source_updated_at
        if checked_at is not None:
            values["checked_at"] = checked_at
        if values:
            with self._write() as session:
                session.execute(update(ArchiveRow).where(ArchiveRow.id == archive_id).values(**values))

    def delete(self, kind: str, object_id: str) -> bool:
        with self._write() as session:
            ids = session.scalars(
                select(ArchiveRow.id).where(ArchiveRow.kind == kind, ArchiveRow.object_id == object_id)
            ).all()
            session.execute(delete(ArchiveSeriesRow).where(ArchiveSeriesRow.archive_id.in_(ids)))
            session.execute(delete(ArchiveRow).where(ArchiveRow.id.in_(ids)))
            return bool(ids)

    # -- reading --------------------------------------------------------------------------------------
    def get(self, kind: str, object_id: str) -> ArchiveInfo | None:
        return self.get_many(kind, [object_id]).get(object_id)

    def get_many(self, kind: str, object_ids: Collection[str]) -> dict[str, ArchiveInfo]:
        if not object_ids:
            return {}
        with self._read() as session:
            rows = session.scalars(
                select(ArchiveRow).where(ArchiveRow.kind == kind, ArchiveRow.object_id.in_(list(object_ids)))
            )
            return {row.object_id: _info(row) for row in rows}

    def series(self, archive_id: str) -> list[EncodedSeries]:
        """The archive's series as stored (empty when it was replaced meanwhile)."""
        with self._read() as session:
            rows = session.execute(
                select(ArchiveSeriesRow.labels, ArchiveSeriesRow.sample_count, ArchiveSeriesRow.data)
                .where(ArchiveSeriesRow.archive_id == archive_id)
                .order_by(ArchiveSeriesRow.seq)
            )
            return [EncodedSeries(labels, int(n), bytes(data)) for labels, n, data in rows]

    def load(self, archive_id: str) -> ArchiveSource:
        """The archive decoded into memory."""
        return ArchiveSource((json.loads(s.labels), *decode_series(s.data)) for s in self.series(archive_id))

    def pending_executions(
        self,
        ready_before: datetime,
        options_digest: str,
        limit: int | None = None,
        exclude: Collection[str] = (),
    ) -> list[Pending]:
        """Finished executions (not active; start, end and host known; ended before `ready_before`)
        without an archive, or whose row or the settings changed since it was made; newest first."""
        finished = (ExecutionRow.status.not_in(ACTIVE_STATUSES), ExecutionRow.hostname.is_not(None))
        return self._pending(
            EXECUTION,
            ExecutionRow,
            ExecutionRow.execution_id,
            finished,
            ready_before,
            options_digest,
            limit,
            exclude,
        )

    def pending_pods(
        self,
        ready_before: datetime,
        options_digest: str,
        limit: int | None = None,
        exclude: Collection[str] = (),
    ) -> list[Pending]:
        """Finished pods (not Pending/Running; start and end known; ended before `ready_before`), as
        `pending_executions`."""
        finished = (PodRow.phase.not_in(ACTIVE_PHASES),)
        return self._pending(
            POD, PodRow, PodRow.pod_id, finished, ready_before, options_digest, limit, exclude
        )

    def _pending(
        self,
        kind: str,
        table: type[ExecutionRow] | type[PodRow],
        object_id: InstrumentedAttribute[str],
        finished: Sequence[ColumnElement[bool]],
        ready_before: datetime,
        options_digest: str,
        limit: int | None,
        exclude: Collection[str],
    ) -> list[Pending]:
        """The objects of `table` (keyed by `object_id`) that are `finished`, have a start and an end
        at or before `ready_before`, and have no archive or an outdated one; newest first."""
        stmt = (
            select(object_id, table.updated_at, ArchiveRow)
            .outerjoin(ArchiveRow, and_(ArchiveRow.kind == kind, ArchiveRow.object_id == object_id))
            .where(
                *finished,
                table.start_time.is_not(None),
                table.end_time.is_not(None),
                table.end_time <= ready_before,
                or_(
                    ArchiveRow.id.is_(None),
                    ArchiveRow.source_updated_at < table.updated_at,
                    ArchiveRow.options_digest != options_digest,
                ),
            )
            .order_by(table.end_time.desc(), object_id)
        )
        if exclude:
            stmt = stmt.where(object_id.not_in(list(exclude)))
        with self._read() as session:
            return [
                Pending(oid, updated_at, None if row is None else _info(row))
                for oid, updated_at, row in session.execute(stmt.limit(limit))
            ]

    def updated_at(self, kind: str, object_id: str) -> datetime | None:
        """The `updated_at` of the execution's or pod's registry row (None: no such row)."""
        table: type[ExecutionRow] | type[PodRow] = ExecutionRow if kind == EXECUTION else PodRow
        key = ExecutionRow.execution_id if kind == EXECUTION else PodRow.pod_id
        with self._read() as session:
            return session.scalar(select(table.updated_at).where(key == object_id))

    def pod_org(self, pod_id: str) -> str | None:
        """The org of a pod (its workload's)."""
        with self._read() as session:
            return session.scalar(
                select(WorkloadRow.org)
                .join(PodRow, PodRow.workload_id == WorkloadRow.workload_id)
                .where(PodRow.pod_id == pod_id)
            )

    def due_for_check(
        self, created_after: datetime, checked_before: datetime, limit: int | None = None
    ) -> list[ArchiveInfo]:
        """Archives made after `created_after` and not checked for late samples since `checked_before`."""
        stmt = (
            select(ArchiveRow)
            .where(ArchiveRow.created_at > created_after, ArchiveRow.checked_at < checked_before)
            .order_by(ArchiveRow.checked_at)
            .limit(limit)
        )
        with self._read() as session:
            return [_info(row) for row in session.scalars(stmt)]

    def totals(self) -> ArchiveTotals:
        stmt = select(
            ArchiveRow.kind,
            func.count(),
            func.coalesce(func.sum(ArchiveRow.series_count), 0),
            func.coalesce(func.sum(ArchiveRow.sample_count), 0),
            func.coalesce(func.sum(ArchiveRow.byte_count), 0),
        ).group_by(ArchiveRow.kind)
        counts = {EXECUTION: 0, POD: 0}
        series = samples = size = 0
        with self._read() as session:
            for kind, n, s, k, b in session.execute(stmt):
                counts[kind] = int(n)
                series += int(s)
                samples += int(k)
                size += int(b)
        return ArchiveTotals(counts[EXECUTION], counts[POD], series, samples, size)
