"""The live alerts' background work while `gpulens serve` runs: the evaluation pass every
`GPULENS_ALERTS_INTERVAL` seconds, the digests' pass beside it (as often: it sends a digest once its
period ended) and the deliverer (a slow receiver never delays a pass)."""

from __future__ import annotations

import anyio

from gpulens.service.alerts.deliver import Deliverer
from gpulens.service.alerts.digest import Digester, DigestOptions
from gpulens.service.alerts.evaluate import Evaluator
from gpulens.storage.digests import DigestStore

DELIVERY_INTERVAL_S = 1.0  # how often the deliverer looks for due deliveries (one indexed query)


def digester_for(evaluator: Evaluator) -> Digester:
    """The digests' pass over the evaluator's registry, clock and options."""
    o = evaluator.options
    options = DigestOptions(interval_s=o.interval_s, public_url=o.public_url, prices=o.prices)
    return Digester(evaluator.store, DigestStore(evaluator.registry), evaluator.clock, options)


async def alerts_task(evaluator: Evaluator, deliverer: Deliverer) -> None:
    """The loops until cancelled; the deliverer's HTTP client closed at the end."""
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(evaluator.run_forever)
            tasks.start_soon(digester_for(evaluator).run_forever)
            tasks.start_soon(deliverer.run_forever, DELIVERY_INTERVAL_S)
    finally:
        with anyio.CancelScope(shield=True):
            await deliverer.aclose()
