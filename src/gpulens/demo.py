"""`python -m gpulens.demo`: generated GPU history in a local Prometheus, a demo org and key, gpulens on it.

The first start generates the synthetic `default` scenario (three hosts, five executions in a fixed
past window ending 2026-01-01), backfills it into a Prometheus TSDB under the demo data directory
(`$GPULENS_DATA_DIR/demo`, default `~/.local/share/gpulens/demo`) and records what it built in
`manifest.json`; later starts reuse that TSDB. The executions are registered for org `demo` in
`demo.db`, and the org's API key is kept in `demo.key` (mode 0600) so it stays the same.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, TextIO

from pydantic import ValidationError

from gpulens.config import Settings, describe_error
from gpulens.domain.keys import hash_key
from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.storage.registry import Registry
from gpulens.synth.generate import generate
from gpulens.synth.openmetrics import BLOCK_LADDER_S
from gpulens.synth.promload import (
    PROMETHEUS,
    PROMTOOL,
    LoadError,
    ServerHandle,
    backfill_dataset,
    start_prometheus,
)
from gpulens.synth.scenario import ExecutionSpec, Scenario, default_scenario

DEMO_ORG = "demo"
KEY_NAME = "demo"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1  # bump when the TSDB layout the demo writes changes: old ones are rebuilt
TSDB = "tsdb"
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
    """A running demo backend: Prometheus (`prometheus`), the migrated `registry`, the org's `key`."""

    data_dir: Path
    scenario: Scenario
    prometheus: ServerHandle
    registry: Registry
    key: str
    executions: tuple[DemoExecution, ...]
    reused_tsdb: bool
    reused_key: bool

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
            prometheus_url=self.prometheus.url,
            database_url=self.database_url,
            data_dir=self.data_dir,
            scrape_interval=f"{self.scenario.scrape_interval_s}s",
            dcgm_host_label="auto",
            node_match="auto",
            metric_names={},
        )

    def stop(self) -> None:
        """Stop Prometheus and close the registry (idempotent)."""
        try:
            self.prometheus.stop()
        finally:
            self.registry.dispose()

    def __enter__(self) -> DemoEnv:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# -- the TSDB ----------------------------------------------------------------------------------------


def scenario_identity(scenario: Scenario) -> dict[str, Any]:
    """What the TSDB's content depends on; a manifest with other values means: rebuild."""
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


def _reusable_block_s(data_dir: Path, scenario: Scenario) -> int | None:
    """The block duration of an existing TSDB built for `scenario`, or None when it must be built."""
    try:
        manifest = json.loads((data_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict):
        return None
    block_s = manifest.pop("block_s", None)
    if manifest != scenario_identity(scenario) or block_s not in BLOCK_LADDER_S:
        return None
    tsdb = data_dir / TSDB
    if not any(p.is_dir() and (p / "meta.json").is_file() for p in tsdb.glob("*")):
        return None  # the manifest survived, the blocks did not
    assert isinstance(block_s, int)
    return block_s


def _build_tsdb(data_dir: Path, scenario: Scenario) -> int:
    """Generate and backfill into a staging directory, then swap it in and write the manifest."""
    tsdb, staging, spool = data_dir / TSDB, data_dir / f"{TSDB}.partial", data_dir / "openmetrics"
    (data_dir / MANIFEST).unlink(missing_ok=True)
    for path in (tsdb, staging, spool):
        shutil.rmtree(path, ignore_errors=True)
    block_s = backfill_dataset(generate(scenario), staging, spool)
    shutil.rmtree(spool, ignore_errors=True)
    staging.rename(tsdb)
    _write_atomic(data_dir / MANIFEST, json.dumps({**scenario_identity(scenario), "block_s": block_s}) + "\n")
    return block_s


def _write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have taken bits away; set exactly these
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _missing(names: Sequence[str]) -> list[str]:
    return [n for n in names if shutil.which(n) is None]


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
    """Build or reuse the TSDB, start Prometheus on it, register the executions, ensure the key.

    The caller owns the returned environment: `env.stop()` (or `with prepare(...) as env`) stops
    Prometheus. Raises DemoError for what the user can fix (missing binaries, Prometheus not starting).
    """
    scenario = scenario or default_scenario()
    data_dir = data_dir.expanduser().resolve()
    block_s = _reusable_block_s(data_dir, scenario)
    missing = _missing([PROMETHEUS] if block_s is not None else [PROMETHEUS, PROMTOOL])
    if missing:
        raise DemoError(
            f"the demo needs Prometheus ({' and '.join(f'`{m}`' for m in missing)} not found on PATH): "
            "run `make servers`, which installs it"
        )
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    reused = block_s is not None
    if block_s is None:
        hours = (scenario.end_s - scenario.start_s) / 3600
        _say(
            log,
            f"generating {hours:g} h of GPU history ({scenario.name} scenario) into {data_dir / TSDB} ...",
        )
        try:
            block_s = _build_tsdb(data_dir, scenario)
        except LoadError as exc:
            raise DemoError(f"loading the generated history failed: {_one_line(exc)}") from exc
    else:
        _say(log, f"reusing the generated GPU history in {data_dir / TSDB}")
    try:
        prometheus = start_prometheus(
            data_dir / TSDB, block_s=block_s, scrape_interval_s=scenario.scrape_interval_s
        )
    except LoadError as exc:
        raise DemoError(
            f"Prometheus did not start ({_one_line(exc)}); deleting {data_dir / MANIFEST} makes the demo "
            "rebuild its data"
        ) from exc
    try:
        registry, executions = _open_registry(data_dir, scenario)
        try:
            key, reused_key = _ensure_key(registry, data_dir / KEY_FILE)
        except BaseException:
            registry.dispose()
            raise
    except BaseException:
        prometheus.stop()
        raise
    return DemoEnv(data_dir, scenario, prometheus, registry, key, executions, reused, reused_key)


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
        f"({sc.start:%Y-%m-%d %H:%M} - {sc.end:%Y-%m-%d %H:%M} UTC), in Prometheus at {env.prometheus.url}",
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
        "Serving until Ctrl-C (which stops Prometheus too)."
        if serving
        else "Not serving (--no-serve): Prometheus stops now; run without --no-serve to try the commands.",
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

    app = create_app(env.settings(host, port), registry=env.registry)
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
        description="Load generated GPU history into a local Prometheus and serve gpulens over it.",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the demo keeps its TSDB, registry and key (default: $GPULENS_DATA_DIR/demo, "
        "i.e. ~/.local/share/gpulens/demo)",
    )
    p.add_argument("--host", default=None, help="bind address (default: $GPULENS_HOST or 127.0.0.1)")
    p.add_argument("--port", type=_port, default=None, help="port (default: $GPULENS_PORT or 8080)")
    p.add_argument(
        "--no-serve",
        action="store_true",
        help="set everything up, print how to use it, stop Prometheus and exit",
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
                print("gpulens demo: stopped (gpulens and Prometheus)", file=sys.stderr, flush=True)
        return 0
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    finally:
        if listener is not None:
            listener.close()


if __name__ == "__main__":
    sys.exit(main())
