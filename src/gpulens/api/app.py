"""The composition root: `create_app(settings)` builds every component; nothing is built at import."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from functools import partial
from typing import Any

import anyio
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from gpulens import __version__
from gpulens.api import admin, admin_workloads, foreground, guard, health, observability
from gpulens.api import errors as api_errors
from gpulens.api.deps import AppContext
from gpulens.api.lyceum import alerts as lyceum_alerts
from gpulens.api.lyceum import executions as lyceum_executions
from gpulens.api.lyceum import export as lyceum_export
from gpulens.api.lyceum import keys as lyceum_keys
from gpulens.api.lyceum import metrics as lyceum_metrics
from gpulens.api.lyceum import summaries as lyceum_summaries
from gpulens.api.lyceum import summary as lyceum_summary
from gpulens.api.lyceum import usage as lyceum_usage
from gpulens.api.runai import metrics as runai_metrics
from gpulens.api.runai import pods as runai_pods
from gpulens.api.runai import summary as runai_summary
from gpulens.api.runai import token as runai_token
from gpulens.api.ui import docs as api_docs
from gpulens.api.ui import install as install_ui

__all__ = [  # the wiring's functions, also reached through here
    "archive_options",
    "backend_access",
    "build_context",
    "create_app",
    "make_backend",
    "plan_options",
    "pod_plan_options",
]
from gpulens.backends.base import MetricsBackend
from gpulens.config import Settings
from gpulens.service.alerts.deliver import Deliverer
from gpulens.service.alerts.evaluate import Evaluator
from gpulens.service.alerts.rules import AlertService
from gpulens.service.alerts.runner import alerts_task
from gpulens.service.archive import AnswerCache, Archiver, ArchiveService, archive_task
from gpulens.service.auth import Authenticator, TokenIssuer
from gpulens.service.discovery import discovery_task
from gpulens.service.executions import ExecutionService
from gpulens.service.live_tails import LiveTails
from gpulens.service.metrics import MetricsLimits, MetricsService
from gpulens.service.pod_metrics import PodMetricsService
from gpulens.service.priority import Priority, YieldingArchives, YieldingBackend
from gpulens.service.running_usage import RunningUsage, running_usage_task
from gpulens.service.slurm import slurm_discovery_task, slurm_rest_source
from gpulens.service.summary import SummaryService
from gpulens.service.summary_store import StoredSummaries, StoredSummaryOptions, summary_task
from gpulens.service.usage import UsageService
from gpulens.service.wiring import (
    archive_options,
    backend_access,
    delivery_options,
    eval_options,
    make_backend,
    plan_options,
    pod_plan_options,
)
from gpulens.service.workloads import WorkloadService
from gpulens.storage.alerts import AlertStore
from gpulens.storage.archive import ArchiveStore
from gpulens.storage.registry import Registry
from gpulens.storage.summaries import SummaryStore
from gpulens.storage.usage import UsageStore


def runai_openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI documents 422 on every route with parameters; the Run:ai routes never answer 422."""
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        for path, item in schema.get("paths", {}).items():
            if path.startswith(api_errors.RUNAI_PREFIX):
                for operation in item.values():
                    operation.get("responses", {}).pop("422", None)
        app.openapi_schema = schema
    return app.openapi_schema


def build_context(
    settings: Settings,
    registry: Registry,
    backend: MetricsBackend,
    clock: Callable[[], datetime] | None = None,
) -> AppContext:
    """Every service, wired once; create_app and the CLI's in-process commands share it."""
    limits = MetricsLimits(
        max_points_per_query=settings.max_points_per_query,
        max_points_per_series=settings.max_points_per_series,
        in_flight=settings.query_concurrency,
    )
    now = clock or (lambda: datetime.now(UTC))
    executions = ExecutionService(registry, clock=now)
    archives = ArchiveService(
        ArchiveStore(registry), archive_options(settings), cache_bytes=settings.archive_cache_bytes
    )
    priority = Priority()  # summaries step aside while other requests are served (service/priority.py)
    metrics = MetricsService(
        executions,
        YieldingBackend(backend, priority),
        plan_options(settings),
        limits,
        now,
        archives=YieldingArchives(archives, priority),  # archived executions' summaries step aside too
    )
    workloads = WorkloadService(registry, clock=now)
    pod_metrics = PodMetricsService(
        workloads,
        backend,
        pod_plan_options(settings),
        advanced_enabled=settings.advanced_gpu_metrics,
        clock=now,
        archives=archives,
        max_pods_per_query=settings.max_pods_per_query,
    )
    summaries = StoredSummaries(
        SummaryService(metrics, settings.prices, settings.carbon_intensity, priority),
        SummaryStore(registry),
        lyceum_summary.to_json,
        StoredSummaryOptions(
            concurrency=settings.max_concurrent_summaries,
            wait_s=settings.summary_wait,
            grace_ms=settings.archive_grace_ms,
            batch=settings.summary_batch,
        ),
        now,
    )
    return AppContext(
        settings=settings,
        registry=registry,
        authenticator=Authenticator(
            registry, settings, clock=now, issuer=TokenIssuer(registry, settings, clock=now)
        ),
        executions=executions,
        metrics=metrics,
        workloads=workloads,
        pod_metrics=pod_metrics,
        archives=archives,
        answers=AnswerCache(settings.archive_answer_cache_bytes),
        summaries=summaries,
        alerts=AlertService(AlertStore(registry), clock=now),
        usage=UsageService(UsageStore(registry), settings.prices, clock=now),
    )


def state_collector(settings: Settings, ctx: AppContext) -> observability.StateCollector:
    """/metrics' figures read at scrape time: the caches, the archive, the SQLite files."""

    def caches() -> dict[str, observability.CacheLike]:
        found: dict[str, observability.CacheLike] = {**ctx.metrics.caches(), **ctx.pod_metrics.caches()}
        if ctx.answers is not None:
            found["archived_answers"] = ctx.answers
        return found

    files = {} if settings.prometheus_url else {"samples": settings.samples_path}
    if settings.registry_path is not None:
        files["registry"] = settings.registry_path
    totals = ctx.archives.store.totals if ctx.archives is not None else None
    return observability.StateCollector(caches, totals, files, ctx.summaries.figures)


def create_app(
    settings: Settings,
    *,
    registry: Registry | None = None,
    backend: MetricsBackend | None = None,
    clock: Callable[[], datetime] | None = None,
    collector: observability.CollectorLike | None = None,
) -> FastAPI:
    """`collector`: the embedded default's collector, watched by /readyz and /metrics."""
    registry = registry or Registry.from_url(settings.resolved_database_url)
    telemetry = observability.Telemetry()
    backend = observability.MeteredBackend(backend or make_backend(settings), telemetry)
    ctx = build_context(settings, registry, backend, clock)
    if settings.alerts is not None:  # the operator's default rules and channels, written once at start
        ctx.alerts.load_defaults(settings.alerts)
    now = ctx.metrics.clock
    telemetry.registry.register(state_collector(settings, ctx))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tasks:
            if settings.discovery_interval > 0 and settings.discovery_org:
                tasks.start_soon(
                    partial(
                        discovery_task,
                        backend,
                        registry,
                        settings.discovery_org,
                        interval_s=settings.discovery_interval,
                        max_window_s=settings.discovery_max_window,
                        metric_names=settings.metric_names,
                        clock=now,
                    )
                )
            if settings.discovery_interval > 0 and settings.discovery_org and settings.slurm_url:
                tasks.start_soon(
                    partial(
                        slurm_discovery_task,
                        partial(slurm_rest_source, settings),
                        registry,
                        settings.discovery_org,
                        interval_s=settings.discovery_interval,
                        cluster=settings.slurm_cluster,
                        backend=backend if settings.prometheus_url else None,
                        clock=now,
                    )
                )
            archives = ctx.archives
            if archives is not None and settings.archive_interval > 0 and settings.prometheus_url:
                # (on the embedded default the local store is the source: nothing to archive)
                archiver = Archiver(registry, archives.store, backend, archives.options, now)
                tasks.start_soon(
                    partial(
                        archive_task,
                        archiver,
                        interval_s=settings.archive_interval,
                        on_pass=telemetry.archive_pass,
                    )
                )
            if settings.alerts_interval > 0:
                # live alerts: the evaluation pass and the deliverer (docs/alerts.md)
                deliverer = Deliverer(ctx.alerts.store, options=delivery_options(settings), clock=now)
                ctx.alerts.tester = deliverer.send_test
                evaluator = Evaluator(
                    ctx.alerts.store,
                    registry,
                    LiveTails(ctx.summaries.summaries),
                    now,
                    eval_options(settings),
                )
                tasks.start_soon(alerts_task, evaluator, deliverer)
            if settings.summary_interval > 0:
                # the summaries of finished executions, stored once computed (also on the embedded default)
                tasks.start_soon(partial(summary_task, ctx.summaries, interval_s=settings.summary_interval))
            if settings.usage_interval > 0:
                # the provisional usage of running executions (docs/usage.md)
                running = RunningUsage(ctx.summaries, clock=now)
                tasks.start_soon(partial(running_usage_task, running, interval_s=settings.usage_interval))
            yield
            tasks.cancel_scope.cancel()
        await backend.aclose()

    app = FastAPI(
        title="gpulens",
        version=__version__,
        description="How did my execution use the hardware? Lyceum- and Run:ai-compatible GPU metrics.",
        lifespan=lifespan,
        docs_url=None,  # FastAPI's pages load their scripts from a CDN: /docs is served from the package
        redoc_url=None,
    )
    app.state.ctx = ctx
    app.openapi = partial(runai_openapi, app)  # type: ignore[method-assign]
    api_errors.install(app)
    app.add_middleware(guard.RequestGuard, ctx=ctx)
    app.add_middleware(foreground.CountRequests, priority=ctx.summaries.summaries.priority)
    app.state.pass_clock = observability.watch_collector(collector, telemetry) if collector else None
    observability.install(app, telemetry, json_logs=settings.log_format == "json")  # outermost
    app.include_router(health.router)
    # the metrics reads first: FastAPI tries the routers in order, each one costs ~20 us to pass (the
    # Run:ai read passed twelve: a quarter of a millisecond a request); no path of one overlaps another's
    app.include_router(lyceum_metrics.router)
    app.include_router(runai_metrics.router)
    app.include_router(lyceum_summary.router)
    app.include_router(lyceum_summaries.router)
    app.include_router(lyceum_usage.router)
    app.include_router(lyceum_export.router)
    app.include_router(lyceum_executions.router)
    app.include_router(lyceum_keys.router)
    app.include_router(lyceum_alerts.router)
    app.include_router(admin.router)
    app.include_router(admin_workloads.router)
    app.include_router(runai_summary.router)
    app.include_router(runai_pods.router)
    app.include_router(runai_token.router)
    install_ui(app)  # the web dashboard: /, /ui/...
    app.include_router(api_docs.router)  # /docs (vendored Swagger UI, the dashboard's CSP)
    return app
