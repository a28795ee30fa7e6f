"""The demo's data: generated GPU history in an embedded store, a registry of its runs, an org key.

The first start generates the synthetic `default` scenario (three hosts, five executions in a fixed
past window ending 2026-01-01), writes it into an embedded sample store (`samples.db`) under the demo
data directory (`$GPULENS_DATA_DIR/demo`, default `~/.local/share/gpulens/demo`) and records what it
built in `manifest.json`; later starts reuse that store. The executions are registered for org `demo`
in `demo.db`, and the org's API key is kept in `demo.key` (mode 0600) so it stays the same.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from gpulens.agent.samples import Sample
from gpulens.backends.embedded import EmbeddedBackend
from gpulens.config import Settings
from gpulens.demo.history import generate
from gpulens.demo.scenario import ExecutionSpec, Scenario, default_scenario
from gpulens.domain.keys import hash_key
from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.storage.registry import Registry
from gpulens.storage.samples import SampleStore

DEMO_ORG = "demo"
KEY_NAME = "demo"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 2  # bump when the store the demo writes changes: old ones are rebuilt (1: Prometheus TSDB)
STORE = "samples.db"
LEGACY_TSDB = "tsdb"  # what format 1 left behind; removed when the store is (re)built
DATABASE = "demo.db"
KEY_FILE = "demo.key"
PRICES_FILE = "prices.toml"
# what a GPU-hour of each demo profile costs, so that receipts, the usage table and reports show cost
DEMO_PRICES = """# gpulens demo: the price of one GPU-hour per hardware profile (GPULENS_PRICES)
currency = "USD"

[gpu_hour]
"gpu.h100" = 2.5
"gpu.a100" = 1.5
"""

# What each demo run stands for in the registry: the script a user would have started, the outcome.
_FAILURE_TEXT = {"oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"}


class DemoError(RuntimeError):
    """Something the user can fix; `gpulens demo` prints it as one line and exits 2."""


@dataclass(frozen=True, slots=True)
class DemoExecution:
    """One scenario execution as registered: its scenario `name` and the registry's `execution`."""

    name: str
    spec: ExecutionSpec
    execution: Execution
    gpus: tuple[int, ...]  # the GPU indices it owns (every GPU of the host when it lists none)

    @property
    def execution_id(self) -> str:
        return self.execution.execution_id


@dataclass
class DemoEnv:
    """A demo backend: the embedded sample `store`, the migrated `registry`, the org's `key`."""

    data_dir: Path
    scenario: Scenario
    store: SampleStore
    registry: Registry
    key: str
    executions: tuple[DemoExecution, ...]
    reused_store: bool
    reused_key: bool
    _closed: bool = field(default=False, init=False, repr=False)

    @property
    def store_path(self) -> Path:
        return self.data_dir / STORE

    @property
    def database_url(self) -> str:
        return f"sqlite:///{self.data_dir / DATABASE}"

    @property
    def key_path(self) -> Path:
        return self.data_dir / KEY_FILE

    def execution(self, name: str) -> DemoExecution:
        for e in self.executions:
            if e.name == name:
                return e
        raise KeyError(name)

    def settings(self, host: str = "127.0.0.1", port: int = 8080) -> Settings:
        """gpulens settings over this demo (exporter metric names, the scenario's scrape interval; the
        demo's prices unless GPULENS_PRICES names other ones)."""
        settings = Settings(
            host=host,
            port=port,
            prometheus_url=None,
            database_url=self.database_url,
            data_dir=self.data_dir,
            scrape_interval=f"{self.scenario.scrape_interval_s}s",
            dcgm_host_label="auto",
            node_match="auto",
            metric_names={},
        )
        if settings.prices is None:
            settings = settings.model_copy(update={"prices": self.data_dir / PRICES_FILE})
        return settings

    def backend(self) -> EmbeddedBackend:
        """A metrics backend over the store (it does not own it: `stop` closes the store)."""
        return EmbeddedBackend(self.store)

    def stop(self) -> None:
        """Close the sample store and the registry (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.store.close()
        finally:
            self.registry.dispose()

    def __enter__(self) -> DemoEnv:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# -- the sample store --------------------------------------------------------------------------------


def scenario_identity(scenario: Scenario) -> dict[str, Any]:
    """What the store's content depends on; a manifest with other values means: rebuild."""
    return {
        "format": MANIFEST_FORMAT,
        "scenario": scenario.name,
        "seed": scenario.seed,
        "start_s": scenario.start_s,
        "end_s": scenario.end_s,
        "scrape_interval_s": scenario.scrape_interval_s,
        "hosts": [h.hostname for h in scenario.hosts],
        "executions": [e.execution_id for e in scenario.executions],
    }


def _reusable(data_dir: Path, scenario: Scenario) -> bool:
    """Whether an existing store was built for `scenario` (else it must be built)."""
    try:
        manifest = json.loads((data_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if manifest != scenario_identity(scenario):
        return False
    return (data_dir / STORE).is_file()  # else the manifest survived, the store did not


def _sqlite_files(path: Path) -> tuple[Path, ...]:
    return (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm"))


def _build_store(data_dir: Path, scenario: Scenario) -> int:
    """Generate into a staging store, then swap it in and write the manifest; returns the samples written."""
    store_path, staging = data_dir / STORE, data_dir / f"{STORE}.partial"
    (data_dir / MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(data_dir / LEGACY_TSDB, ignore_errors=True)
    for path in (*_sqlite_files(store_path), *_sqlite_files(staging)):
        path.unlink(missing_ok=True)
    dataset = generate(scenario)
    written = 0
    store = SampleStore.from_path(staging)
    try:
        for s in dataset.series:
            samples = (Sample(s.name, s.labels, float(v), t * 1000) for t, v in dataset.samples(s))
            written += store.write(samples)
    finally:
        store.close()  # the last connection closing checkpoints the WAL into the file
    for leftover in _sqlite_files(staging)[1:]:
        leftover.unlink(missing_ok=True)
    staging.rename(store_path)
    _write_atomic(data_dir / MANIFEST, json.dumps(scenario_identity(scenario)) + "\n")
    return written


def _write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have taken bits away; set exactly these
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


# -- the registry ------------------------------------------------------------------------------------


def _hardware_profile(scenario: Scenario, spec: ExecutionSpec) -> str:
    model = scenario.host(spec.hostname).gpu_model
    if model is None:
        return "cpu"
    return "gpu.a100" if "A100" in model.name else "gpu.h100"


def demo_execution(scenario: Scenario, spec: ExecutionSpec) -> DemoExecution:
    """The registry's view of a scenario execution, for org `demo`."""
    failed = spec.status in (ExecutionStatus.FAILED, ExecutionStatus.SYSTEM_FAILURE)
    failure = _FAILURE_TEXT.get(spec.name)
    execution = Execution(
        execution_id=spec.execution_id,
        org=DEMO_ORG,
        hostname=spec.hostname,
        gpus=tuple(str(g) for g in spec.gpus),
        status=spec.status,
        created_at=spec.start,
        start_time=spec.start,
        end_time=spec.end,
        hardware_profile=_hardware_profile(scenario, spec),
        user=spec.user,
        project=spec.project,
        file_name=spec.name.replace("-", "_") + ".py",
        return_code=(1 if failed else 0) if not spec.status.is_active else None,
        system_errors=(failure,) if failed and failure else (),
    )
    return DemoExecution(spec.name, spec, execution, scenario.gpus_of(spec))


def _ensure_key(registry: Registry, path: Path) -> tuple[str, bool]:
    """The org's key from `path` if the registry still accepts it, else a new one written there."""
    try:
        plaintext = path.read_text().strip()
    except OSError:
        plaintext = ""
    if plaintext:
        found = registry.find_key(hash_key(plaintext))
        if found is not None and found.org == DEMO_ORG and found.refusal(datetime.now(UTC)) is None:
            path.chmod(0o600)
            return plaintext, True
    _, plaintext = registry.create_key(DEMO_ORG, name=KEY_NAME)
    _write_atomic(path, plaintext + "\n", 0o600)
    return plaintext, False


def _open_registry(data_dir: Path, scenario: Scenario) -> tuple[Registry, tuple[DemoExecution, ...]]:
    registry = Registry.from_url(f"sqlite:///{data_dir / DATABASE}")
    try:
        registry.migrate()
        registry.ensure_org(DEMO_ORG, "gpulens demo")
        executions = tuple(demo_execution(scenario, spec) for spec in scenario.executions)
        for e in executions:
            registry.upsert_execution(e.execution)
    except BaseException:
        registry.dispose()
        raise
    return registry, executions


# -- setting up --------------------------------------------------------------------------------------


def prepare(data_dir: Path, *, scenario: Scenario | None = None, log: TextIO | None = None) -> DemoEnv:
    """Build or reuse the sample store, open it, register the executions, ensure the key.

    The caller owns the returned environment: `env.stop()` (or `with prepare(...) as env`) closes
    the store and the registry. Raises DemoError for what the user can fix (a store that will not open).
    """
    scenario = scenario or default_scenario()
    data_dir = data_dir.expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    reused = _reusable(data_dir, scenario)
    store_path = data_dir / STORE
    if not reused:
        hours = (scenario.end_s - scenario.start_s) / 3600
        _say(log, f"generating {hours:g} h of GPU history ({scenario.name} scenario) into {store_path} ...")
        try:
            _build_store(data_dir, scenario)
        except (OSError, sqlite3.Error) as exc:
            raise DemoError(f"writing the generated history failed: {_one_line(exc)}") from exc
    else:
        _say(log, f"reusing the generated GPU history in {store_path}")
    prices = data_dir / PRICES_FILE
    if not prices.exists():  # the user's own edits are kept
        _write_atomic(prices, DEMO_PRICES)
    try:
        store = SampleStore.from_path(store_path)
    except sqlite3.Error as exc:
        raise DemoError(
            f"the sample store did not open ({_one_line(exc)}); deleting {data_dir / MANIFEST} makes "
            "the demo rebuild its data"
        ) from exc
    try:
        registry, executions = _open_registry(data_dir, scenario)
        try:
            key, reused_key = _ensure_key(registry, data_dir / KEY_FILE)
        except BaseException:
            registry.dispose()
            raise
    except BaseException:
        store.close()
        raise
    return DemoEnv(data_dir, scenario, store, registry, key, executions, reused, reused_key)


def _say(log: TextIO | None, message: str) -> None:
    if log is not None:
        print(message, file=log, flush=True)


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
