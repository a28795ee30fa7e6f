"""schemathesis against the app's own OpenAPI document (issue 10, item 12): the document says what
the server does.

The app is the real one (create_app) over the embedded store with an hour of two fake GPUs, a
registry with two orgs, their executions, workloads and pods, and keys (tests/api/world.py). Every
operation of `/openapi.json` gets positive cases (valid per the schema) and negative ones (not),
sent in-process through schemathesis' ASGI transport with the owner's key (the admin key on admin
routes). About half of each operation's cases name the existing objects in the path (the rest are
generated ids), so the routes run to the end, not only to their 404. Checks on every response:

* no 5xx (`not_a_server_error`);
* its status code is documented for the operation (`status_code_conformance`), its content type
  too (`content_type_conformance`), and its body matches the documented schema
  (`response_schema_conformance`);
* a positive case is never refused (400/422) but for relations a schema cannot state
  (`positive_data_accepted`, SEMANTIC_REFUSALS).

Hypothesis runs derandomized (the same cases on every run). `GPULENS_FUZZ_CASES` sets the total
(default 700: about 650 run, some operations having fewer distinct cases; under a
minute here. `make fuzz` runs many more). Every failure is collected, not
only the first, and the counts are printed.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.api import world as w

CASES = int(os.environ.get("GPULENS_FUZZ_CASES", "700"))
# What a request valid per the schema may still be refused for: relations a JSON schema cannot
# state (one field against another, against the clock, against the window's size, ids derived
# from two fields). Anything else that refuses a positive case (400 or 422) is a document wrong.
SEMANTIC_REFUSALS = re.compile(
    r"must not be before start"  # end < start (query or body)
    r"|more than the maximum of \d+"  # step too fine for the window (the message names a step that fits)
    r"|expires_at is in the past"
    r"|the same pod appears twice"  # two pods of a registration with the same (derived) id
    r"|does not overlap the pod's life"  # a pod summary's window against the pod's registered life
    r"|is not a channel of this organization"  # a rule's channel ids against the org's channels
    r"|must be at most 30d"  # a duration's bound (for, after), which a pattern of its texts cannot state
    r"|every must be at least 1h"  # a digest's shortest period, likewise
    r"|until must be in the future|until must be at most 30 days ahead"  # a snooze against the clock
)


def positive_data_accepted(ctx: Any, response: schemathesis.Response, case: schemathesis.Case) -> bool | None:
    """A positive case is answered 2xx, or refused for who is asking (401/403/404/409), or for a
    relation between values the schema cannot state (SEMANTIC_REFUSALS); never 400/422 otherwise."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code not in (400, 422):
        return None
    text = response.text
    assert SEMANTIC_REFUSALS.search(text), (
        f"a request valid per the schema was refused: {response.status_code} {text[:500]}"
    )
    return None


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    positive_data_accepted,
]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[w.World]:
    built = w.build_world(Path(tmp_path_factory.mktemp("fuzz")))
    try:
        yield built
    finally:
        built.close()


def known_path(world: w.World, path: str) -> dict[str, str]:
    """Path parameters naming objects that exist (owned by acme; keys the routes may revoke)."""
    names = {
        "execution_id": w.EXECUTION,
        "workloadId": w.WORKLOAD,
        "workload_id": w.WORKLOAD,
        "podId": w.POD,
        "pod_id": w.POD,
        "api_key_id": world.spare_key_ids[0],
        "rule_id": world.spare_rule,
        "channel_id": world.alert_channel,
        "delivery_id": world.alert_delivery,
    }
    return {k: v for k, v in names.items() if "{" + k + "}" in path}


def test_the_openapi_document_says_what_the_server_does(
    world: w.World, capsys: pytest.CaptureFixture[str], record_property: Any
) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", world.app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20, [op.label for op in operations]
    per_run = max(2, CASES // (2 * len(operations)))
    counts: Counter[str] = Counter()
    statuses: Counter[int] = Counter()
    failures: dict[str, str] = {}  # first report per (operation, failure title)
    no_negative: list[str] = []

    def fuzz(operation: Any, mode: GenerationMode, strategy: Any, headers: dict[str, str]) -> None:
        @settings(
            max_examples=per_run,
            derandomize=True,
            database=None,
            deadline=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=strategy)
        def run(case: schemathesis.Case) -> None:
            counts[mode.value] += 1
            try:
                response = case.call(headers=headers)
            except Exception as exc:  # the in-process transport re-raises what the app did not handle (a 500)
                title = f"{operation.label} [{mode.value}] unhandled {type(exc).__name__}"
                failures.setdefault(title, f"{title}: {exc}\n{case.as_curl_command(headers=headers)}")
                statuses[500] += 1
                return
            statuses[response.status_code] += 1
            try:
                case.validate_response(response, checks=CHECKS, headers=headers)
            except FailureGroup as group:
                for failure in group.exceptions:
                    title = f"{operation.label} [{mode.value}] {failure.title}"
                    failures.setdefault(
                        title, f"{title}\n{failure.message}\n{case.as_curl_command(headers=headers)}"
                    )

        try:
            run()
        except Unsatisfiable:  # nothing to negate (no parameters, no body): no negative case exists
            assert mode is GenerationMode.NEGATIVE, operation.label
            no_negative.append(operation.label)

    for operation in operations:
        key = world.admin if operation.path.startswith("/api/v2/admin/") else world.owner
        headers = {"Authorization": f"Bearer {key}"}
        known = known_path(world, operation.path)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategy = operation.as_strategy(generation_mode=mode)
            if known:
                strategy = st.one_of(
                    strategy, operation.as_strategy(generation_mode=mode, path_parameters=known)
                )
            fuzz(operation, mode, strategy, headers)

    total = sum(counts.values())
    record_property("fuzz_cases", total)
    with capsys.disabled():
        print(
            f"\nschemathesis: {total} cases over {len(operations)} operations "
            f"({dict(counts)}); statuses {dict(sorted(statuses.items()))}; {len(failures)} distinct failures"
        )
    assert total >= min(CASES, 500), f"only {total} of {CASES} cases ran"
    assert not failures, "\n\n".join(failures.values())


def test_unix_seconds_beyond_float_milliseconds_are_out_of_range(world: w.World) -> None:
    """Found by the fuzzer: `start=-1.7976931348623155e+308` (finite seconds, infinite milliseconds)
    made math.floor raise OverflowError: a 500. Now it is out of range, as any other far timestamp."""
    from tests.api.conftest import Client

    client = Client(world.app)
    headers = {"Authorization": f"Bearer {world.owner}"}
    for raw in ("-1.7976931348623155e+308", "1e300", "1e15"):
        r = client.get(
            f"/api/v2/external/execution/{w.EXECUTION}/summary", params={"start": raw}, headers=headers
        )
        assert r.status_code == 422, (raw, r.text)
        assert "out of range" in r.json()["detail"][0]["msg"]
        r = client.get(
            f"/api/v1/workloads/{w.WORKLOAD}/metrics",
            params={"metricType": "GPU_UTILIZATION", "start": raw, "end": "2026-11-28T12:00:00Z"},
            headers=headers,
        )
        assert r.status_code == 400, (raw, r.text)
