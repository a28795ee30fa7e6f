"""The one table of input limits (domain/limits.py): the patterns, the API's schema, the services and
the CLI all hold exactly its numbers (the longest accepted, one more refused)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpulens.api.openapi_dump import document
from gpulens.cli.keys import app as keys_app
from gpulens.domain import limits
from gpulens.domain.errors import InvalidParameter
from gpulens.domain.models import EXECUTION_ID_RE, HOSTNAME_RE, ORG_SLUG_RE, PROJECT_RE, Principal
from gpulens.domain.workloads import K8S_NAMESPACE_RE, K8S_POD_NAME_RE
from gpulens.service.executions import ExecutionService
from gpulens.storage.registry import Registry
from tests.cli.conftest import invoke, one_line_error

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
ADMIN = Principal(org="platform", subject="svc", is_admin=True)


@pytest.mark.parametrize(
    ("pattern", "longest"),
    [
        (ORG_SLUG_RE, limits.ORG_SLUG_MAX),
        (PROJECT_RE, limits.PROJECT_MAX),
        (EXECUTION_ID_RE, limits.EXECUTION_ID_MAX),
        (HOSTNAME_RE, limits.HOSTNAME_MAX),
        (K8S_NAMESPACE_RE, limits.NAMESPACE_MAX),
        (K8S_POD_NAME_RE, limits.POD_NAME_MAX),
    ],
)
def test_patterns_take_the_tables_lengths(pattern: str, longest: int) -> None:
    assert re.fullmatch(pattern, "a" * longest)
    assert not re.fullmatch(pattern, "a" * (longest + 1))


def _schema(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = document()["components"]["schemas"][name]
    return schema


def test_the_api_schema_states_the_tables_limits() -> None:
    registration = _schema("ExecutionRegistration")["properties"]

    def bound(field: str, key: str) -> object:
        prop = registration[field]
        return next(s[key] for s in prop.get("anyOf", [prop]) if key in s)

    assert bound("gpus", "maxItems") == limits.GPUS_MAX
    assert bound("system_errors", "maxItems") == limits.SYSTEM_ERRORS_MAX
    assert bound("file_name", "maxLength") == limits.FILE_NAME_MAX
    assert bound("hardware_profile", "maxLength") == limits.PROFILE_MAX
    assert bound("return_code", "maximum") == limits.INT32_MAX
    assert bound("return_code", "minimum") == limits.INT32_MIN
    assert _schema("ApiKeyCreate")["properties"]["key_name"]["maxLength"] == limits.KEY_NAME_MAX


@pytest.fixture
def service(registry: Registry) -> ExecutionService:
    return ExecutionService(registry, clock=lambda: NOW)


@pytest.mark.parametrize(
    ("field", "longest", "over"),
    [
        ("hostname", "h" * limits.HOSTNAME_MAX, "h" * (limits.HOSTNAME_MAX + 1)),
        ("project", "p" * limits.PROJECT_MAX, "p" * (limits.PROJECT_MAX + 1)),
        ("file_name", "f" * limits.FILE_NAME_MAX, "f" * (limits.FILE_NAME_MAX + 1)),
        ("gpus", [str(i) for i in range(limits.GPUS_MAX)], [str(i) for i in range(limits.GPUS_MAX + 1)]),
        (
            "system_errors",
            ["e" * limits.SYSTEM_ERROR_MAX] * limits.SYSTEM_ERRORS_MAX,
            ["e"] * (limits.SYSTEM_ERRORS_MAX + 1),
        ),
        ("return_code", limits.INT32_MAX, limits.INT32_MAX + 1),
    ],
)
async def test_the_service_holds_the_tables_limits(
    service: ExecutionService, field: str, longest: object, over: object
) -> None:
    await service.register(ADMIN, {"org": "acme", field: longest})  # type: ignore[misc]
    with pytest.raises(InvalidParameter) as refused:
        await service.register(ADMIN, {"org": "acme", field: over})  # type: ignore[misc]
    assert refused.value.name == field


async def test_key_names_and_orgs_through_the_one_key_path(service: ExecutionService) -> None:
    caller = Principal(org="acme", subject="k")
    await service.create_key(caller, "n" * limits.KEY_NAME_MAX)
    with pytest.raises(InvalidParameter, match=str(limits.KEY_NAME_MAX)):
        await service.create_key(caller, "n" * (limits.KEY_NAME_MAX + 1))
    await service.create_key_for(ADMIN, "o" * limits.ORG_SLUG_MAX, "k")
    with pytest.raises(InvalidParameter, match=str(limits.ORG_SLUG_MAX)):
        await service.create_key_for(ADMIN, "o" * (limits.ORG_SLUG_MAX + 1), "k")


def test_the_cli_refuses_what_the_api_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULENS_DATABASE_URL", f"sqlite:///{tmp_path / 'registry.db'}")
    monkeypatch.setenv("GPULENS_DATA_DIR", str(tmp_path))
    long_name = "n" * (limits.KEY_NAME_MAX + 1)
    message = one_line_error(invoke(keys_app, "create", "--org", "acme", "--name", long_name), 2)
    assert message.startswith("error: --name:") and f"1-{limits.KEY_NAME_MAX}" in message
    message = one_line_error(invoke(keys_app, "create", "--org", "o" * (limits.ORG_SLUG_MAX + 1)), 2)
    assert message.startswith("error: --org:") and f"1-{limits.ORG_SLUG_MAX}" in message


def test_registry_columns_hold_the_longest_accepted_values() -> None:
    """The migrations fix the column widths; the table's limits must never outgrow them."""
    from gpulens.storage.tables import ApiKeyRow, ExecutionRow, OrgRow, PodRow, WorkloadRow

    def width(row: Any, column: str) -> int:
        length: int = row.__table__.c[column].type.length
        return length

    assert width(OrgRow, "slug") >= limits.ORG_SLUG_MAX
    assert width(ApiKeyRow, "name") >= limits.KEY_NAME_MAX
    assert width(ExecutionRow, "execution_id") >= limits.EXECUTION_ID_MAX
    assert width(ExecutionRow, "project") >= limits.PROJECT_MAX
    assert width(ExecutionRow, "hostname") >= limits.HOSTNAME_MAX
    assert width(ExecutionRow, "hardware_profile") >= limits.PROFILE_MAX
    assert width(ExecutionRow, "execution_type") >= limits.PROFILE_MAX
    assert width(ExecutionRow, "file_name") >= limits.FILE_NAME_MAX
    assert width(WorkloadRow, "name") >= limits.WORKLOAD_NAME_MAX
    assert width(PodRow, "name") >= limits.POD_NAME_MAX
    assert width(PodRow, "namespace") >= limits.NAMESPACE_MAX
    assert width(PodRow, "node") >= limits.HOSTNAME_MAX
