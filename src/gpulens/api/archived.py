"""Answers of archived executions and pods, kept whole: a repeat read is served from memory.

An archived object's answer cannot change while its archive generation is the same, so a route keys
the response body by (route, object, generation, normalised parameters). Each read still resolves
the object for its caller first (same errors as the service: not found, another org or project) and
checks that the archive is fresh; only the metric evaluation is saved. An answer is kept only when it
was computed for the same registration that was looked up (a PATCH in between is never cached).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable, Sequence
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import Response

from gpulens.api.deps import AppContext
from gpulens.domain.catalog import PodMetricDef
from gpulens.domain.models import Execution
from gpulens.domain.workloads import Pod
from gpulens.service.archive import AnswerCache, CachedAnswer


@dataclass(frozen=True, slots=True)
class AnswerSlot:
    """Where one read's answer is, or will be, kept."""

    cache: AnswerCache
    key: Hashable
    subject: object  # the execution or pods the key was made for

    def hit(self) -> Response | None:
        found = self.cache.get(self.key)
        if found is None:
            return None
        return Response(found.body, status_code=found.status, media_type=found.media_type)

    def keep(self, subject: object, response: Response) -> None:
        """Keep a finished response computed for `subject`."""
        if subject == self.subject and isinstance(response.body, bytes):
            media = response.media_type or "application/json"
            self.cache.put(self.key, CachedAnswer(response.status_code, media, response.body))

    async def recording(
        self, subject: object, media_type: str, parts: AsyncIterator[bytes]
    ) -> AsyncIterator[bytes]:
        """Passes a streamed body through; keeps it once it has been sent whole."""
        sent: list[bytes] = []
        async for part in parts:
            sent.append(part)
            yield part
        if subject == self.subject:
            self.cache.put(self.key, CachedAnswer(200, media_type, b"".join(sent)))


async def lyceum_slot(
    ctx: AppContext, execution: Execution, params: tuple[int | None, ...]
) -> AnswerSlot | None:
    """The slot of an execution-metrics read (of an execution its caller may see), when the
    execution is archived."""
    if ctx.archives is None or ctx.answers is None:
        return None
    generation = await ctx.archives.execution_generation(execution)
    if generation is None:
        return None
    return AnswerSlot(ctx.answers, ("lyceum", execution.execution_id, generation, params), execution)


async def runai_slot(
    request: Request,
    ctx: AppContext,
    workload_id: str,
    pod_id: str | None,
    pods: tuple[Pod, ...],
    types: Sequence[PodMetricDef],
    start_ms: int,
    end_ms: int,
    samples: int,
) -> AnswerSlot | None:
    """The slot of a pod-metrics read (`pod_id`) or of a workload-metrics read (None), when every pod
    it covers (`pods`, as the route resolved them for its caller) is archived."""
    if ctx.archives is None or ctx.answers is None:
        return None
    generation = await ctx.archives.pods_generation(pods)
    if generation is None:
        return None
    csv_wanted = "text/csv" in request.headers.get("accept", "")
    params = (tuple(m.type for m in types), start_ms, end_ms, samples, csv_wanted)
    return AnswerSlot(ctx.answers, ("runai", workload_id, pod_id, generation, params), pods)
