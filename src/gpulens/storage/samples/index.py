"""The label index: every series' id, name and labels, held in memory, and Prometheus' label matching
over it (=, !=, =~, !~; regexes fully anchored, a missing label reads as ""). The `series` table is
small, so matching is done here and only samples are read from disk.

Several threads read the index while the writer adds to it: its dictionaries change under `_lock`,
which is never held while SQLite runs (rows are read first, then added under the lock). A writer adds
the series it created only after its transaction committed, so the index never holds an id that a
rollback took back.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache

from gpulens.domain import catalog as c

LabelPairs = Sequence[tuple[str, str]]
Matcher = tuple[str, str, str]  # (label, op, value)


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
    """Labels as the `series` table keys them: JSON, keys sorted, compact."""
    pairs = labels.items() if isinstance(labels, Mapping) else labels
    # Prometheus drops empty-valued labels: a label set with `a=""` is the set without `a`
    return json.dumps(dict(sorted((k, v) for k, v in pairs if v != "")), separators=(",", ":"))


class SeriesIndex:
    """Series id <-> (name, canonical labels), by name, and label matching."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: dict[tuple[str, str], int] = {}
        self._series: dict[int, tuple[str, dict[str, str]]] = {}
        self._by_name: dict[str, list[int]] = {}
        self._loaded_to = 0  # every series row with an id up to here is in the index

    def id_of(self, key: tuple[str, str]) -> int | None:
        return self._ids.get(key)  # one dict look-up: atomic, no lock needed

    def add(self, found: Iterable[tuple[int, str, str]]) -> None:
        """Remember (id, name, canonical labels) rows; known ids are skipped."""
        with self._lock:
            for sid, name, labels in found:
                if sid not in self._series:
                    self._ids[(name, labels)] = sid
                    self._series[sid] = (name, json.loads(labels))
                    self._by_name.setdefault(name, []).append(sid)

    def refresh(self, conn: sqlite3.Connection) -> None:
        """Pick up series created since the last look, here or by another process (cheap when there
        are none: one max(id))."""
        loaded = self._loaded_to
        (newest,) = conn.execute("SELECT coalesce(max(id), 0) FROM series").fetchone()
        if newest > loaded:
            rows = conn.execute(
                "SELECT id, name, labels FROM series WHERE id > ? AND id <= ? ORDER BY id", (loaded, newest)
            ).fetchall()
            self.add(rows)
            with self._lock:
                self._loaded_to = max(self._loaded_to, int(newest))

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._by_name)

    def name_by_id(self) -> dict[int, str]:
        with self._lock:
            return {sid: name for sid, (name, _) in self._series.items()}

    def matching(self, metric: str, matchers: Sequence[Matcher]) -> list[tuple[int, dict[str, str]]]:
        """(series id, labels with `__name__`) of every series of `metric` ("" = any name) that
        satisfies all matchers."""
        with self._lock:
            if metric:
                candidates: list[int] = list(self._by_name.get(metric, ()))
            else:
                candidates = [sid for ids in self._by_name.values() for sid in ids]
            known = [(sid, self._series[sid]) for sid in candidates]
        out = []
        for sid, (name, labels) in known:
            full = {c.LABEL_METRIC_NAME: name, **labels}
            if all(matches(full.get(lbl, ""), op, val) for lbl, op, val in matchers):
                out.append((sid, full))
        return out
