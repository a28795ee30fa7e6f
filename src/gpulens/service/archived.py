"""The seam between the metric services and gpulens' archive of finished executions and pods.

A service asks the lookup for a backend that answers from the archive; `None` means "not archived
(or the archive is stale): ask the live backend". The archive service implements this protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gpulens.backends.base import MetricsBackend
from gpulens.domain.models import Execution
from gpulens.domain.workloads import Pod


class ArchiveLookup(Protocol):
    async def for_execution(self, execution: Execution) -> MetricsBackend | None:
        """A backend over the execution's archived samples, when a fresh archive exists."""
        ...

    async def for_pods(self, pods: Sequence[Pod]) -> MetricsBackend | None:
        """A backend over the pods' archived samples, when every one of them has a fresh archive."""
        ...
