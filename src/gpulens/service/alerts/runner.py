"""The live alerts' background work while `gpulens serve` runs: the evaluation pass every
`GPULENS_ALERTS_INTERVAL` seconds and the deliverer beside it (a slow receiver never delays a pass)."""

from __future__ import annotations

import anyio

from gpulens.service.alerts.deliver import Deliverer
from gpulens.service.alerts.evaluate import Evaluator

DELIVERY_INTERVAL_S = 1.0  # how often the deliverer looks for due deliveries (one indexed query)


async def alerts_task(evaluator: Evaluator, deliverer: Deliverer) -> None:
    """Both loops until cancelled; the deliverer's HTTP client closed at the end."""
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(evaluator.run_forever)
            tasks.start_soon(deliverer.run_forever, DELIVERY_INTERVAL_S)
    finally:
        with anyio.CancelScope(shield=True):
            await deliverer.aclose()
