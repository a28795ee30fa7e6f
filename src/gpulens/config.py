"""Settings (env prefix GPULENS_); read only by entry points (cli, api.app) and passed down."""

from __future__ import annotations

import json
import os
import re
import ssl
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpulens.domain import limits
from gpulens.domain.catalog import MAX_PROCESS_SERIES
from gpulens.domain.models import ORG_SLUG_RE, ORG_SLUG_TEXT
from gpulens.domain.timeparse import parse_duration_ms
from gpulens.shaping.usage import parse_prices

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP token (RFC 9110)
# headers gpulens sets itself or that frame the request: not settable through GPULENS_PROMETHEUS_HEADERS
_RESERVED_HEADERS = {"host", "content-length", "content-type", "transfer-encoding", "connection", "te"}


def usable_cpus(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The CPUs this process may use, 1 to 64: those it may run on (its affinity: a container's cpuset),
    fewer when its cgroup's CPU quota says so (a Kubernetes CPU limit of 2 on a 64-core node: 2)."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        count = os.cpu_count() or 1
    quota = _cpu_quota(cgroup)
    if quota is not None:
        count = min(count, max(1, -(-quota[0] // quota[1])))
    return max(1, min(64, count))


def _cpu_quota(cgroup: Path) -> tuple[int, int] | None:
    """(quota, period) of the cgroup's CPU limit (v2 `cpu.max`, v1 `cpu.cfs_quota_us`), None: none."""
    try:
        parts = (cgroup / "cpu.max").read_text().split()
        if len(parts) == 2 and parts[0] != "max":
            return int(parts[0]), int(parts[1])
        return None
    except (OSError, ValueError):
        pass
    try:
        quota = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return (quota, period) if quota > 0 and period > 0 else None


def parse_headers(text: str) -> dict[str, str]:
    """GPULENS_PROMETHEUS_HEADERS: a JSON object of strings, or `Name: value` lines (blank lines and
    lines starting with `#` skipped). Errors name the header, never its value (it may be a key)."""
    text = text.strip()
    pairs: list[tuple[str, object]] = []
    if text.startswith("{"):
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError:
            raise ValueError("prometheus_headers: not a valid JSON object") from None
        pairs = list(loaded.items())
    else:
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            name, colon, value = line.partition(":")
            if not colon:
                raise ValueError(f"prometheus_headers: line {number} is not 'Name: value'")
            pairs.append((name.strip(), value.strip()))
    out: dict[str, str] = {}
    for name, given in pairs:
        if not _HEADER_NAME.fullmatch(name):
            raise ValueError(f"prometheus_headers: {name[:64]!r} is not a header name")
        if name.lower() in _RESERVED_HEADERS:
            raise ValueError(f"prometheus_headers: {name} is set by gpulens itself")
        if not isinstance(given, str) or not given or not (given.isascii() and given.isprintable()):
            raise ValueError(f"prometheus_headers: the value of {name} must be one line of printable ASCII")
        if given != given.strip():
            raise ValueError(f"prometheus_headers: the value of {name} has surrounding spaces")
        if name.lower() in {n.lower() for n in out}:
            raise ValueError(f"prometheus_headers: {name} is given twice")
        out[name] = given
    return out


def default_data_dir() -> Path:
    return Path.home() / ".local" / "share" / "gpulens"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPULENS_", extra="ignore", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)
    prometheus_url: str | None = None
    data_dir: Path = Field(default_factory=default_data_dir)
    database_url: str | None = None  # default: SQLite file in data_dir

    # how to reach the metrics backend (Mimir/Cortex tenants, auth proxies, TLS): docs/operations.md
    prometheus_headers: SecretStr | None = None  # JSON object or "Name: value" lines; values may be keys
    prometheus_username: str | None = None
    prometheus_password: SecretStr | None = None
    prometheus_password_file: Path | None = None  # re-read when it changes
    prometheus_bearer_token: SecretStr | None = None
    prometheus_bearer_token_file: Path | None = None  # re-read when it changes (rotated projected tokens)
    prometheus_ca_file: Path | None = None  # PEM CA bundle: the only CAs trusted for https
    prometheus_cert_file: Path | None = None  # PEM client certificate (and key, unless key_file)
    prometheus_key_file: Path | None = None

    # metrics backend
    backend_timeout: float = Field(
        30.0, gt=0, le=3600, description="seconds per whole backend request (a deadline, not per read)"
    )
    backend_pool_timeout: float | None = Field(
        None,
        gt=0,
        le=3600,
        description="seconds to wait for a free backend connection, then 503 (default: backend_timeout)",
    )
    max_backend_answer_bytes: int = Field(
        64 << 20, ge=1024, le=1 << 34, description="largest backend answer read; beyond it 502"
    )
    backend_compression: bool = False  # gzip costs 1.1-3x on loopback/LAN (docs/operations.md)
    query_concurrency: int = Field(12, ge=1, le=64)
    max_points_per_query: int = Field(11_000, ge=10, le=1_000_000)  # Prometheus: (end-start)/step <= 11000
    max_points_per_series: int = Field(200_000, ge=10, le=10_000_000)
    scrape_interval: str = "15s"
    dcgm_host_label: str = "auto"  # "auto" tries Hostname and hostname
    node_match: Literal["auto", "instance", "nodename"] = "auto"
    metric_names: dict[str, str] = Field(default_factory=dict)  # exporter name -> name in your TSDB

    # Run:ai dialect: the "Advanced GPU Metrics" (GPU profiling) feature flag
    advanced_gpu_metrics: bool = True
    # the most pods a workload-metrics read covers (those alive in its time range); beyond it 400
    max_pods_per_query: int = Field(limits.PODS_PER_QUERY_DEFAULT, ge=1, le=10_000)

    # insights (`.../execution/{id}/summary`): a TOML file of GPU-hour prices per hardware profile
    # (`currency = "USD"`, `[gpu_hour]` `"gpu.h100" = 2.50`) and the carbon intensity in g CO2e/kWh
    prices: Path | None = None
    carbon_intensity: float | None = Field(None, ge=0, le=10_000)

    # auth
    jwt_secret: SecretStr | None = None  # HS256
    jwt_public_key: str | None = None  # RS256: PEM text or a path to a PEM file
    jwt_audience: str | None = None
    runai_token_ttl: int = Field(3600, ge=60, le=86_400 * 7)

    # log lines: plain text, or one JSON object a line with the request id (api/observability.py)
    log_format: Literal["text", "json"] = "text"

    # the largest request body any route reads (413 beyond it, before it is read)
    max_body_bytes: int = Field(1 << 20, ge=1024, le=1 << 30)

    # Kubernetes discovery (kube-state-metrics in the same Prometheus) while serving
    discovery_interval: int = Field(0, ge=0, le=86_400 * 7, description="seconds between runs; 0 = off")
    discovery_org: str | None = None  # the org discovered workloads belong to (needed when on)
    discovery_max_window: int = Field(
        86_400, ge=3600, le=86_400 * 30, description="seconds: the longest window one discovery run queries"
    )

    # Slurm discovery (`gpulens discover slurm`; in `serve` every discovery_interval when slurm_url is set):
    # slurmrestd's URL, a JWT (or a file holding it) and the user it was issued to (default: its `sun`)
    slurm_url: str | None = None
    slurm_token: SecretStr | None = None
    slurm_token_file: Path | None = None
    slurm_user: str | None = None
    slurm_cluster: str | None = None  # for records that do not name their cluster (sacct of old versions)

    # local agent (`gpulens agent`): seconds between collector passes; fake GPUs instead of NVML (demo, tests)
    collect_interval: float = Field(5.0, ge=1, le=3600, description="seconds between agent passes")
    fake_gpus: int = Field(0, ge=0, le=64, description="> 0: the agent reads N scripted GPUs, not NVML")
    max_process_series: int = Field(
        MAX_PROCESS_SERIES, ge=0, le=1_000_000, description="per-process GPU series one agent run creates"
    )

    # embedded sample store (`gpulens serve` without Prometheus, `gpulens run`): full resolution for
    # retention_full, then 1-minute min/avg/max until retention_downsampled, then deleted
    retention_full: str = "30d"
    retention_downsampled: str = "365d"

    # archive of finished executions and pods (a fleet's Prometheus): every archive_interval seconds
    # (0 = off) `serve` copies what finished archive_grace ago into the registry, from
    # archive_margin before its start; reads of archived objects are served from there
    archive_interval: int = Field(300, ge=0, le=86_400 * 7, description="seconds between passes; 0 = off")
    archive_grace: str = "5m"
    archive_margin: str = "10m"
    archive_cache_bytes: int = Field(256 << 20, ge=0, description="decoded archives kept in memory")
    archive_answer_cache_bytes: int = Field(64 << 20, ge=0, description="answers of archived objects kept")

    # summaries (service/summary_store.py): finished executions' whole-life summaries are stored once
    # computed; `serve` computes those of newly finished ones every summary_interval seconds (0 = off),
    # summary_batch a pass, one at a time; at most max_concurrent_summaries (the CPUs this process may
    # use) compute at once, and a request waits summary_wait seconds for a free slot (then 503)
    summary_interval: int = Field(60, ge=0, le=86_400, description="seconds between passes; 0 = off")
    summary_batch: int = Field(5, ge=1, le=1000, description="summaries the background computes a pass")
    # fleet usage (docs/usage.md): every usage_interval seconds (0 = off) `serve` computes the provisional
    # usage of running executions since their last pass, so the usage table counts them up to then
    usage_interval: int = Field(900, ge=0, le=86_400, description="seconds between running-usage passes")
    max_concurrent_summaries: int = Field(
        default_factory=usable_cpus, ge=1, le=64, description="summaries computing at once"
    )
    summary_wait: float = Field(10.0, gt=0, le=3600, description="seconds a request waits for a slot")

    # live alerts (docs/alerts.md): `serve` evaluates the rules on running executions every
    # alerts_interval seconds (0 = off); deliveries are retried for alerts_retry_for seconds; a rule's
    # stop action sends `execution.stop_requested` marked dryRun unless actions = "enforce"
    alerts: Path | None = None  # a TOML file of org default rules and channels
    alerts_interval: float = Field(60.0, ge=0, le=86_400, description="seconds between passes; 0 = off")
    alerts_retry_for: int = Field(86_400, ge=60, le=86_400 * 7, description="seconds a delivery is retried")
    alerts_timeout: float = Field(10.0, gt=0, le=120, description="seconds one delivery attempt may take")
    actions: Literal["dry-run", "enforce"] = "dry-run"
    public_url: str | None = None  # where users reach gpulens (the dashboard links in alerts)

    @field_validator("archive_grace", "archive_margin")
    @classmethod
    def _archive_duration(cls, value: str) -> str:
        parse_duration_ms(value)
        return value

    @field_validator("prometheus_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        # never echoed whole: it could carry a password
        if not re.match(r"^https?://[^\s/]+", value) or re.search(r"\s", value):
            raise ValueError("prometheus_url must be an http(s) URL (http://host:port/optional/prefix)")
        if "@" in value.split("://", 1)[1].split("/", 1)[0]:
            raise ValueError(
                "prometheus_url must not carry credentials (user:password@): use GPULENS_PROMETHEUS_USERNAME "
                "with GPULENS_PROMETHEUS_PASSWORD or _PASSWORD_FILE"
            )
        if "?" in value or "#" in value:
            raise ValueError("prometheus_url must not have a query or fragment (a path prefix is fine)")
        return value.rstrip("/")

    @field_validator("prometheus_headers")
    @classmethod
    def _headers(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            parse_headers(value.get_secret_value())
        return value

    @field_validator(
        "prometheus_password_file",
        "prometheus_bearer_token_file",
        "prometheus_ca_file",
        "prometheus_cert_file",
        "prometheus_key_file",
    )
    @classmethod
    def _readable_file(cls, value: Path | None) -> Path | None:
        if value is not None:
            try:
                with value.open("rb"):
                    pass
            except OSError as exc:
                raise ValueError(f"cannot read {value}: {exc.strerror}") from None
        return value

    @field_validator("scrape_interval", "retention_full", "retention_downsampled")
    @classmethod
    def _scrape(cls, value: str) -> str:
        parse_duration_ms(value)
        return value

    @field_validator("dcgm_host_label")
    @classmethod
    def _host_label(cls, value: str) -> str:
        if value != "auto" and not _LABEL_NAME.fullmatch(value):
            raise ValueError(f"dcgm_host_label must be 'auto' or a label name, got {value!r}")
        return value

    @field_validator("metric_names")
    @classmethod
    def _metric_names(cls, value: dict[str, str]) -> dict[str, str]:
        for src, dst in value.items():
            if not _METRIC_NAME.fullmatch(src) or not _METRIC_NAME.fullmatch(dst):
                raise ValueError(f"metric_names: {src!r} -> {dst!r} is not a valid metric name mapping")
        return value

    @field_validator("prices")
    @classmethod
    def _prices(cls, value: Path | None) -> Path | None:
        if value is not None:
            try:
                parse_prices(value.read_text())
            except OSError as exc:
                raise ValueError(f"prices: cannot read {value}: {exc.strerror}") from None
        return value

    @field_validator("discovery_org")
    @classmethod
    def _discovery_org(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(ORG_SLUG_RE, value):
            raise ValueError(f"discovery_org must be {ORG_SLUG_TEXT}, got {value!r}")
        return value

    @field_validator("jwt_secret")
    @classmethod
    def _secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value().encode()) < 32:
            raise ValueError("jwt_secret must be at least 32 bytes (HS256 with a short secret is guessable)")
        return value

    @model_validator(mode="after")
    def _backend_access(self) -> Settings:
        basic = self.prometheus_username is not None
        passwords = (self.prometheus_password is not None) + (self.prometheus_password_file is not None)
        tokens = (self.prometheus_bearer_token is not None) + (self.prometheus_bearer_token_file is not None)
        if passwords > 1 or tokens > 1:
            raise ValueError("set a password or a password file, a bearer token or a token file: not both")
        if basic != bool(passwords):
            raise ValueError("basic auth needs GPULENS_PROMETHEUS_USERNAME and a password (or password file)")
        if basic and tokens:
            raise ValueError("basic auth and a bearer token exclude each other")
        headers = parse_headers(self.prometheus_headers.get_secret_value()) if self.prometheus_headers else {}
        if (basic or tokens) and any(name.lower() == "authorization" for name in headers):
            raise ValueError("prometheus_headers sets Authorization, as basic auth or a bearer token does")
        if self.prometheus_key_file is not None and self.prometheus_cert_file is None:
            raise ValueError("prometheus_key_file needs prometheus_cert_file")
        if self.prometheus_ca_file is not None or self.prometheus_cert_file is not None:
            try:  # a bad bundle or key stops the start, not the first query
                context = ssl.create_default_context(
                    cafile=str(self.prometheus_ca_file) if self.prometheus_ca_file else None
                )
                if self.prometheus_cert_file is not None:
                    key = str(self.prometheus_key_file) if self.prometheus_key_file else None
                    context.load_cert_chain(str(self.prometheus_cert_file), key, password=b"")
            except (ssl.SSLError, OSError) as exc:
                raise ValueError(f"prometheus TLS files: {exc}") from None
        return self

    @property
    def prometheus_header_map(self) -> dict[str, str]:
        """GPULENS_PROMETHEUS_HEADERS parsed (checked at start)."""
        return parse_headers(self.prometheus_headers.get_secret_value()) if self.prometheus_headers else {}

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.max_points_per_query > self.max_points_per_series:
            raise ValueError("max_points_per_query must not exceed max_points_per_series")
        if self.discovery_interval > 0 and self.discovery_org is None:
            raise ValueError("discovery_interval > 0 needs GPULENS_DISCOVERY_ORG (the org to sync into)")
        if self.slurm_token is not None and self.slurm_token_file is not None:
            raise ValueError("set GPULENS_SLURM_TOKEN or GPULENS_SLURM_TOKEN_FILE, not both")
        if self.slurm_url and self.slurm_token is None and self.slurm_token_file is None:
            # said at start, not at the first discovery pass a few minutes later
            raise ValueError("GPULENS_SLURM_URL needs GPULENS_SLURM_TOKEN or GPULENS_SLURM_TOKEN_FILE")
        if parse_duration_ms(self.retention_downsampled) < parse_duration_ms(self.retention_full):
            raise ValueError("retention_downsampled must not be shorter than retention_full")
        url = self.resolved_database_url
        if not url.startswith(("sqlite", "postgresql")):
            raise ValueError(f"database_url must be sqlite:/// or postgresql://, got {url.split(':')[0]!r}")
        return self

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            url = self.database_url
            if url.startswith("postgresql://") or url.startswith("postgres://"):
                url = "postgresql+psycopg://" + url.split("://", 1)[1]
            return url
        return f"sqlite:///{self.data_dir / 'gpulens.db'}"

    @property
    def samples_path(self) -> Path:
        """The embedded store's file: what `gpulens serve` collects into without a Prometheus URL."""
        return self.data_dir / "samples.db"

    @property
    def registry_path(self) -> Path | None:
        """The registry's file when it is SQLite (None for PostgreSQL or an in-memory database)."""
        url = self.resolved_database_url
        if not url.startswith("sqlite:///") or url == "sqlite:///:memory:":
            return None
        return Path(url.removeprefix("sqlite:///"))

    @property
    def scrape_interval_ms(self) -> int:
        """The sampling interval the rate windows are sized from: the setting, else on the embedded
        default (no Prometheus) the local collector's interval."""
        if self.prometheus_url is None and "scrape_interval" not in self.model_fields_set:
            return round(self.collect_interval * 1000)
        return parse_duration_ms(self.scrape_interval)

    @property
    def archive_grace_ms(self) -> int:
        return parse_duration_ms(self.archive_grace)

    @property
    def archive_margin_ms(self) -> int:
        return parse_duration_ms(self.archive_margin)

    @property
    def retention_full_ms(self) -> int:
        return parse_duration_ms(self.retention_full)

    @property
    def retention_downsampled_ms(self) -> int:
        return parse_duration_ms(self.retention_downsampled)

    def slurm_jwt(self) -> str | None:
        """The Slurm JWT: GPULENS_SLURM_TOKEN, else the file's content (read now: it may be rotated)."""
        if self.slurm_token is not None:
            return self.slurm_token.get_secret_value().strip() or None
        if self.slurm_token_file is not None:
            return self.slurm_token_file.read_text().strip() or None
        return None

    def jwt_public_key_pem(self) -> str | None:
        if not self.jwt_public_key:
            return None
        if self.jwt_public_key.lstrip().startswith("-----BEGIN"):
            return self.jwt_public_key
        return Path(self.jwt_public_key).read_text()


def describe_error(exc: ValidationError) -> str:
    """One line for a person: which setting, and why."""
    parts = []
    for err in exc.errors():
        name = ".".join(str(p) for p in err["loc"]) or "settings"
        env = f"GPULENS_{name.upper()}" if err["loc"] else "settings"
        parts.append(f"{env}: {err['msg'].removeprefix('Value error, ')}")
    return "invalid settings: " + "; ".join(parts)
