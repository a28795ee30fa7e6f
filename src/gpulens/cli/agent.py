"""`gpulens agent`: sample this host's GPUs (NVML) and CPU/RAM (psutil); serve /metrics or print one pass."""

from __future__ import annotations

import logging
import signal
import socket
import threading
from types import FrameType
from typing import Annotated

import typer

from gpulens.cli.common import err_console, fail, load_settings


def agent(
    listen: Annotated[
        str, typer.Option("--listen", help="HOST:PORT to serve /metrics on (dcgm-exporter's port is 9400)")
    ] = "127.0.0.1:9400",
    once: Annotated[
        bool, typer.Option("--once", help="Print one pass in Prometheus text format and exit")
    ] = False,
    interval: Annotated[
        float | None,
        typer.Option("--interval", help="Seconds between passes (1-3600); env GPULENS_COLLECT_INTERVAL"),
    ] = None,
    fake_gpus: Annotated[
        int | None,
        typer.Option("--fake-gpus", help="N scripted GPUs instead of NVML (demo); env GPULENS_FAKE_GPUS"),
    ] = None,
    hostname: Annotated[
        str | None,
        typer.Option("--hostname", help="The Hostname / nodename label; default: this machine's host name"),
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level")] = "info",
) -> None:
    """Collect this host's metrics and serve them with dcgm-exporter and node-exporter names."""
    from gpulens.agent.collector import Collector
    from gpulens.agent.exposition import ExpositionSink, render
    from gpulens.agent.readers import default_readers
    from gpulens.agent.server import MetricsServer, parse_listen

    settings = load_settings(collect_interval=interval, fake_gpus=fake_gpus)
    level = logging.getLevelName(log_level.upper())
    if not isinstance(level, int):
        fail(f"--log-level: unknown level {log_level!r}", 2)
    if settings.log_format == "json":  # the same JSON lines as `gpulens serve`
        from gpulens.api.observability import configure_logging

        configure_logging(True, log_level)
    else:
        logging.basicConfig(format="gpulens agent: %(message)s", level=level)
    logging.getLogger("gpulens.agent").setLevel(level)
    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        fail(str(exc), 2)
    node = hostname or socket.gethostname()

    readers = default_readers(node, settings.fake_gpus, settings.max_process_series)
    if once:
        collector = Collector(readers, interval_s=settings.collect_interval)
        try:
            samples = collector.collect()
        finally:
            collector.close()
        typer.echo(render(samples), nl=False)
        return

    exposition = ExpositionSink()
    collector = Collector(readers, [exposition], interval_s=settings.collect_interval)
    try:
        server = MetricsServer(exposition, host, port)
    except OSError as exc:
        collector.close()
        fail(f"cannot listen on {listen}: {exc}", 2)
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_term)
    server.start()
    err_console.print(
        f"gpulens agent on {server.url}/metrics (host {node}, a pass every {settings.collect_interval:g} s)",
        soft_wrap=True,
        highlight=False,
    )
    try:
        collector.run(stop)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.stop()
        collector.close()
