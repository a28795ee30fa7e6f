"""The embedded time-series store: the collector's samples in one SQLite file, read back by selector.

Why SQLite: it is in the standard library (no server, no extra wheel), and in WAL mode a crash or a
SIGKILL in the middle of `write` loses at most the transaction that was open: every batch is one
transaction, committed whole or not at all, and the file is never left unreadable. `synchronous=NORMAL`
keeps a commit to a WAL append (no fsync per batch); a power cut may lose the last batches but not
corrupt the file, which is the right trade for metrics sampled every few seconds.

Layout: `series` (id, metric name, labels as canonical JSON: keys sorted, compact) with an index on
the name; `samples` (series_id, t_ms, value) as a WITHOUT ROWID table keyed (series_id, t_ms), so the
samples of one series lie together in time order and a range read is one index walk. A REAL column
stores integral floats as integers (1-8 bytes), which most GPU gauges are.

Matchers are Prometheus' (=, !=, =~, !~; regexes fully anchored, a missing label reads as ""); the
series table is small and cached in memory, so matching is done in Python and only the samples are
read from disk.

Retention (`compact`): samples older than the full-resolution horizon are rolled into 1-minute
buckets. Each bucket keeps ONE sample in `samples`, under the original series, so every query of the
embedded backend keeps working on old data (an instant selector sees one sample a minute, well inside
the 5-minute lookback): the average for gauges, the LAST value for counters (names ending `_total`,
`_bucket`, `_count`, `_sum`, or a counter of the catalog such as DCGM's energy), so that rate() and
increase() over old data stay right. The sample sits at the timestamp of the bucket's last raw sample.
The bucket's count/min/avg/max go to the side table `rollups` (series_id, t_ms = bucket start, rep_ms
= that sample's timestamp, n, min, avg, max). Rows older than the downsampled horizon are deleted
(series rows are kept: another process may hold their ids). Compaction works in bounded transactions
(one series x one hour per transaction), re-reads each bucket inside its transaction and merges with
an existing rollup, so it is idempotent and safe alongside a writer or another compactor in another
process; `meta.compacted_until_ms` bounds the work of the next run. A sample written with a timestamp
older than that watermark after it moved (late data) stays at full resolution until it expires.
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
from typing import Protocol

from gpulens.domain import catalog as c

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
)

BUCKET_MS = 60_000
WINDOW_MS = 3_600_000  # one series x one hour per compaction transaction
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


NAME_LABEL = "__name__"

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
        """Store a batch in one transaction (a later sample at the same instant replaces the earlier)."""
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
                    rows.append((sid, int(s.timestamp_ms), float(s.value)))
                conn.executemany(
                    "INSERT OR REPLACE INTO samples (series_id, t_ms, value) VALUES (?, ?, ?)", rows
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                # series rows inserted in the failed transaction are gone: forget them too
                self._reload()
                raise
        return len(rows)

    def _reload(self) -> None:
        self._fast.clear()
        self._ids.clear()
        self._series.clear()
        self._by_name.clear()
        for sid, name, labels in self._conn.execute("SELECT id, name, labels FROM series ORDER BY id"):
            self._remember(sid, name, labels)

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
            if metric:
                candidates = list(self._by_name.get(metric, ()))
            else:
                candidates = [sid for ids in self._by_name.values() for sid in ids]
            for sid in candidates:
                name, labels = self._series[sid]
                full = {NAME_LABEL: name, **labels}
                if not all(matches(full.get(lbl, ""), op, val) for lbl, op, val in matchers):
                    continue
                rows = self._conn.execute(
                    "SELECT t_ms, value FROM samples WHERE series_id = ? AND t_ms BETWEEN ? AND ?"
                    " ORDER BY t_ms",
                    (sid, start_ms, end_ms),
                ).fetchall()
                if rows:
                    out.append((full, [(int(t), float(v)) for t, v in rows]))
        return out

    def select_rollups(
        self, metric: str, matchers: Sequence[tuple[str, str, str]], start_ms: int, end_ms: int
    ) -> list[tuple[dict[str, str], list[tuple[int, int, float, float, float]]]]:
        """Like `select`, from `rollups`: (bucket start, n, min, avg, max) per bucket in the range."""
        out: list[tuple[dict[str, str], list[tuple[int, int, float, float, float]]]] = []
        with self._lock:
            self._refresh()
            names = [metric] if metric else list(self._by_name)
            for name in names:
                for sid in self._by_name.get(name, ()):
                    full = {NAME_LABEL: name, **self._series[sid][1]}
                    if not all(matches(full.get(lbl, ""), op, val) for lbl, op, val in matchers):
                        continue
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
            deleted_samples += self._delete_before(sid, "samples", horizon)
            deleted_rollups += self._delete_before(sid, "rollups", horizon)
        with self._lock:
            row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (WATERMARK,)).fetchone()
            if row is not None:
                start = int(row[0])
            else:  # first run: from the oldest sample (one index probe per series)
                start = cutoff
                for sid in sids:
                    (first,) = self._conn.execute(
                        "SELECT min(t_ms) FROM samples WHERE series_id = ?", (sid,)
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

    def _delete_before(self, sid: int, table: str, horizon: int) -> int:
        """Delete rows of one series older than `horizon`, DELETE_BATCH rows per transaction."""
        ts = "rep_ms" if table == "rollups" else "t_ms"
        deleted = 0
        while True:
            with self._lock:
                conn = self._conn
                conn.execute("BEGIN IMMEDIATE")
                try:
                    edge = conn.execute(
                        f"SELECT t_ms FROM {table} WHERE series_id = ? AND t_ms < ?"
                        " ORDER BY t_ms LIMIT 1 OFFSET ?",
                        (sid, horizon, DELETE_BATCH - 1),
                    ).fetchone()
                    upto = horizon if edge is None else int(edge[0]) + 1
                    cur = conn.execute(
                        f"DELETE FROM {table} WHERE series_id = ? AND t_ms < ? AND {ts} < ?",
                        (sid, upto, horizon),
                    )
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
            deleted += max(cur.rowcount, 0)
            if edge is None:
                return deleted

    def _compact_window(self, sid: int, counter: bool, w0: int, w1: int) -> tuple[int, int]:
        """Roll [w0, w1) of one series into minutes, in one transaction. Returns (buckets, folded)."""
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                rows = conn.execute(
                    "SELECT t_ms, value FROM samples WHERE series_id = ? AND t_ms >= ? AND t_ms < ?"
                    " ORDER BY t_ms",
                    (sid, w0, w1),
                ).fetchall()
                if not rows:
                    conn.execute("COMMIT")
                    return 0, 0
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
                        rep_value[bucket] = float(v)  # the bucket's rolled-up sample
                    else:
                        raw.setdefault(bucket, []).append((int(t), float(v)))
                new_samples: list[tuple[int, int, float]] = []
                new_rollups: list[tuple[int, int, int, int, float, float, float]] = []
                folded = 0
                for bucket, pts in raw.items():
                    values = [v for _, v in pts]
                    n, lo, hi, total = len(values), min(values), max(values), sum(values)
                    last_t, last_v = pts[-1]
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
                    new_samples.append((sid, last_t, last_v if counter else avg))
                    new_rollups.append((sid, bucket, last_t, n, lo, avg, hi))
                conn.executemany(
                    "DELETE FROM samples WHERE series_id = ? AND t_ms >= ? AND t_ms < ?",
                    [(sid, b, b + BUCKET_MS) for b in raw],
                )
                conn.executemany("INSERT INTO samples (series_id, t_ms, value) VALUES (?, ?, ?)", new_samples)
                conn.executemany(
                    "INSERT OR REPLACE INTO rollups (series_id, t_ms, rep_ms, n, min, avg, max)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    new_rollups,
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return len(new_rollups), folded

    def close(self) -> None:
        with self._lock:
            self._conn.close()
