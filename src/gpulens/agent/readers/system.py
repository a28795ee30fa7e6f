"""Host readings through psutil, named as node-exporter names them (domain/catalog.py).

CPU is exposed as node-exporter's per-CPU, per-mode counters `node_cpu_seconds_total{cpu,mode}` (not a
CPU-% gauge): Prometheus and the planner compute busy % over any window from them
(`100 * (1 - sum(rate(…{mode="idle"}[w])) / sum(rate(…[w])))`), and a sink that stores them keeps
the window choice for query time. On Linux psutil's `user` includes guest time, as /proc/stat and
node-exporter do.
"""

from __future__ import annotations

import platform
from typing import Any

import psutil

from gpulens.agent.samples import Labels, Sample
from gpulens.domain import catalog as c

# node-exporter's modes (collector/cpu_linux.go), in its (alphabetical) output order; a platform
# without one (macOS has no iowait) simply lacks that series.
CPU_MODES: tuple[str, ...] = ("idle", "iowait", "irq", "nice", "softirq", "steal", "system", "user")


def uname_labels(hostname: str) -> Labels:
    """node_uname_info's labels (collector/uname.go), `nodename` = the agent's host name.

    The nodename is the same string as the DCGM `Hostname` label, so the planner's
    node_uname_info{nodename=...} join finds this agent's node series.
    """
    u = platform.uname()
    return (
        ("machine", u.machine),
        (c.LABEL_NODENAME, hostname),
        ("release", u.release),
        ("sysname", u.system),
        ("version", u.version),
    )


class SystemReader:
    """CPU seconds per CPU and mode, MemTotal / MemAvailable, and node_uname_info, once per pass."""

    name = "system"

    def __init__(self, hostname: str, *, ps: Any = psutil) -> None:
        self._ps = ps  # injectable for tests
        self._uname = uname_labels(hostname)
        self._cpu_labels: dict[tuple[int, str], Labels] = {}

    def _cpu(self, cpu: int, mode: str) -> Labels:
        labels = self._cpu_labels.get((cpu, mode))
        if labels is None:
            labels = self._cpu_labels[(cpu, mode)] = ((c.LABEL_CPU, str(cpu)), (c.LABEL_CPU_MODE, mode))
        return labels

    def read(self, now_ms: int) -> list[Sample]:
        out: list[Sample] = []
        for cpu, times in enumerate(self._ps.cpu_times(percpu=True)):
            for mode in CPU_MODES:
                value = getattr(times, mode, None)
                if value is not None:
                    out.append(Sample(c.NODE_CPU_SECONDS, self._cpu(cpu, mode), float(value), now_ms))
        mem = self._ps.virtual_memory()
        out.append(Sample(c.NODE_MEM_TOTAL, (), float(mem.total), now_ms))
        out.append(Sample(c.NODE_MEM_AVAILABLE, (), float(mem.available), now_ms))
        out.append(Sample(c.NODE_UNAME_INFO, self._uname, 1.0, now_ms))
        return out

    def close(self) -> None:
        return None
