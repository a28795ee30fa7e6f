"""ExecutionService: body checks shared with the workloads (service/checks.py) and the tenant rule."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpulens.domain.errors import Forbidden, InvalidParameter, NotFound
from gpulens.domain.models import Principal
from gpulens.service.executions import ExecutionService
from gpulens.storage.registry import Registry

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
ADMIN = Principal(org="platform", subject="svc", is_admin=True)


@pytest.fixture
def service(registry: Registry) -> ExecutionService:
    return ExecutionService(registry, clock=lambda: NOW)


@pytest.mark.parametrize("gpus", ["012", ["0", "gpu0"], 7])
async def test_gpus_must_be_a_list_of_ids(service: ExecutionService, gpus: object) -> None:
    with pytest.raises(InvalidParameter) as exc:
        await service.register(ADMIN, {"org": "acme", "hostname": "h", "gpus": gpus})  # type: ignore[typeddict-item]
    assert exc.value.name == "gpus"


async def test_gpus_keep_order_and_drop_repeats(service: ExecutionService) -> None:
    execution, _ = await service.register(ADMIN, {"org": "acme", "hostname": "h", "gpus": ["3", "0", "3"]})
    assert execution.gpus == ("3", "0")


async def test_other_orgs_do_not_exist_and_other_projects_are_forbidden(service: ExecutionService) -> None:
    e, _ = await service.register(ADMIN, {"org": "acme", "hostname": "h", "project": "team-a"})
    assert (await service.get_for(Principal(org="acme", subject="k"), e.execution_id)) == e
    with pytest.raises(NotFound):
        await service.get_for(Principal(org="beta", subject="k"), e.execution_id)
    with pytest.raises(Forbidden):
        await service.get_for(
            Principal(org="acme", subject="k", projects=frozenset({"team-b"})), e.execution_id
        )
