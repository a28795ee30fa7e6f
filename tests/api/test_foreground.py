"""api/foreground.py: which HTTP requests hold the summaries back."""

from __future__ import annotations

import pytest
from starlette.types import Receive, Scope, Send

from gpulens.api.foreground import CountRequests
from gpulens.service.priority import Priority


@pytest.mark.parametrize(
    ("path", "busy", "summaries"),
    [
        ("/api/v2/external/execution/exec-1/metrics", True, 0),
        ("/api/v2/external/execution/exec-1/summary", False, 1),
        ("/api/v2/external/execution/exec-1/summary/x", True, 0),
        ("/api/v2/external/execution-summaries", True, 0),
        ("/healthz", False, 0),
        ("/readyz", False, 0),
        ("/metrics", False, 0),
        ("/gpulens/api/v2/external/execution/exec-1/summary", False, 1),  # under a proxy's root path
        ("/gpulens/healthz", False, 0),
    ],
)
async def test_reads_hold_summaries_back_and_summaries_and_probes_do_not(
    path: str, busy: bool, summaries: int
) -> None:
    priority = Priority()
    seen: list[tuple[bool, int, float]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append((priority.busy(), priority.low, priority._last_busy))

    async def receive() -> dict[str, object]:
        return {}

    async def send(message: dict[str, object]) -> None:
        return None

    scope = {"type": "http", "path": path, "root_path": "/gpulens" if path.startswith("/gpulens/") else ""}
    await CountRequests(app, priority=priority)(scope, receive, send)  # type: ignore[arg-type]
    ((was_busy, low, last_busy),) = seen
    assert was_busy == busy and low == summaries
    if not busy:  # a summary or a probe never marks the process busy, even for an instant
        assert last_busy == float("-inf")
    assert priority.requests == priority.low == 0
