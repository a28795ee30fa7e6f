"""The `k8s` scenario: determinism, exporter-exact labels, restarts, excluded series, and its Run:ai truth."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from gpulens.domain import catalog as c
from gpulens.domain.workloads import UUID_RE, PodPhase
from gpulens_testkit.__main__ import main
from gpulens_testkit.k8s_generate import (
    HISTOGRAMS,
    VLLM_TTFT_BUCKETS,
    DcgmField,
    K8sDataset,
    SeriesSource,
    le_label,
)
from gpulens_testkit.k8s_scenario import RESTART_GAP_S, GpuSlot, K8sScenario, PodSpec, k8s_scenario
from gpulens_testkit.k8s_truth import (
    K8sTruth,
    RunaiWindow,
    bucket_quantile,
    extrapolated_increase,
    nearest_rank,
    runai_grid,
)
from gpulens_testkit.openmetrics import exposition, iter_text

SC = k8s_scenario()
DS = K8sDataset(SC)
GT = K8sTruth(DS)
END = SC.end_s
INF = math.inf


def pod(name: str) -> PodSpec:
    return SC.pod(name)


def samples_of(series: object) -> list[float | None]:
    return list(DS.raw(series))  # type: ignore[arg-type]


# -- scenario and generator -------------------------------------------------------------------------


def test_same_seed_same_series_other_seed_other_values() -> None:
    again = K8sDataset(k8s_scenario())
    assert [exposition(s) for s in again.series] == [exposition(s) for s in DS.series]
    assert all(again.raw(a) == DS.raw(b) for a, b in zip(again.series, DS.series, strict=True))
    last = DS.sample_count - 1
    assert "".join(iter_text(again, last, last + 1)) == "".join(iter_text(DS, last, last + 1))
    other = K8sDataset(k8s_scenario(seed=22))
    assert [p.pod_id for p in other.scenario.pods] == [p.pod_id for p in SC.pods]  # ids: names only
    util = DS.select(c.DCGM_GPU_UTIL, {c.LABEL_EXPORTED_POD: "train-0"})[0]
    other_util = other.select(c.DCGM_GPU_UTIL, {c.LABEL_EXPORTED_POD: "train-0"})[0]
    assert DS.raw(util) != other.raw(other_util)


def test_scenario_shape_and_ids() -> None:
    assert SC.end_s == 1767225600 and SC.end_s - SC.start_s == 7200
    assert [n.hostname for n in SC.nodes] == ["gpu-node-1", "gpu-node-2", "mig-node-1"]
    assert [p.name for p in SC.pods] == [
        "train-0",
        "train-1-6c8f9d7b5-q4x2z",
        "llm-serve-0",
        "nim-llama-0",
        "train-b-0",
        "mig-a-0",
        "mig-b-0",
    ]
    assert all(re.fullmatch(UUID_RE, p.pod_id) and re.fullmatch(UUID_RE, p.workload_id) for p in SC.pods)
    assert len({p.pod_id for p in SC.pods}) == len(SC.pods)
    assert (
        SC.pod(pod("llm-serve-0").pod_id) is pod("llm-serve-0")
        and SC.pod("team-b/nim-llama-0").app.value == "nim"
    )
    assert pod("train-0").slot_keys == ("0", "1") and pod("mig-a-0").slot_keys == ("0/1",)
    owned = {k for p in SC.pods_on("gpu-node-1") for k in p.slot_keys}
    assert owned == {"0", "1", "2", "3", "4", "5", "6"}  # GPU 7 idle


def test_scenario_validation() -> None:
    p = pod("train-0")
    clash = PodSpec(**{**{f: getattr(p, f) for f in PodSpec.__dataclass_fields__}, "name": "other"})
    with pytest.raises(ValueError, match="overlap"):
        K8sScenario("x", 1, SC.start_s, SC.end_s, SC.nodes, (p, clash))
    bad = PodSpec(**{**{f: getattr(p, f) for f in PodSpec.__dataclass_fields__}, "slots": (GpuSlot(0, 1),)})
    with pytest.raises(ValueError, match="no GPU slot"):
        K8sScenario("x", 1, SC.start_s, SC.end_s, SC.nodes, (bad,))
    odd = PodSpec(**{**{f: getattr(p, f) for f in PodSpec.__dataclass_fields__}, "start_s": p.start_s + 7})
    with pytest.raises(ValueError, match="scrape intervals"):
        K8sScenario("x", 1, SC.start_s, SC.end_s, SC.nodes, (odd,))


def test_dcgm_labels_on_honor_labels_false_node() -> None:
    labelled = DS.select(c.DCGM_GPU_UTIL, {c.LABEL_EXPORTED_POD: "train-0"})
    assert [s.label(c.LABEL_GPU) for s in labelled] == ["0", "1"]
    lab = labelled[0].label_dict()
    assert lab["exported_namespace"] == "team-a" and lab["exported_container"] == "trainer"
    assert lab["pod"].startswith("nvidia-dcgm-exporter-") and lab["namespace"] == "gpu-operator"
    assert lab["Hostname"] == "gpu-node-1" and "hostname" not in lab
    bare = [s for s in DS.select(c.DCGM_GPU_UTIL, {"Hostname": "gpu-node-1", "gpu": "0"}) if not s.pod]
    assert len(bare) == 1 and "exported_pod" not in bare[0].label_dict()
    # before the pod, unlabelled; during, labelled; after, the same unlabelled series again
    k_start, k_end = DS.k_of(pod("train-0").start_s), DS.k_of(pod("train-0").end_s or END)
    assert samples_of(bare[0])[k_start] is not None and samples_of(bare[0])[k_start + 1] is None
    assert samples_of(labelled[0])[k_start + 1] is not None and samples_of(labelled[0])[k_end + 1] is None
    assert samples_of(bare[0])[k_end + 1] is not None
    gpu7 = DS.select(c.DCGM_GPU_UTIL, {"Hostname": "gpu-node-1", "gpu": "7"})
    assert len(gpu7) == 1 and set(samples_of(gpu7[0])) == {0}


def test_dcgm_labels_on_honor_labels_true_node() -> None:
    series = DS.select(c.DCGM_FB_USED, {"hostname": "gpu-node-2"})
    mine = [s for s in series if s.pod == "train-b-0"]
    assert [s.label("gpu") for s in mine] == ["0", "1"]
    lab = mine[0].label_dict()
    assert (lab["namespace"], lab["pod"], lab["container"]) == ("team-c", "train-b-0", "trainer")
    assert not {k for k in lab if k.startswith("exported_")} and "Hostname" not in lab
    idle = [s for s in series if not s.pod]
    assert idle and all(s.label("namespace") == "gpu-operator" for s in idle)


def test_mig_instances() -> None:
    assert not DS.select(c.DCGM_GPU_UTIL, {"Hostname": "mig-node-1"})
    assert not DS.select(c.DCGM_MEM_COPY_UTIL, {"Hostname": "mig-node-1"})
    sm = DS.select(c.DCGM_SM_ACTIVE, {c.LABEL_EXPORTED_POD: "mig-a-0"})
    assert len(sm) == 1
    lab = sm[0].label_dict()
    assert (lab["gpu"], lab["GPU_I_ID"], lab["GPU_I_PROFILE"]) == ("0", "1", "3g.20gb")
    fb_used = DS.select(c.DCGM_FB_USED, {c.LABEL_EXPORTED_POD: "mig-b-0"})[0]
    fb_free = DS.select(c.DCGM_FB_FREE, {c.LABEL_EXPORTED_POD: "mig-b-0"})[0]
    assert {
        u + f for u, f in zip(samples_of(fb_used), samples_of(fb_free), strict=True) if u is not None
    } == {19_968}
    pcie = DS.select(c.DCGM_PCIE_RX_BYTES, {"Hostname": "mig-node-1"})
    assert len(pcie) == 1 and pcie[0].label("GPU_I_ID") == "" and not pcie[0].pod  # device level, no pod


def test_every_dcgm_field_per_pod_gpu_in_units() -> None:
    k = DS.k_of(pod("train-0").start_s) + 40 * 2  # steady
    for field in DcgmField:
        series = DS.dcgm_series(field, pod("train-0"))
        assert [s.slot for s in series] == ["0", "1"], field
        v = samples_of(series[0])[k]
        assert v is not None
        if field in (DcgmField.GPU_UTIL, DcgmField.MEM_COPY_UTIL):
            assert 0 <= v <= 100 and v == int(v)
        elif field.value.startswith("DCGM_FI_PROF") and "BYTES" not in field.value:
            assert 0.0 <= v <= 1.0
    util = samples_of(DS.dcgm_series(DcgmField.GPU_UTIL, pod("train-0"))[0])[k]
    assert util is not None and util > 80
    tx = samples_of(DS.dcgm_series(DcgmField.NVLINK_TX, pod("train-0"))[0])[k]
    rx = samples_of(DS.dcgm_series(DcgmField.NVLINK_RX, pod("train-0"))[0])[k]
    total = samples_of(DS.dcgm_series(DcgmField.NVLINK_BANDWIDTH_TOTAL, pod("train-0"))[0])[k]
    assert tx and rx and total == (tx + rx) // 1_024_000


def test_cadvisor_series_and_the_excluded_ones() -> None:
    cpu = DS.select(c.CADVISOR_CPU_SECONDS, {"namespace": "team-a", "pod": "train-0"})
    assert sorted(s.label("container") for s in cpu) == ["", "POD", "data-loader", "trainer"]
    pod_cgroup = next(s for s in cpu if s.label("container") == "")
    assert "container" not in pod_cgroup.label_dict()  # empty labels are not stored
    assert all(s.label("cpu") == "total" for s in cpu)
    mem = DS.select(
        c.CADVISOR_MEMORY_WORKING_SET, {"namespace": "team-a", "pod": "train-0"}, {"container": ("", "POD")}
    )
    assert sorted(s.container for s in mem) == ["data-loader", "trainer"]
    k = DS.k_of(pod("train-0").start_s) + 100  # train-0 runs
    containers = [s for s in cpu if s.label("container") not in ("", "POD")]
    total = sum(samples_of(s)[k] or 0 for s in containers)
    assert (samples_of(pod_cgroup)[k] or 0) > total  # the cgroup counts everything: must be excluded


def test_restart_resets_counters_and_histograms() -> None:
    p = pod("llm-serve-0")
    assert p.restart_s is not None
    k_r, k_up = DS.k_of(p.restart_s), DS.k_of(p.restart_s + RESTART_GAP_S)
    app = [s for s in DS.series if s.source is SeriesSource.APP and s.pod == "llm-serve-0"]
    counters = [s for s in app if s.metric_type in ("counter", "histogram")]
    assert counters
    dropped = 0
    for s in counters:
        vals = samples_of(s)
        assert all(v is None for v in vals[k_r + 1 : k_up])  # /metrics down while the model reloads
        assert vals[k_up] == 0  # back at zero
        before = vals[k_r]
        assert before is not None
        dropped += before > 0
    assert dropped > 100  # every non-empty counter visibly resets
    # cAdvisor: a new container instance, a new series starting from zero
    vllm = sorted(
        DS.select(c.CADVISOR_CPU_SECONDS, {"pod": "llm-serve-0", "container": "vllm"}),
        key=lambda s: s.instance,
    )
    assert [s.instance for s in vllm] == [0, 1]
    old, new = samples_of(vllm[0]), samples_of(vllm[1])
    assert old[k_r] is not None and old[k_r + 1] is None and new[k_r] is None
    assert new[k_r + 1] is not None and new[k_r + 1] < old[k_r]
    assert vllm[0].label("id") != vllm[1].label("id")


def test_histograms_are_cumulative_and_match_the_observations() -> None:
    p = pod("llm-serve-0")
    h = HISTOGRAMS[c.VLLM_TTFT]
    assert h.les[:3] == ("0.001", "0.005", "0.01") and h.les[-1] == "+Inf" and "1.0" in h.les
    assert len(h.les) == len(VLLM_TTFT_BUCKETS) + 1 and le_label(2560.0) == "2560.0"
    for engine in p.engines:
        buckets = [
            DS.select(f"{c.VLLM_TTFT}_bucket", {"pod": p.name, "engine": engine, "le": le})[0] for le in h.les
        ]
        count = DS.select(f"{c.VLLM_TTFT}_count", {"pod": p.name, "engine": engine})[0]
        reqs = DS.requests(p, engine)
        lo, hi = DS.app_windows(p)[1]
        for k in range(lo, hi + 1):
            row = [samples_of(b)[k] for b in buckets]
            assert row == sorted(row, key=lambda x: x or 0)  # cumulative over le
            assert row[-1] == samples_of(count)[k]
            seen = [r.ttft_s for kk in range(lo, k + 1) for r in reqs[kk]]
            assert row[-1] == len(seen) and row[0] == sum(1 for v in seen if v <= 0.001)
    nim = DS.select(f"{c.NIM_E2E_LATENCY}_bucket", {"pod": "nim-llama-0"})
    assert {s.le for s in nim} == set(HISTOGRAMS[c.NIM_E2E_LATENCY].les)
    assert "engine" not in nim[0].label_dict() and nim[0].label("model_name") == "meta/llama-3.1-8b-instruct"
    over = [v for per_k in DS.observations(pod("nim-llama-0"), c.NIM_E2E_LATENCY) for v in per_k if v > 60]
    assert over  # NIM's short buckets overflow into +Inf


def test_vllm_labels_and_both_metric_generations() -> None:
    running = DS.select(c.VLLM_NUM_REQUESTS_RUNNING, {"namespace": "team-b", "pod": "llm-serve-0"})
    assert [s.label("engine") for s in running] == ["0", "1"]
    assert running[0].label("model_name") == "meta-llama/Llama-3.1-8B-Instruct"
    reasons = {s.label("finished_reason") for s in DS.select(c.VLLM_REQUEST_SUCCESS, {"pod": "llm-serve-0"})}
    assert reasons == {"stop", "length", "abort", "error", "repetition"}
    new, old = (
        DS.select(n, {"pod": "llm-serve-0", "engine": "0"})[0]
        for n in (c.VLLM_KV_CACHE_USAGE, c.VLLM_GPU_CACHE_USAGE_OLD)
    )
    assert samples_of(new) == samples_of(old)
    assert DS.select(f"{c.VLLM_TIME_PER_OUTPUT_TOKEN_OLD}_bucket", {"pod": "llm-serve-0"})


def test_kube_state_metrics_series() -> None:
    p = pod("train-0")
    info = DS.select(c.KSM_POD_INFO, {"pod": "train-0"})
    assert len(info) == 2 and {s.label("uid") for s in info} == {p.pod_id}
    assert [s.label("pod_ip") for s in info] == ["", p.ip] or [s.label("pod_ip") for s in info] == [p.ip, ""]
    assert all(s.label("node") == "gpu-node-1" and s.label("created_by_kind") == "StatefulSet" for s in info)
    done = DS.select(c.KSM_POD_COMPLETION_TIME, {"pod": "train-0"})[0]
    assert {v for v in samples_of(done) if v is not None} == {p.end_s}
    assert not DS.select(c.KSM_POD_COMPLETION_TIME, {"pod": "llm-serve-0"})
    phases = {
        s.label("phase"): samples_of(s) for s in DS.select(c.KSM_POD_STATUS_PHASE, {"pod": "train-b-0"})
    }
    assert set(phases) == {ph.value for ph in PodPhase}
    assert phases["Failed"][-1] == 1 and phases["Running"][-1] == 0
    assert DS.pod_phase_at(pod("train-b-0"), END) is PodPhase.FAILED
    owner = DS.select(c.KSM_POD_OWNER, {"pod": "train-1-6c8f9d7b5-q4x2z"})[0]
    assert (owner.label("owner_kind"), owner.label("owner_name")) == ("ReplicaSet", "train-1-6c8f9d7b5")
    rs = DS.select(c.KSM_REPLICASET_OWNER)
    assert len(rs) == 1 and (rs[0].label("owner_kind"), rs[0].label("owner_name")) == (
        "Deployment",
        "train-1",
    )


def test_openmetrics_text_of_histograms() -> None:
    text = "".join(iter_text(DS, DS.sample_count - 1, DS.sample_count))
    assert "# TYPE vllm:time_to_first_token_seconds histogram\n" in text
    assert "# TYPE vllm:request_success counter\n" in text
    assert text.endswith("# EOF\n")
    assert re.search(
        r'^vllm:time_to_first_token_seconds_bucket\{engine="1",model_name="[^"]+",le="\+Inf",', text, re.M
    )
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert len(lines) == sum(1 for s in DS.series if DS.raw(s)[-1] is not None)


# -- truth ------------------------------------------------------------------------------------------


def test_runai_grid() -> None:
    assert runai_grid(0, 60_000, 4) == ((0, 15_000, 30_000, 45_000, 60_000), 15_000)
    assert runai_grid(0, 60_000, 0) == ((60_000,), 60_000)
    assert runai_grid(5, 5, 3) == ((5,), 0) and GT.grid(RunaiWindow(5, 5, 3)) == ((5,), 15_000)
    assert runai_grid(0, 60_000, 7) == (tuple(k * 8571 for k in range(8)), 8571)  # floor, like the API
    assert runai_grid(0, 5, 10) == ((0, 1, 2, 3, 4, 5), 1)
    with pytest.raises(ValueError):
        runai_grid(10, 0, 1)
    w = GT.pod_window("train-0")
    train = pod("train-0")
    assert (w.start_ms, w.end_ms, w.n) == (train.start_s * 1000, (train.end_s or 0) * 1000, 20)
    span_ms = ((train.end_s or 0) - train.start_s) * 1000
    assert span_ms % 20 == 0  # so the 20 steps tile the life exactly: 21 grid points
    assert len(w.grid) == 21 and w.step_ms == span_ms // 20


def test_bucket_quantile_follows_prometheus() -> None:
    b = [(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (INF, 40.0)]
    assert bucket_quantile(0.25, b) == 0.1  # rank 10 is the top of the first bucket
    assert bucket_quantile(0.1, b) == pytest.approx(0.04)  # the lowest bucket interpolates from 0
    assert bucket_quantile(0.5, b) == pytest.approx(0.1 + 0.4 * (20 - 10) / 20)
    assert bucket_quantile(0.99, [(0.1, 1.0), (0.5, 2.0), (INF, 10.0)]) == 0.5  # +Inf -> 2nd highest bound
    assert math.isnan(bucket_quantile(0.5, [(0.1, 0.0), (INF, 0.0)]))
    assert math.isnan(bucket_quantile(0.5, [(0.1, 1.0), (1.0, 2.0)]))  # no +Inf bucket
    assert math.isnan(bucket_quantile(0.5, [(INF, 3.0)]))
    assert bucket_quantile(0.5, [(1.0, 3.0), (0.5, 1.0), (INF, 4.0)]) == bucket_quantile(
        0.5, [(0.5, 1.0), (1.0, 3.0), (INF, 4.0)]
    )  # any order
    assert bucket_quantile(0.5, [(0.5, 3.0), (1.0, 2.0), (INF, 4.0)]) == pytest.approx(
        0.5 * 2 / 3
    )  # monotonic envelope
    assert bucket_quantile(-1, b) == -INF and bucket_quantile(2, b) == INF
    assert nearest_rank([3.0, 1.0, 2.0], 0.5) == 2.0 and nearest_rank([], 0.5) is None


def test_increase_extrapolates_like_prometheus() -> None:
    pts = [(0, 10.0), (15_000, 12.0), (30_000, 0.0), (45_000, 3.0)]
    assert extrapolated_increase(pts, 0, 45_000) == 2 + 3  # a reset adds the value before it back
    assert extrapolated_increase([(15_000, 4.0), (30_000, 8.0)], 0, 30_000) == pytest.approx(8.0)
    assert extrapolated_increase([(0, 1.0)], 0, 15_000) is None


def test_truth_aggregates_follow_the_catalog_units() -> None:
    w = GT.pod_window("train-0", 30)
    per_gpu = GT.measurement("train-0", "GPU_MEMORY_USAGE_BYTES_PER_GPU", w)
    total = GT.measurement("train-0", "GPU_MEMORY_USAGE_BYTES", w)[None]
    util = GT.measurement("train-0", "GPU_UTILIZATION", w)[None]
    util_gpu = GT.measurement("train-0", "GPU_UTILIZATION_PER_GPU", w)
    nv = GT.measurement("train-0", "NVLINK_BANDWIDTH_TOTAL_PER_GPU", w)
    sm = GT.measurement("train-0", "GPU_SM_ACTIVITY_PER_GPU", w)
    raw_sm = DS.dcgm_series(DcgmField.SM_ACTIVE, pod("train-0"))[0]
    checked = 0
    for i, t in enumerate(w.grid):
        if total.values[i] is None:
            continue
        checked += 1
        a, b = per_gpu["0"].values[i], per_gpu["1"].values[i]
        assert a is not None and b is not None and total.values[i] == a + b and a % 1_048_576 == 0
        ua, ub = util_gpu["0"].values[i], util_gpu["1"].values[i]
        assert ua is not None and ub is not None and util.values[i] == (ua + ub) / 2
        nv0 = nv["0"].values[i]
        assert nv0 is not None and nv0 % 1_024_000 == 0
        k = (t // 1000 - SC.start_s) // 15
        assert sm["0"].values[i] == 100 * (DS.raw(raw_sm)[k] or 0)
    assert checked == len(w.grid) - 1  # every point but the first
    mig = GT.measurement("mig-a-0", "GPU_TENSOR_ACTIVITY_PER_GPU", GT.pod_window("mig-a-0"))
    assert list(mig) == ["0/1"] and mig["0/1"].points()
    assert GT.measurement("mig-a-0", "GPU_UTILIZATION", GT.pod_window("mig-a-0"))[None].points() == []
    pcie = GT.measurement("mig-a-0", "GPU_PCIE_RECEIVED_BANDWIDTH_PER_GPU", GT.pod_window("mig-a-0"))
    assert pcie["0/1"].points() == []  # device-level on MIG: not attributed to the pod
    swap = GT.measurement("train-0", "GPU_SWAP_MEMORY_BYTES_PER_GPU", w)
    assert set(swap) == {"0", "1"} and all(m.points() == [] and all(m.stable) for m in swap.values())


def test_truth_cpu_and_app_types() -> None:
    w = GT.pod_window("train-0", 60)
    cpu = GT.measurement("train-0", "CPU_USAGE_CORES", w)[None]
    assert all(5 < v < 12 for _, v in cpu.stable_points())
    assert len(cpu.stable_points()) > 40
    mem = GT.measurement("train-0", "CPU_MEMORY_USAGE_BYTES", w)[None]
    assert all(55 * 2**30 < v < 65 * 2**30 for _, v in mem.stable_points())  # 48 + 12 GiB, no cgroup
    t = GT.pod("train-0", w)
    assert all(
        not m.points()
        for typ, ms in t.measurements.items()
        if typ.startswith(("VLLM", "NIM"))
        for m in ms.values()
    )
    assert all(h.source is None for h in t.histograms.values())
    vl = GT.pod("llm-serve-0")
    assert {typ for typ, ms in vl.measurements.items() if None in ms and ms[None].points()} >= {
        "VLLM_NUM_REQUESTS_RUNNING",
        "VLLM_REQUEST_SUCCESS",
        "VLLM_KV_CACHE_USAGE_PERC",
        "VLLM_PROMPT_TOKENS_PER_SECOND",
        "NIM_NUM_REQUESTS_RUNNING",  # NIM 2.x fallback to vllm:* names
    }
    assert not vl.measurements["NIM_NUM_REQUEST_MAX"][None].points()
    nim = GT.pod("nim-llama-0")
    assert {v for _, v in nim.measurements["NIM_NUM_REQUEST_MAX"][None].points()} == {256.0}
    assert not nim.measurements["VLLM_NUM_REQUESTS_RUNNING"][None].points()
    assert nim.histograms["NIM_E2E_REQUEST_LATENCY_SECONDS"].source == c.NIM_E2E_LATENCY
    assert vl.histograms["NIM_E2E_REQUEST_LATENCY_SECONDS"].source == c.VLLM_E2E_LATENCY
    assert vl.percentiles["VLLM_INTER_TOKEN_LATENCY_SECONDS_PERCENTILES"].source == c.VLLM_INTER_TOKEN_LATENCY


def test_request_success_counts_stop_and_length_exactly() -> None:
    p = pod("llm-serve-0")
    w = RunaiWindow(p.start_s * 1000, END * 1000, 46)  # 150 s steps
    ok = GT.measurement("llm-serve-0", "VLLM_REQUEST_SUCCESS", w)[None]
    failed = GT.measurement("llm-serve-0", "NIM_REQUEST_FAILURE_TOTAL", w)[None]
    for m, reasons in ((ok, c.SUCCESS_REASONS), (failed, ("abort", "error", "repetition"))):
        stable = m.stable_points()
        assert len(stable) > 30
        for t, v in stable:
            ks = range(DS.k_of(t // 1000 - w.step_ms // 1000) + 1, DS.k_of(t // 1000) + 1)
            want = sum(
                1 for e in p.engines for k in ks for r in DS.requests(p, e)[k] if r.finished_reason in reasons
            )
            assert v == want


def test_histogram_truth_counts_and_stability() -> None:
    p = pod("llm-serve-0")
    assert p.restart_s is not None
    w = GT.pod_window("llm-serve-0", 46)
    h = GT.histogram("llm-serve-0", "VLLM_TIME_TO_FIRST_TOKEN_SECONDS", w)
    assert h.source == c.VLLM_TTFT and h.les == HISTOGRAMS[c.VLLM_TTFT].les
    assert h.counts[0] is None  # one sample only at the pod start
    checked = compared = 0
    for i, t in enumerate(h.timestamps_ms):
        counts, prom = h.counts[i], h.prom[i]
        if counts is None:
            continue
        checked += 1
        assert list(counts) == sorted(counts)
        assert counts[-1] == len(GT.observations("llm-serve-0", c.VLLM_TTFT, t - w.step_ms, t))
        if h.stable[i]:
            compared += 1
            assert prom == tuple(float(x) for x in counts)
    assert checked == len(h.timestamps_ms) - 1  # all but the first (None, above)
    assert compared > 40
    near = RunaiWindow(p.restart_s * 1000 - 60_000, p.restart_s * 1000 + 240_000, 20)  # 15 s steps
    hn = GT.histogram("llm-serve-0", "VLLM_TIME_TO_FIRST_TOKEN_SECONDS", near)
    lo, hi = p.restart_s * 1000, (p.restart_s + RESTART_GAP_S) * 1000
    gap = [i for i, t in enumerate(hn.timestamps_ms) if lo < t < hi]
    assert len(gap) == 6 and all(hn.counts[i] is None for i in gap)  # /metrics down: nothing to count
    assert not hn.stable[gap[0]] and all(hn.stable[i] for i in gap[1:])  # half-covered, then empty
    assert hn.stable[-1] and hn.counts[-1] is not None
    assert dict(h.points()).keys() <= set(h.timestamps_ms)


def test_percentiles_truth_against_raw_observations() -> None:
    w = GT.pod_window("nim-llama-0", 20)  # 315 s steps, on the scrape grid
    for mtype, source in (
        ("NIM_TIME_TO_FIRST_TOKEN_SECONDS_PERCENTILES", c.NIM_TTFT),
        ("NIM_E2E_REQUEST_LATENCY_SECONDS_PERCENTILES", c.NIM_E2E_LATENCY),
    ):
        pt = GT.percentiles("nim-llama-0", mtype, w)
        assert pt.source == source and pt.window_ms == w.step_ms
        bounds = (*HISTOGRAMS[source].bounds, INF)
        checked = 0
        for label, q in c.PERCENTILES:
            m = pt.quantiles[label]
            for t, v in m.stable_points():
                exact = nearest_rank(GT.observations("nim-llama-0", source, t - pt.window_ms, t), q)
                assert exact is not None
                i = next(i for i, b in enumerate(bounds) if exact <= b)
                if math.isinf(bounds[i]):
                    assert v == bounds[-2]
                else:
                    assert (0.0 if i == 0 else bounds[i - 1]) <= v <= bounds[i]
                checked += 1
        assert checked > 30


def test_cli_k8s(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--scenario", "k8s", "--out", str(tmp_path), "--no-files", "--samples", "10"]) == 0
    out = capsys.readouterr().out
    assert "llm-serve-0" in out and pod("llm-serve-0").pod_id in out and "honor_labels=true" in out
    doc = json.loads((tmp_path / "truth.json").read_text())
    assert [p["name"] for p in doc["pods"]] == [p.name for p in SC.pods]
    first = doc["pods"][0]
    assert first["podId"] == pod("train-0").pod_id and first["window"]["n"] == 10
    assert set(first["measurements"]["GPU_UTILIZATION_PER_GPU"]) == {"0", "1"}
    assert len(first["measurements"]["GPU_UTILIZATION"]["pod"]["values"]) == 11
