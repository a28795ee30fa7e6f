"""`python -m gpulens.demo`: generated GPU history in the embedded store, a demo org and key, gpulens on it.

No Prometheus is needed. The first start generates the synthetic `default` scenario (three hosts,
five executions in a fixed past window ending 2026-01-01), writes it into an embedded sample store
(`samples.db`) under the demo data directory (`$GPULENS_DATA_DIR/demo`, default
`~/.local/share/gpulens/demo`) and records what it built in `manifest.json`; later starts reuse that
store. The executions are registered for org `demo` in
`demo.db`, and the org's API key is kept in `demo.key` (mode 0600) so it stays the same.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import sqlite3
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, TextIO

from pydantic import ValidationError

from gpulens.agent.samples import Sample
from gpulens.backends.embedded import EmbeddedBackend
from gpulens.config import Settings, describe_error
from gpulens.domain.keys import hash_key
from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.storage.registry import Registry
from gpulens.storage.samples import SampleStore
from gpulens.synth.generate import generate
from gpulens.synth.scenario import ExecutionSpec, Scenario, default_scenario

DEMO_ORG = "demo"
KEY_NAME = "demo"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 2  # bump when the store the demo writes changes: old ones are rebuilt (1: Prometheus TSDB)
STORE = "samples.db"
LEGACY_TSDB = "tsdb"  # what format 1 left behind; removed when the store is (re)built
DATABASE = "demo.db"
KEY_FILE = "demo.key"
LYCEUM = ".venv-lyceum/bin/lyceum"
HEALTHY = "healthy"

# What each demo run stands for in the registry: the script a user would have started, the outcome.
_FAILURE_TEXT = {"oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"}


class DemoError(RuntimeError):
    """Something the user can fix; `main` prints it as one line and exits 2."""


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
        """gpulens settings over this demo (exporter metric names, the scenario's scrape interval)."""
        return Settings(
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


# -- what the user sees ------------------------------------------------------------------------------


def base_url(host: str, port: int) -> str:
    """The URL to call a server bound to host:port (a wildcard address is reached on loopback)."""
    if host in ("", "0.0.0.0"):  # noqa: S104 - mapping a wildcard to loopback, not binding to it
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _window(e: DemoExecution) -> str:
    start, end = e.spec.start, e.spec.end
    tail = f"{end:%H:%M}" if end.date() == start.date() else f"{end:%Y-%m-%d %H:%M}"
    return f"{start:%Y-%m-%d %H:%M} - {tail}"


def _gpus(e: DemoExecution) -> str:
    if not e.gpus:
        return "-"
    listed = ",".join(str(g) for g in e.gpus)
    return listed if e.spec.gpus else f"{listed} (all)"


def render(env: DemoEnv, url: str, *, serving: bool, lyceum: str = LYCEUM) -> str:
    """The block `main` prints: where to call, the key, the executions, three commands to paste."""
    sc = env.scenario
    rows = [("name", "execution id", "host", "GPUs", "status", "window (UTC)")]
    rows += [
        (e.name, e.execution_id, e.spec.hostname, _gpus(e), e.execution.status.value, _window(e))
        for e in env.executions
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    table = [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows
    ]
    healthy = env.execution(HEALTHY).execution_id
    config = json.dumps({"api_key": env.key, "base_url": url})
    lyceum_note = "" if Path(lyceum).exists() else " (install it with `make lyceum-cli`)"
    hours = (sc.end_s - sc.start_s) / 3600
    lines = [
        "",
        f"gpulens demo: {hours:g} h of generated GPU history on {len(sc.hosts)} hosts "
        f"({sc.start:%Y-%m-%d %H:%M} - {sc.end:%Y-%m-%d %H:%M} UTC), "
        f"in the embedded store at {env.store_path}",
        "",
        f"  API      {url}",
        f"  API key  {env.key}   (org {DEMO_ORG}; kept in {env.key_path})",
        "",
        *table,
        "",
        "Try it:",
        "",
        f'  curl -s -H "Authorization: Bearer {env.key}" '
        f'"{url}/api/v2/external/execution/{healthy}/metrics?step=1m" | head -c 600',
        "",
        f"  # the public lyceum CLI{lyceum_note}; this replaces ~/.lyceum/config.json",
        f"  mkdir -p ~/.lyceum && echo '{config}' > ~/.lyceum/config.json",
        f"  {lyceum} jobs metrics {healthy}",
        "",
        "  # each run's summary and findings from the CLI (no server needed; the default --data-dir)",
        f"  gpulens report {env.execution('throttled').execution_id} --demo",
        "",
        "Serving until Ctrl-C."
        if serving
        else "Not serving (--no-serve): run without --no-serve to try the commands.",
        "",
    ]
    return "\n".join(lines)


# -- serving -----------------------------------------------------------------------------------------


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, bound before anything slow starts (raises OSError if taken)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def serve(env: DemoEnv, listener: socket.socket, host: str, port: int, log_level: str = "warning") -> None:
    """gpulens on `listener` until Ctrl-C or SIGTERM (both end here normally, so cleanup runs)."""
    import uvicorn

    from gpulens.api.app import create_app

    app = create_app(env.settings(host, port), registry=env.registry, backend=env.backend())
    config = uvicorn.Config(app, log_level=log_level, access_log=False, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    # uvicorn handles SIGINT/SIGTERM itself, then re-raises the signal: make SIGTERM's an exception too.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.run(sockets=[listener])
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- command line ------------------------------------------------------------------------------------


def _port(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {raw!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 1-65535, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gpulens.demo",
        description="Load generated GPU history into the embedded store and serve gpulens over it.",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the demo keeps its sample store, registry and key (default: $GPULENS_DATA_DIR/demo, "
        "i.e. ~/.local/share/gpulens/demo)",
    )
    p.add_argument("--host", default=None, help="bind address (default: $GPULENS_HOST or 127.0.0.1)")
    p.add_argument("--port", type=_port, default=None, help="port (default: $GPULENS_PORT or 8080)")
    p.add_argument(
        "--no-serve",
        action="store_true",
        help="set everything up, print how to use it and exit",
    )
    p.add_argument(
        "--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug")
    )
    return p


def _error(message: str) -> None:
    print(f"gpulens demo: {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        from_env = Settings()
    except ValidationError as exc:
        _error(describe_error(exc))
        return 2
    data_dir: Path = args.data_dir if args.data_dir is not None else from_env.data_dir / "demo"
    host: str = args.host if args.host is not None else from_env.host
    port: int = args.port if args.port is not None else from_env.port
    listener: socket.socket | None = None
    if not args.no_serve:
        try:
            listener = bind(host, port)
        except OSError as exc:
            _error(
                f"cannot listen on {host}:{port} ({exc.strerror or exc}); "
                "pass --port N (or set GPULENS_PORT) to use another port"
            )
            return 2
    try:
        try:
            env = prepare(data_dir, log=sys.stderr)
        except DemoError as exc:
            _error(str(exc))
            return 2
        with env:
            url = base_url(host, port)
            print(render(env, url, serving=listener is not None), flush=True)
            if listener is not None:
                serve(env, listener, host, port, args.log_level)
                print("gpulens demo: stopped", file=sys.stderr, flush=True)
        return 0
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    finally:
        if listener is not None:
            listener.close()


if __name__ == "__main__":
    sys.exit(main())
