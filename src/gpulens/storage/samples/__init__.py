"""The embedded time-series store: the collector's samples in one SQLite file, read back by selector.

Why SQLite: it is in the standard library (no server), and in WAL mode a crash or a SIGKILL in the
middle of `write` loses at most the transaction that was open: every batch is one transaction,
committed whole or not at all, and the file is never left unreadable. `synchronous=NORMAL` keeps a
commit to a WAL append (no fsync per batch); a power cut may lose the last batches but not corrupt the
file, which is the right trade for metrics sampled every few seconds. Several processes (`serve`,
`gpulens run`, `gpulens metrics`) share the file; every change is one short IMMEDIATE transaction.

The package, by responsibility:
* `schema.py`: the tables (`series`, `head`, `chunks`, `rollups`, `meta`) and the time constants;
* `connections.py`: one writer connection, a pool of reader connections (reads never wait for a
  write), SQLite's failures as `StoreUnavailable` (503 with Retry-After);
* `index.py`: the label index in memory and Prometheus' label matching;
* `sealing.py`: head rows -> compressed hourly chunks (a read merges both, the head wins);
* `reads.py`: a series' samples in a range, as arrays;
* `retention.py`: rollups into 1-minute buckets past the full-resolution horizon, then deletion;
* `store.py`: `SampleStore`, the public face over all of them.
"""

from gpulens.storage.samples.index import canonical_labels, matches
from gpulens.storage.samples.retention import CompactReport, is_counter
from gpulens.storage.samples.schema import BLOCK_MS, BUCKET_MS, SEAL_MS
from gpulens.storage.samples.store import SampleLike, SampleStore, StoreStats

__all__ = [
    "BLOCK_MS",
    "BUCKET_MS",
    "SEAL_MS",
    "CompactReport",
    "SampleLike",
    "SampleStore",
    "StoreStats",
    "canonical_labels",
    "is_counter",
    "matches",
]
