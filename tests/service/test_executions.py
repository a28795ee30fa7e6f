"""ExecutionService: body checks shared with the workloads (service/checks.py) and the tenant rule."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from gpulens.domain.errors import Conflict, Forbidden, InvalidParameter, NotFound
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


async def test_gpu_indices_are_kept_as_exporters_write_them(service: ExecutionService) -> None:
    """A padded index ("01") is the GPU its series name gpu="1": as given, it would match none."""
    uuid = "GPU-5a3f0c2e-9b1d-4e7a-8c6f-0d2e4b6a8c01"
    gpus = ["03", "3", "00", uuid, "10"]
    execution, _ = await service.register(ADMIN, {"org": "acme", "hostname": "h", "gpus": gpus})
    assert execution.gpus == ("3", "0", uuid, "10")


async def test_other_orgs_do_not_exist_and_other_projects_are_forbidden(service: ExecutionService) -> None:
    e, _ = await service.register(ADMIN, {"org": "acme", "hostname": "h", "project": "team-a"})
    assert (await service.get_for(Principal(org="acme", subject="k"), e.execution_id)) == e
    with pytest.raises(NotFound):
        await service.get_for(Principal(org="beta", subject="k"), e.execution_id)
    with pytest.raises(Forbidden):
        await service.get_for(
            Principal(org="acme", subject="k", projects=frozenset({"team-b"})), e.execution_id
        )


@pytest.mark.parametrize("recent", [False, True], ids=["read", "recent"])
async def test_the_tenant_rule_holds_for_recent_reads_too(service: ExecutionService, recent: bool) -> None:
    e, _ = await service.register(ADMIN, {"org": "acme", "hostname": "h", "project": "team-a"})
    for _ in range(2):  # the second from what the first kept
        assert await service.get_for(Principal(org="acme", subject="k"), e.execution_id, recent=recent) == e
        with pytest.raises(NotFound):
            await service.get_for(Principal(org="beta", subject="k"), e.execution_id, recent=recent)
        with pytest.raises(Forbidden):
            limited = Principal(org="acme", subject="k", projects=frozenset({"team-b"}))
            await service.get_for(limited, e.execution_id, recent=recent)


async def test_recent_reads_share_one_registry_read_and_see_changes_made_here(
    service: ExecutionService, registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Metrics reads (`recent`) read a running execution once per RECENT_READ_TTL_S, concurrent ones
    together; one unknown a moment ago is looked for again at once, a finished one every time; a
    change through this service is seen by the next read."""
    acme = Principal(org="acme", subject="k")
    eid = "6c0a2f4e-1b3d-4e5f-8a9b-0c1d2e3f4a5b"
    reads: list[str] = []
    read = registry.get_execution
    monkeypatch.setattr(registry, "get_execution", lambda i: reads.append(i) or read(i))
    with pytest.raises(NotFound):
        await service.get_for(acme, eid, recent=True)
    other = ExecutionService(registry, clock=lambda: NOW)  # another replica registers it
    await other.register(ADMIN, {"execution_id": eid, "org": "acme", "hostname": "h"})
    reads.clear()
    found = await asyncio.gather(*(service.get_for(acme, eid, recent=True) for _ in range(5)))
    assert len({e.execution_id for e in found}) == 1 and reads == [eid]
    await service.get_for(acme, eid, recent=True)
    await service.get_for(acme, eid)  # a plain read always reads
    assert reads == [eid, eid]
    await service.update(ADMIN, eid, {"end_time": NOW})
    reads.clear()
    for _ in range(2):  # finished: read as it is now (a change would make its archive stale)
        assert (await service.get_for(acme, eid, recent=True)).end_time == NOW
    assert reads == [eid, eid]
    await service.register(ADMIN, {"execution_id": eid, "org": "acme", "project": "team-z"})
    with pytest.raises(Forbidden):
        await service.get_for(
            Principal(org="acme", subject="k", projects=frozenset({"team-a"})), eid, recent=True
        )


async def test_naive_body_times_are_utc_and_stored_so(service: ExecutionService, registry: Registry) -> None:
    """The edge rule (a time without a zone is UTC, as runapy sends a naive datetime) holds through
    the service into storage and back."""
    naive = datetime(2026, 11, 28, 10, 0)
    e, _ = await service.register(
        ADMIN, {"org": "acme", "hostname": "h", "created_at": naive, "start_time": naive}
    )
    stored = registry.get_execution(e.execution_id)
    assert stored is not None and stored.start_time is not None
    assert stored.created_at == stored.start_time == datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
    assert stored.start_time.tzinfo is UTC
    updated = await service.update(ADMIN, e.execution_id, {"end_time": datetime(2026, 11, 28, 11, 0)})
    assert updated.end_time == datetime(2026, 11, 28, 11, 0, tzinfo=UTC)
    key, _ = await service.create_key(Principal(org="acme", subject="k"), "ci", datetime(2027, 1, 1))
    assert key.expires_at == datetime(2027, 1, 1, tzinfo=UTC)


async def test_one_key_path_checks_scope_for_every_caller(service: ExecutionService) -> None:
    """create_key (the Lyceum route) and create_key_for (admin, CLI) share the checks: no broader key
    than the caller, admin keys only from admins, the expiry clamp."""
    limited = Principal(org="acme", subject="k", projects=frozenset({"a"}))
    key, _ = await service.create_key(limited, "mine")
    assert key.projects == frozenset({"a"}) and not key.is_admin
    with pytest.raises(Forbidden):
        await service.create_key_for(limited, "acme", "x")  # not an admin
    ends = NOW.replace(year=2027)
    clamped_admin = Principal(org="platform", subject="svc", is_admin=True, key_expires_at=ends)
    issued, _ = await service.create_key_for(
        clamped_admin, "beta", "svc", is_admin=True, projects=["p", "q"], expires_at=NOW.replace(year=2030)
    )
    assert issued.org == "beta" and issued.is_admin and issued.projects == frozenset({"p", "q"})
    assert issued.expires_at == ends  # never outlives its creator
    with pytest.raises(InvalidParameter) as bad_project:
        await service.create_key_for(ADMIN, "beta", "svc", projects=["no spaces"])
    assert bad_project.value.name == "projects"
    with pytest.raises(InvalidParameter) as past:
        await service.create_key_for(ADMIN, "beta", "svc", expires_at=NOW.replace(year=2001))
    assert past.value.name == "expires_at"


async def test_admins_find_revoke_and_toggle_keys_of_any_org(service: ExecutionService) -> None:
    key, _ = await service.create_key_for(ADMIN, "beta", "k")
    assert await service.find_any_key(ADMIN, key.prefix) == key
    assert await service.find_any_key(ADMIN, key.key_id) == key
    assert [k.key_id for k in await service.list_all_keys(ADMIN, org="beta")] == [key.key_id]
    with pytest.raises(Forbidden):
        await service.find_any_key(Principal(org="beta", subject="k"), key.key_id)
    assert not (await service.toggle_any_key(ADMIN, key.prefix)).is_active
    assert (await service.revoke_any_key(ADMIN, key.key_id)).is_revoked
    with pytest.raises(Conflict, match="already revoked"):
        await service.revoke_any_key(ADMIN, key.key_id)
    assert await service.list_all_keys(ADMIN, org="beta") == []
    assert len(await service.list_all_keys(ADMIN, org="beta", include_revoked=True)) == 1
    with pytest.raises(NotFound):
        await service.find_any_key(ADMIN, "lk_zzzzz")
