"""SampleStore under concurrency: reads never wait for a write, writes from many threads (and from a
second store on the same file, as another process would) all land, and SQLite's locks and failures
surface as StoreUnavailable within the busy timeout, never holding up readers."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpulens.agent.samples import Sample
from gpulens.domain.errors import BackendUnavailable, StoreUnavailable
from gpulens.storage.samples import SEAL_MS, SampleStore

LABELS = (("gpu", "0"), ("Hostname", "h"))


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "s.db"


@pytest.fixture
def store(path: Path) -> Iterator[SampleStore]:
    st = SampleStore.from_path(path, busy_timeout_s=5.0)
    st.write([Sample("m", LABELS, 1.0, 1000)])
    yield st
    st.close()


def _values(store: SampleStore) -> list[tuple[int, float]]:
    return store.select("m", [("gpu", "=", "0")], 0, 10**12)[0][1]


def _held_write_lock(path: Path) -> sqlite3.Connection:
    """Another connection (another process, as far as SQLite knows) in the middle of a write."""
    other = sqlite3.connect(str(path), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO meta (key, value) VALUES ('held', 1)")
    return other


def test_a_read_proceeds_while_another_connection_holds_a_write_transaction(
    store: SampleStore, path: Path
) -> None:
    other = _held_write_lock(path)
    try:
        t0 = time.monotonic()
        assert _values(store) == [(1000, 1.0)]
        assert store.stats().head_samples == 1
        assert time.monotonic() - t0 < 1.0  # no busy wait: WAL readers do not take the write lock
    finally:
        other.execute("ROLLBACK")
        other.close()


def test_a_read_proceeds_while_a_write_of_this_store_waits_and_while_one_runs(
    store: SampleStore, path: Path
) -> None:
    # 1. a write of this store waits for another connection's write lock
    other = _held_write_lock(path)
    waiting = threading.Thread(target=store.write, args=([Sample("m", LABELS, 2.0, 2000)],))
    waiting.start()
    try:
        time.sleep(0.2)  # the write is now retrying BEGIN IMMEDIATE
        assert waiting.is_alive()
        t0 = time.monotonic()
        assert _values(store) == [(1000, 1.0)]
        assert time.monotonic() - t0 < 1.0
    finally:
        other.execute("ROLLBACK")
        other.close()
    waiting.join(5)
    assert not waiting.is_alive()
    assert _values(store) == [(1000, 1.0), (2000, 2.0)]

    # 2. a transaction of this store's writer is open (held open here until the read is done)
    inside, release = threading.Event(), threading.Event()

    def slow(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO head (t_ms, series_id, value) VALUES (3000, 1, 3.0)")
        inside.set()
        assert release.wait(5)

    running = threading.Thread(target=store._writer.transaction, args=(slow,))
    running.start()
    try:
        assert inside.wait(5)
        t0 = time.monotonic()
        assert _values(store) == [(1000, 1.0), (2000, 2.0)]  # its snapshot: not the uncommitted row
        assert time.monotonic() - t0 < 1.0
    finally:
        release.set()
        running.join(5)
    assert _values(store)[-1] == (3000, 3.0)


def test_a_write_locked_past_the_busy_timeout_is_store_unavailable(path: Path) -> None:
    store = SampleStore.from_path(path, busy_timeout_s=0.3)
    other = _held_write_lock(path)
    try:
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable) as caught:
            store.write([Sample("m", LABELS, 1.0, 1000)])
        assert 0.25 < time.monotonic() - t0 < 3.0
        exc = caught.value
        assert isinstance(exc, BackendUnavailable) and exc.retry_after_s == 1
        assert str(path) not in exc.message and "busy" in exc.message  # the file is for logs only
        assert str(path) in exc.backend
        assert isinstance(exc.__cause__, sqlite3.OperationalError)
        assert store.select("m", [], 0, 10**12) == []  # reads still work, nothing half-written
    finally:
        other.execute("ROLLBACK")
        other.close()
    store.write([Sample("m", LABELS, 1.0, 1000)])  # and the store recovers once the lock is gone
    assert _values(store) == [(1000, 1.0)]
    store.close()


def test_a_damaged_file_is_store_unavailable(store: SampleStore, path: Path) -> None:
    store._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with path.open("r+b") as f:
        f.write(b"\0" * 100)  # the header: "file is not a database"
    with pytest.raises(StoreUnavailable) as caught:
        store.select("m", [], 0, 10**12)
    assert isinstance(caught.value.__cause__, sqlite3.DatabaseError)


def test_a_constraint_error_is_not_turned_into_unavailable(store: SampleStore) -> None:
    def bad(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO series (id, name, labels) VALUES (1, 'x', '{}')")

    with pytest.raises(sqlite3.IntegrityError):
        store._writer.transaction(bad)


def test_writes_from_many_threads_and_two_stores_all_land(path: Path) -> None:
    """8 threads over one store and 2 over a second store on the same file (SQLite sees two writers),
    each writing its own series across seal boundaries, while 2 threads read; every sample lands once."""
    first = SampleStore.from_path(path, busy_timeout_s=10.0)
    second = SampleStore.from_path(path, busy_timeout_s=10.0)
    writers, batches, per_batch = 10, 30, 20
    step = SEAL_MS // 10  # every thread crosses several seal boundaries: sealing contends as well
    done = threading.Event()
    read_errors: list[BaseException] = []

    def write(k: int) -> int:
        st = first if k < 8 else second
        labels = (("gpu", str(k)), ("Hostname", "h"))
        written = 0
        for b in range(batches):
            batch = [
                Sample("m", labels, float(b * per_batch + i), (b * per_batch + i) * step // per_batch)
                for i in range(per_batch)
            ]
            written += st.write(batch)
        return written

    def read() -> None:
        try:
            while not done.is_set():
                for labels, t, _ in first.select_arrays("m", [], 0, 10**12):
                    assert (t[1:] > t[:-1]).all(), labels  # time-ordered, no duplicates, mid-seal too
        except BaseException as exc:  # reported below
            read_errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(2)]
    for r in readers:
        r.start()
    try:
        with ThreadPoolExecutor(writers) as pool:
            counts = list(pool.map(write, range(writers)))
    finally:
        done.set()
        for r in readers:
            r.join(10)
    assert not read_errors, read_errors
    assert counts == [batches * per_batch] * writers
    for st in (first, second):
        got = {labels["gpu"]: (t, v) for labels, t, v in st.select_arrays("m", [], 0, 10**12)}
        assert sorted(got, key=int) == [str(k) for k in range(writers)]
        for t, v in got.values():
            assert len(t) == batches * per_batch
            assert v.tolist() == [float(x) for x in range(batches * per_batch)]
    first.flush()
    assert first.stats().sealed_samples + first.stats().head_samples == writers * batches * per_batch
    first.close()
    second.close()
