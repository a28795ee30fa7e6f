"""gpulens' own telemetry: `GET /metrics` (prometheus_client), one access line per request, and the
collector's last pass for `/readyz`.

- `gpulens_http_request_duration_seconds{route,method,status}`: `route` is the route's template
  (`/api/v2/external/execution/{execution_id}/metrics`), never a raw path with ids in it;
  requests no route matched count as `route="unmatched"`. `method` is one of the methods the app's
  routes serve (as declared: GET, HEAD, POST, PATCH, DELETE today), any other (`PROPFIND`, `M-SEARCH`,
  a made-up token) `other`: the series stay bounded by the routes, whatever a client sends.
- `gpulens_backend_query_duration_seconds{backend,outcome}` and `gpulens_backend_errors_total
  {backend,kind}`: every backend call as the services see it (queue wait included); `backend` is
  the kind (`prometheus`, `embedded`), never its address.
- `gpulens_collector_last_pass_timestamp_seconds`: the embedded collector's last completed pass.
- `gpulens_cache_lookups_total{cache,result}` and `gpulens_cache_entries{cache}`: the look-up caches
  (host and pod layouts, node instances) and the archived answers' cache; `result` is hit or miss.
- `gpulens_archive_objects{kind}`, `gpulens_archive_bytes`, `gpulens_archive_samples`: what the archive
  holds (read from the registry at most once a minute); `gpulens_archive_last_pass_timestamp_seconds`,
  `gpulens_archive_passes_total{outcome}`, `gpulens_archive_built_total{kind}` and
  `gpulens_archive_failures_total`: the archiver's passes.
- `gpulens_summaries_served_total{source}` (stored, computed), `gpulens_summaries_computing`,
  `gpulens_summaries_waiting`, `gpulens_summaries_queued`: the stored summaries (service/summary_store.py).
- `gpulens_store_bytes{store}`: the size on disk of the SQLite files (embedded samples, registry).

Every request gets an id: `X-Request-ID` when the caller sent a sane one, else a new one; it is
echoed in the response (which also gets `X-Content-Type-Options: nosniff`) and, with
GPULENS_LOG_FORMAT=json, on every log line written while the request runs. The access line holds
the id, method, route template, status, duration and the caller's org: never a key, a token or a query string.

The log configuration of `gpulens serve` is here too (`uvicorn_log_config`, `configure_logging`):
with GPULENS_LOG_FORMAT=json, uvicorn's own start-up, error and access lines are JSON lines as well.
"""

from __future__ import annotations

import contextvars
import copy
import logging
import logging.config
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import anyio
import orjson
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.datastructures import MutableHeaders
from starlette.routing import Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpulens.api.deps import PRINCIPAL_SCOPE_KEY
from gpulens.backends.base import MetricsBackend
from gpulens.domain.errors import BackendBadResponse, BackendError, BackendTimeout, BackendUnavailable
from gpulens.domain.models import Principal, RangeQuery, Series
from gpulens.service.archive import PassReport

access_log = logging.getLogger("gpulens.access")
log = logging.getLogger("gpulens.observability")
REQUEST_ID = contextvars.ContextVar[str | None]("gpulens_request_id", default=None)
_SANE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
UNMATCHED = "unmatched"
OTHER_METHOD = "other"
STALE_PASSES = 3  # /readyz fails once the collector has missed this many intervals

_HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Telemetry:
    """The metrics of one app, in a registry of its own (two apps in one process do not collide)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.http = Histogram(
            "gpulens_http_request_duration_seconds",
            "Time from a request's arrival to the end of its response, by route template.",
            ("route", "method", "status"),
            buckets=_HTTP_BUCKETS,
            registry=self.registry,
        )
        self.backend = Histogram(
            "gpulens_backend_query_duration_seconds",
            "Time of one metrics-backend call as the services wait for it (queueing included).",
            ("backend", "outcome"),
            buckets=_HTTP_BUCKETS,
            registry=self.registry,
        )
        self.backend_errors = Counter(
            "gpulens_backend_errors",
            "Metrics-backend calls that failed, by kind (timeout, unavailable, bad_response).",
            ("backend", "kind"),
            registry=self.registry,
        )
        self.last_pass = Gauge(
            "gpulens_collector_last_pass_timestamp_seconds",
            "Unix time of the embedded collector's last completed pass (absent without one).",
            registry=self.registry,
        )

        self.archive_last_pass = Gauge(
            "gpulens_archive_last_pass_timestamp_seconds",
            "Unix time of the archiver's last pass (absent before the first).",
            registry=self.registry,
        )
        self.archive_passes = Counter(
            "gpulens_archive_passes",
            "Archive passes, by outcome (ok, failed).",
            ("outcome",),
            registry=self.registry,
        )
        self.archive_built = Counter(
            "gpulens_archive_built",
            "Archives written, by kind (execution, pod; rebuilt for late samples included).",
            ("kind",),
            registry=self.registry,
        )
        self.archive_failures = Counter(
            "gpulens_archive_failures", "Objects an archive pass could not archive.", registry=self.registry
        )

    def archive_pass(self, report: PassReport | None) -> None:
        """One archiver pass (None: it failed as a whole)."""
        self.archive_last_pass.set(time.time())
        self.archive_passes.labels("failed" if report is None else "ok").inc()
        if report is not None:
            self.archive_built.labels("execution").inc(report.executions)
            self.archive_built.labels("pod").inc(report.pods)
            self.archive_failures.inc(len(report.failed))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class StateCollector:
    """Figures read when /metrics is scraped: cache counters, what the archive holds, file sizes."""

    ARCHIVE_TTL_S = 60.0

    def __init__(
        self,
        caches: Callable[[], Mapping[str, CacheLike]],
        archive_totals: Callable[[], ArchiveTotals] | None,
        files: Mapping[str, Path],
        summaries: Callable[[], SummaryFigures] | None = None,
    ) -> None:
        self._summaries = summaries
        self._caches = caches
        self._archive_totals = archive_totals
        self._files = dict(files)
        self._totals: tuple[float, ArchiveTotals] | None = None

    def collect(self) -> Iterator[Metric]:
        caches = self._caches()
        lookups = CounterMetricFamily(
            "gpulens_cache_lookups",
            "Cache look-ups by cache and result (hit, miss).",
            labels=("cache", "result"),
        )
        entries = GaugeMetricFamily("gpulens_cache_entries", "Entries held, by cache.", labels=("cache",))
        for name, cache in sorted(caches.items()):
            lookups.add_metric((name, "hit"), cache.hits)
            lookups.add_metric((name, "miss"), cache.misses)
            entries.add_metric((name,), len(cache))
        yield lookups
        yield entries
        yield from self._summary_figures()
        totals = self._archive()
        if totals is not None:
            objects = GaugeMetricFamily(
                "gpulens_archive_objects", "Archived objects, by kind.", labels=("kind",)
            )
            objects.add_metric(("execution",), totals.executions)
            objects.add_metric(("pod",), totals.pods)
            yield objects
            yield GaugeMetricFamily("gpulens_archive_bytes", "Bytes of archived samples.", value=totals.bytes)
            yield GaugeMetricFamily("gpulens_archive_samples", "Archived samples.", value=totals.samples)
        sizes = GaugeMetricFamily(
            "gpulens_store_bytes", "SQLite files on disk (WAL included).", labels=("store",)
        )
        for name, path in sorted(self._files.items()):
            size = sum(_size(path.with_name(path.name + suffix)) for suffix in ("", "-wal"))
            sizes.add_metric((name,), size)
        yield sizes

    def _summary_figures(self) -> Iterator[Metric]:
        if self._summaries is None:
            return
        f = self._summaries()
        served = CounterMetricFamily(
            "gpulens_summaries_served",
            "Whole-life execution summaries answered, by source (stored: from the registry; computed).",
            labels=("source",),
        )
        served.add_metric(("stored",), f.stored)
        served.add_metric(("computed",), f.computed)
        yield served
        yield GaugeMetricFamily("gpulens_summaries_computing", "Summaries computing now.", value=f.computing)
        yield GaugeMetricFamily(
            "gpulens_summaries_waiting", "Summary requests waiting for a compute slot.", value=f.waiting
        )
        yield GaugeMetricFamily(
            "gpulens_summaries_queued", "Finished executions queued for the background pass.", value=f.queued
        )

    def _archive(self) -> ArchiveTotals | None:
        if self._archive_totals is None:
            return None
        now = time.monotonic()
        if self._totals is None or now - self._totals[0] > self.ARCHIVE_TTL_S:
            try:
                self._totals = (now, self._archive_totals())
            except Exception as exc:  # a registry that does not answer: the figure is left out this time
                log.warning("archive totals unavailable for /metrics: %s", type(exc).__name__)
                return None if self._totals is None else self._totals[1]
        return self._totals[1]


class SummaryFigures(Protocol):
    """The stored summaries' figures (service.summary_store.SummaryFigures)."""

    @property
    def stored(self) -> int: ...
    @property
    def computed(self) -> int: ...
    @property
    def computing(self) -> int: ...
    @property
    def waiting(self) -> int: ...
    @property
    def queued(self) -> int: ...


class ArchiveTotals(Protocol):
    """What the archive holds (storage.archive.ArchiveTotals)."""

    @property
    def executions(self) -> int: ...
    @property
    def pods(self) -> int: ...
    @property
    def samples(self) -> int: ...
    @property
    def bytes(self) -> int: ...


class CacheLike(Protocol):
    hits: int
    misses: int

    def __len__(self) -> int: ...


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


# -- backend calls ---------------------------------------------------------------------------------
def _outcome(exc: BaseException | None) -> str:
    if exc is None:
        return "ok"
    if isinstance(exc, BackendTimeout):
        return "timeout"
    if isinstance(exc, BackendUnavailable):
        return "unavailable"
    if isinstance(exc, BackendBadResponse):
        return "bad_response"
    return "error"


class MeteredBackend:
    """A `MetricsBackend` that times every call of the one it wraps."""

    def __init__(self, inner: MetricsBackend, telemetry: Telemetry) -> None:
        self.inner = inner
        self.name = inner.name
        self.kind = type(inner).__name__.removesuffix("Backend").lower() or "backend"
        self._telemetry = telemetry

    def _observe(self, started: float, exc: BaseException | None) -> None:
        outcome = _outcome(exc)
        self._telemetry.backend.labels(self.kind, outcome).observe(time.perf_counter() - started)
        if isinstance(exc, BackendError):
            self._telemetry.backend_errors.labels(self.kind, outcome).inc()

    async def query_range(self, query: RangeQuery) -> list[Series]:
        started = time.perf_counter()
        try:
            out = await self.inner.query_range(query)
        except BaseException as exc:
            self._observe(started, exc)
            raise
        self._observe(started, None)
        return out

    async def query(self, expr: str, time_ms: int) -> list[Series]:
        started = time.perf_counter()
        try:
            out = await self.inner.query(expr, time_ms)
        except BaseException as exc:
            self._observe(started, exc)
            raise
        self._observe(started, None)
        return out

    async def series_labels(self, match: str, label: str, start_ms: int, end_ms: int) -> list[str]:
        started = time.perf_counter()
        try:
            out = await self.inner.series_labels(match, label, start_ms, end_ms)
        except BaseException as exc:
            self._observe(started, exc)
            raise
        self._observe(started, None)
        return out

    async def series(self, match: str, start_ms: int, end_ms: int) -> list[dict[str, str]]:
        started = time.perf_counter()
        try:
            out = await self.inner.series(match, start_ms, end_ms)
        except BaseException as exc:
            self._observe(started, exc)
            raise
        self._observe(started, None)
        return out

    async def query_raw(self, match: str, start_ms: int, end_ms: int) -> list[Series]:
        started = time.perf_counter()
        try:
            out = await self.inner.query_raw(match, start_ms, end_ms)
        except BaseException as exc:
            self._observe(started, exc)
            raise
        self._observe(started, None)
        return out

    async def ready(self) -> None:
        await self.inner.ready()  # probes are not queries: not timed

    async def aclose(self) -> None:
        await self.inner.aclose()


# -- the collector ---------------------------------------------------------------------------------
class CollectorLike(Protocol):
    """What is watched of the embedded collector (gpulens.agent.Collector): its sinks and interval."""

    sinks: list[Any]
    interval_s: float


class PassClock:
    """A collector sink that notes when each pass completed (written from the collector's thread)."""

    def __init__(self, interval_s: float, telemetry: Telemetry) -> None:
        self.interval_s = interval_s
        self._telemetry = telemetry
        self._lock = threading.Lock()
        self.last: float | None = None

    def write(self, samples: Sequence[Any]) -> None:
        now = time.time()
        with self._lock:
            self.last = now
        self._telemetry.last_pass.set(now)

    def stale_for(self, now: float | None = None) -> float | None:
        """Seconds since the last pass when that exceeds STALE_PASSES intervals (None: fresh)."""
        with self._lock:
            last = self.last
        now = time.time() if now is None else now
        if last is None:
            return float("inf")
        age = now - last
        return age if age > STALE_PASSES * self.interval_s else None


def watch_collector(collector: CollectorLike, telemetry: Telemetry) -> PassClock:
    clock = PassClock(collector.interval_s, telemetry)
    collector.sinks.append(clock)  # the last sink: its time is the pass's completion
    if getattr(collector, "passes", 0) > 0:  # started already (serve runs a first pass before the app)
        clock.write(())
    return clock


# -- requests --------------------------------------------------------------------------------------
def _request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            text: str = value.decode("latin-1")
            if _SANE_ID.fullmatch(text):
                return text
            break
    return uuid.uuid4().hex


def route_template(scope: Scope) -> str:
    route = scope.get("route")
    path: object = getattr(route, "path", None)
    return path if isinstance(path, str) and path else UNMATCHED


def _routes(container: object, depth: int = 0) -> Iterator[object]:
    """Every route under `container`: those of included routers (FastAPI keeps an included router as
    one route holding it, `original_router`) and of mounts too."""
    for route in getattr(container, "routes", ()):
        yield route
        if depth < 16:
            yield from _routes(getattr(route, "original_router", route), depth + 1)


def served_methods(app: object) -> frozenset[str]:
    """The methods `app`'s routes serve (a mount, static files: GET and HEAD)."""
    methods: set[str] = set()
    for route in _routes(app):
        declared = getattr(route, "methods", None)
        if declared:
            methods.update(str(m).upper() for m in declared)
        elif isinstance(route, Mount):
            methods.update(("GET", "HEAD"))
    return frozenset(methods)


class RequestTelemetry:
    """Pure ASGI, outermost: times each request, names it by its route template, gives it an id."""

    def __init__(self, app: ASGIApp, *, telemetry: Telemetry, json_logs: bool) -> None:
        self.app = app
        self.telemetry = telemetry
        self.json_logs = json_logs
        self._methods: tuple[object, int, frozenset[str]] | None = None  # (app, its routes, methods)

    def method_label(self, scope: Scope) -> str:
        """The request's method when a route serves it, else `other` (the label's values are bounded)."""
        method = str(scope.get("method", ""))
        app = scope.get("app")
        routes = len(getattr(app, "routes", ()))
        known = self._methods
        if known is None or known[0] is not app or known[1] != routes:
            known = self._methods = (app, routes, served_methods(app))
        return method if method in known[2] else OTHER_METHOD

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = _request_id(scope)
        token = REQUEST_ID.set(rid)
        started = time.perf_counter()
        status = 500  # an app that raised before answering

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = MutableHeaders(scope=message)
                headers["X-Request-ID"] = rid
                # every answer (JSON above all) is what its Content-Type says: a browser never sniffs one
                # as HTML or script
                headers.setdefault("X-Content-Type-Options", "nosniff")
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - started
            route, method = route_template(scope), str(scope.get("method", ""))
            self.telemetry.http.labels(route, self.method_label(scope), str(status)).observe(elapsed)
            if self.json_logs:
                principal = scope.get(PRINCIPAL_SCOPE_KEY)
                access_log.info(
                    "request",
                    extra={
                        "method": method,
                        "route": route,
                        "status": status,
                        "duration_ms": round(elapsed * 1000, 3),
                        "org": principal.org if isinstance(principal, Principal) else None,
                    },
                )
            REQUEST_ID.reset(token)


# -- JSON log lines --------------------------------------------------------------------------------
# a record's own attributes, and uvicorn's `color_message` (its message again, with ANSI colours)
_RECORD_FIELDS = frozenset(logging.makeLogRecord({}).__dict__) | {
    "message",
    "asctime",
    "taskName",
    "color_message",
}


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, the request id, and the record's extras."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = REQUEST_ID.get()
        if rid is not None:
            line["request_id"] = rid
        for key, value in record.__dict__.items():
            if key not in _RECORD_FIELDS and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        text: str = orjson.dumps(line, default=str).decode()
        return text


def use_json_logs() -> None:
    """Every handler of the root logger writes JSON lines (one stderr handler when there is none)."""
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler())
    for handler in root.handlers:
        handler.setFormatter(JsonFormatter())
    if access_log.getEffectiveLevel() > logging.INFO:
        access_log.setLevel(logging.INFO)


_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def uvicorn_log_config(json_logs: bool, level: str = "info") -> dict[str, Any]:
    """uvicorn's `log_config` for `gpulens serve` (a `logging.config.dictConfig` dict).

    Text: uvicorn's own default, unchanged. JSON: one stderr handler on the root logger writing
    `JsonFormatter` lines, and uvicorn's loggers (startup and errors in `uvicorn.error`, access lines
    in `uvicorn.access`) write through it instead of their own text handlers, so every line the server
    logs is one JSON object. uvicorn's and gpulens' loggers log from `level` up (uvicorn's
    `--log-level`; its `trace` is `debug` here), gpulens' access line always; others from WARNING.
    """
    if not json_logs:
        from uvicorn.config import LOGGING_CONFIG

        default: dict[str, Any] = copy.deepcopy(LOGGING_CONFIG)
        return default
    name = level.lower()
    if name not in _LEVELS:
        raise ValueError(f"unknown log level {level!r} (one of {', '.join(_LEVELS)})")
    named_level = "DEBUG" if name == "trace" else name.upper()  # uvicorn sets its own TRACE later
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {
            "stderr": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
        },
        "root": {"handlers": ["stderr"]},
        "loggers": {
            "uvicorn": {"handlers": [], "propagate": True, "level": named_level},
            "uvicorn.error": {"handlers": [], "propagate": True},
            "uvicorn.access": {"handlers": [], "propagate": True},
            "gpulens": {"level": named_level},
            access_log.name: {"level": "INFO"},
        },
    }


def configure_logging(json_logs: bool, level: str = "info") -> dict[str, Any]:
    """Apply `uvicorn_log_config` now, so what is logged before uvicorn starts is in the same format;
    returns it for uvicorn, which applies it again when it starts. JSON: Python's warnings too."""
    config = uvicorn_log_config(json_logs, level)
    logging.config.dictConfig(copy.deepcopy(config))  # dictConfig consumes what it is given
    if json_logs:
        logging.captureWarnings(True)  # Python's warnings, too, as log records (`py.warnings`)
    return config


# -- wiring ----------------------------------------------------------------------------------------
router = APIRouter(tags=["Health"])


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    telemetry: Telemetry = request.app.state.telemetry
    body = await anyio.to_thread.run_sync(telemetry.exposition)  # the archive figures read the registry
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def install(app: FastAPI, telemetry: Telemetry, *, json_logs: bool) -> None:
    """`/metrics` and the request middleware (call after every other middleware: it goes outermost)."""
    app.state.telemetry = telemetry
    app.include_router(router)
    app.add_middleware(RequestTelemetry, telemetry=telemetry, json_logs=json_logs)
    if json_logs:
        use_json_logs()
