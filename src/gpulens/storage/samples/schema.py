"""The sample store's tables, its time constants, and the one-time move of files in the old layout.

* `series` (id, metric name, labels as canonical JSON: keys sorted, compact), indexed by name.
* `head` holds the last minutes as written: (t_ms, series_id, value) rows in a WITHOUT ROWID table
  keyed time first, so that a collector pass appends to the last page or two of the b-tree. (Keyed
  series first, every pass dirtied one page per series: ~195 pages, 780 KiB of WAL a pass for 163
  series; now it is a few pages.)
* `chunks` holds sealed history: one row per series per aligned hour (`BLOCK_MS`), its samples
  compressed by `gpulens.storage.chunks`.
* `rollups` holds the 1-minute buckets retention made (see `retention.py`); `meta` its watermark.
"""

from __future__ import annotations

import sqlite3

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

BUCKET_MS = 60_000  # retention's rollup bucket
BLOCK_MS = 3_600_000  # one chunk per series per aligned hour
SEAL_MS = 600_000  # the head is sealed up to the last 10-minute boundary a write crossed


def create(conn: sqlite3.Connection) -> None:
    """Create what is missing, and move the rows of the old `samples` table (keyed series first)
    into `head`. Runs inside a write transaction the caller holds."""
    for stmt in SCHEMA:
        conn.execute(stmt)
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'samples'").fetchone():
        conn.execute(
            "INSERT OR REPLACE INTO head (t_ms, series_id, value) SELECT t_ms, series_id, value FROM samples"
        )
        conn.execute("DROP TABLE samples")
