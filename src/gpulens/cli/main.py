"""`gpulens` command: serve, keys, executions, ..."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from gpulens import __version__
from gpulens.cli import agent as agent_cli
from gpulens.cli import alerts as alerts_cli
from gpulens.cli import archive as archive_cli
from gpulens.cli import demo as demo_cli
from gpulens.cli import discover as discover_cli
from gpulens.cli import executions as executions_cli
from gpulens.cli import export as export_cli
from gpulens.cli import keys as keys_cli
from gpulens.cli import metrics as metrics_cli
from gpulens.cli import report as report_cli
from gpulens.cli import run as run_cli
from gpulens.cli import usage as usage_cli
from gpulens.cli import workloads as workloads_cli
from gpulens.cli.common import DatabaseOpt, fail, load_settings, open_registry
from gpulens.cli.serving import LogLevel, listen, run_server
from gpulens.domain.errors import GpulensError

app = typer.Typer(
    name="gpulens",
    help="How did my execution use the hardware? GPU execution metrics, Lyceum- and Run:ai-compatible.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(keys_cli.app, name="keys", help="Create, list, revoke and toggle API keys.")
app.add_typer(executions_cli.app, name="executions", help="Register, update and list executions.")
app.command(name="metrics")(metrics_cli.metrics)
app.command(name="report")(report_cli.report)
app.command(name="export")(export_cli.export)
app.command(name="run", context_settings={"allow_interspersed_args": False})(run_cli.run_command)
app.add_typer(workloads_cli.app, name="workloads", help="Register workloads with their pods; list them.")
app.add_typer(discover_cli.app, name="discover", help="Discover workloads and pods (kube-state-metrics).")
app.add_typer(alerts_cli.app, name="alerts", help="List an org's alert rules, channels and deliveries.")
app.command(name="usage")(usage_cli.usage)
app.command(name="agent")(agent_cli.agent)
app.command(name="archive")(archive_cli.archive)
app.command(name="demo")(demo_cli.demo)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpulens {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """Settings come from flags and GPULENS_* environment variables (flags win)."""


@app.command()
def serve(
    host: Annotated[str | None, typer.Option("--host", help="Bind address; env GPULENS_HOST")] = None,
    port: Annotated[int | None, typer.Option("--port", help="Port; env GPULENS_PORT")] = None,
    prometheus_url: Annotated[
        str | None,
        typer.Option("--prometheus-url", help="Prometheus-compatible base URL; env GPULENS_PROMETHEUS_URL"),
    ] = None,
    database: DatabaseOpt = None,
    log_level: Annotated[LogLevel, typer.Option("--log-level", case_sensitive=False)] = LogLevel.INFO,
    demo: Annotated[
        bool,
        typer.Option("--demo", help="Serve generated demo data (its own store and database)"),
    ] = False,
) -> None:
    """Start the HTTP API."""
    if demo:  # `gpulens demo` with these flags
        demo_cli.run_demo(host=host, port=port, log_level=log_level)
        return

    from gpulens.api.app import create_app
    from gpulens.api.observability import configure_logging

    settings = load_settings(host=host, port=port, prometheus_url=prometheus_url, database_url=database)
    json_logs = settings.log_format == "json"
    try:  # now, so that what start-up logs is in the same format (GPULENS_LOG_FORMAT) as the rest
        log_config = configure_logging(json_logs, log_level)
    except ValueError as exc:
        fail(f"--log-level: {exc}", 2)
    listener = listen(settings.host, settings.port)  # before anything slow: a taken port fails at once
    local = None
    try:
        try:
            registry = open_registry(settings)
            if settings.prometheus_url:
                backend_text = settings.prometheus_url
                application = create_app(settings, registry=registry)
            else:  # the embedded default: collect this host into a local store and serve from it
                from gpulens.cli.local import bootstrap_admin_key, open_local

                local = open_local(settings)
                key = bootstrap_admin_key(settings, registry)
                if key is not None:
                    typer.echo(
                        f"created org 'local' and its admin key (shown once; kept in "
                        f"{settings.data_dir / 'admin.key'}, mode 0600):\n{key}"
                    )
                local.start()
                backend_text = (
                    f"embedded store in {settings.data_dir}, collecting {local.hostname} every "
                    f"{settings.collect_interval:g}s"
                )
                application = create_app(
                    settings, registry=registry, backend=local.backend, collector=local.collector
                )
        except GpulensError as exc:
            fail(exc.message, 2)
        except (ValueError, OSError) as exc:  # e.g. an unreadable or non-RSA GPULENS_JWT_PUBLIC_KEY
            fail(f"cannot start: {exc}", 2)
        banner = (
            f"gpulens {__version__} on http://{settings.host}:{settings.port} "
            f"(backend {backend_text}, registry {settings.resolved_database_url.split('://')[0]})"
        )
        if json_logs:
            logging.getLogger("gpulens.serve").info(banner)
        else:
            typer.echo(banner, err=True)
        run_server(
            application,
            listener,
            log_level=log_level.value,
            access_log=log_level is LogLevel.DEBUG,
            log_config=log_config,
        )
    finally:
        listener.close()
        if local is not None:
            local.close()


def main(argv: list[str] | None = None) -> int:
    try:
        rv = app(args=argv, prog_name="gpulens", standalone_mode=False)
    except typer.Exit as exc:
        return int(exc.exit_code or 0)
    except (typer.Abort, KeyboardInterrupt):
        return 130
    except Exception as exc:
        # usage errors (typer's vendored click): its own short message, no traceback
        show, code = getattr(exc, "show", None), getattr(exc, "exit_code", None)
        if callable(show) and isinstance(code, int):
            show()
            return code
        raise
    return rv if isinstance(rv, int) else 0


def run() -> None:
    sys.exit(main())
