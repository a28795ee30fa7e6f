"""The embedded time-series store: the collector's samples in one SQLite file, read back by selector.

Why SQLite: it is in the standard library (no server), and in WAL mode a crash or a SIGKILL in the
middle of `write` loses at most the transaction that was open: every batch is one transaction,
committed whole or not at all, and the file is never left unreadable. `synchronous=NORMAL` keeps a
commit to a WAL append (no fsync per batch); a power cut may lose the last batches but not corrupt the
file, which is the right trade for metrics sampled every few seconds. Several processes (`serve`,
`gpulens run`, `gpulens metrics`) share the file; every change is one short IMMEDIATE transaction.

Layout:
* `series` (id, metric name, labels as canonical JSON: keys sorted, compact), indexed by name; small,
  cached in memory, so label matching (Prometheus' =, !=, =~, !~; regexes fully anchored, a missing
  label reads as "") is done in Python and only samples are read from disk.
* `head` holds the last minutes as written: (t_ms, series_id, value) rows in a WITHOUT ROWID table
  keyed time first, so that a collector pass appends to the last page or two of the b-tree. (Keyed
  series first, every pass dirtied one page per series: ~195 pages, 780 KiB of WAL a pass for 163
  series; now it is a few pages.)
* `chunks` holds sealed history: one row per series per aligned hour (`BLOCK_MS`), its samples
  compressed by `gpulens.storage.chunks` (delta-of-delta timestamps, XOR'd values: 1-4 bytes a sample
  instead of ~22 as head rows). When a write crosses a `SEAL_MS` (10 minute) boundary, the head rows
  before it are sealed: merged into their hour's chunk and deleted from the head, one transaction per
  hour of all series. So the head never holds much more than 10 minutes, and a read scans little of
  it. `seal` does the same on demand (what a stopped writer left behind).
* A read merges a series' chunks with its head rows; on the same timestamp the head wins (a later
  write replaces an earlier one, as in the head itself). So sealing never changes an answer.
* Files written before the head existed (a `samples` table keyed series first) are moved into the
  head when opened, then sealed as usual.

Retention (`compact`): samples older than the full-resolution horizon are rolled into 1-minute
buckets. Each bucket keeps ONE sample, under the original series, so every query of the embedded
backend keeps working on old data (an instant selector sees one sample a minute, well inside the
5-minute lookback): the average for gauges, the LAST value for counters (names ending `_total`,
`_bucket`, `_count`, `_sum`, or a counter of the catalog such as DCGM's energy), so that rate() and
increase() over old data stay right. The sample sits at the timestamp of the bucket's last raw sample.
The bucket's count/min/avg/max go to the side table `rollups` (series_id, t_ms = bucket start, rep_ms
= that sample's timestamp, n, min, avg, max). Samples and rollups older than the downsampled horizon
are deleted (series rows are kept: another process may hold their ids). Compaction works in bounded
transactions (one series x one block per transaction), re-reads each bucket inside its transaction and
merges with an existing rollup, so it is idempotent and safe alongside a writer or another compactor
in another process; `meta.compacted_until_ms` bounds the work of the next run. A sample written with a
timestamp older than that watermark after it moved (late data) stays at full resolution until it
expires.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from gpulens.domain import catalog as c
from gpulens.storage import chunks

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS series ("
    " id INTEGER PRIMARY KEY, name TEXT NOT NULL, labels TEXT NOT NULL, UNIQUE (name, labels))",
    "CREATE INDEX IF NOT EXISTS series_name ON series (name)",
    "CREATE TABLE IF NOT EXISTS head ("
    " t_ms INTEGER NOT NULL, series_id INTEGER NOT NULL, value REAL NOT NULL,"
    " PRIMARY KEY (t_ms, series_id)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS rollups ("
    " series_id INTEGER NOT NULL, t_ms INTEGER NOT NULL, rep_ms INTEGER NOT NULL, n INTEGER NOT NULL,"
    " min REAL NOT NULL, avg REAL NOT NULL, max REAL NOT NULL,"
    " PRIMARY KEY (series_id, t_ms)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    # a rowid table: a chunk of a 1 s series is kilobytes, too big for a WITHOUT ROWID b-tree row
    "CREATE TABLE IF NOT EXISTS chunks ("
    " series_id INTEGER NOT NULL, block_ms INTEGER NOT NULL, n INTEGER NOT NULL, data BLOB NOT NULL,"
    " PRIMARY KEY (series_id, block_ms))",
)

BUCKET_MS = 60_000
BLOCK_MS = 3_600_000  # one chunk per series per aligned hour
WINDOW_MS = BLOCK_MS  # one series x one block per compaction transaction
SEAL_MS = 600_000  # the head is sealed up to the last 10-minute boundary a write crossed
DELETE_BATCH = 5_000  # rows per deleting transaction
WATERMARK = "compacted_until_ms"
KNOWN_COUNTERS = frozenset({c.DCGM_TOTAL_ENERGY_CONSUMPTION})


def is_counter(name: str) -> bool:
    """Counters keep the last value of a minute when rolled up (rate() stays right); gauges the avg."""
    return name in KNOWN_COUNTERS or name.lower().endswith(c.COUNTER_SUFFIXES)


@dataclass(frozen=True, slots=True)
class CompactReport:
    buckets: int = 0  # 1-minute buckets written (new or merged)
    folded: int = 0  # raw samples folded into them
    deleted_samples: int = 0  # past the downsampled horizon
    deleted_rollups: int = 0
    complete: bool = True  # False: stopped early (the next run resumes)
    elapsed_s: float = 0.0


@dataclass(frozen=True, slots=True)
class StoreStats:
    head_samples: int  # rows in `head`, not sealed yet
    sealed_samples: int  # samples in `chunks`
    chunks: int


T = TypeVar("T")
Times = npt.NDArray[np.int64]
Values = npt.NDArray[np.float64]
_NO_TIMES: Times = np.empty(0, dtype=np.int64)
_NO_VALUES: Values = np.empty(0, dtype=np.float64)

LabelPairs = Sequence[tuple[str, str]]
Selected = list[tuple[dict[str, str], list[tuple[int, float]]]]


class SampleLike(Protocol):
    """Anything shaped like `gpulens.agent.samples.Sample` (the store does not import the agent)."""

    @property
    def name(self) -> str: ...
    @property
    def labels(self) -> LabelPairs | Mapping[str, str]: ...
    @property
    def value(self) -> float: ...
    @property
    def timestamp_ms(self) -> int: ...


@lru_cache(maxsize=1024)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.DOTALL)


def matches(value: str, op: str, pattern: str) -> bool:
    """One Prometheus label matcher against a label value ("" when the label is missing)."""
    if op == "=":
        return value == pattern
    if op == "!=":
        return value != pattern
    if op == "=~":
        return _regex(pattern).fullmatch(value) is not None
    if op == "!~":
        return _regex(pattern).fullmatch(value) is None
    raise ValueError(f"bad matcher op {op!r}")


def _merge(sealed: list[tuple[int, float]], head: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    """Two time-ordered sample lists as one; on the same timestamp `head` (the later write) wins."""
    if not head:
        return sealed
    if not sealed or head[0][0] > sealed[-1][0]:
        return sealed + list(head)
    merged = dict(sealed)
    merged.update(head)
    return sorted(merged.items())


def _merge_arrays(t: Times, v: Values, head: list[tuple[int, float]]) -> tuple[Times, Values]:
    """Sealed arrays and time-ordered head rows as one pair of arrays; the head wins a shared instant."""
    if not len(t) or head[0][0] > int(t[-1]):
        ht = np.fromiter((x for x, _ in head), dtype=np.int64, count=len(head))
        hv = np.fromiter((y for _, y in head), dtype=np.float64, count=len(head))
        return (ht, hv) if not len(t) else (np.concatenate((t, ht)), np.concatenate((v, hv)))
    merged = _merge(list(zip(t.tolist(), v.tolist(), strict=True)), head)
    return (
        np.fromiter((x for x, _ in merged), dtype=np.int64, count=len(merged)),
        np.fromiter((y for _, y in merged), dtype=np.float64, count=len(merged)),
    )


def canonical_labels(labels: LabelPairs | Mapping[str, str]) -> str:
    pairs = labels.items() if isinstance(labels, Mapping) else labels
    # Prometheus drops empty-valued labels: a label set with `a=""` is the set without `a`
    return json.dumps(dict(sorted((k, v) for k, v in pairs if v != "")), separators=(",", ":"))


class SampleStore:
    """Append samples, select them back by metric name, label matchers and time range."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()  # one connection shared by the worker threads of a backend
        for stmt in SCHEMA:
            conn.execute(stmt)
        conn.commit()
        self._migrate_series_major_head()
        self._ids: dict[tuple[str, str], int] = {}
        self._series: dict[int, tuple[str, dict[str, str]]] = {}
        self._by_name: dict[str, list[int]] = {}
        # the collector repeats the same label tuples every pass: skip canonicalising them again
        self._fast: dict[tuple[str, object], int] = {}
        self._sealed_to = 0  # the newest SEAL_MS boundary this process sealed up to
        for sid, name, labels in conn.execute("SELECT id, name, labels FROM series ORDER BY id"):
            self._remember(sid, name, labels)

    @classmethod
    def from_path(cls, path: str | Path) -> SampleStore:
        conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA busy_timeout=10000")  # another process (serve / run) may be writing
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return cls(conn)

    def _migrate_series_major_head(self) -> None:
        """Move the rows of the old `samples` table (keyed series first) into `head`, once."""
        conn = self._conn
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'samples'").fetchone():
            conn.execute("BEGIN IMMEDIATE")
            try:
                if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'samples'").fetchone():
                    conn.execute(
                        "INSERT OR REPLACE INTO head (t_ms, series_id, value)"
                        " SELECT t_ms, series_id, value FROM samples"
                    )
                    conn.execute("DROP TABLE samples")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def _remember(self, sid: int, name: str, labels: str) -> None:
        self._ids[(name, labels)] = sid
        self._series[sid] = (name, json.loads(labels))
        self._by_name.setdefault(name, []).append(sid)

    # -- writing ----------------------------------------------------------------------------------
    def write(self, samples: Iterable[SampleLike]) -> int:
        """Store a batch in one transaction (a later sample at the same instant replaces the earlier);
        when it crosses a SEAL_MS boundary, or writes before the last one (a backfill, late data),
        seal the head before that boundary."""
        rows: list[tuple[int, int, float]] = []
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                fast = self._fast
                for s in samples:
                    labels = s.labels
                    sid = fast.get((s.name, labels)) if isinstance(labels, tuple) else None
                    if sid is None:
                        key = (s.name, canonical_labels(labels))
                        sid = self._ids.get(key)
                        if sid is None:  # new here; another process may have created it already
                            conn.execute("INSERT OR IGNORE INTO series (name, labels) VALUES (?, ?)", key)
                            (sid,) = conn.execute(
                                "SELECT id FROM series WHERE name = ? AND labels = ?", key
                            ).fetchone()
                            self._remember(sid, *key)
                        if isinstance(labels, tuple):
                            fast[(s.name, labels)] = sid
                    t = int(s.timestamp_ms)
                    rows.append((t, sid, float(s.value)))
                conn.executemany(
                    "INSERT OR REPLACE INTO head (t_ms, series_id, value) VALUES (?, ?, ?)", rows
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                # series rows inserted in the failed transaction are gone: forget them too
                self._reload()
                raise
        if not rows:
            return 0
        times = [t for t, _, _ in rows]
        boundary = max(max(times) // SEAL_MS * SEAL_MS, self._sealed_to)
        if boundary > self._sealed_to or min(times) < self._sealed_to:  # a new span, or a backfill
            self.seal(boundary)
        return len(rows)

    def _reload(self) -> None:
        self._fast.clear()
        self._ids.clear()
        self._series.clear()
        self._by_name.clear()
        for sid, name, labels in self._conn.execute("SELECT id, name, labels FROM series ORDER BY id"):
            self._remember(sid, name, labels)

    # -- sealing: head rows -> compressed hourly chunks --------------------------------------------
    def seal(self, before_ms: int) -> int:
        """Seal the head rows before the SEAL_MS boundary at or below `before_ms`: one transaction per
        hour (all series at once), from the oldest head row. Returns the number of samples sealed."""
        cut = before_ms // SEAL_MS * SEAL_MS
        sealed = 0
        lo = -(2**63)
        while True:
            with self._lock:
                (first,) = self._conn.execute("SELECT min(t_ms) FROM head WHERE t_ms >= ?", (lo,)).fetchone()
            if first is None or first >= cut:
                break
            hour = first // BLOCK_MS * BLOCK_MS
            lo = min(hour + BLOCK_MS, cut)
            sealed += self._seal_span(first, lo)
        self._sealed_to = max(self._sealed_to, cut)
        return sealed

    def flush(self) -> int:
        """Seal everything but the head's newest SEAL_MS span (what a quiet writer leaves behind)."""
        with self._lock:
            (newest,) = self._conn.execute("SELECT max(t_ms) FROM head").fetchone()
        return 0 if newest is None else self.seal(int(newest))

    def _seal_span(self, lo: int, hi: int) -> int:
        """Move the head rows in [lo, hi) (within one hour) into their chunks: one transaction."""
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                by_series: dict[int, list[tuple[int, float]]] = {}
                rows = conn.execute(
                    "SELECT t_ms, series_id, value FROM head WHERE t_ms >= ? AND t_ms < ?", (lo, hi)
                ).fetchall()
                for t, sid, v in rows:
                    by_series.setdefault(sid, []).append((t, v))
                block = lo // BLOCK_MS * BLOCK_MS
                for sid, pts in by_series.items():
                    self._write_chunk(sid, block, _merge(self._chunk(sid, block), pts))
                conn.execute("DELETE FROM head WHERE t_ms >= ? AND t_ms < ?", (lo, hi))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return len(rows)

    # the helpers below run inside a transaction the caller holds (with self._lock)
    def _chunk(self, sid: int, block: int) -> list[tuple[int, float]]:
        row = self._conn.execute(
            "SELECT data FROM chunks WHERE series_id = ? AND block_ms = ?", (sid, block)
        ).fetchone()
        return [] if row is None else chunks.decode_pairs(row[0])

    def _block(self, sid: int, block: int) -> list[tuple[int, float]]:
        """Every sample of one series in one block: chunk and head merged."""
        head = self._conn.execute(
            "SELECT t_ms, value FROM head WHERE t_ms >= ? AND t_ms < ? AND series_id = ? ORDER BY t_ms",
            (block, block + BLOCK_MS, sid),
        ).fetchall()
        return _merge(self._chunk(sid, block), head)

    def _put_block(self, sid: int, block: int, pts: Sequence[tuple[int, float]]) -> None:
        """Make `pts` (time-ordered) the whole content of one block: its chunk, and no head rows."""
        self._conn.execute(
            "DELETE FROM head WHERE t_ms >= ? AND t_ms < ? AND series_id = ?", (block, block + BLOCK_MS, sid)
        )
        self._write_chunk(sid, block, pts)

    def _write_chunk(self, sid: int, block: int, pts: Sequence[tuple[int, float]]) -> None:
        conn = self._conn
        if pts:
            blob = chunks.encode([t for t, _ in pts], [v for _, v in pts])
            conn.execute(
                "INSERT OR REPLACE INTO chunks (series_id, block_ms, n, data) VALUES (?, ?, ?, ?)",
                (sid, block, len(pts), blob),
            )
        else:
            conn.execute("DELETE FROM chunks WHERE series_id = ? AND block_ms = ?", (sid, block))

    # -- reading ----------------------------------------------------------------------------------
    def _refresh(self) -> None:
        """Pick up series another process created since we last looked (cheap: one max(id))."""
        (newest,) = self._conn.execute("SELECT coalesce(max(id), 0) FROM series").fetchone()
        if newest > max(self._series, default=0):
            self._reload()

    def series_names(self) -> list[str]:
        with self._lock:
            self._refresh()
            return sorted(self._by_name)

    def _matching(
        self, metric: str, matchers: Sequence[tuple[str, str, str]]
    ) -> list[tuple[int, dict[str, str]]]:
        """(series id, labels with `__name__`) of every series that satisfies all matchers."""
        if metric:
            candidates: Iterable[int] = self._by_name.get(metric, ())
        else:
            candidates = [sid for ids in self._by_name.values() for sid in ids]
        out = []
        for sid in candidates:
            name, labels = self._series[sid]
            full = {c.LABEL_METRIC_NAME: name, **labels}
            if all(matches(full.get(lbl, ""), op, val) for lbl, op, val in matchers):
                out.append((sid, full))
        return out

    def _sealed(self, sid: int, start_ms: int, end_ms: int) -> tuple[Times, Values]:
        """One series' sealed samples in [start_ms, end_ms], time-ordered, as arrays."""
        times: list[Times] = []
        values: list[Values] = []
        for (blob,) in self._conn.execute(
            "SELECT data FROM chunks WHERE series_id = ? AND block_ms BETWEEN ? AND ? ORDER BY block_ms",
            (sid, start_ms // BLOCK_MS * BLOCK_MS, end_ms),
        ):
            t, v = chunks.decode(blob)
            if t[0] < start_ms or t[-1] > end_ms:
                lo = int(np.searchsorted(t, start_ms, side="left"))
                hi = int(np.searchsorted(t, end_ms, side="right"))
                t, v = t[lo:hi], v[lo:hi]
            times.append(t)
            values.append(v)
        if not times:
            return _NO_TIMES, _NO_VALUES
        if len(times) == 1:
            return times[0], values[0]
        return np.concatenate(times), np.concatenate(values)

    def _head(self, sids: Sequence[int], start_ms: int, end_ms: int) -> dict[int, list[tuple[int, float]]]:
        """The head rows of `sids` in [start_ms, end_ms], per series, time-ordered: one range scan of
        the head (it holds about SEAL_MS of every series)."""
        query = "SELECT t_ms, series_id, value FROM head WHERE t_ms BETWEEN ? AND ?"
        params: list[int] = [start_ms, end_ms]
        if len(sids) <= 256:  # let SQLite drop the other series' rows
            query += f" AND series_id IN ({','.join('?' * len(sids))})"
            params += sids
        wanted = set(sids)
        out: dict[int, list[tuple[int, float]]] = {}
        for t, sid, v in self._conn.execute(query, params):
            if sid in wanted:
                out.setdefault(sid, []).append((int(t), float(v)))
        return out

    def select(
        self,
        metric: str,
        matchers: Sequence[tuple[str, str, str]],
        start_ms: int,
        end_ms: int,
    ) -> Selected:
        """Series of `metric` ("" = any name; `__name__` matchers apply) matching every matcher, with
        their samples in [start_ms, end_ms]; labels include `__name__`. Series without samples in the
        range are left out."""
        return [
            (labels, list(zip(t.tolist(), v.tolist(), strict=True)))
            for labels, t, v in self.select_arrays(metric, matchers, start_ms, end_ms)
        ]

    def select_arrays(
        self,
        metric: str,
        matchers: Sequence[tuple[str, str, str]],
        start_ms: int,
        end_ms: int,
    ) -> list[tuple[dict[str, str], Times, Values]]:
        """`select` with each series' samples as (timestamps, values) arrays (the embedded backend
        computes on arrays: no Python tuple per sample)."""
        out: list[tuple[dict[str, str], Times, Values]] = []
        with self._lock:
            self._refresh()
            conn = self._conn
            conn.execute("BEGIN")  # one snapshot: a seal in another process cannot move rows mid-read
            try:
                found = self._matching(metric, matchers)
                head = self._head([sid for sid, _ in found], start_ms, end_ms) if found else {}
                for sid, full in found:
                    t, v = self._sealed(sid, start_ms, end_ms)
                    rows = head.get(sid)
                    if rows:
                        t, v = _merge_arrays(t, v, rows)
                    if len(t):
                        out.append((full, t, v))
            finally:
                conn.execute("COMMIT")
        return out

    def select_rollups(
        self, metric: str, matchers: Sequence[tuple[str, str, str]], start_ms: int, end_ms: int
    ) -> list[tuple[dict[str, str], list[tuple[int, int, float, float, float]]]]:
        """Like `select`, from `rollups`: (bucket start, n, min, avg, max) per bucket in the range."""
        out: list[tuple[dict[str, str], list[tuple[int, int, float, float, float]]]] = []
        with self._lock:
            self._refresh()
            for sid, full in self._matching(metric, matchers):
                rows = self._conn.execute(
                    "SELECT t_ms, n, min, avg, max FROM rollups"
                    " WHERE series_id = ? AND t_ms BETWEEN ? AND ? ORDER BY t_ms",
                    (sid, start_ms, end_ms),
                ).fetchall()
                if rows:
                    out.append(
                        (full, [(int(t), int(n), float(a), float(b), float(x)) for t, n, a, b, x in rows])
                    )
        return out

    def stats(self) -> StoreStats:
        """How many samples sit in the head and in chunks, and in how many chunks."""
        with self._lock:
            (head,) = self._conn.execute("SELECT count(*) FROM head").fetchone()
            n_chunks, sealed = self._conn.execute(
                "SELECT count(*), coalesce(sum(n), 0) FROM chunks"
            ).fetchone()
        return StoreStats(int(head), int(sealed), int(n_chunks))

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
        now-downsampled. Idempotent; bounded transactions; `should_stop` is checked between them."""
        started = time.monotonic()
        stop = should_stop or (lambda: False)
        horizon = now_ms - downsampled_ms
        cutoff = (now_ms - full_ms) // BUCKET_MS * BUCKET_MS
        with self._lock:
            self._refresh()
            names = {sid: name for sid, (name, _) in self._series.items()}
        sids = sorted(names)
        deleted_samples = self._delete_rows_before("head", "t_ms", horizon)
        deleted_rollups = buckets = folded = 0
        for sid in sids:
            if stop():
                return CompactReport(
                    0, 0, deleted_samples, deleted_rollups, False, time.monotonic() - started
                )
            deleted_samples += self._delete_samples_before(sid, horizon)
            deleted_rollups += self._delete_rollups_before(sid, horizon)
        with self._lock:
            row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (WATERMARK,)).fetchone()
            if row is not None:
                start = int(row[0])
            else:  # first run: from the oldest sample (index probes)
                (first,) = self._conn.execute("SELECT min(t_ms) FROM head").fetchone()
                start = cutoff if first is None else min(cutoff, int(first))
                for sid in sids:
                    (first,) = self._conn.execute(
                        "SELECT min(block_ms) FROM chunks WHERE series_id = ?", (sid,)
                    ).fetchone()
                    if first is not None:
                        start = min(start, int(first))
        start = max(start, horizon) // BUCKET_MS * BUCKET_MS
        complete = True
        w0 = start
        while w0 < cutoff:
            w1 = min((w0 // WINDOW_MS + 1) * WINDOW_MS, cutoff)
            for sid in sids:
                if stop():
                    complete = False
                    break
                b, f = self._compact_window(sid, is_counter(names[sid]), w0, w1)
                buckets += b
                folded += f
            if not complete:
                break
            with self._lock:
                self._conn.execute(
                    "INSERT INTO meta (key, value) VALUES (?, ?)"
                    " ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)",
                    (WATERMARK, w1),
                )
            w0 = w1
        return CompactReport(
            buckets, folded, deleted_samples, deleted_rollups, complete, time.monotonic() - started
        )

    def _transaction(self, work: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                done = work(conn)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return done

    def _delete_samples_before(self, sid: int, horizon: int) -> int:
        """Delete one series' sealed samples older than `horizon`: whole chunks DELETE_BATCH // 100 at a
        time, then the block that straddles the horizon rewritten."""
        edge = horizon // BLOCK_MS * BLOCK_MS

        def whole_chunks(conn: sqlite3.Connection) -> int:
            found = conn.execute(
                "SELECT block_ms, n FROM chunks WHERE series_id = ? AND block_ms < ?"
                " ORDER BY block_ms LIMIT ?",
                (sid, edge, DELETE_BATCH // 100),
            ).fetchall()
            if found:
                conn.execute("DELETE FROM chunks WHERE series_id = ? AND block_ms <= ?", (sid, found[-1][0]))
            return sum(n for _, n in found) if found else -1

        deleted = 0
        while (got := self._transaction(whole_chunks)) >= 0:
            deleted += got

        def straddling(conn: sqlite3.Connection) -> int:
            pts = self._block(sid, edge)
            kept = [(t, v) for t, v in pts if t >= horizon]
            if len(kept) < len(pts):
                self._put_block(sid, edge, kept)
            return len(pts) - len(kept)

        if horizon > edge:
            deleted += self._transaction(straddling)
        return deleted

    def _delete_rollups_before(self, sid: int, horizon: int) -> int:
        return self._delete_rows_before("rollups", "rep_ms", horizon, sid)

    def _delete_rows_before(self, table: str, ts: str, horizon: int, sid: int | None = None) -> int:
        """Delete rows (of one series, or all) whose `ts` is older than `horizon`, DELETE_BATCH rows per
        transaction."""
        of = "" if sid is None else "series_id = ? AND "
        key: tuple[int, ...] = () if sid is None else (sid,)

        def batch(conn: sqlite3.Connection) -> tuple[int, bool]:
            edge = conn.execute(
                f"SELECT t_ms FROM {table} WHERE {of}t_ms < ? ORDER BY t_ms LIMIT 1 OFFSET ?",
                (*key, horizon, DELETE_BATCH - 1),
            ).fetchone()
            upto = horizon if edge is None else int(edge[0]) + 1
            cur = conn.execute(f"DELETE FROM {table} WHERE {of}t_ms < ? AND {ts} < ?", (*key, upto, horizon))
            return max(cur.rowcount, 0), edge is not None

        deleted, more = 0, True
        while more:
            got, more = self._transaction(batch)
            deleted += got
        return deleted

    def _compact_window(self, sid: int, counter: bool, w0: int, w1: int) -> tuple[int, int]:
        """Roll [w0, w1) (inside one block) of one series into minutes, in one transaction.
        Returns (buckets, folded)."""
        block = w0 // BLOCK_MS * BLOCK_MS
        result = (0, 0)

        def work(conn: sqlite3.Connection) -> int:
            nonlocal result
            pts = self._block(sid, block)
            rows = [(t, v) for t, v in pts if w0 <= t < w1]
            if not rows:
                return 0
            rolled = {
                int(t): (int(rep), int(n), float(lo), float(avg), float(hi))
                for t, rep, n, lo, avg, hi in conn.execute(
                    "SELECT t_ms, rep_ms, n, min, avg, max FROM rollups"
                    " WHERE series_id = ? AND t_ms >= ? AND t_ms < ?",
                    (sid, w0, w1),
                )
            }
            raw: dict[int, list[tuple[int, float]]] = {}
            rep_value: dict[int, float] = {}
            for t, v in rows:
                bucket = t // BUCKET_MS * BUCKET_MS
                old = rolled.get(bucket)
                if old is not None and old[0] == t:
                    rep_value[bucket] = v  # the bucket's rolled-up sample
                else:
                    raw.setdefault(bucket, []).append((t, v))
            if not raw:
                return 0
            new_samples: list[tuple[int, float]] = []
            new_rollups: list[tuple[int, int, int, int, float, float, float]] = []
            folded = 0
            for bucket, bucket_pts in raw.items():
                values = [v for _, v in bucket_pts]
                n, lo, hi, total = len(values), min(values), max(values), sum(values)
                last_t, last_v = bucket_pts[-1]
                folded += n
                old = rolled.get(bucket)
                if old is not None:  # late samples into a bucket already rolled up: merge
                    rep, n_old, lo_old, avg_old, hi_old = old
                    total += avg_old * n_old
                    n += n_old
                    lo, hi = min(lo, lo_old), max(hi, hi_old)
                    if rep > last_t:
                        last_t, last_v = rep, rep_value.get(bucket, avg_old)
                avg = total / n
                new_samples.append((last_t, last_v if counter else avg))
                new_rollups.append((sid, bucket, last_t, n, lo, avg, hi))
            kept = [(t, v) for t, v in pts if t // BUCKET_MS * BUCKET_MS not in raw]
            self._put_block(sid, block, sorted(kept + new_samples))
            conn.executemany(
                "INSERT OR REPLACE INTO rollups (series_id, t_ms, rep_ms, n, min, avg, max)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                new_rollups,
            )
            result = (len(new_rollups), folded)
            return 0

        self._transaction(work)
        return result

    def close(self) -> None:
        with self._lock:
            self._conn.close()
