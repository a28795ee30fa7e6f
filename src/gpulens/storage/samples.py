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
* `samples` is the head: (series_id, t_ms, value) rows as written, a WITHOUT ROWID table keyed
  (series_id, t_ms). A write is an append here, cheap and crash-safe.
* `chunks` holds sealed history: one row per series per aligned hour (`BLOCK_MS`), its samples
  compressed by `gpulens.storage.chunks` (delta-of-delta timestamps, XOR'd values: 1-4 bytes a sample
  instead of ~22 as head rows). Once a series writes into a newer hour, its older head rows are
  sealed: merged into their block's chunk and deleted from the head, in one transaction, a few series
  per write so no pass stalls (`seal` sweeps what a dead process left behind).
* A read merges a series' chunks with its head rows; on the same timestamp the head wins (a later
  write replaces an earlier one, as in the head itself). So sealing never changes an answer.

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

from gpulens.domain import catalog as c
from gpulens.storage import chunks

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS series ("
    " id INTEGER PRIMARY KEY, name TEXT NOT NULL, labels TEXT NOT NULL, UNIQUE (name, labels))",
    "CREATE INDEX IF NOT EXISTS series_name ON series (name)",
    "CREATE TABLE IF NOT EXISTS samples ("
    " series_id INTEGER NOT NULL, t_ms INTEGER NOT NULL, value REAL NOT NULL,"
    " PRIMARY KEY (series_id, t_ms)) WITHOUT ROWID",
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
SEAL_PER_WRITE = 8  # series sealed after one write, at most (the rest after the next writes)
DELETE_BATCH = 5_000  # rows per deleting transaction
WATERMARK = "compacted_until_ms"
COUNTER_SUFFIXES = ("_total", "_bucket", "_count", "_sum")
KNOWN_COUNTERS = frozenset({c.DCGM_TOTAL_ENERGY_CONSUMPTION})


def is_counter(name: str) -> bool:
    """Counters keep the last value of a minute when rolled up (rate() stays right); gauges the avg."""
    return name in KNOWN_COUNTERS or name.lower().endswith(COUNTER_SUFFIXES)


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
    head_samples: int  # rows in `samples`, not sealed yet
    sealed_samples: int  # samples in `chunks`
    chunks: int


NAME_LABEL = "__name__"
T = TypeVar("T")

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
        self._ids: dict[tuple[str, str], int] = {}
        self._series: dict[int, tuple[str, dict[str, str]]] = {}
        self._by_name: dict[str, list[int]] = {}
        # the collector repeats the same label tuples every pass: skip canonicalising them again
        self._fast: dict[tuple[str, object], int] = {}
        self._head_block: dict[int, int] = {}  # newest block this process wrote, per series
        self._pending: set[int] = set()  # series with older head blocks to seal
        for sid, name, labels in conn.execute("SELECT id, name, labels FROM series ORDER BY id"):
            self._remember(sid, name, labels)

    @classmethod
    def from_path(cls, path: str | Path) -> SampleStore:
        conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA busy_timeout=10000")  # another process (serve / run) may be writing
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return cls(conn)

    def _remember(self, sid: int, name: str, labels: str) -> None:
        self._ids[(name, labels)] = sid
        self._series[sid] = (name, json.loads(labels))
        self._by_name.setdefault(name, []).append(sid)

    # -- writing ----------------------------------------------------------------------------------
    def write(self, samples: Iterable[SampleLike]) -> int:
        """Store a batch in one transaction (a later sample at the same instant replaces the earlier),
        then seal a few series whose older hours are complete."""
        rows: list[tuple[int, int, float]] = []
        with self._lock:
            conn = self._conn
            head, pending = self._head_block, self._pending
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
                    rows.append((sid, t, float(s.value)))
                    block = t // BLOCK_MS
                    top = head.get(sid)
                    if top is None or block > top:
                        if top is not None:
                            pending.add(sid)
                        head[sid] = block
                    elif block < top:  # an older hour (a backfill, late data): seal it too
                        pending.add(sid)
                conn.executemany(
                    "INSERT OR REPLACE INTO samples (series_id, t_ms, value) VALUES (?, ?, ?)", rows
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                # series rows inserted in the failed transaction are gone: forget them too
                self._reload()
                raise
            due = [pending.pop() for _ in range(min(SEAL_PER_WRITE, len(pending)))]
            cuts = [(sid, head[sid] * BLOCK_MS) for sid in due]
        for sid, before in cuts:
            self._seal_series(sid, before)
        return len(rows)

    def _reload(self) -> None:
        self._fast.clear()
        self._ids.clear()
        self._series.clear()
        self._by_name.clear()
        self._head_block.clear()
        self._pending.clear()
        for sid, name, labels in self._conn.execute("SELECT id, name, labels FROM series ORDER BY id"):
            self._remember(sid, name, labels)

    # -- sealing: head rows -> compressed hourly chunks --------------------------------------------
    def seal(self, before_ms: int) -> int:
        """Seal every series' head rows in hours that ended by `before_ms` (what a process that stopped
        writing left in the head). Returns the number of samples sealed."""
        cut = before_ms // BLOCK_MS * BLOCK_MS
        with self._lock:
            sids = [
                sid
                for (sid,) in self._conn.execute(
                    "SELECT DISTINCT series_id FROM samples WHERE t_ms < ?", (cut,)
                )
            ]
        return sum(self._seal_series(sid, cut) for sid in sids)

    def flush(self) -> int:
        """Seal what writes left pending (at most SEAL_PER_WRITE went with each write)."""
        with self._lock:
            cuts = [(sid, self._head_block[sid] * BLOCK_MS) for sid in self._pending]
            self._pending.clear()
        return sum(self._seal_series(sid, before) for sid, before in cuts)

    def _seal_series(self, sid: int, before_ms: int) -> int:
        """Move one series' head rows older than `before_ms` into their blocks' chunks: one transaction."""
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                rows = conn.execute(
                    "SELECT t_ms, value FROM samples WHERE series_id = ? AND t_ms < ? ORDER BY t_ms",
                    (sid, before_ms),
                ).fetchall()
                by_block: dict[int, list[tuple[int, float]]] = {}
                for t, v in rows:
                    by_block.setdefault(t // BLOCK_MS * BLOCK_MS, []).append((t, v))
                for block, pts in by_block.items():
                    self._put_block(sid, block, _merge(self._chunk(sid, block), pts))
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
            "SELECT t_ms, value FROM samples WHERE series_id = ? AND t_ms >= ? AND t_ms < ? ORDER BY t_ms",
            (sid, block, block + BLOCK_MS),
        ).fetchall()
        return _merge(self._chunk(sid, block), head)

    def _put_block(self, sid: int, block: int, pts: Sequence[tuple[int, float]]) -> None:
        """Make `pts` (time-ordered) the whole content of one block: its chunk, and no head rows."""
        conn = self._conn
        conn.execute(
            "DELETE FROM samples WHERE series_id = ? AND t_ms >= ? AND t_ms < ?",
            (sid, block, block + BLOCK_MS),
        )
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
            full = {NAME_LABEL: name, **labels}
            if all(matches(full.get(lbl, ""), op, val) for lbl, op, val in matchers):
                out.append((sid, full))
        return out

    def _range(self, sid: int, start_ms: int, end_ms: int) -> list[tuple[int, float]]:
        """One series' samples in [start_ms, end_ms], time-ordered: chunks and head merged."""
        conn = self._conn
        times: list[np.ndarray] = []
        values: list[np.ndarray] = []
        for (blob,) in conn.execute(
            "SELECT data FROM chunks WHERE series_id = ? AND block_ms BETWEEN ? AND ? ORDER BY block_ms",
            (sid, start_ms // BLOCK_MS * BLOCK_MS, end_ms),
        ):
            t, v = chunks.decode(blob)
            if t[0] < start_ms or t[-1] > end_ms:
                lo, hi = (
                    np.searchsorted(t, [start_ms, end_ms], side="left")[0],
                    np.searchsorted(t, end_ms, side="right"),
                )
                t, v = t[lo:hi], v[lo:hi]
            times.append(t)
            values.append(v)
        sealed: list[tuple[int, float]] = []
        if times:
            t_all = np.concatenate(times) if len(times) > 1 else times[0]
            v_all = np.concatenate(values) if len(values) > 1 else values[0]
            sealed = list(zip(t_all.tolist(), v_all.tolist(), strict=True))
        head = conn.execute(
            "SELECT t_ms, value FROM samples WHERE series_id = ? AND t_ms BETWEEN ? AND ? ORDER BY t_ms",
            (sid, start_ms, end_ms),
        ).fetchall()
        return _merge(sealed, [(int(t), float(v)) for t, v in head])

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
        out: Selected = []
        with self._lock:
            self._refresh()
            conn = self._conn
            conn.execute("BEGIN")  # one snapshot: a seal in another process cannot move rows mid-read
            try:
                for sid, full in self._matching(metric, matchers):
                    pts = self._range(sid, start_ms, end_ms)
                    if pts:
                        out.append((full, pts))
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
            (head,) = self._conn.execute("SELECT count(*) FROM samples").fetchone()
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
        deleted_samples = deleted_rollups = buckets = folded = 0
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
            else:  # first run: from the oldest sample (index probes per series)
                start = cutoff
                for sid in sids:
                    for query in (
                        "SELECT min(t_ms) FROM samples WHERE series_id = ?",
                        "SELECT min(block_ms) FROM chunks WHERE series_id = ?",
                    ):
                        (first,) = self._conn.execute(query, (sid,)).fetchone()
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
        """Delete one series' samples older than `horizon`: whole chunks DELETE_BATCH // 100 at a time,
        the block that straddles the horizon rewritten, head rows DELETE_BATCH per transaction."""
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
        return deleted + self._delete_rows_before(sid, "samples", "t_ms", horizon)

    def _delete_rollups_before(self, sid: int, horizon: int) -> int:
        return self._delete_rows_before(sid, "rollups", "rep_ms", horizon)

    def _delete_rows_before(self, sid: int, table: str, ts: str, horizon: int) -> int:
        """Delete rows of one series whose `ts` is older than `horizon`, DELETE_BATCH per transaction."""

        def batch(conn: sqlite3.Connection) -> tuple[int, bool]:
            edge = conn.execute(
                f"SELECT t_ms FROM {table} WHERE series_id = ? AND t_ms < ? ORDER BY t_ms LIMIT 1 OFFSET ?",
                (sid, horizon, DELETE_BATCH - 1),
            ).fetchone()
            upto = horizon if edge is None else int(edge[0]) + 1
            cur = conn.execute(
                f"DELETE FROM {table} WHERE series_id = ? AND t_ms < ? AND {ts} < ?", (sid, upto, horizon)
            )
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
