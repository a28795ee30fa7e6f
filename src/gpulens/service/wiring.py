"""From settings to the objects they describe: plan options, the metrics backend and its access.

Entry points (the API app, the CLI) pass their `Settings` here; nothing below reads settings itself.
Kept out of the API package so that a CLI command that needs a backend does not load FastAPI.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from pydantic import SecretStr

from gpulens.backends.base import MetricsBackend
from gpulens.backends.prometheus import BackendAccess, PrometheusBackend, Secret, make_client
from gpulens.config import Settings
from gpulens.domain import catalog
from gpulens.domain.errors import InvalidRequest
from gpulens.planning.hosts import HostPlanOptions
from gpulens.planning.pods import PodPlanOptions
from gpulens.service.alerts.deliver import DeliveryOptions
from gpulens.service.alerts.evaluate import EvalOptions
from gpulens.service.archive import ArchiveOptions


def host_labels(settings: Settings) -> tuple[str, ...]:
    """The labels dcgm-exporter names a GPU's host by: GPULENS_DCGM_HOST_LABEL, or both spellings."""
    return catalog.DCGM_HOST_LABELS if settings.dcgm_host_label == "auto" else (settings.dcgm_host_label,)


def plan_options(settings: Settings) -> HostPlanOptions:
    return HostPlanOptions(
        host_labels=host_labels(settings),
        node_match=settings.node_match,
        metric_names=dict(settings.metric_names),
        scrape_interval_ms=settings.scrape_interval_ms,
    )


def pod_plan_options(settings: Settings) -> PodPlanOptions:
    return PodPlanOptions(
        metric_names=dict(settings.metric_names),
        scrape_interval_ms=settings.scrape_interval_ms,
        host_labels=host_labels(settings),
    )


def archive_options(settings: Settings) -> ArchiveOptions:
    return ArchiveOptions(
        host=plan_options(settings),
        pod=pod_plan_options(settings),
        margin_ms=settings.archive_margin_ms,
        grace_ms=settings.archive_grace_ms,
    )


def backend_access(settings: Settings) -> BackendAccess:
    """Headers, credentials and TLS files for the backend, from the GPULENS_PROMETHEUS_* settings."""

    def secret(value: SecretStr | None, path: Path | None) -> Secret | None:
        if value is not None:
            return Secret(value.get_secret_value())
        return Secret(path=path) if path is not None else None

    return BackendAccess(
        headers=settings.prometheus_header_map,
        username=settings.prometheus_username,
        password=secret(settings.prometheus_password, settings.prometheus_password_file),
        bearer=secret(settings.prometheus_bearer_token, settings.prometheus_bearer_token_file),
        ca_file=settings.prometheus_ca_file,
        cert_file=settings.prometheus_cert_file,
        key_file=settings.prometheus_key_file,
    )


def make_backend(settings: Settings) -> MetricsBackend:
    if not settings.prometheus_url:
        raise InvalidRequest(
            "no metrics backend: set GPULENS_PROMETHEUS_URL (or --prometheus-url) "
            "to a Prometheus-compatible URL"
        )
    client = make_client(
        settings.backend_timeout,
        settings.backend_compression,
        settings.query_concurrency,
        backend_access(settings),
        settings.backend_pool_timeout,
    )
    return PrometheusBackend(
        settings.prometheus_url,
        client,
        concurrency=settings.query_concurrency,
        timeout_s=settings.backend_timeout,
        max_answer_bytes=settings.max_backend_answer_bytes,
    )


def eval_options(settings: Settings) -> EvalOptions:
    """The evaluation pass (GPULENS_ALERTS_INTERVAL, GPULENS_ACTIONS, GPULENS_PUBLIC_URL); a finding
    still holds when it ends within three scrape intervals of the window's end."""
    return EvalOptions(
        interval_s=settings.alerts_interval,
        end_slack_ms=max(3 * settings.scrape_interval_ms, 5_000),
        enforce=settings.actions == "enforce",
        public_url=settings.public_url,
        prices=settings.prices,
    )


def delivery_options(settings: Settings) -> DeliveryOptions:
    return DeliveryOptions(
        retry_for=timedelta(seconds=settings.alerts_retry_for),
        timeout_s=settings.alerts_timeout,
        public_url=settings.public_url,
    )
