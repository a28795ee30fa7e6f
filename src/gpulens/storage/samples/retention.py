"""Retention (`compact`): samples older than the full-resolution horizon are rolled into 1-minute
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

import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

from gpulens.domain import catalog as c
from gpulens.storage.samples.connections import Readers, Writer
from gpulens.storage.samples.schema import BLOCK_MS, BUCKET_MS
from gpulens.storage.samples.sealing import block_points, put_block

WINDOW_MS = BLOCK_MS  # one series x one block per compaction transaction
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


def compact(
    writer: Writer,
    readers: Readers,
    names: Mapping[int, str],
    now_ms: int,
    full_ms: int,
    downsampled_ms: int,
    should_stop: Callable[[], bool],
) -> CompactReport:
    """Roll the samples of the series `names` (id -> metric name) older than now-full into 1-minute
    buckets; delete what is older than now-downsampled. `should_stop` is checked between transactions."""
    started = time.monotonic()
    horizon = now_ms - downsampled_ms
    cutoff = (now_ms - full_ms) // BUCKET_MS * BUCKET_MS
    sids = sorted(names)
    deleted_samples = _delete_rows_before(writer, "head", "t_ms", horizon)
    deleted_rollups = buckets = folded = 0
    for sid in sids:
        if should_stop():
            return CompactReport(0, 0, deleted_samples, deleted_rollups, False, time.monotonic() - started)
        deleted_samples += _delete_samples_before(writer, sid, horizon)
        deleted_rollups += _delete_rows_before(writer, "rollups", "rep_ms", horizon, sid)
    start = readers.snapshot(lambda conn: _first_to_compact(conn, sids, cutoff))
    start = max(start, horizon) // BUCKET_MS * BUCKET_MS
    complete = True
    w0 = start
    while w0 < cutoff:
        w1 = min((w0 // WINDOW_MS + 1) * WINDOW_MS, cutoff)
        for sid in sids:
            if should_stop():
                complete = False
                break
            b, f = writer.transaction(
                partial(_compact_window, sid=sid, counter=is_counter(names[sid]), w0=w0, w1=w1)
            )
            buckets += b
            folded += f
        if not complete:
            break
        writer.transaction(partial(_advance_watermark, to_ms=w1))
        w0 = w1
    elapsed = time.monotonic() - started
    return CompactReport(buckets, folded, deleted_samples, deleted_rollups, complete, elapsed)


def _advance_watermark(conn: sqlite3.Connection, to_ms: int) -> None:
    conn.execute(
        "INSERT INTO meta (key, value) VALUES (?, ?)"
        " ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)",
        (WATERMARK, to_ms),
    )


def _first_to_compact(conn: sqlite3.Connection, sids: list[int], cutoff: int) -> int:
    """Where compaction starts: the watermark, or on a first run the oldest sample (index probes)."""
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (WATERMARK,)).fetchone()
    if row is not None:
        return int(row[0])
    (first,) = conn.execute("SELECT min(t_ms) FROM head").fetchone()
    start = cutoff if first is None else min(cutoff, int(first))
    for sid in sids:
        (first,) = conn.execute("SELECT min(block_ms) FROM chunks WHERE series_id = ?", (sid,)).fetchone()
        if first is not None:
            start = min(start, int(first))
    return start


def _delete_samples_before(writer: Writer, sid: int, horizon: int) -> int:
    """Delete one series' sealed samples older than `horizon`: whole chunks DELETE_BATCH // 100 at a
    time, then the block that straddles the horizon rewritten."""
    edge = horizon // BLOCK_MS * BLOCK_MS

    def whole_chunks(conn: sqlite3.Connection) -> int:
        found = conn.execute(
            "SELECT block_ms, n FROM chunks WHERE series_id = ? AND block_ms < ? ORDER BY block_ms LIMIT ?",
            (sid, edge, DELETE_BATCH // 100),
        ).fetchall()
        if found:
            conn.execute("DELETE FROM chunks WHERE series_id = ? AND block_ms <= ?", (sid, found[-1][0]))
        return sum(n for _, n in found) if found else -1

    deleted = 0
    while (got := writer.transaction(whole_chunks)) >= 0:
        deleted += got

    def straddling(conn: sqlite3.Connection) -> int:
        pts = block_points(conn, sid, edge)
        kept = [(t, v) for t, v in pts if t >= horizon]
        if len(kept) < len(pts):
            put_block(conn, sid, edge, kept)
        return len(pts) - len(kept)

    if horizon > edge:
        deleted += writer.transaction(straddling)
    return deleted


def _delete_rows_before(writer: Writer, table: str, ts: str, horizon: int, sid: int | None = None) -> int:
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
        got, more = writer.transaction(batch)
        deleted += got
    return deleted


def _compact_window(conn: sqlite3.Connection, sid: int, counter: bool, w0: int, w1: int) -> tuple[int, int]:
    """Roll [w0, w1) (inside one block) of one series into minutes, inside the caller's transaction.
    Returns (buckets, folded)."""
    block = w0 // BLOCK_MS * BLOCK_MS
    pts = block_points(conn, sid, block)
    rows = [(t, v) for t, v in pts if w0 <= t < w1]
    if not rows:
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
            rep_value[bucket] = v  # the bucket's rolled-up sample
        else:
            raw.setdefault(bucket, []).append((t, v))
    if not raw:
        return 0, 0
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
    put_block(conn, sid, block, sorted(kept + new_samples))
    conn.executemany(
        "INSERT OR REPLACE INTO rollups (series_id, t_ms, rep_ms, n, min, avg, max)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        new_rollups,
    )
    return len(new_rollups), folded
