"""Host readings: node-exporter names and labels from psutil."""

from __future__ import annotations

import types

from gpulens.agent.readers.system import CPU_MODES, SystemReader
from gpulens.domain import catalog as c

NOW = 1_767_225_600_000


class FakePsutil:
    def __init__(self) -> None:
        self.cpu = [
            types.SimpleNamespace(
                user=10.5,
                nice=0.0,
                system=2.0,
                idle=100.0,
                iowait=1.0,
                irq=0.0,
                softirq=0.1,
                steal=0.0,
                guest=0.0,
                guest_nice=0.0,
            ),
            types.SimpleNamespace(user=1.0, nice=0.0, system=0.5, idle=120.0),  # a platform without iowait
        ]

    def cpu_times(self, percpu: bool = False) -> list[types.SimpleNamespace]:
        assert percpu
        return self.cpu

    def virtual_memory(self) -> types.SimpleNamespace:
        return types.SimpleNamespace(total=3_831_959_552, available=1_584_373_760)


def test_node_exporter_series_from_psutil() -> None:
    samples = SystemReader("gpu-node-1", ps=FakePsutil()).read(NOW)
    cpu = [s for s in samples if s.name == c.NODE_CPU_SECONDS]
    assert [(s.label("cpu"), s.label("mode")) for s in cpu[:8]] == [("0", m) for m in CPU_MODES]
    assert [s.label("mode") for s in cpu[8:]] == ["idle", "nice", "system", "user"]  # absent modes left out
    idle0 = next(s for s in cpu if s.labels == (("cpu", "0"), ("mode", "idle")))
    assert idle0.value == 100.0
    mem = {s.name: s.value for s in samples if not s.labels}
    assert mem == {c.NODE_MEM_TOTAL: 3_831_959_552, c.NODE_MEM_AVAILABLE: 1_584_373_760}
    uname = [s for s in samples if s.name == c.NODE_UNAME_INFO]
    assert len(uname) == 1 and uname[0].value == 1 and uname[0].label(c.LABEL_NODENAME) == "gpu-node-1"
    assert all(s.timestamp_ms == NOW for s in samples)


def test_real_psutil_on_this_host() -> None:
    reader = SystemReader("h")
    a = {(s.name, s.labels): s.value for s in reader.read(NOW)}
    b = {(s.name, s.labels): s.value for s in reader.read(NOW + 1000)}
    idle = [k for k in a if k[0] == c.NODE_CPU_SECONDS and ("mode", "idle") in k[1]]
    assert idle and all(b[k] >= a[k] for k in idle)  # counters
    assert a[(c.NODE_MEM_TOTAL, ())] >= a[(c.NODE_MEM_AVAILABLE, ())] > 0
