"""The synthetic exporter history: determinism, exporter-exact labels, OpenMetrics files, value model."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpulens.demo.history import CPU_MODES, TICKS_PER_SECOND, Field, generate
from gpulens.demo.scenario import (
    DEFAULT_END_S,
    ExecutionSpec,
    Phase,
    PhaseKind,
    Scenario,
    default_scenario,
)
from gpulens.domain import catalog as c
from gpulens_testkit.__main__ import main
from gpulens_testkit.openmetrics import (
    BLOCK_LADDER_S,
    block_windows,
    choose_block_seconds,
    iter_text,
    write_openmetrics,
)
from gpulens_testkit.scenarios import bench_scenario

SC = default_scenario()
DS = generate(SC)
LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\}) (\S+) (\d+)$")


def k_of(t_s: int) -> int:
    return (t_s - SC.start_s) // SC.scrape_interval_s


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    a = write_openmetrics(generate(default_scenario(seed=3)), tmp_path / "a")
    b = write_openmetrics(generate(default_scenario(seed=3)), tmp_path / "b")
    other = write_openmetrics(generate(default_scenario(seed=4)), tmp_path / "c")
    assert [p.name for p in a] == [p.name for p in b]
    assert all(pa.read_bytes() == pb.read_bytes() for pa, pb in zip(a, b, strict=True))
    assert a[0].read_bytes() != other[0].read_bytes()


def test_default_scenario_shape() -> None:
    assert SC.end_s == DEFAULT_END_S == 1767225600  # 2026-01-01T00:00:00Z
    assert SC.end_s - SC.start_s == 3 * 3600
    assert [h.hostname for h in SC.hosts] == ["gpu-node-1", "gpu-node-2", "cpu-node-1"]
    node1, node2, cpu1 = SC.hosts
    assert (len(node1.gpus), node1.host_label, node1.node_found_by_uname_only) == (8, "Hostname", False)
    assert (len(node2.gpus), node2.host_label, node2.node_found_by_uname_only) == (2, "hostname", True)
    assert node2.pcie_kbps and node2.power_limit_series == c.DCGM_POWER_MGMT_LIMIT
    assert cpu1.gpu_model is None and not cpu1.gpus
    assert {e.name for e in SC.executions} == {"healthy", "throttled", "oom", "input-bound", "cpu-only"}
    assert SC.gpus_of(SC.execution("healthy")) == (0, 3)
    assert SC.gpus_of(SC.execution("oom")) == (0, 1)  # empty list = every GPU of the host
    assert len({g.uuid for h in SC.hosts for g in h.gpus}) == 10
    assert default_scenario(seed=7).hosts[0].gpus == default_scenario(seed=7).hosts[0].gpus


def test_dcgm_labels_are_exporter_exact() -> None:
    s = DS.gpu_series("gpu-node-1", Field.GPU_UTIL, (3,))[0]
    gpu = SC.hosts[0].gpus[3]
    assert s.name == c.DCGM_GPU_UTIL
    assert s.labels == (
        ("gpu", "3"),
        ("UUID", gpu.uuid),
        ("pci_bus_id", gpu.pci_bus_id),
        ("device", "nvidia3"),
        ("modelName", "NVIDIA H100 80GB HBM3"),
        ("Hostname", "gpu-node-1"),
        ("DCGM_FI_DRIVER_VERSION", "580.105.08"),
        ("instance", "gpu-node-1:9400"),
        ("job", "dcgm"),
    )
    assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", gpu.uuid)
    lower = DS.gpu_series("gpu-node-2", Field.GPU_UTIL)[0].label_dict()
    assert lower["hostname"] == "gpu-node-2" and "Hostname" not in lower


def test_host_flavours_pick_series_names() -> None:
    names = {
        h: {s.name for s in DS.series if s.hostname == h} for h in ("gpu-node-1", "gpu-node-2", "cpu-node-1")
    }
    assert {c.DCGM_ENFORCED_POWER_LIMIT, c.DCGM_PCIE_RX_BYTES, c.DCGM_PCIE_TX_BYTES} <= names["gpu-node-1"]
    assert not {c.DCGM_POWER_MGMT_LIMIT, c.DCGM_PCIE_RX_THROUGHPUT} & names["gpu-node-1"]
    assert {c.DCGM_POWER_MGMT_LIMIT, c.DCGM_PCIE_RX_THROUGHPUT, c.DCGM_PCIE_TX_THROUGHPUT} <= names[
        "gpu-node-2"
    ]
    assert not {c.DCGM_ENFORCED_POWER_LIMIT, c.DCGM_PCIE_RX_BYTES} & names["gpu-node-2"]
    assert names["cpu-node-1"] == {
        c.NODE_MEM_TOTAL,
        c.NODE_MEM_AVAILABLE,
        c.NODE_CPU_SECONDS,
        c.NODE_UNAME_INFO,
    }
    assert all(dict(s.labels).keys() >= {"instance", "job"} for s in DS.series)


def test_node_exporter_series() -> None:
    uname = DS.series_of("gpu-node-2", Field.UNAME)[0].label_dict()
    assert uname["nodename"] == "gpu-node-2" and uname["instance"] == "10.0.0.5:9100"
    assert {"sysname", "release", "machine"} <= uname.keys() and uname["job"] == "node"
    cpus = DS.series_of("gpu-node-1", Field.CPU_SECONDS)
    assert len(cpus) == 8 * len(CPU_MODES)
    assert {s.mode for s in cpus} == {"idle", "iowait", "user", "system"}
    assert all(s.metric_type == "counter" for s in cpus)


def test_values_slices_agree_with_single_samples() -> None:
    for s in DS.series[::7]:
        assert DS.values(s, 100, 260) == [DS.value_at(s, k) for k in range(100, 260)]
    assert len(DS.values(DS.series[0])) == SC.sample_count == 721


def test_fb_used_plus_free_is_constant() -> None:
    for host in SC.hosts[:2]:
        assert host.gpu_model is not None
        cap = host.gpu_model.fb_capacity_mib
        for used, free in zip(
            DS.series_of(host.hostname, Field.FB_USED),
            DS.series_of(host.hostname, Field.FB_FREE),
            strict=True,
        ):
            assert {u + f for u, f in zip(DS.values(used), DS.values(free), strict=True)} == {cap}


def test_oom_fills_the_frame_buffer_then_the_execution_ends() -> None:
    oom = SC.execution("oom")
    free = DS.gpu_series("gpu-node-2", Field.FB_FREE)
    end = k_of(oom.end_s)
    last_phase = oom.spans()[-1]
    assert last_phase.phase.kind is PhaseKind.OOM
    climb = DS.values(free[0], k_of(last_phase.start_s) + 1, end + 1)
    assert climb == sorted(climb, reverse=True) and climb[-1] == 0
    assert all(DS.value_at(s, end) == 0 for s in free)
    assert all(DS.value_at(s, end + 1) > 0 for s in free)  # memory released once it is gone


def test_phase_signatures_and_unowned_gpus() -> None:
    healthy = SC.execution("healthy")
    steady = next(s for s in healthy.spans() if s.phase.kind is PhaseKind.STEADY)
    k = k_of(steady.start_s) + 40
    util = {s.gpu: DS.value_at(s, k) for s in DS.series_of("gpu-node-1", Field.GPU_UTIL)}
    fb = {s.gpu: DS.value_at(s, k) for s in DS.series_of("gpu-node-1", Field.FB_USED)}
    sm = {s.gpu: DS.value_at(s, k) for s in DS.series_of("gpu-node-1", Field.SM_CLOCK)}
    assert 90 <= util[0] <= 98 and 90 <= util[3] <= 98
    assert util[1] == util[2] == 0 and fb[1] == fb[2] == 0  # unowned GPUs idle, empty
    assert sm[0] == 1980 and sm[1] == 345
    throttle = next(s for s in SC.execution("throttled").spans() if s.phase.kind is PhaseKind.THROTTLE)
    k = k_of(throttle.end_s)
    power = [DS.value_at(s, k) for s in DS.gpu_series("gpu-node-1", Field.POWER, (4, 5, 6, 7))]
    temp = [DS.value_at(s, k) for s in DS.gpu_series("gpu-node-1", Field.GPU_TEMP, (4, 5, 6, 7))]
    assert all(699 <= p <= 700 for p in power) and all(86 <= t <= 88 for t in temp)
    assert DS.gpu_phase_at("gpu-node-1", 4, k) is not None
    assert DS.gpu_phase_at("gpu-node-1", 1, k) is None


def test_cpu_counters_grow_by_the_phase_percentage() -> None:
    stall = next(s for s in SC.execution("input-bound").spans() if s.phase.kind is PhaseKind.INPUT_STALL)
    k = k_of(stall.start_s) + 20
    assert DS.cpu_percent_at("gpu-node-2", k) == 90  # host base 5 + input stall 85
    for s in DS.series_of("gpu-node-2", Field.CPU_SECONDS):
        a, b = DS.value_at(s, k - 1), DS.value_at(s, k)
        ticks = round((b - a) * TICKS_PER_SECOND)
        if s.mode == "idle":
            assert ticks == SC.scrape_interval_s * (100 - 90)
        assert ticks >= 0
    total = sum(
        round((DS.value_at(s, k) - DS.value_at(s, k - 1)) * 100)
        for s in DS.series_of("gpu-node-2", Field.CPU_SECONDS)
        if s.cpu == 0
    )
    assert total == SC.scrape_interval_s * TICKS_PER_SECOND


def test_openmetrics_files(tmp_path: Path) -> None:
    paths = write_openmetrics(DS, tmp_path)
    block = choose_block_seconds(SC.end_s - SC.start_s)
    assert block in BLOCK_LADDER_S
    windows = block_windows(DS, block)
    assert [p.name for p in paths] == [f"default-{w0}.om" for w0, _ in windows]
    total = 0
    for path, (w0, w1) in zip(paths, windows, strict=True):
        text = path.read_text()
        assert text.endswith("\n# EOF\n") and text.count("# EOF") == 1
        last: dict[str, int] = {}
        declared: set[str] = set()
        for line in text.splitlines()[:-1]:
            if line.startswith("# TYPE "):
                _, _, family, kind = line.split(" ")
                assert kind in ("gauge", "counter") and family not in declared
                assert not (kind == "counter" and family.endswith("_total"))
                declared.add(family)
                continue
            m = LINE.match(line)
            assert m, line
            name, labels, value, ts = m.groups()
            assert name in declared or name.removesuffix("_total") in declared
            t = int(ts)  # whole seconds, inside the file's epoch-aligned window
            assert w0 <= t < w1 and SC.start_s <= t <= SC.end_s
            float(value)
            key = name + labels
            assert t > last.get(key, -1)  # per-series time order
            last[key] = t
            total += 1
    assert total == len(DS.series) * SC.sample_count


def test_millisecond_text_for_victoria_metrics() -> None:
    text = "".join(iter_text(DS, 0, 2, millis=True, openmetrics=False))
    assert "# EOF" not in text
    stamps = {int(line.rsplit(" ", 1)[1]) for line in text.splitlines() if not line.startswith("#")}
    assert stamps == {SC.start_s * 1000, (SC.start_s + 15) * 1000}


def test_scenario_validation() -> None:
    host = SC.hosts[0]
    a = ExecutionSpec("a", "a", host.hostname, (0,), SC.start_s, (Phase(PhaseKind.STEADY, 600),))
    b = ExecutionSpec("b", "b", host.hostname, (0, 1), SC.start_s + 300, (Phase(PhaseKind.STEADY, 600),))
    with pytest.raises(ValueError, match="overlap"):
        Scenario("x", 1, SC.start_s, SC.end_s, (host,), (a, b))
    odd = ExecutionSpec("c", "c", host.hostname, (0,), SC.start_s + 7, (Phase(PhaseKind.STEADY, 600),))
    with pytest.raises(ValueError, match="scrape intervals"):
        Scenario("x", 1, SC.start_s, SC.end_s, (host,), (odd,))


def test_bench_scenario_streams() -> None:
    sc = bench_scenario(days=0.5)
    ds = generate(sc)
    assert sc.end_s == DEFAULT_END_S and len(sc.hosts) == 1 and len(sc.hosts[0].gpus) == 8
    assert len(ds.series) == 8 * 10 + 16 * 4 + 3
    assert {e.status.value for e in sc.executions} == {"completed", "failed"}
    block = choose_block_seconds(sc.end_s - sc.start_s)
    assert block == 6 * 3600 and choose_block_seconds(30 * 86_400) == 54 * 3600
    s = ds.series[0]
    assert ds.values(s, 1000, 1010) == [ds.value_at(s, k) for k in range(1000, 1010)]


def test_cli_writes_files_truth_and_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--out", str(tmp_path), "--hours", "1.5", "--seed", "5"]) == 0
    out = capsys.readouterr().out
    for name in ("healthy", "throttled", "oom", "input-bound", "cpu-only", "gpu-node-2"):
        assert name in out
    assert (tmp_path / "truth.json").is_file()
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".om", ".om"]
