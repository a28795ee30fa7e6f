"""The committed openapi.json is the contract: regenerate it with `make openapi` when the API changes."""

from __future__ import annotations

import json
from pathlib import Path

from gpulens.api.openapi_dump import document

COMMITTED = Path(__file__).resolve().parents[2] / "openapi.json"


def test_openapi_has_not_drifted() -> None:
    current = json.loads(json.dumps(document(), sort_keys=True))
    committed = json.loads(COMMITTED.read_text())
    assert current == committed, "the API changed: run `make openapi` and commit openapi.json"


def test_lyceum_metrics_route_uses_the_vendor_schema_names() -> None:
    schemas = document()["components"]["schemas"]
    for name in ("ExecutionMetricsResponse", "MetricDataPoint", "TimeRange", "HTTPValidationError"):
        assert name in schemas
