"""`SampleStore`: the public face of the embedded time-series store (see the package's docstring)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

from gpulens.storage.samples import reads, retention, schema, sealing
from gpulens.storage.samples.connections import BUSY_TIMEOUT_S, Readers, Writer
from gpulens.storage.samples.index import LabelPairs, Matcher, SeriesIndex, canonical_labels
from gpulens.storage.samples.reads import Rollup, Times, Values
from gpulens.storage.samples.retention import CompactReport
from gpulens.storage.samples.schema import SEAL_MS

SeriesArrays = tuple[dict[str, str], Times, Values]  # (labels with `__name__`, times, values)
Selected = list[tuple[dict[str, str], list[tuple[int, float]]]]


class SampleLike(Protocol):
    """What `write` takes: `gpulens.agent.samples.Sample` (the store does not import the agent)."""

    @property
    def name(self) -> str: ...
    @property
    def labels(self) -> LabelPairs | Mapping[str, str]: ...
    @property
    def value(self) -> float: ...
    @property
    def timestamp_ms(self) -> int: ...


@dataclass(frozen=True, slots=True)
class StoreStats:
    head_samples: int  # rows in `head`, not sealed yet
    sealed_samples: int  # samples in `chunks`
    chunks: int


class SampleStore:
    """Append samples, select them back by metric name, label matchers and time range.

    Safe to share between threads: reads run on reader connections of their own and never wait for a
    write; writes take turns on the writer connection. SQLite's failures (locked past
    `busy_timeout_s`, I/O) raise `StoreUnavailable`."""

    in_memory = False  # reads go to the file: the embedded backend runs them in worker threads

    def __init__(self, path: str | Path, *, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        name = f"embedded store {path}"
        self._writer = Writer(path, name, busy_timeout_s)
        self._readers = Readers(path, name, busy_timeout_s)
        self._conn = self._writer.conn  # for maintenance outside any transaction (a checkpoint, VACUUM)
        self._index = SeriesIndex()
        # the collector repeats the same label tuples every pass: skip canonicalising them again
        self._fast: dict[tuple[str, object], int] = {}
        self._sealed_to = 0  # the newest SEAL_MS boundary this process sealed up to
        try:
            self._writer.transaction(schema.create)
            self._readers.snapshot(self._index.refresh)
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_path(cls, path: str | Path, *, busy_timeout_s: float = BUSY_TIMEOUT_S) -> SampleStore:
        return cls(path, busy_timeout_s=busy_timeout_s)

    # -- writing ----------------------------------------------------------------------------------
    def write(self, samples: Iterable[SampleLike]) -> int:
        """Store a batch in one transaction (a later sample at the same instant replaces the earlier);
        when it crosses a SEAL_MS boundary, or writes before the last one (a backfill, late data),
        seal the head before that boundary."""
        batch = samples if isinstance(samples, Sequence) else list(samples)
        created: list[tuple[int, str, str]] = []  # series rows this batch made: indexed once committed
        fast_new: dict[tuple[str, object], int] = {}

        def work(conn: sqlite3.Connection) -> list[tuple[int, int, float]]:
            created.clear()
            fast_new.clear()
            staged: dict[tuple[str, str], int] = {}
            fast, index = self._fast, self._index
            rows: list[tuple[int, int, float]] = []
            for s in batch:
                labels = s.labels
                tupled = isinstance(labels, tuple)
                sid = fast.get((s.name, labels)) if tupled else None
                if sid is None:
                    key = (s.name, canonical_labels(labels))
                    sid = index.id_of(key)
                    if sid is None:
                        sid = staged.get(key)
                    if sid is None:  # new here; another process may have created it already
                        conn.execute("INSERT OR IGNORE INTO series (name, labels) VALUES (?, ?)", key)
                        (sid,) = conn.execute(
                            "SELECT id FROM series WHERE name = ? AND labels = ?", key
                        ).fetchone()
                        staged[key] = sid
                        created.append((sid, *key))
                    if tupled:
                        fast_new[(s.name, labels)] = sid
                rows.append((int(s.timestamp_ms), sid, float(s.value)))
            conn.executemany("INSERT OR REPLACE INTO head (t_ms, series_id, value) VALUES (?, ?, ?)", rows)
            return rows

        rows = self._writer.transaction(work)
        if created:
            self._index.add(created)
        self._fast.update(fast_new)
        if not rows:
            return 0
        times = [t for t, _, _ in rows]
        boundary = max(max(times) // SEAL_MS * SEAL_MS, self._sealed_to)
        if boundary > self._sealed_to or min(times) < self._sealed_to:  # a new span, or a backfill
            self.seal(boundary)
        return len(rows)

    # -- sealing: head rows -> compressed hourly chunks --------------------------------------------
    def seal(self, before_ms: int) -> int:
        """Seal the head rows before the SEAL_MS boundary at or below `before_ms`: one transaction per
        hour (all series at once), from the oldest head row. Returns the number of samples sealed."""
        cut = before_ms // SEAL_MS * SEAL_MS
        sealed = 0
        lo = -(2**63)
        while True:
            done = self._writer.transaction(partial(sealing.seal_next_hour, lo=lo, cut=cut))
            if done is None:
                break
            n, lo = done
            sealed += n
        self._sealed_to = max(self._sealed_to, cut)
        return sealed

    def flush(self) -> int:
        """Seal everything but the head's newest SEAL_MS span (what a quiet writer leaves behind)."""
        (newest,) = self._readers.snapshot(lambda conn: conn.execute("SELECT max(t_ms) FROM head").fetchone())
        return 0 if newest is None else self.seal(int(newest))

    # -- reading ----------------------------------------------------------------------------------
    def series_names(self) -> list[str]:
        self._readers.snapshot(self._index.refresh)
        return self._index.names()

    def select(self, metric: str, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> Selected:
        """Series of `metric` ("" = any name; `__name__` matchers apply) matching every matcher, with
        their samples in [start_ms, end_ms]; labels include `__name__`. Series without samples in the
        range are left out."""
        return [
            (labels, list(zip(t.tolist(), v.tolist(), strict=True)))
            for labels, t, v in self.select_arrays(metric, matchers, start_ms, end_ms)
        ]

    def select_arrays(
        self, metric: str, matchers: Sequence[Matcher], start_ms: int, end_ms: int
    ) -> list[SeriesArrays]:
        """`select` with each series' samples as (timestamps, values) arrays (the embedded backend
        computes on arrays: no Python tuple per sample). One read snapshot: a seal in another process
        cannot move rows mid-read."""

        def read(conn: sqlite3.Connection) -> list[SeriesArrays]:
            self._index.refresh(conn)
            return reads.series_arrays(conn, self._index.matching(metric, matchers), start_ms, end_ms)

        return self._readers.snapshot(read)

    def select_labels(
        self, metric: str, matchers: Sequence[Matcher], start_ms: int, end_ms: int
    ) -> list[dict[str, str]]:
        """The labels of the series `select_arrays` returns (those with samples in the range), from
        the index and the range's edge chunks: a series look-up reads no other samples."""

        def read(conn: sqlite3.Connection) -> list[dict[str, str]]:
            self._index.refresh(conn)
            return reads.series_with_samples(conn, self._index.matching(metric, matchers), start_ms, end_ms)

        return self._readers.snapshot(read)

    def select_rollups(
        self, metric: str, matchers: Sequence[Matcher], start_ms: int, end_ms: int
    ) -> list[tuple[dict[str, str], list[Rollup]]]:
        """Like `select`, from `rollups`: (bucket start, n, min, avg, max) per bucket in the range."""

        def read(conn: sqlite3.Connection) -> list[tuple[dict[str, str], list[Rollup]]]:
            self._index.refresh(conn)
            out = []
            for sid, full in self._index.matching(metric, matchers):
                rows = reads.rollups(conn, sid, start_ms, end_ms)
                if rows:
                    out.append((full, rows))
            return out

        return self._readers.snapshot(read)

    def stats(self) -> StoreStats:
        """How many samples sit in the head and in chunks, and in how many chunks."""

        def read(conn: sqlite3.Connection) -> StoreStats:
            (head,) = conn.execute("SELECT count(*) FROM head").fetchone()
            n_chunks, n_sealed = conn.execute("SELECT count(*), coalesce(sum(n), 0) FROM chunks").fetchone()
            return StoreStats(int(head), int(n_sealed), int(n_chunks))

        return self._readers.snapshot(read)

    # -- retention --------------------------------------------------------------------------------
    def compact(
        self,
        now_ms: int,
        full_ms: int,
        downsampled_ms: int,
        *,
        should_stop: Callable[[], bool] | None = None,
    ) -> CompactReport:
        """Roll samples older than now-full into 1-minute buckets; delete what is older than
        now-downsampled (see `retention.py`). Idempotent; bounded transactions; `should_stop` is
        checked between them."""
        self._readers.snapshot(self._index.refresh)
        return retention.compact(
            self._writer,
            self._readers,
            self._index.name_by_id(),
            now_ms,
            full_ms,
            downsampled_ms,
            should_stop or (lambda: False),
        )

    def close(self) -> None:
        self._readers.close()
        self._writer.close()
