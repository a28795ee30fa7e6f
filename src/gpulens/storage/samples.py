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
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Protocol

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS series ("
    " id INTEGER PRIMARY KEY, name TEXT NOT NULL, labels TEXT NOT NULL, UNIQUE (name, labels))",
    "CREATE INDEX IF NOT EXISTS series_name ON series (name)",
    "CREATE TABLE IF NOT EXISTS samples ("
    " series_id INTEGER NOT NULL, t_ms INTEGER NOT NULL, value REAL NOT NULL,"
    " PRIMARY KEY (series_id, t_ms)) WITHOUT ROWID",
)

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

    def close(self) -> None:
        with self._lock:
            self._conn.close()
