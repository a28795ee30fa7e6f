"""Sealing: head rows -> compressed hourly chunks, and the block reads and rewrites retention shares.

A chunk holds one series' samples of one aligned hour (`BLOCK_MS`), compressed by
`gpulens.storage.chunks` (delta-of-delta timestamps, XOR'd values: 1-4 bytes a sample instead of ~22
as head rows). When a write crosses a `SEAL_MS` (10 minute) boundary, the head rows before it are
sealed: merged into their hour's chunk and deleted from the head, one transaction per hour of all
series. So the head never holds much more than 10 minutes, and a read scans little of it. A read
merges a series' chunks with its head rows; on the same timestamp the head wins (a later write
replaces an earlier one, as in the head itself), so sealing never changes an answer.

Every function here runs inside a write transaction the caller holds (`Writer.transaction`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from gpulens.storage import chunks
from gpulens.storage.samples.schema import BLOCK_MS

Points = list[tuple[int, float]]


def merge(sealed: Points, head: Sequence[tuple[int, float]]) -> Points:
    """Two time-ordered sample lists as one; on the same timestamp `head` (the later write) wins."""
    if not head:
        return sealed
    if not sealed or head[0][0] > sealed[-1][0]:
        return sealed + list(head)
    merged = dict(sealed)
    merged.update(head)
    return sorted(merged.items())


def seal_next_hour(conn: sqlite3.Connection, lo: int, cut: int) -> tuple[int, int] | None:
    """Seal the head rows of the hour of the oldest head row at or after `lo`, up to `cut` (a SEAL_MS
    boundary): merged into their chunks, deleted from the head. Returns (samples sealed, where the
    next call starts), or None when the head holds nothing in [lo, cut)."""
    (first,) = conn.execute("SELECT min(t_ms) FROM head WHERE t_ms >= ?", (lo,)).fetchone()
    if first is None or first >= cut:
        return None
    block = first // BLOCK_MS * BLOCK_MS
    hi = min(block + BLOCK_MS, cut)
    by_series: dict[int, Points] = {}
    rows = conn.execute(
        "SELECT t_ms, series_id, value FROM head WHERE t_ms >= ? AND t_ms < ?", (first, hi)
    ).fetchall()
    for t, sid, v in rows:
        by_series.setdefault(sid, []).append((t, v))
    for sid, pts in by_series.items():
        write_chunk(conn, sid, block, merge(chunk(conn, sid, block), pts))
    conn.execute("DELETE FROM head WHERE t_ms >= ? AND t_ms < ?", (first, hi))
    return len(rows), hi


def chunk(conn: sqlite3.Connection, sid: int, block: int) -> Points:
    row = conn.execute(
        "SELECT data FROM chunks WHERE series_id = ? AND block_ms = ?", (sid, block)
    ).fetchone()
    return [] if row is None else chunks.decode_pairs(row[0])


def block_points(conn: sqlite3.Connection, sid: int, block: int) -> Points:
    """Every sample of one series in one block: chunk and head merged."""
    head = conn.execute(
        "SELECT t_ms, value FROM head WHERE t_ms >= ? AND t_ms < ? AND series_id = ? ORDER BY t_ms",
        (block, block + BLOCK_MS, sid),
    ).fetchall()
    return merge(chunk(conn, sid, block), head)


def put_block(conn: sqlite3.Connection, sid: int, block: int, pts: Sequence[tuple[int, float]]) -> None:
    """Make `pts` (time-ordered) the whole content of one block: its chunk, and no head rows."""
    conn.execute(
        "DELETE FROM head WHERE t_ms >= ? AND t_ms < ? AND series_id = ?", (block, block + BLOCK_MS, sid)
    )
    write_chunk(conn, sid, block, pts)


def write_chunk(conn: sqlite3.Connection, sid: int, block: int, pts: Sequence[tuple[int, float]]) -> None:
    if pts:
        blob = chunks.encode([t for t, _ in pts], [v for _, v in pts])
        conn.execute(
            "INSERT OR REPLACE INTO chunks (series_id, block_ms, n, data) VALUES (?, ?, ?, ?)",
            (sid, block, len(pts), blob),
        )
    else:
        conn.execute("DELETE FROM chunks WHERE series_id = ? AND block_ms = ?", (sid, block))
