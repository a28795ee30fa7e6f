"""`gpulens demo`: generated GPU history of a few runs in the embedded store, a demo org and key, served.

No Prometheus is needed. The data, registry and key live under `--data-dir` (default
`$GPULENS_DATA_DIR/demo`); they are built on the first start and reused after (`gpulens.demo.env`).
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from gpulens.cli.common import fail, load_settings
from gpulens.cli.serving import LogLevel, listen, run_server
from gpulens.demo import DemoError, base_url, prepare, render


def demo(
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            help="Where the demo keeps its sample store, registry and key "
            "(default: $GPULENS_DATA_DIR/demo, i.e. ~/.local/share/gpulens/demo)",
        ),
    ] = None,
    host: Annotated[str | None, typer.Option("--host", help="Bind address; env GPULENS_HOST")] = None,
    port: Annotated[
        int | None, typer.Option("--port", min=1, max=65535, help="Port; env GPULENS_PORT")
    ] = None,
    no_serve: Annotated[
        bool, typer.Option("--no-serve", help="Set everything up, print how to use it and exit")
    ] = False,
    log_level: Annotated[LogLevel, typer.Option("--log-level", case_sensitive=False)] = LogLevel.WARNING,
) -> None:
    """Load generated GPU history (healthy, throttled, OOM, input-bound, CPU-only runs) and serve it."""
    run_demo(data_dir, host=host, port=port, serve=not no_serve, log_level=log_level)


def run_demo(
    data_dir: Path | None = None,
    *,
    host: str | None = None,
    port: int | None = None,
    serve: bool = True,
    log_level: LogLevel = LogLevel.WARNING,
) -> None:
    """`gpulens demo` (also `gpulens serve --demo`): set up, print how to use it, serve unless not `serve`."""
    from gpulens.api.observability import configure_logging

    settings = load_settings(host=host, port=port)
    log_config: dict[str, Any] | None = None
    if serve:
        try:  # GPULENS_LOG_FORMAT, as for `gpulens serve`; before the (first-time slow) set-up
            log_config = configure_logging(settings.log_format == "json", log_level)
        except ValueError as exc:
            fail(f"--log-level: {exc}", 2)
    listener: socket.socket | None = listen(settings.host, settings.port) if serve else None
    try:
        try:
            env = prepare(data_dir if data_dir is not None else settings.data_dir / "demo", log=sys.stderr)
        except DemoError as exc:
            fail(str(exc), 2)
        with env:
            url = base_url(settings.host, settings.port)
            typer.echo(render(env, url, serving=listener is not None))
            if listener is not None:
                from gpulens.api.app import create_app

                app = create_app(
                    env.settings(settings.host, settings.port), registry=env.registry, backend=env.backend()
                )
                # their summaries at once (they ended long before the background pass looks), so that the
                # fleet usage table and the list's figures are there from the start
                for e in env.executions:
                    app.state.ctx.summaries.enqueue(e.execution_id)
                run_server(
                    app,
                    listener,
                    log_level=log_level.value,
                    access_log=log_level is LogLevel.DEBUG,
                    log_config=log_config,
                )
                typer.echo("gpulens demo: stopped", err=True)
    finally:
        if listener is not None:
            listener.close()
