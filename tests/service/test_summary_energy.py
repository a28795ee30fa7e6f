"""The summary's energy: DCGM's energy counter when exported (its increase, resets included), else the
power integral; on the embedded backend, through the app as a user calls it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpulens.agent.samples import Sample
from gpulens.api.app import create_app
from gpulens.backends.embedded.backend import EmbeddedBackend
from gpulens.config import Settings
from gpulens.domain import catalog as c
from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.storage.samples import SampleStore
from tests.api.conftest import Client
from tests.conftest import sqlite_registry

T0 = 1_767_225_600 - 7_200  # 2 h of data, epoch-aligned
EVERY = 15
WATTS = (100.0, 300.0)  # two GPUs at a constant draw
EID = "5e7f0a4e-9a42-4c36-8a8e-3c1c2d0e9b11"


def gpu_labels(gpu: int) -> tuple[tuple[str, str], ...]:
    uuid = f"GPU-{gpu:08d}-0000-0000-0000-000000000000"
    return ((c.LABEL_GPU, str(gpu)), (c.LABEL_UUID, uuid), (c.DCGM_HOST_LABELS[0], "node-a"))


def samples(with_counter: bool, mig: bool = False) -> list[Sample]:
    """Power and utilization of two GPUs, and (`with_counter`) their energy counters; `mig`: GPU 0's
    counter repeated by each of its two MIG instances, as dcgm-exporter shows device fields."""
    out = []
    for t in range(T0, T0 + 7_200 + 1, EVERY):
        for gpu, watts in enumerate(WATTS):
            labels = gpu_labels(gpu)
            out.append(Sample(c.DCGM_POWER_USAGE, labels, watts, t * 1000))
            out.append(Sample(c.DCGM_GPU_UTIL, labels, 90.0, t * 1000))
            if with_counter:
                mj = watts * 1000 * (t - T0)  # W = J/s = 1,000 mJ/s
                if gpu == 1 and t >= T0 + 3_600:  # a driver reload: the counter starts again from 0
                    mj = watts * 1000 * (t - T0 - 3_600)
                if mig and gpu == 0:
                    for instance in ("1", "2"):
                        mig_labels = (*labels, (c.LABEL_GPU_INSTANCE, instance))
                        out.append(Sample(c.DCGM_TOTAL_ENERGY_CONSUMPTION, mig_labels, mj, t * 1000))
                else:
                    out.append(Sample(c.DCGM_TOTAL_ENERGY_CONSUMPTION, labels, mj, t * 1000))
    return out


@pytest.mark.parametrize(("with_counter", "mig"), [(True, False), (True, True), (False, False)])
def test_energy_from_the_counter_else_the_power_integral(
    tmp_path: Path, with_counter: bool, mig: bool
) -> None:
    store = SampleStore.from_path(tmp_path / "samples.db")
    store.write(samples(with_counter, mig))
    store.flush()
    registry = sqlite_registry(tmp_path / "r.db")
    try:
        _, key = registry.create_key("acme", name="alice")
        start = datetime.fromtimestamp(T0 + 600, UTC)
        end = datetime.fromtimestamp(T0 + 600 + 3_600 * 1.5, UTC)
        registry.upsert_execution(
            Execution(
                EID,
                "acme",
                "node-a",
                ("0", "1"),
                ExecutionStatus.COMPLETED,
                start,
                start_time=start,
                end_time=end,
            ),
            now=end,
        )
        settings = Settings(
            data_dir=tmp_path,
            prometheus_url=None,
            database_url=f"sqlite:///{tmp_path / 'r.db'}",
            scrape_interval=f"{EVERY}s",
        )
        client = Client(create_app(settings, registry=registry, backend=EmbeddedBackend(store)))
        r = client.get(
            f"/api/v2/external/execution/{EID}/summary", headers={"Authorization": f"Bearer {key}"}
        )
        assert r.status_code == 200, r.text
        got = r.json()["energy"]
        kwh = sum(WATTS) * 1.5 / 1000  # 1.5 h at 400 W
        assert got["kwh"] == pytest.approx(kwh, rel=0.005), got
        if with_counter:
            assert (got["source"], got["method"]) == ("dcgm_energy_counter", "increase")
        else:
            assert (got["source"], got["method"]) == ("power_integral", "trapezoid")
    finally:
        registry.dispose()
        store.close()
