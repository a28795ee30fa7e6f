"""Raw PromQL against a real Prometheus (and VictoriaMetrics) equals the `k8s` scenario's Run:ai truth.

The expressions are written here, from domain/catalog.py's pod forms, independently of
gpulens.planning: this proves generator + loader + truth agree before any API uses them. Prometheus
values are compared bit for bit (no expression here divides two vectors, so Prometheus' map order
never changes a sum); VictoriaMetrics at 1e-9 on the truth's `stable` points.
"""

from __future__ import annotations

import math

import httpx
import pytest

from gpulens.backends.embedded.arith import bucket_quantile
from gpulens.domain import catalog as c
from gpulens.domain.catalog import Kind, PodForm, PodMetricDef
from gpulens_testkit.k8s_scenario import PodSpec
from gpulens_testkit.k8s_truth import RunaiWindow, nearest_rank
from gpulens_testkit.promload import LoadedK8sDataset
from tests.integration.conftest import instant, range_result

pytestmark = pytest.mark.integration

PODS = ["train-0", "train-1-6c8f9d7b5-q4x2z", "llm-serve-0", "nim-llama-0", "train-b-0", "mig-a-0", "mig-b-0"]
Series = dict[tuple[tuple[str, str], ...], dict[int, float | None]]


def _float(v: str) -> float | None:
    x = float(v)
    return None if math.isnan(x) else x


def query_range(client: httpx.Client, url: str, expr: str, w: RunaiWindow, **extra: str) -> Series:
    """{labels: {t_ms: value}} (NaN -> None) of a range query on the Run:ai grid."""
    result = range_result(client, url, expr, w.start_ms, w.end_ms, max(w.step_ms, 1), **extra)
    return {
        tuple(sorted(r["metric"].items())): {round(float(t) * 1000): _float(v) for t, v in r["values"]}
        for r in result
    }


def only(series: Series) -> dict[int, float | None]:
    assert len(series) <= 1, series.keys()
    return next(iter(series.values()), {})


def dur(ms: int) -> str:
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def dcgm_sel(ds: LoadedK8sDataset, pod: PodSpec) -> str:
    """honor_labels=false nodes rename the pod labels to exported_*; honor_labels=true keep them."""
    if ds.scenario.node(pod.node).honor_labels:
        return f'namespace="{pod.namespace}",pod="{pod.name}"'
    return f'exported_namespace="{pod.namespace}",exported_pod="{pod.name}"'


def app_sel(pod: PodSpec) -> str:
    return f'namespace="{pod.namespace}",pod="{pod.name}"'


def measurement_expr(d: PodMetricDef, ds: LoadedK8sDataset, pod: PodSpec, w: RunaiWindow) -> str:
    step = w.step_ms
    rate_w = dur(max(step, 4 * ds.scenario.scrape_interval_s * 1000))
    forms = []
    for src in d.sources:
        m = src.series[0]
        if d.form is PodForm.DCGM_PER_GPU:
            e = f"max by (gpu, GPU_I_ID) ({m}{{{dcgm_sel(ds, pod)}}})"
        elif d.form is PodForm.DCGM_POD:
            e = f"{d.agg.value}(max by (gpu, GPU_I_ID) ({m}{{{dcgm_sel(ds, pod)}}}))"
        elif d.form is PodForm.CONTAINER_RATE:
            e = f'sum(rate({m}{{{app_sel(pod)},container!="",container!="POD"}}[{rate_w}]))'
        elif d.form is PodForm.CONTAINER_SUM:
            e = f'sum({m}{{{app_sel(pod)},container!="",container!="POD"}})'
        else:
            sel = app_sel(pod)
            if m == c.VLLM_REQUEST_SUCCESS and d.success_filter is not None:
                op = "=~" if d.success_filter else "!~"
                sel += f',finished_reason{op}"stop|length"'
            if d.form is PodForm.APP_GAUGE:
                e = f"{d.agg.value}({m}{{{sel}}})"
            elif d.form is PodForm.APP_RATE:
                e = f"sum(rate({m}{{{sel}}}[{rate_w}]))"
            else:
                assert d.form is PodForm.APP_INCREASE
                e = f"sum(increase({m}{{{sel}}}[{dur(step)}]))"
        forms.append(e if src.scale == 1.0 else f"{src.scale!r} * {e}")
    return " or ".join(f"({f})" for f in forms)


def windows(ds: LoadedK8sDataset, name: str) -> list[RunaiWindow]:
    pod = ds.scenario.pod(name)
    life = ds.truth.pod_window(name)
    start = (pod.start_s - 420) * 1000 + 7_000  # off the scrape grid, with margins
    n = (ds.scenario.pod_end_s(pod) * 1000 + 300_000 - start) // 30_000
    return [
        life,  # the Run:ai default: 20 samples over the pod's life
        RunaiWindow(life.start_ms, life.end_ms, (life.end_ms - life.start_ms) // 15_000),  # every scrape
        RunaiWindow(start, start + n * 30_000, n),
    ]


@pytest.mark.parametrize("name", PODS)
def test_every_measurement_type_equals_truth(
    prom_k8s_dataset: LoadedK8sDataset, client: httpx.Client, name: str
) -> None:
    ds = prom_k8s_dataset
    pod = ds.scenario.pod(name)
    defs = [d for d in c.POD_METRICS if d.kind is Kind.MEASUREMENT]
    for w in windows(ds, name):
        for d in defs:
            want = ds.truth.measurement(name, d.type, w)
            if d.form is PodForm.NO_SOURCE:
                assert all(m.points() == [] for m in want.values()), d.type
                continue
            got = query_range(client, ds.url, measurement_expr(d, ds, pod, w), w)
            if d.per_gpu:
                assert set(want) == set(pod.slot_keys)
                keyed = {
                    dict(k)["gpu"] + ("/" + dict(k)["GPU_I_ID"] if "GPU_I_ID" in dict(k) else ""): v
                    for k, v in got.items()
                }
                for key, truth in want.items():
                    assert keyed.get(key, {}) == truth.as_dict(), (name, d.type, key, w)
                assert set(keyed) <= set(want), (name, d.type)
                continue
            assert only(got) == want[None].as_dict(), (name, d.type, w)


def test_pod_labels_per_node_flavour(prom_k8s_dataset: LoadedK8sDataset, client: httpx.Client) -> None:
    ds = prom_k8s_dataset
    w = ds.truth.pod_window("train-0")
    t = ds.truth.measurement("train-0", "GPU_UTILIZATION_PER_GPU", w)
    got = query_range(
        client,
        ds.url,
        'max by (gpu) (DCGM_FI_DEV_GPU_UTIL{exported_namespace="team-a",exported_pod="train-0"})',
        w,
    )
    assert {dict(k)["gpu"]: v for k, v in got.items()} == {g: m.as_dict() for g, m in t.items()}
    # the exported_ trap: plain pod/namespace hold the exporter's pod on honor_labels=false nodes
    assert query_range(client, ds.url, 'DCGM_FI_DEV_GPU_UTIL{namespace="team-a",pod="train-0"}', w) == {}
    # honor_labels=true node: plain labels, lower-case hostname
    w2 = ds.truth.pod_window("train-b-0")
    fb = query_range(
        client,
        ds.url,
        'sum(max by (gpu) (DCGM_FI_DEV_FB_USED{namespace="team-c",pod="train-b-0"})) * 1048576',
        w2,
    )
    assert only(fb) == ds.truth.measurement("train-b-0", "GPU_MEMORY_USAGE_BYTES", w2)[None].as_dict()
    assert instant(client, ds.url, 'count(DCGM_FI_DEV_GPU_UTIL{hostname="gpu-node-2"})', ds.scenario.end_s)
    assert not instant(
        client, ds.url, 'DCGM_FI_DEV_GPU_UTIL{exported_pod!="",hostname="gpu-node-2"}', ds.scenario.end_s
    )
    # MIG: per GPU instance, no GPU_UTIL
    w3 = ds.truth.pod_window("mig-a-0")
    sm = query_range(
        client,
        ds.url,
        "100 * max by (gpu, GPU_I_ID) "
        '(DCGM_FI_PROF_SM_ACTIVE{exported_namespace="team-a",exported_pod="mig-a-0"})',
        w3,
    )
    assert list(sm) == [(("GPU_I_ID", "1"), ("gpu", "0"))]
    assert (
        next(iter(sm.values()))
        == ds.truth.measurement("mig-a-0", "GPU_SM_ACTIVITY_PER_GPU", w3)["0/1"].as_dict()
    )
    assert query_range(client, ds.url, 'DCGM_FI_DEV_GPU_UTIL{Hostname="mig-node-1"}', w3) == {}


def test_cpu_excludes_pod_cgroup_and_sandbox(
    prom_k8s_dataset: LoadedK8sDataset, client: httpx.Client
) -> None:
    ds = prom_k8s_dataset
    w = ds.truth.pod_window("train-0", 60)
    want = ds.truth.measurement("train-0", "CPU_USAGE_CORES", w)[None]
    good = (
        "sum(rate(container_cpu_usage_seconds_total"
        '{namespace="team-a",pod="train-0",container!="",container!="POD"}[1m]))'
    )
    assert w.step_ms == 90_000  # 90 s steps: the rate window is the step
    got = only(query_range(client, ds.url, good.replace("[1m]", "[90s]"), w))
    assert got == want.as_dict()
    everything = only(
        query_range(
            client,
            ds.url,
            'sum(rate(container_cpu_usage_seconds_total{namespace="team-a",pod="train-0"}[90s]))',
            w,
        )
    )
    assert all(v is not None and v > want.as_dict()[t] for t, v in everything.items() if t in want.as_dict())
    stable = want.stable_points()
    assert stable and all(5.0 < v < 12.0 for _, v in stable)  # trainer ~6 + loader ~2.5 cores
    # a 15 s grid with the catalog's 1 m window: exact on the stable points (and everywhere else)
    w15 = ds.truth.pod_window("train-0", 360)
    fine = ds.truth.measurement("train-0", "CPU_USAGE_CORES", w15)[None]
    assert only(query_range(client, ds.url, good, w15)) == fine.as_dict()


def test_histogram_counts_per_step_survive_the_restart(
    prom_k8s_dataset: LoadedK8sDataset, client: httpx.Client
) -> None:
    ds = prom_k8s_dataset
    pod = ds.scenario.pod("llm-serve-0")
    assert pod.restart_s is not None
    spanning_restart = 0
    for mtype, source in (
        ("VLLM_TIME_TO_FIRST_TOKEN_SECONDS", c.VLLM_TTFT),
        ("VLLM_E2E_REQUEST_LATENCY_SECONDS", c.VLLM_E2E_LATENCY),
        ("NIM_TIME_TO_FIRST_TOKEN_SECONDS", c.VLLM_TTFT),  # NIM 2.x fallback: vLLM names
    ):
        for n in (20, 46):
            w = ds.truth.pod_window("llm-serve-0", n)
            h = ds.truth.histogram("llm-serve-0", mtype, w)
            assert h.source == source
            expr = f"sum by (le) (increase({source}_bucket{{{app_sel(pod)}}}[{dur(w.step_ms)}]))"
            got = query_range(client, ds.url, expr, w)
            by_le = {dict(k)["le"]: v for k, v in got.items()}
            assert set(by_le) == set(h.les)
            for i, t in enumerate(h.timestamps_ms):
                prom = h.prom[i]
                if prom is None:
                    assert all(t not in by_le[le] for le in h.les)
                    continue
                assert [by_le[le][t] for le in h.les] == list(prom), (mtype, t)
                if h.stable[i]:
                    assert h.counts[i] is not None and list(prom) == [float(x) for x in h.counts[i]]
                    spanning_restart += t - w.step_ms < pod.restart_s * 1000 < t
            assert any(h.stable) and any(not s for s in h.stable)
    assert spanning_restart > 0  # exact although the counters restarted inside the step
    # a step that spans the restart gap: increase() adds the value before the reset
    w = RunaiWindow(pod.restart_s * 1000 - 300_000, pod.restart_s * 1000 + 600_000, 1)
    h = ds.truth.histogram("llm-serve-0", "VLLM_TIME_TO_FIRST_TOKEN_SECONDS", w)
    got = query_range(
        client,
        ds.url,
        f"sum by (le) (increase(vllm:time_to_first_token_seconds_bucket{{{app_sel(pod)}}}[900s]))",
        w,
    )
    inf = {dict(k)["le"]: v for k, v in got.items()}["+Inf"][w.end_ms]
    assert h.counts[-1] is not None and h.stable[-1] and inf == h.counts[-1][-1]
    assert inf == len(ds.truth.observations("llm-serve-0", c.VLLM_TTFT, w.end_ms - 900_000, w.end_ms)) > 0


@pytest.mark.parametrize("name", ["llm-serve-0", "nim-llama-0"])
def test_percentiles_equal_histogram_quantile(
    prom_k8s_dataset: LoadedK8sDataset, client: httpx.Client, name: str
) -> None:
    ds = prom_k8s_dataset
    pod = ds.scenario.pod(name)
    types = [d for d in c.POD_METRICS if d.kind is Kind.PERCENTILES]
    checked = 0
    for w in windows(ds, name):
        for d in types:
            pt = ds.truth.percentiles(name, d.type, w)
            if pt.source is None:
                assert all(m.points() == [] for m in pt.quantiles.values()), d.type
                continue
            for label, q in c.PERCENTILES:
                rate = f"rate({pt.source}_bucket{{{app_sel(pod)}}}[{dur(pt.window_ms)}])"
                expr = f"histogram_quantile({q}, sum by (le) ({rate}))"
                got = only(query_range(client, ds.url, expr, w))
                want = pt.quantiles[label]
                assert {t: v for t, v in got.items() if v is not None} == want.as_dict(), (
                    name,
                    d.type,
                    label,
                    w,
                )
                checked += len(want.points())
    assert checked > 100


def test_percentiles_are_within_a_bucket_of_the_raw_observations(
    prom_k8s_dataset: LoadedK8sDataset, client: httpx.Client
) -> None:
    """Independent of the truth's arithmetic: nearest-rank over the observations of each window."""
    ds = prom_k8s_dataset
    w = ds.truth.pod_window("llm-serve-0", 23)
    compared = 0
    for mtype in (
        "VLLM_TIME_TO_FIRST_TOKEN_SECONDS_PERCENTILES",
        "VLLM_E2E_REQUEST_LATENCY_SECONDS_PERCENTILES",
        "VLLM_INTER_TOKEN_LATENCY_SECONDS_PERCENTILES",
    ):
        pt = ds.truth.percentiles("llm-serve-0", mtype, w)
        source, window_ms = pt.source, pt.window_ms
        assert source is not None
        les = sorted(
            {float(dict(k)["le"]) for k in query_range(client, ds.url, f"count by (le) ({source}_bucket)", w)}
        )
        for label, q in c.PERCENTILES:
            expr = (
                f"histogram_quantile({q}, sum by (le) "
                f'(rate({source}_bucket{{namespace="team-b",pod="llm-serve-0"}}[{dur(window_ms)}])))'
            )
            got = only(query_range(client, ds.url, expr, w))
            stable = dict(zip(pt.quantiles[label].timestamps_ms, pt.quantiles[label].stable, strict=True))
            for t, v in got.items():
                obs = ds.truth.observations("llm-serve-0", source, t - window_ms, t)
                if v is None or not obs or not stable[t]:
                    continue
                exact = nearest_rank(obs, q)
                assert exact is not None
                i = next(i for i, b in enumerate(les) if exact <= b)
                lower = 0.0 if i == 0 else les[i - 1]
                if math.isinf(les[i]):
                    assert v == lower
                else:
                    assert lower <= v <= les[i], (source, q, t, v, exact)
                # the bucket arithmetic alone, on counts of the raw observations, gives the same value
                counts = [(b, float(sum(1 for o in obs if o <= b))) for b in les]
                assert bucket_quantile(q, counts) == pytest.approx(v, rel=1e-9)
                compared += 1
    assert compared > 100


def test_kube_state_metrics(prom_k8s_dataset: LoadedK8sDataset, client: httpx.Client) -> None:
    ds = prom_k8s_dataset
    end = ds.scenario.end_s
    span = f"{end - ds.scenario.start_s}s"
    for pod in ds.scenario.pods:
        sel = f'namespace="{pod.namespace}",pod="{pod.name}"'
        info = instant(
            client,
            ds.url,
            f"max by (namespace, pod, uid, node) (max_over_time(kube_pod_info{{{sel}}}[{span}]))",
            end,
        )
        assert [r["metric"] for r in info] == [
            {"namespace": pod.namespace, "pod": pod.name, "uid": pod.pod_id, "node": pod.node}
        ]
        started = instant(client, ds.url, f"max(max_over_time(kube_pod_start_time{{{sel}}}[{span}]))", end)
        assert started[0]["value"] == [end, str(pod.start_s)]
        done = instant(client, ds.url, f"max(max_over_time(kube_pod_completion_time{{{sel}}}[{span}]))", end)
        assert (done[0]["value"][1] if done else None) == (None if pod.end_s is None else str(pod.end_s))
        phase = instant(client, ds.url, f"kube_pod_status_phase{{{sel}}} == 1", end)
        assert [r["metric"]["phase"] for r in phase] == [pod.final_phase.value]  # type: ignore[index]
        owner = instant(client, ds.url, f"kube_pod_owner{{{sel}}}", end)
        assert [(r["metric"]["owner_kind"], r["metric"]["owner_name"]) for r in owner] == [  # type: ignore[index]
            (pod.owner_kind, pod.owner_name)
        ]
    rs = instant(client, ds.url, 'kube_replicaset_owner{replicaset="train-1-6c8f9d7b5"}', end)
    assert [(r["metric"]["owner_kind"], r["metric"]["owner_name"]) for r in rs] == [("Deployment", "train-1")]  # type: ignore[index]


def test_ended_pod_and_unlabelled_gpu_overlap_for_the_lookback(
    prom_k8s_dataset: LoadedK8sDataset, client: httpx.Client
) -> None:
    ds = prom_k8s_dataset
    pod = ds.scenario.pod("train-0")
    assert pod.end_s is not None
    sel = 'DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-node-1",gpu="0"}'
    assert len(instant(client, ds.url, sel, pod.end_s)) == 1
    assert len(instant(client, ds.url, sel, pod.end_s + 60)) == 2  # labelled (stale) + unlabelled
    assert len(instant(client, ds.url, sel, pod.end_s + 300)) == 2  # 2.x lookback is closed
    assert len(instant(client, ds.url, sel, pod.end_s + 315)) == 1
    w = RunaiWindow(pod.end_s * 1000 - 60_000, pod.end_s * 1000 + 420_000, 32)
    util = ds.truth.measurement("train-0", "GPU_UTILIZATION", w)[None]
    tail = [t for t, v in util.points() if t > pod.end_s * 1000]
    assert tail and max(tail) == pod.end_s * 1000 + 300_000
    assert not any(ok for t, ok in zip(util.timestamps_ms, util.stable, strict=True) if t in tail)


def test_every_series_loaded(prom_k8s_dataset: LoadedK8sDataset, client: httpx.Client) -> None:
    ds = prom_k8s_dataset
    end = ds.scenario.end_s
    span = f"{end - ds.scenario.start_s}s"
    for family in ds.dataset.families:
        names = {s.name for s in family.series}
        for name in names:
            want = sum(1 for s in family.series if s.name == name for v in ds.dataset.raw(s) if v is not None)
            got = instant(client, ds.url, f'sum(count_over_time({{__name__="{name}"}}[{span}]))', end)
            assert got[0]["value"] == [end, str(want)], name


def test_victoria_metrics_agrees_on_stable_points(
    vm_k8s_dataset: LoadedK8sDataset, client: httpx.Client
) -> None:
    """MetricsQL differs at data edges, in gaps and after slope changes; `stable` points must agree."""
    ds = vm_k8s_dataset
    checked = 0
    for name in ("train-0", "llm-serve-0", "nim-llama-0", "train-b-0", "mig-b-0"):
        pod = ds.scenario.pod(name)
        w = ds.truth.pod_window(name, 30)
        for d in c.POD_METRICS:
            if d.kind is not Kind.MEASUREMENT or d.form is PodForm.NO_SOURCE:
                continue
            got = query_range(client, ds.url, measurement_expr(d, ds, pod, w), w, nocache="1")
            want = ds.truth.measurement(name, d.type, w)
            for key, truth in want.items():
                if key is None:
                    series = only(got)
                else:
                    series = next(
                        (
                            v
                            for k, v in got.items()
                            if dict(k)["gpu"] + ("/" + dict(k)["GPU_I_ID"] if "GPU_I_ID" in dict(k) else "")
                            == key
                        ),
                        {},
                    )
                for t, v in truth.stable_points():
                    g = series.get(t)
                    assert g is not None and g == pytest.approx(v, rel=1e-9, abs=1e-9), (name, d.type, key, t)
                    checked += 1
        for d in c.POD_METRICS:
            if d.kind is not Kind.HISTOGRAM:
                continue
            h = ds.truth.histogram(name, d.type, w)
            if h.source is None:
                continue
            expr = f"sum by (le) (increase({h.source}_bucket{{{app_sel(pod)}}}[{dur(w.step_ms)}]))"
            by_le = {dict(k)["le"]: v for k, v in query_range(client, ds.url, expr, w, nocache="1").items()}
            for i, t in enumerate(h.timestamps_ms):
                counts = h.counts[i]
                if h.stable[i] and counts is not None:
                    assert [by_le[le].get(t) for le in h.les] == [pytest.approx(x) for x in counts], (
                        name,
                        d.type,
                        t,
                    )
                    checked += 1
    assert checked > 1000
