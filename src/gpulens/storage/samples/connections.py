"""Connections to the store's file: one writer connection, a small pool of reader connections, and
SQLite's failures as the domain's `StoreUnavailable` (503 with Retry-After, never a 500).

The file is in WAL mode, so a reader never waits for a writer: each read runs in its own snapshot on
a connection of its own, whatever the writer (here or in another process) is doing. Writes in this
process take turns on the writer connection under a lock, but that lock is never held while SQLite
waits: the writer connection has no busy timeout, and when another connection (another process:
`serve`, `gpulens run`, `gpulens metrics` share the file) holds the write lock, `BEGIN IMMEDIATE`
fails at once, the lock is let go, and the attempt is repeated after a short sleep until the busy
timeout has passed. Once `BEGIN IMMEDIATE` succeeds nothing in the transaction waits (WAL: a commit
appends to the log; the automatic checkpoint is passive).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from gpulens.domain.errors import StoreUnavailable

T = TypeVar("T")

BUSY_TIMEOUT_S = 10.0  # how long a write waits for another writer before giving up (503)
IDLE_READERS = 4  # reader connections kept open between reads
_RETRY_FIRST_S = 0.001
_RETRY_MAX_S = 0.05
MESSAGE = "the metrics store is busy or failing; try again shortly"


@contextmanager
def translated(name: str) -> Iterator[None]:
    """SQLite's operational failures (locked, busy, I/O, disk full, a damaged file) as
    `StoreUnavailable`; programming errors (a constraint, a bad statement) stay what they are."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        raise StoreUnavailable(f"{name}: {exc}", MESSAGE) from exc
    except sqlite3.DatabaseError as exc:
        if type(exc) is not sqlite3.DatabaseError:  # IntegrityError and the other subclasses
            raise
        raise StoreUnavailable(f"{name}: {exc}", MESSAGE) from exc


def _busy(exc: sqlite3.OperationalError) -> bool:
    return exc.sqlite_errorname.startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))


def connect(path: str | Path, busy_timeout_ms: int) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
    return conn


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:  # SQLite may have rolled back already (an I/O error, a full disk)
        conn.execute("ROLLBACK")


class Writer:
    """The store's one write connection; `transaction` runs work in a `BEGIN IMMEDIATE` on it."""

    def __init__(self, path: str | Path, name: str, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        self.name = name
        self.busy_timeout_s = busy_timeout_s
        self._lock = threading.Lock()
        with translated(name):
            conn = connect(path, int(busy_timeout_s * 1000))  # the pragmas may wait: no lock held yet
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA busy_timeout=0")  # from now on: never wait inside SQLite
            except BaseException:
                conn.close()
                raise
        self.conn = conn

    def _begin(self, deadline: float) -> bool:
        """Take the lock and open the write transaction: True; the lock is then held. False: another
        connection holds SQLite's write lock (the lock is let go again)."""
        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            held = f"{self.name}: this process' other writers held the store past the timeout"
            raise StoreUnavailable(held, MESSAGE)
        try:
            self.conn.execute("BEGIN IMMEDIATE")
            return True
        except sqlite3.OperationalError as exc:
            self._lock.release()
            if _busy(exc) and time.monotonic() < deadline:
                return False
            raise StoreUnavailable(f"{self.name}: {exc}", MESSAGE) from exc
        except BaseException:
            self._lock.release()
            raise

    def transaction(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """`work(conn)` in one write transaction, committed whole or rolled back."""
        deadline = time.monotonic() + self.busy_timeout_s
        delay = _RETRY_FIRST_S
        while not self._begin(deadline):
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, _RETRY_MAX_S)
        conn = self.conn
        try:
            with translated(self.name):
                try:
                    done = work(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    _rollback(conn)
                    raise
        finally:
            self._lock.release()
        return done

    def close(self) -> None:
        with self._lock:
            self.conn.close()


class Readers:
    """Reader connections, one per concurrent read, `IDLE_READERS` of them kept between reads."""

    def __init__(self, path: str | Path, name: str, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        self.name = name
        self._path = path
        self._timeout_ms = int(busy_timeout_s * 1000)
        self._idle: list[sqlite3.Connection] = []
        self._lock = threading.Lock()  # guards `_idle` only (a list pop or append)
        self._closed = False

    def _take(self) -> sqlite3.Connection:
        with self._lock:
            if self._closed:
                raise StoreUnavailable(f"{self.name}: closed", MESSAGE)
            if self._idle:
                return self._idle.pop()
        conn = connect(self._path, self._timeout_ms)
        conn.execute("PRAGMA query_only=1")
        return conn

    def _give(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < IDLE_READERS:
                self._idle.append(conn)
                return
        conn.close()

    def snapshot(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """`work(conn)` in one read transaction: every statement sees the same committed state (a
        seal in another process cannot move rows between two of them)."""
        with translated(self.name):
            conn = self._take()
            try:
                conn.execute("BEGIN")
                try:
                    done = work(conn)
                finally:
                    _rollback(conn)  # nothing was written: ending the snapshot is all it does
            except BaseException:
                conn.close()  # in whatever state the failure left it: not back to the pool
                raise
        self._give(conn)
        return done

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
