"""The Run:ai `text/csv` answer cannot carry formulas (issue 21): a `gpu` label a spreadsheet would run
gets a leading `'`, one test per character that starts a formula; values stay numbers."""

from __future__ import annotations

import csv
import io
from typing import Any

import httpx
import orjson
import pytest

from gpulens.shaping.cells import FORMULA_STARTS
from tests.api.lyceum.conftest import grid_values
from tests.api.runai.conftest import RunaiApi
from tests.shaping.test_cells import PAYLOADS

WINDOW = "start=2026-01-01T10:00:00Z&end=2026-01-01T11:00:00Z"


def hostile_gpu(runai: RunaiApi, label: str) -> None:
    """The per-GPU answers name their GPU `label` (values negative, to show numbers stay numbers)."""

    def answer(form: dict[str, str]) -> httpx.Response | None:
        if "step" not in form or "DCGM_" not in form["query"]:
            return None
        result: list[dict[str, Any]] = [
            {"metric": {"gpu": label}, "values": grid_values(form, lambda t: "-1.5")},
        ]
        data = {"resultType": "matrix", "result": result}
        return httpx.Response(200, content=orjson.dumps({"status": "success", "data": data}))

    runai.prom.fail = answer


@pytest.mark.parametrize("start", FORMULA_STARTS, ids=repr)
def test_a_formula_gpu_label_is_neutralised(runai: RunaiApi, start: str) -> None:
    payload = PAYLOADS[start]
    hostile_gpu(runai, payload)
    r = runai.metrics(
        f"metricType=GPU_UTILIZATION_PER_GPU,CPU_USAGE_CORES&{WINDOW}&numberOfSamples=2",
        headers={"Accept": "text/csv"},
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv"), r.text
    rows = list(csv.reader(io.StringIO(r.text)))
    assert rows[0] == ["type", "gpu", "timestamp", "value"]
    per_gpu = [row for row in rows[1:] if row[0] == "GPU_UTILIZATION_PER_GPU"]
    assert per_gpu and {row[1] for row in per_gpu} == {"'" + payload}
    assert {row[3] for row in per_gpu} == {"-1.5"}  # a negative number is a number: no quote
    # the JSON answer carries the label as it is (JSON is not read as formulas)
    body = runai.metrics(f"metricType=GPU_UTILIZATION_PER_GPU&{WINDOW}&numberOfSamples=2").json()
    labels = [m["labels"] for m in body["measurements"]]
    assert {"gpu": payload} in labels, labels
