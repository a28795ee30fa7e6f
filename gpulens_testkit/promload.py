"""Load a dataset into a private Prometheus (promtool backfill) or VictoriaMetrics (import API), stdlib only.

Servers listen on 127.0.0.1 on a free port with their own config and data directory; nothing here
reads /etc/prometheus. Retention is 10 years so a fixed past end (2026-01-01) stays queryable, and
Prometheus gets the backfill's block duration as its maximum so it never compacts mid-test.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

from gpulens.demo.scenario import Scenario
from gpulens_testkit.history import Dataset
from gpulens_testkit.k8s_generate import K8sDataset
from gpulens_testkit.k8s_scenario import K8sScenario
from gpulens_testkit.k8s_truth import K8sTruth
from gpulens_testkit.openmetrics import (
    BLOCK_LADDER_S,
    Exposable,
    block_seconds,
    format_block_duration,
    iter_blocks,
    iter_prometheus_ms_blocks,
    write_block,
)
from gpulens_testkit.truth import GroundTruth

PROMETHEUS = "prometheus"
PROMTOOL = "promtool"
VICTORIA_METRICS = "victoria-metrics"
RETENTION = "10y"


class MissingBinary(RuntimeError):
    """A server binary is not on PATH."""


class LoadError(RuntimeError):
    """A backfill, import or server start failed."""


def find_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise MissingBinary(
            f"`{name}` was not found on PATH (Debian: apt-get install --no-install-recommends "
            "prometheus victoria-metrics)"
        )
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# -- Prometheus -------------------------------------------------------------------------------------


def promtool_command(file: Path, tsdb_dir: Path, block_s: int, promtool: str | None = None) -> list[str]:
    return [
        promtool or find_binary(PROMTOOL),
        "tsdb",
        "create-blocks-from",
        "openmetrics",
        f"--max-block-duration={format_block_duration(block_s)}",
        "--quiet",
        str(file),
        str(tsdb_dir),
    ]


def _run_promtool(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)  # noqa: S603 - our argv
    if done.returncode != 0:
        raise LoadError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")


def backfill(files: Sequence[Path], tsdb_dir: Path, block_s: int, *, jobs: int = 2) -> None:
    """`promtool tsdb create-blocks-from openmetrics --max-block-duration=<block>` for each file.

    promtool exits 0 on out-of-order, duplicate or millisecond-timestamp input (it drops or misplaces
    the samples); only the writer's discipline (seconds, time-ordered, `# EOF`) prevents that.
    """
    if block_s not in BLOCK_LADDER_S:
        raise ValueError(f"block duration must be one of {BLOCK_LADDER_S} seconds")
    promtool = find_binary(PROMTOOL)
    tsdb_dir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for fut in [
            pool.submit(_run_promtool, promtool_command(f, tsdb_dir, block_s, promtool)) for f in files
        ]:
            fut.result()


def backfill_dataset(
    dataset: Exposable,
    tsdb_dir: Path,
    spool_dir: Path,
    *,
    block_s: int | None = None,
    jobs: int = 2,
    keep_files: bool = False,
) -> int:
    """Write and backfill block by block (at most `jobs` + 1 files on disk); returns the block duration.

    Generation (Python) overlaps with promtool (separate processes), so a month loads in one pass.
    """
    block_s = block_seconds(dataset, block_s)
    if block_s not in BLOCK_LADDER_S:  # promtool silently rounds other durations down
        raise ValueError(f"block duration must be one of {BLOCK_LADDER_S} seconds")
    promtool = find_binary(PROMTOOL)
    tsdb_dir.mkdir(parents=True, exist_ok=True)
    spool_dir.mkdir(parents=True, exist_ok=True)
    pending: deque[tuple[Future[None], Path]] = deque()

    def settle(fut: Future[None], path: Path) -> None:
        fut.result()
        if not keep_files:
            path.unlink(missing_ok=True)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        try:
            for block in iter_blocks(dataset, block_s):
                path = write_block(dataset, spool_dir, *block)
                pending.append(
                    (pool.submit(_run_promtool, promtool_command(path, tsdb_dir, block_s, promtool)), path)
                )
                while len(pending) > max(1, jobs):
                    settle(*pending.popleft())
            while pending:
                settle(*pending.popleft())
        finally:
            for fut, _ in pending:
                fut.cancel()
    return block_s


@dataclass
class ServerHandle:
    """A server process we started: its base `url`; `stop()` ends it (also on context exit)."""

    kind: str
    url: str
    process: subprocess.Popen[bytes]
    data_dir: Path
    log_path: Path
    _log: IO[bytes] | None = field(default=None, repr=False)

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _http_get(url: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - http://127.0.0.1 only
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def _wait_ready(handle: ServerHandle, path: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if handle.process.poll() is not None:
            handle.stop()
            raise LoadError(f"{handle.kind} exited with {handle.process.returncode}: {handle.log_tail()}")
        status, _ = _http_get(handle.url + path, timeout_s=1.0)
        if status == 200:
            return
        time.sleep(0.05)
    handle.stop()
    raise LoadError(f"{handle.kind} not ready at {handle.url}{path} after {timeout_s} s: {handle.log_tail()}")


def _spawn(
    kind: str, argv: list[str], url: str, data_dir: Path, log_path: Path, env: Mapping[str, str] | None = None
) -> ServerHandle:
    log = log_path.open("ab")
    proc = subprocess.Popen(  # noqa: S603 - our argv
        argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
    )
    return ServerHandle(kind, url, proc, data_dir, log_path, log)


def start_server(
    kind: str,
    argv_for: Callable[[int], list[str]],
    ready_path: str,
    data_dir: Path,
    log_path: Path,
    *,
    port: int | None = None,
    timeout_s: float = 60.0,
    env: Mapping[str, str] | None = None,
) -> ServerHandle:
    """`argv_for(port)` listening on 127.0.0.1:`port`, ready (`ready_path` answers 200) when this returns.

    Without a `port`, a free one is chosen and, should another process take it between probing and
    binding ("address already in use" in the log), another one, 3 tries in all. `env` None: ours.
    """
    last_error: LoadError | None = None
    for _ in range(3):
        chosen = port or free_port()
        handle = _spawn(kind, argv_for(chosen), f"http://127.0.0.1:{chosen}", data_dir, log_path, env)
        try:
            _wait_ready(handle, ready_path, timeout_s)
            return handle
        except LoadError as exc:
            last_error = exc
            if port is not None or "address already in use" not in str(exc).lower():
                raise
    assert last_error is not None
    raise last_error


def prometheus_config(scrape_interval_s: int) -> str:
    """A config that scrapes nothing (never /etc/prometheus/prometheus.yml: it scrapes live targets)."""
    every = f"{scrape_interval_s}s"
    return f"global:\n  scrape_interval: {every}\n  evaluation_interval: {every}\nscrape_configs: []\n"


def start_prometheus(
    tsdb_dir: Path,
    *,
    block_s: int,
    scrape_interval_s: int = 15,
    port: int | None = None,
    timeout_s: float = 60.0,
    extra_args: Sequence[str] = (),
) -> ServerHandle:
    """Prometheus on 127.0.0.1 over `tsdb_dir`, ready (`/-/ready`) when this returns.

    min/max block duration = 2h / the backfill's block: no compaction of the backfilled blocks.
    """
    binary = find_binary(PROMETHEUS)
    tsdb_dir.mkdir(parents=True, exist_ok=True)
    work = tsdb_dir.parent
    config = work / f"{tsdb_dir.name}-prometheus.yml"
    config.write_text(prometheus_config(scrape_interval_s))

    def argv(listen_port: int) -> list[str]:
        return [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tsdb_dir}",
            f"--storage.tsdb.retention.time={RETENTION}",
            f"--storage.tsdb.min-block-duration={format_block_duration(BLOCK_LADDER_S[0])}",
            f"--storage.tsdb.max-block-duration={format_block_duration(block_s)}",
            f"--web.listen-address=127.0.0.1:{listen_port}",
            "--log.level=warn",
            *extra_args,
        ]

    log_path = work / f"{tsdb_dir.name}-prometheus.log"
    return start_server("prometheus", argv, "/-/ready", tsdb_dir, log_path, port=port, timeout_s=timeout_s)


def load_prometheus(
    dataset: Exposable, workdir: Path, *, block_s: int | None = None, jobs: int = 2, keep_files: bool = False
) -> ServerHandle:
    """Generate, backfill and serve a dataset: the returned handle's `url` answers PromQL."""
    tsdb = workdir / "tsdb"
    block = backfill_dataset(
        dataset, tsdb, workdir / "openmetrics", block_s=block_s, jobs=jobs, keep_files=keep_files
    )
    return start_prometheus(tsdb, block_s=block, scrape_interval_s=dataset.scenario.scrape_interval_s)


@dataclass(frozen=True)
class LoadedDataset:
    """A running server holding a generated dataset, and what its answers must be (test fixtures)."""

    url: str
    truth: GroundTruth
    scenario: Scenario
    dataset: Dataset
    backend: str  # "prometheus" or "victoriametrics"
    handle: ServerHandle

    def stop(self) -> None:
        self.handle.stop()


@dataclass(frozen=True)
class LoadedK8sDataset:
    """A running server holding the generated `k8s` scenario, and its Run:ai truth (test fixtures)."""

    url: str
    truth: K8sTruth
    scenario: K8sScenario
    dataset: K8sDataset
    backend: str  # "prometheus" or "victoriametrics"
    handle: ServerHandle

    def stop(self) -> None:
        self.handle.stop()


# -- VictoriaMetrics --------------------------------------------------------------------------------


def start_victoria_metrics(
    data_dir: Path, *, port: int | None = None, timeout_s: float = 60.0, extra_args: Sequence[str] = ()
) -> ServerHandle:
    """VictoriaMetrics on 127.0.0.1 with 10 y retention (its default, 1 month from now, drops old rows)."""
    binary = find_binary(VICTORIA_METRICS)
    data_dir.mkdir(parents=True, exist_ok=True)

    def argv(listen_port: int) -> list[str]:
        return [
            binary,
            f"-storageDataPath={data_dir}",
            f"-retentionPeriod={RETENTION}",
            f"-httpListenAddr=127.0.0.1:{listen_port}",
            "-loggerLevel=WARN",
            *extra_args,
        ]

    log_path = data_dir.parent / f"{data_dir.name}-vm.log"
    return start_server(
        "victoria-metrics", argv, "/health", data_dir, log_path, port=port, timeout_s=timeout_s
    )


def vm_import(url: str, chunks: Iterable[bytes], timeout_s: float = 600.0) -> None:
    """POST Prometheus text (ms timestamps) to `/api/v1/import/prometheus`, chunked."""
    req = urllib.request.Request(  # noqa: S310 - http://127.0.0.1 only
        url.rstrip("/") + "/api/v1/import/prometheus",
        data=iter(chunks),
        method="POST",
        headers={"Content-Type": "text/plain", "Transfer-Encoding": "chunked"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
            if resp.status not in (200, 204):
                raise LoadError(f"import answered {resp.status}: {resp.read()[:2000]!r}")
    except urllib.error.HTTPError as exc:
        raise LoadError(f"import answered {exc.code}: {exc.read()[:2000]!r}") from exc


def vm_force_flush(url: str) -> None:
    """Make imported rows searchable now (otherwise after ~1 s)."""
    status, body = _http_get(url.rstrip("/") + "/internal/force_flush", timeout_s=60.0)
    if status != 200:
        raise LoadError(f"force_flush answered {status}: {body[:2000]!r}")


def vm_import_dataset(url: str, dataset: Exposable, *, block_s: int | None = None) -> None:
    """Import every sample, one request per block window, then flush."""
    for block in iter_prometheus_ms_blocks(dataset, block_s):
        vm_import(url, block)
    vm_force_flush(url)


def load_victoria_metrics(dataset: Exposable, workdir: Path, *, block_s: int | None = None) -> ServerHandle:
    """Start VictoriaMetrics in `workdir` and import a dataset: the handle's `url` answers PromQL."""
    handle = start_victoria_metrics(workdir / "vmdata")
    try:
        vm_import_dataset(handle.url, dataset, block_s=block_s)
    except BaseException:
        handle.stop()
        raise
    return handle


__all__ = [
    "LoadError",
    "LoadedDataset",
    "LoadedK8sDataset",
    "MissingBinary",
    "ServerHandle",
    "backfill",
    "backfill_dataset",
    "find_binary",
    "load_prometheus",
    "load_victoria_metrics",
    "start_prometheus",
    "start_server",
    "start_victoria_metrics",
    "vm_force_flush",
    "vm_import",
    "vm_import_dataset",
]
