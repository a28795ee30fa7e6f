"""A throwaway Slurm for the tests: munged, slurmctld, slurmd and slurmrestd (JWT auth) from Debian's
packages, all in a temp directory, with GPUs declared as GRES over empty stand-in device files. Two
nodes, two slurmd on this host: `gpunode1` (eight GPUs, partition `gpu`, the default) and `gpunode2`
(four GPUs), which only partition `multi` holds (multi-node and heterogeneous jobs).

Started as root (slurmctld and slurmd need it); slurmrestd runs as `nobody` on 127.0.0.1. Nothing
outside the temp directory is touched: munged gets its own key and socket, the daemons their own
ports, state and spool directories. `SLURM_CONF` in `LocalSlurm.env()` points the client commands
(sbatch, squeue, scontrol) at it.

`Prolog`, `Epilog` and `EpilogSlurmctld` are wrappers in the temp directory that run
`hooks/<name>` there when a test has put one in place (`install_hook`), so one session-wide Slurm
serves the tests with and without hooks.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpulens_testkit.promload import free_port

CLUSTER = "gpulens-test"
NODE = "gpunode1"
NODE2 = "gpunode2"  # only in partition MULTI (multi-node and heterogeneous jobs)
MULTI = "multi"
GPUS2 = 4
PARTITION = "gpu"
GPU_TYPE = "h100"
GPUS = 8
CPUS = 16
BINARIES = ("munged", "slurmctld", "slurmd", "slurmrestd", "sbatch", "squeue", "scontrol", "scancel")
HOOKS = ("prolog", "epilog", "epilog_slurmctld")


class SlurmUnavailable(Exception):
    pass


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None]


@dataclass
class LocalSlurm:
    root: Path
    conf: Path
    rest_url: str
    cluster: str = CLUSTER
    node: str = NODE
    node2: str = NODE2  # a second node, only in partition `multi`
    multi: str = MULTI
    partition: str = PARTITION
    gpu_type: str = GPU_TYPE
    gpus: int = GPUS
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf), **(extra or {})}

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(  # noqa: S603 - Slurm's own commands, no shell
            list(argv), capture_output=True, text=True, env=self.env(), check=False, timeout=timeout
        )
        if check and done.returncode != 0:
            raise SlurmUnavailable(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def token(self, user: str = "root", lifespan_s: int = 3600) -> str:
        """A JWT for slurmrestd (`scontrol token`)."""
        out = self.run("scontrol", "token", f"username={user}", f"lifespan={lifespan_s}").stdout
        for line in out.splitlines():
            if line.startswith("SLURM_JWT="):
                return line.split("=", 1)[1].strip()
        raise SlurmUnavailable(f"scontrol token printed no SLURM_JWT: {out!r}")

    def sbatch(self, *options: str, script: str = "true") -> int:
        """Submits `script` (shell text) with `options`; returns the job id (an array's parent id)."""
        body = f"#!/bin/sh\n{script}\n"
        out = self.run(
            "sbatch", "--parsable", "--output=/dev/null", "--chdir=/tmp", *options, "--wrap", body
        ).stdout
        return int(out.strip().split(";")[0].split("_")[0])

    def gate(self, name: str) -> tuple[Path, str]:
        """(file, shell line): jobs running the line wait until the file exists (any job user can see it)."""
        path = self.root / "gates" / name
        path.parent.mkdir(mode=0o755, exist_ok=True)
        return path, f"while [ ! -e {path} ]; do sleep 0.1; done"

    def job_gres(self, job_id: int) -> dict[str, str]:
        """node -> `GRES=` of `scontrol -d show job` (e.g. "gpu:h100:2(IDX:0-1)"): the allocation as
        the text interface shows it, while the job runs."""
        out = self.run("scontrol", "-d", "show", "job", str(job_id)).stdout
        found: dict[str, str] = {}
        mine = False
        for line in out.splitlines():  # an array's id shows every task: read this job's block only
            if line.startswith("JobId="):
                mine = line.split()[0] == f"JobId={job_id}"
            if not mine:
                continue
            parts = dict(p.split("=", 1) for p in line.split() if "=" in p)
            if "Nodes" in parts and "GRES" in parts and "CPU_IDs" in parts:
                for node in self.hostnames(parts["Nodes"]):  # nodes alike share a line: gpunode[1-2]
                    found[node] = parts["GRES"]
        return found

    def hostnames(self, hostlist: str) -> list[str]:
        return self.run("scontrol", "show", "hostnames", hostlist).stdout.split()

    def wait_running(self, job_ids: Sequence[int], timeout_s: float = 60) -> list[dict[str, Any]]:
        """Waits until every job (array tasks included) of `job_ids` runs; returns their records."""
        wanted = set(job_ids)
        deadline = time.monotonic() + timeout_s
        while True:
            mine = [j for j in self.jobs() if j.get("job_id") in wanted or j.get("array_job_id") in wanted]
            if mine and all(_state(j) == "RUNNING" for j in mine):
                return mine
            if time.monotonic() > deadline:
                raise SlurmUnavailable(f"jobs {sorted(wanted)} not all running after {timeout_s} s")
            time.sleep(0.1)

    def jobs(self) -> list[dict[str, Any]]:
        """`squeue --json`'s jobs (every state slurmctld still holds)."""
        out = self.run("squeue", "--json", "--states=all").stdout
        jobs: list[dict[str, Any]] = json.loads(out)["jobs"]
        return jobs

    def wait_ended(self, job_ids: Sequence[int], timeout_s: float = 60) -> list[dict[str, Any]]:
        """Waits until every job (and every array task) of `job_ids` has ended; returns their records."""
        wanted = set(job_ids)
        deadline = time.monotonic() + timeout_s
        while True:
            mine = [j for j in self.jobs() if j.get("job_id") in wanted or j.get("array_job_id") in wanted]
            states = [_state(j) for j in mine]
            pending_array = any(
                j.get("job_id") in wanted and j.get("array_task_string") not in (None, "") for j in mine
            )
            if mine and not pending_array and all(s not in ACTIVE_STATES for s in states):
                return mine
            if time.monotonic() > deadline:
                raise SlurmUnavailable(f"jobs {sorted(wanted)} still active after {timeout_s} s: {states}")
            time.sleep(0.2)

    def install_hook(self, name: str, path: Path | None) -> None:
        """Runs `path` as the Prolog/Epilog/EpilogSlurmctld from now on (None: none)."""
        if name not in HOOKS:
            raise ValueError(f"hook must be one of {HOOKS}")
        target = self.root / "hooks" / name
        target.unlink(missing_ok=True)
        if path is not None:
            target.symlink_to(path)

    def stop(self) -> None:
        """Cancels what still runs, waits for the queue to empty, stops the daemons, removes the directory."""
        if self.procs.get("slurmctld") is not None and self.procs["slurmctld"].poll() is None:
            self.run("scancel", "--full", f"--partition={self.partition}", check=False, timeout=10)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    if all(_state(j) not in ACTIVE_STATES for j in self.jobs()):
                        break
                except (SlurmUnavailable, ValueError, subprocess.TimeoutExpired):
                    break
                time.sleep(0.2)
        for name in ("slurmrestd", f"slurmd-{NODE}", f"slurmd-{NODE2}", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        shutil.rmtree(self.root, ignore_errors=True)

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


ACTIVE_STATES = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED"})


def _state(job: Mapping[str, Any]) -> str:
    state = job.get("job_state")
    if isinstance(state, list):
        return str(state[0]) if state else ""
    return str(state or "")


HOOK_WRAPPER = """#!/bin/sh
# runs the test's hook when one is installed (LocalSlurm.install_hook)
[ -x {hook} ] && exec {hook}
exit 0
"""


def _conf(root: Path, ctld_port: int, slurmd_port: int, slurmd_port2: int) -> str:
    return f"""# written by gpulens_testkit.slurm
ClusterName={CLUSTER}
SlurmctldHost={socket.gethostname()}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.socket
CredType=cred/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key={root}/jwt.key
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
MaxJobCount=10000
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SchedulerParameters=sched_interval=1,bf_interval=1
PrologFlags=Alloc
Prolog={root}/wrap/prolog
Epilog={root}/wrap/epilog
EpilogSlurmctld={root}/wrap/epilog_slurmctld
NodeName={NODE} NodeAddr=127.0.0.1 Port={slurmd_port} CPUs={CPUS} Gres=gpu:{GPU_TYPE}:{GPUS} State=UNKNOWN
NodeName={NODE2} NodeAddr=127.0.0.1 Port={slurmd_port2} CPUs={CPUS} Gres=gpu:{GPU_TYPE}:{GPUS2} State=UNKNOWN
PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
PartitionName={MULTI} Nodes={NODE},{NODE2} MaxTime=INFINITE State=UP
"""


def _spawn(
    root: Path, name: str, argv: list[str], env: Mapping[str, str], **kw: Any
) -> subprocess.Popen[bytes]:
    out = (root / f"{name}.out").open("wb")
    return subprocess.Popen(  # noqa: S603 - Debian's daemons, no shell
        argv, stdout=out, stderr=subprocess.STDOUT, env=dict(env), start_new_session=True, **kw
    )


def _wait(what: str, ready: Any, procs: Mapping[str, subprocess.Popen[bytes]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise SlurmUnavailable(f"{name} exited ({proc.returncode}) while waiting for {what}")
        if ready():
            return
        time.sleep(0.05)
    raise SlurmUnavailable(f"{what} not ready within {timeout_s} s")


def start_slurm(timeout_s: float = 30) -> LocalSlurm:
    """munged, slurmctld, slurmd and slurmrestd in a fresh temp directory; `stop()` removes it."""
    missing = missing_binaries()
    if missing:
        raise SlurmUnavailable(f"not on PATH: {', '.join(missing)} (make servers installs them)")
    if os.geteuid() != 0:
        raise SlurmUnavailable("slurmctld and slurmd of the test Slurm must start as root")
    root = Path(tempfile.mkdtemp(prefix="gpulens-slurm-"))
    root.chmod(0o755)  # slurmrestd (nobody) reads slurm.conf
    for sub in ("munge", "state", "spool", "dev", "hooks", "wrap"):
        (root / sub).mkdir(mode=0o755)
    key = root / "munge" / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    jwt = root / "jwt.key"
    jwt.write_bytes(secrets.token_bytes(32))
    jwt.chmod(0o400)
    for node, count in ((NODE, GPUS), (NODE2, GPUS2)):
        (root / "dev" / node).mkdir()
        (root / "spool" / node).mkdir()
        for k in range(count):
            (root / "dev" / node / f"nvidia{k}").touch()
    for hook in HOOKS:
        wrapper = root / "wrap" / hook
        wrapper.write_text(HOOK_WRAPPER.format(hook=root / "hooks" / hook))
        wrapper.chmod(0o755)
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, free_port(), free_port(), free_port()))
    (root / "gres.conf").write_text(
        f"NodeName={NODE} Name=gpu Type={GPU_TYPE} File={root}/dev/{NODE}/nvidia[0-{GPUS - 1}]\n"
        f"NodeName={NODE2} Name=gpu Type={GPU_TYPE} File={root}/dev/{NODE2}/nvidia[0-{GPUS2 - 1}]\n"
    )
    rest_port = free_port()
    slurm = LocalSlurm(root, conf, f"http://127.0.0.1:{rest_port}")
    env = slurm.env()
    try:
        sock = root / "munge" / "munge.socket"
        slurm.procs["munged"] = _spawn(
            root,
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={sock}",
                f"--pid-file={root}/munge/munged.pid",
                f"--log-file={root}/munged.log",
                f"--seed-file={root}/munge/munged.seed",
            ],
            env,
        )
        _wait("munged", sock.exists, slurm.procs, timeout_s)
        slurm.procs["slurmctld"] = _spawn(root, "slurmctld", ["slurmctld", "-D", "-i", "-f", str(conf)], env)
        _wait(
            "slurmctld",
            lambda: slurm.run("scontrol", "ping", check=False, timeout=5).stdout.count("UP") > 0,
            slurm.procs,
            timeout_s,
        )
        for node in (NODE, NODE2):  # two slurmd on this host, one a node (their own ports and spools)
            slurm.procs[f"slurmd-{node}"] = _spawn(
                root, f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(conf)], env
            )

        def node_idle() -> bool:
            out = slurm.run("sinfo", "-h", "-N", "-o", "%N %T", check=False, timeout=5).stdout
            states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
            return all(states.get(n, "").startswith("idle") for n in (NODE, NODE2))

        _wait("slurmd (node idle)", node_idle, slurm.procs, timeout_s)
        nobody = pwd.getpwnam("nobody")
        slurm.procs["slurmrestd"] = _spawn(
            root,
            "slurmrestd",
            [
                "slurmrestd",
                "-f",
                str(conf),
                "-a",
                "rest_auth/jwt",
                "-s",
                "openapi/v0.0.38",
                "-u",
                str(nobody.pw_uid),
                "-g",
                str(nobody.pw_gid),
                f"127.0.0.1:{rest_port}",
            ],
            {**env, "SLURM_JWT": "daemon"},
        )
        _wait("slurmrestd", lambda: _listening(rest_port), slurm.procs, timeout_s)
    except BaseException as exc:
        logs = {
            n: slurm.log(n) or (root / f"{n}.out").read_text(errors="replace")[-2000:] for n in slurm.procs
        }
        slurm.stop()
        if isinstance(exc, SlurmUnavailable):
            raise SlurmUnavailable(f"{exc}; logs: {logs}") from None
        raise
    return slurm


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


# -- dcgm-exporter series of the node's GPUs in a Prometheus --------------------------------------------

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"


def gpu_util_openmetrics(
    node: str,
    utilization: Mapping[int, float],
    start_s: int,
    end_s: int,
    step_s: int = 1,
    hpc_jobs: Mapping[int, str] | None = None,
    lifetimes: Mapping[int, tuple[int, int]] | None = None,
    outside: float = 0.25,
) -> str:
    """DCGM_FI_DEV_GPU_UTIL of `node`'s GPUs (index -> constant percent) every `step_s` over
    [start_s, end_s], as dcgm-exporter labels them on a Slurm node (Hostname, no pod labels; with
    `hpc_jobs` index -> job id, the `hpc_job` label of --hpc-job-mapping-dir). With `lifetimes`
    (index -> [first, last] second of the job that holds it), a GPU reads `outside` out of its job's
    lifetime, as another job (or none) would use it."""
    lines = [f"# TYPE {GPU_UTIL} gauge"]
    for t in range(start_s, end_s + 1, step_s):
        for gpu, busy in sorted(utilization.items()):
            life = None if lifetimes is None else lifetimes.get(gpu)
            value = busy if life is None or life[0] <= t <= life[1] else outside
            labels = (
                f'gpu="{gpu}",UUID="GPU-00000000-0000-0000-0000-{gpu:012d}",device="nvidia{gpu}",'
                f'modelName="NVIDIA H100 80GB HBM3",Hostname="{node}"'
            )
            if hpc_jobs and gpu in hpc_jobs:
                labels += f',hpc_job="{hpc_jobs[gpu]}"'
            lines.append(f"{GPU_UTIL}{{{labels}}} {value} {t}")
    return "\n".join(lines) + "\n# EOF\n"


def prometheus_with(text: str, workdir: Path) -> Any:
    """A Prometheus (promload's) over a TSDB backfilled from OpenMetrics `text`; `.url`, `.stop()`."""
    from gpulens_testkit.openmetrics import BLOCK_LADDER_S
    from gpulens_testkit.promload import backfill, start_prometheus

    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / "series.om"
    source.write_text(text)
    block = BLOCK_LADDER_S[0]
    backfill([source], workdir / "tsdb", block)
    return start_prometheus(workdir / "tsdb", block_s=block, scrape_interval_s=1)
