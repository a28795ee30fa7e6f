"""Reading samples back: a series' sealed chunks in a range, merged with its head rows (the head wins
a shared instant), as (timestamps, values) arrays; and the rollups retention left. Every function runs
inside a read snapshot the caller holds (`Readers.snapshot`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from gpulens.storage import chunks
from gpulens.storage.samples.schema import BLOCK_MS
from gpulens.storage.samples.sealing import merge

Times = npt.NDArray[np.int64]
Values = npt.NDArray[np.float64]
_NO_TIMES: Times = np.empty(0, dtype=np.int64)
_NO_VALUES: Values = np.empty(0, dtype=np.float64)
_HEAD_IN_LIMIT = 256  # up to this many series, the head scan names them (SQLite skips the others)


def merge_arrays(t: Times, v: Values, head: list[tuple[int, float]]) -> tuple[Times, Values]:
    """Sealed arrays and time-ordered head rows as one pair of arrays; the head wins a shared instant."""
    if not len(t) or head[0][0] > int(t[-1]):
        ht = np.fromiter((x for x, _ in head), dtype=np.int64, count=len(head))
        hv = np.fromiter((y for _, y in head), dtype=np.float64, count=len(head))
        return (ht, hv) if not len(t) else (np.concatenate((t, ht)), np.concatenate((v, hv)))
    merged = merge(list(zip(t.tolist(), v.tolist(), strict=True)), head)
    return (
        np.fromiter((x for x, _ in merged), dtype=np.int64, count=len(merged)),
        np.fromiter((y for _, y in merged), dtype=np.float64, count=len(merged)),
    )


def sealed(conn: sqlite3.Connection, sid: int, start_ms: int, end_ms: int) -> tuple[Times, Values]:
    """One series' sealed samples in [start_ms, end_ms], time-ordered, as arrays."""
    times: list[Times] = []
    values: list[Values] = []
    for (blob,) in conn.execute(
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


def head_rows(
    conn: sqlite3.Connection, sids: Sequence[int], start_ms: int, end_ms: int
) -> dict[int, list[tuple[int, float]]]:
    """The head rows of `sids` in [start_ms, end_ms], per series, time-ordered: one range scan of
    the head (it holds about SEAL_MS of every series)."""
    query = "SELECT t_ms, series_id, value FROM head WHERE t_ms BETWEEN ? AND ?"
    params: list[int] = [start_ms, end_ms]
    if len(sids) <= _HEAD_IN_LIMIT:
        query += f" AND series_id IN ({','.join('?' * len(sids))})"
        params += sids
    wanted = set(sids)
    out: dict[int, list[tuple[int, float]]] = {}
    for t, sid, v in conn.execute(query, params):
        if sid in wanted:
            out.setdefault(sid, []).append((int(t), float(v)))
    return out


def series_arrays(
    conn: sqlite3.Connection, found: Sequence[tuple[int, dict[str, str]]], start_ms: int, end_ms: int
) -> list[tuple[dict[str, str], Times, Values]]:
    """The samples in [start_ms, end_ms] of each (series id, labels) in `found`; series without any
    are left out."""
    out: list[tuple[dict[str, str], Times, Values]] = []
    head = head_rows(conn, [sid for sid, _ in found], start_ms, end_ms) if found else {}
    for sid, full in found:
        t, v = sealed(conn, sid, start_ms, end_ms)
        rows = head.get(sid)
        if rows:
            t, v = merge_arrays(t, v, rows)
        if len(t):
            out.append((full, t, v))
    return out


def series_with_samples(
    conn: sqlite3.Connection, found: Sequence[tuple[int, dict[str, str]]], start_ms: int, end_ms: int
) -> list[dict[str, str]]:
    """The labels of the series `series_arrays` returns (those with a sample in [start_ms,
    end_ms]) without reading their samples: a chunk wholly inside the range has one (no chunk is
    empty), so only the chunks at the range's two edges are decoded."""
    if not found:
        return []
    in_head = {
        sid
        for (sid,) in conn.execute(
            "SELECT DISTINCT series_id FROM head WHERE t_ms BETWEEN ? AND ?", (start_ms, end_ms)
        )
    }
    return [full for sid, full in found if sid in in_head or _sealed_in(conn, sid, start_ms, end_ms)]


def _sealed_in(conn: sqlite3.Connection, sid: int, start_ms: int, end_ms: int) -> bool:
    blocks = conn.execute(
        "SELECT block_ms FROM chunks WHERE series_id = ? AND block_ms BETWEEN ? AND ? ORDER BY block_ms",
        (sid, start_ms // BLOCK_MS * BLOCK_MS, end_ms),
    ).fetchall()
    for (block,) in blocks:
        if block >= start_ms and block + BLOCK_MS - 1 <= end_ms:
            return True
        (blob,) = conn.execute(
            "SELECT data FROM chunks WHERE series_id = ? AND block_ms = ?", (sid, block)
        ).fetchone()
        t, _ = chunks.decode(blob)
        lo = int(np.searchsorted(t, start_ms, side="left"))
        if lo < len(t) and t[lo] <= end_ms:
            return True
    return False


Rollup = tuple[int, int, float, float, float]  # (bucket start, n, min, avg, max)


def rollups(conn: sqlite3.Connection, sid: int, start_ms: int, end_ms: int) -> list[Rollup]:
    rows = conn.execute(
        "SELECT t_ms, n, min, avg, max FROM rollups"
        " WHERE series_id = ? AND t_ms BETWEEN ? AND ? ORDER BY t_ms",
        (sid, start_ms, end_ms),
    ).fetchall()
    return [(int(t), int(n), float(a), float(b), float(x)) for t, n, a, b, x in rows]
