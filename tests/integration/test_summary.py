"""The summary route against a real Prometheus holding the generated `default` scenario.

Every phase with a known signature is found at its edges (within one scrape interval plus the
smoothing), steady phases give no finding, energy is the power integral of the ground truth, and
the cost fields add up.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulens.api.app import create_app
from gpulens.backends.embedded import EmbeddedBackend
from gpulens.demo.scenario import ExecutionSpec, PhaseKind
from gpulens.domain import catalog as c
from gpulens.domain.timeparse import format_rfc3339_ms, parse_timestamp_ms
from gpulens.shaping.usage import integral
from gpulens.storage.samples import SampleStore
from gpulens_testkit.promload import LoadedDataset
from tests.api.conftest import Client
from tests.integration.lyceum_app import LiveApi, build
from tests.integration.test_embedded_api_differential import assert_same_json

pytestmark = pytest.mark.integration

INTERVAL_MS = 15_000
TOLERANCE_MS = INTERVAL_MS + c.INSIGHT_THRESHOLDS.smoothing_ms
PRICE = 2.5
CARBON = 400.0
EXPECTED: dict[PhaseKind, str] = {
    PhaseKind.IDLE: "idle_held",
    PhaseKind.INPUT_STALL: "input_bound",
    PhaseKind.THROTTLE: "power_throttle",
    PhaseKind.OOM: "oom_suspected",
}
NAMES = ["healthy", "throttled", "oom", "input-bound", "cpu-only"]


@pytest.fixture(scope="module")
def live(prom_dataset: LoadedDataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveApi]:
    tmp = Path(tmp_path_factory.mktemp("summary"))
    prices = tmp / "prices.toml"
    prices.write_text(f'currency = "USD"\n[gpu_hour]\n"gpu.h100" = {PRICE}\n')
    api = build(prom_dataset, tmp, prices=prices, carbon_intensity=CARBON)
    yield api
    api.registry.dispose()


def summary(live: LiveApi, execution_id: str, key: str | None = None, **params: str) -> Any:
    r = live.client.get(
        f"/api/v2/external/execution/{execution_id}/summary",
        params=params,
        headers={"Authorization": f"Bearer {key or live.key}"},
    )
    assert r.status_code == 200, r.text
    return r.json()


def ms(text: str) -> int:
    return parse_timestamp_ms(text)


def expected_findings(e: ExecutionSpec, has_gpus: bool) -> list[tuple[str, int, int]]:
    if not has_gpus:
        return []
    return [
        (EXPECTED[s.phase.kind], s.start_s * 1000, s.end_s * 1000)
        for s in e.spans()
        if s.phase.kind in EXPECTED
    ]


@pytest.mark.parametrize("name", NAMES)
def test_phases_are_found_at_their_edges(live: LiveApi, name: str) -> None:
    e = live.data.scenario.execution(name)
    body = summary(live, e.execution_id)
    has_gpus = bool(live.data.scenario.gpus_of(e))
    want = expected_findings(e, has_gpus)
    got = [(f["kind"], ms(f["start"]), ms(f["end"])) for f in body["findings"]]
    assert len(got) == len(want), body["findings"]
    for (kind, start, end), (gkind, gstart, gend) in zip(want, got, strict=True):
        assert gkind == kind, body["findings"]
        assert abs(gstart - start) <= TOLERANCE_MS, (
            kind,
            format_rfc3339_ms(gstart),
            format_rfc3339_ms(start),
        )
        assert abs(gend - end) <= TOLERANCE_MS, (kind, format_rfc3339_ms(gend), format_rfc3339_ms(end))
    for f in body["findings"]:
        assert f["severity"] in ("info", "warning", "critical")
        assert f["message"].endswith(".")
        assert f["gpus"] == [str(g) for g in e.gpus]


@pytest.mark.parametrize("name", NAMES)
def test_stats_energy_and_cost(live: LiveApi, name: str) -> None:
    e = live.data.scenario.execution(name)
    body = summary(live, e.execution_id)
    gpus = live.data.scenario.gpus_of(e)
    truth = live.data.truth.execution(name, step_ms=INTERVAL_MS)
    assert body["executionId"] == e.execution_id
    assert body["hostname"] == e.hostname
    assert body["gpuCount"] == len(gpus)
    assert body["stepSeconds"] == INTERVAL_MS / 1000
    assert body["timeRange"] == {
        "start": format_rfc3339_ms(e.start_s * 1000),
        "end": format_rfc3339_ms(e.end_s * 1000),
    }
    assert set(body["stats"]) == set(c.LYCEUM_KEYS)
    for key in c.LYCEUM_KEYS:
        want = truth[key].stats()
        got = body["stats"][key]
        assert got["samples"] == want.count, key
        if want.count:
            assert got["mean"] == pytest.approx(want.mean, rel=1e-9), key
            assert (got["min"], got["max"]) == pytest.approx((want.min, want.max), rel=1e-9), key
            assert got["coverage"] == pytest.approx(1.0), key
        else:
            assert got["mean"] is None and got["coverage"] == 0.0

    if not gpus:
        assert body["energy"] is None and body["cost"] is None and body["perGpu"] == []
        return
    kwh = integral(truth["gpuPowerWatt"].points(), INTERVAL_MS) / 3_600_000
    # per GPU: the 9 GPU series at the scrape interval; means and energies add up to the host figures
    per_gpu = body["perGpu"]
    assert sorted(g["gpu"] for g in per_gpu) == sorted(str(g) for g in gpus)
    assert all(g["uuid"].startswith("GPU-") and g["stepSeconds"] == INTERVAL_MS / 1000 for g in per_gpu)
    gpu_keys = [m.lyceum for m in c.LYCEUM_METRICS if m.exporter is c.Exporter.DCGM]
    assert all(list(g["stats"]) == gpu_keys for g in per_gpu)
    host = body["stats"]
    means = [g["stats"]["gpuUtilizationPercent"]["mean"] for g in per_gpu]
    assert sum(means) / len(means) == pytest.approx(host["gpuUtilizationPercent"]["mean"], rel=1e-9)
    power = sum(g["stats"]["gpuPowerWatt"]["mean"] for g in per_gpu)
    assert power == pytest.approx(host["gpuPowerWatt"]["mean"], rel=1e-9)
    hottest = max(g["stats"]["gpuTemperatureCelsius"]["max"] for g in per_gpu)
    assert hottest == pytest.approx(host["gpuTemperatureCelsius"]["max"])
    assert sum(g["energyKwh"] for g in per_gpu) == pytest.approx(kwh, rel=0.005)
    assert body["energy"]["kwh"] == pytest.approx(kwh, rel=0.005)
    assert body["energy"]["source"] == "power_integral"
    assert body["energy"]["co2eKg"] == pytest.approx(kwh * CARBON / 1000, rel=0.005)

    cost = body["cost"]
    hours = len(gpus) * (e.end_s - e.start_s) / 3600
    assert cost["currency"] == "USD"
    assert cost["gpuHours"] == pytest.approx(hours)
    assert cost["total"] == pytest.approx(hours * PRICE)
    assert cost["active"] == pytest.approx(cost["total"] - cost["idle"] - cost["idleHeld"])
    parts = cost["idle"] + cost["idleHeld"] + cost["inputBound"] + cost["throttled"]
    assert 0 <= parts <= cost["total"] + 1e-9
    for field, kinds in (("idleHeld", (PhaseKind.IDLE,)), ("inputBound", (PhaseKind.INPUT_STALL,))):
        phase_s = sum(s.phase.duration_s for s in e.spans() if s.phase.kind in kinds)
        assert cost[field] == pytest.approx(len(gpus) * phase_s / 3600 * PRICE, abs=len(gpus) * PRICE / 120)
    useful = integral(truth["gpuUtilizationPercent"].points(), INTERVAL_MS) / 100 * len(gpus) / 3600
    assert cost["usefulGpuHours"] == pytest.approx(useful, rel=1e-9)
    assert cost["perUsefulGpuHour"] == pytest.approx(cost["total"] / useful, rel=1e-9)


def test_a_window_inside_the_execution(live: LiveApi) -> None:
    e = live.data.scenario.execution("throttled")
    span = next(s for s in e.spans() if s.phase.kind is PhaseKind.THROTTLE)
    start, end = (span.start_s - 600) * 1000, (span.end_s + 600) * 1000
    body = summary(live, e.execution_id, start=format_rfc3339_ms(start), end=format_rfc3339_ms(end))
    assert body["timeRange"] == {"start": format_rfc3339_ms(start), "end": format_rfc3339_ms(end)}
    assert [f["kind"] for f in body["findings"]] == ["power_throttle"]
    assert body["stats"]["gpuUtilizationPercent"]["samples"] == (end - start) // INTERVAL_MS + 1


def test_another_orgs_execution_is_404_like_the_metrics_route(live: LiveApi) -> None:
    _, other = live.registry.create_key("beta", name="bob")
    e = live.data.scenario.execution("healthy")
    headers = {"Authorization": f"Bearer {other}"}
    r = live.client.get(f"/api/v2/external/execution/{e.execution_id}/summary", headers=headers)
    m = live.client.get(f"/api/v2/external/execution/{e.execution_id}/metrics", headers=headers)
    assert r.status_code == m.status_code == 404
    assert r.json() == m.json()
    r = live.client.get("/api/v2/external/execution/not-an-id/summary", headers=headers)
    assert r.status_code == 404
    r = live.client.get(f"/api/v2/external/execution/{e.execution_id}/summary")
    m = live.client.get(f"/api/v2/external/execution/{e.execution_id}/metrics")
    assert r.status_code == m.status_code == 401
    assert r.json() == m.json()
    r = live.client.get(
        f"/api/v2/external/execution/{e.execution_id}/summary",
        params={"start": "yesterday"},
        headers={"Authorization": f"Bearer {live.key}"},
    )
    m = live.client.get(
        f"/api/v2/external/execution/{e.execution_id}/metrics",
        params={"start": "yesterday"},
        headers={"Authorization": f"Bearer {live.key}"},
    )
    assert r.status_code == m.status_code
    assert r.json() == m.json()


def test_a_gpu_unused_while_the_other_works(live: LiveApi) -> None:
    """GPU 1 of gpu-node-1 belongs to no scenario execution (idle, memory free) while GPU 0 trains."""
    healthy = live.data.scenario.execution("healthy")
    steady = next(s for s in healthy.spans() if s.phase.kind is PhaseKind.STEADY)
    execution_id = str(uuid.UUID(int=91, version=4))
    body = {
        "execution_id": execution_id,
        "org": "acme",
        "hostname": healthy.hostname,
        "gpus": ["0", "1"],
        "status": "completed",
        "start_time": format_rfc3339_ms(steady.start_s * 1000),
        "end_time": format_rfc3339_ms(steady.end_s * 1000),
        "hardware_profile": "gpu.h100",
    }
    r = live.client.post(
        "/api/v2/admin/executions", json=body, headers={"Authorization": f"Bearer {live.admin_key}"}
    )
    assert r.status_code in (200, 201), r.text
    got = summary(live, execution_id)
    assert got["gpuCount"] == 2
    assert [(f["kind"], f["gpus"]) for f in got["findings"]] == [("idle", ["1"])], got["findings"]
    f = got["findings"][0]
    assert abs(ms(f["start"]) - steady.start_s * 1000) <= TOLERANCE_MS
    assert abs(ms(f["end"]) - steady.end_s * 1000) <= TOLERANCE_MS
    hours = (steady.end_s - steady.start_s) / 3600
    assert got["cost"]["idle"] == pytest.approx(hours * PRICE, abs=PRICE / 120)
    assert got["cost"]["active"] == pytest.approx(got["cost"]["total"] - got["cost"]["idle"])


@pytest.fixture(scope="module")
def embedded(live: LiveApi, embedded_store: SampleStore) -> Client:
    """The same registry and settings over the embedded store holding the same samples."""
    return Client(create_app(live.settings, registry=live.registry, backend=EmbeddedBackend(embedded_store)))


@pytest.mark.parametrize("name", NAMES)
def test_the_embedded_store_gives_the_same_summary(live: LiveApi, embedded: Client, name: str) -> None:
    e = live.data.scenario.execution(name)
    headers = {"Authorization": f"Bearer {live.key}"}
    path = f"/api/v2/external/execution/{e.execution_id}/summary"
    a, b = live.client.get(path, headers=headers), embedded.get(path, headers=headers)
    assert a.status_code == b.status_code == 200
    assert assert_same_json(a.json(), b.json()) > 30


def test_a_running_execution_past_the_data_and_an_unpriced_profile(live: LiveApi) -> None:
    """The data ends at the scenario's end: CPU % a rate window (4 intervals) later, the GPU series
    after Prometheus' 5-minute lookback; from then on, `no_data`."""
    sc = live.data.scenario
    execution_id = str(uuid.UUID(int=92, version=4))
    body = {
        "execution_id": execution_id,
        "org": "acme",
        "hostname": "gpu-node-2",
        "gpus": ["0", "1"],
        "status": "running",
        "start_time": format_rfc3339_ms((sc.end_s - 3600) * 1000),
        "hardware_profile": "gpu.b200",
    }
    r = live.client.post(
        "/api/v2/admin/executions", json=body, headers={"Authorization": f"Bearer {live.admin_key}"}
    )
    assert r.status_code in (200, 201), r.text
    end = (sc.end_s + 1800) * 1000
    got = summary(live, execution_id, end=format_rfc3339_ms(end))
    assert got["cost"] is None and got["energy"]["kwh"] > 0
    gaps = [f for f in got["findings"] if f["kind"] == "no_data"]
    assert len(gaps) == 1, got["findings"]
    assert abs(ms(gaps[0]["start"]) - (sc.end_s + 60) * 1000) <= TOLERANCE_MS
    assert ms(gaps[0]["end"]) == end
    assert gaps[0]["evidence"]["series"] == ["gpuUtilizationPercent", "systemCpuUsagePercent"]
    coverage = got["stats"]["gpuUtilizationPercent"]["coverage"]
    assert coverage == pytest.approx((3600 + 300) / 5400, abs=0.01)
    # the input-bound run ended 25 minutes before the data: its GPUs idle (memory free) after it
    input_bound = sc.execution("input-bound")
    idle = [f for f in got["findings"] if f["kind"] == "idle"]
    assert len(idle) == 1 and abs(ms(idle[0]["start"]) - input_bound.end_s * 1000) <= TOLERANCE_MS
