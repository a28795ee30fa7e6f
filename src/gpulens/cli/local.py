"""The embedded default: this host's collector -> sample store -> embedded backend; nothing else installed."""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from gpulens.agent.collector import Collector
from gpulens.agent.readers import default_readers
from gpulens.agent.samples import Sample
from gpulens.backends.embedded import EmbeddedBackend
from gpulens.cli.common import CLI_ADMIN
from gpulens.config import Settings
from gpulens.domain import catalog as c
from gpulens.domain import limits
from gpulens.service.executions import ExecutionService
from gpulens.storage.registry import Registry
from gpulens.storage.samples import SampleStore

log = logging.getLogger("gpulens.local")

LOCAL_ORG = "local"
ADMIN_KEY_FILE = "admin.key"
JOB = "gpulens"
COMPACT_EVERY_S = 3600.0
SEAL_GRACE_MS = 300_000  # an hour is sealed by the sweep once it ended this long ago (late passes)


def this_host() -> str:
    """The machine's host name, reduced to what the registry and PromQL matchers accept."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()).strip("-._") or "localhost"
    return name[: limits.HOSTNAME_MAX]


@dataclass(frozen=True, slots=True)
class StampedSample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float
    timestamp_ms: int


@dataclass(slots=True)
class StoreSink:
    """Writes each collector pass in one transaction, with the `instance`/`job` labels a Prometheus
    scrape would add (the planner finds node series by `instance`)."""

    store: SampleStore
    hostname: str

    def write(self, samples: Sequence[Sample]) -> None:
        extra = ((c.LABEL_INSTANCE, self.hostname), ("job", JOB))
        self.store.write(
            StampedSample(s.name, (*tuple(s.labels), *extra), s.value, s.timestamp_ms) for s in samples
        )


@dataclass(slots=True)
class Local:
    store: SampleStore
    backend: EmbeddedBackend
    collector: Collector
    hostname: str
    retention_full_ms: int = 30 * 86_400_000
    retention_downsampled_ms: int = 365 * 86_400_000
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    compactor: threading.Thread | None = None

    def start(self) -> None:
        self.collector.collect()  # a first pass right away: data within a second, not an interval
        self.thread = self.collector.start(self.stop)
        self.compactor = threading.Thread(target=self._compact_loop, name="gpulens-compact", daemon=True)
        self.compactor.start()

    def compact(self) -> None:
        """Seal the hours a stopped writer (an ended `gpulens run`) left in the head, then one retention
        pass: full resolution, then 1-minute rollups, then gone (see SampleStore)."""
        now_ms = int(time.time() * 1000)
        sealed = self.store.seal(now_ms - SEAL_GRACE_MS)
        if sealed:
            log.info("sealed %d samples that other writers left in the store's head", sealed)
        report = self.store.compact(
            now_ms,
            self.retention_full_ms,
            self.retention_downsampled_ms,
            should_stop=self.stop.is_set,
        )
        if report.buckets or report.deleted_samples or report.deleted_rollups:
            log.info(
                "compacted the sample store: %d minutes from %d samples, %d samples and %d rollups"
                " deleted, %.2f s",
                report.buckets,
                report.folded,
                report.deleted_samples,
                report.deleted_rollups,
                report.elapsed_s,
            )

    def _compact_loop(self) -> None:
        """Once at start, then every hour, until `close`."""
        while not self.stop.is_set():
            try:
                self.compact()
            except Exception:  # a locked or busy store: try again next time, never kill the process
                log.exception("compacting the sample store failed")
            self.stop.wait(COMPACT_EVERY_S)

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=10)
        if self.compactor is not None:
            self.compactor.join(timeout=30)
        self.collector.close()
        self.store.close()


def open_local(settings: Settings) -> Local:
    """The sample store in GPULENS_DATA_DIR, its backend, and a collector for this host."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    store = SampleStore.from_path(settings.samples_path)
    hostname = this_host()
    collector = Collector(
        default_readers(hostname, settings.fake_gpus, settings.max_process_series),
        [StoreSink(store, hostname)],
        interval_s=settings.collect_interval,
    )
    return Local(
        store,
        EmbeddedBackend(store),
        collector,
        hostname,
        retention_full_ms=settings.retention_full_ms,
        retention_downsampled_ms=settings.retention_downsampled_ms,
    )


def bootstrap_admin_key(settings: Settings, registry: Registry) -> str | None:
    """On first start: org `local` and an admin key, written 0600 to GPULENS_DATA_DIR/admin.key.

    Returns the key when it was just created (to be shown once), else None.
    """
    path: Path = settings.data_dir / ADMIN_KEY_FILE
    if path.exists():
        return None
    service = ExecutionService(registry)
    _, plaintext = anyio.run(
        lambda: service.create_key_for(CLI_ADMIN, LOCAL_ORG, "local-admin", is_admin=True)
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(plaintext + "\n")
    return plaintext
