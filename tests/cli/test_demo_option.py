"""`--demo` on the commands that read the demo's executions names the command that serves it."""

from __future__ import annotations

import pytest
import typer
from typer.core import TyperGroup, TyperOption

from gpulens.cli.main import app


@pytest.mark.parametrize("command", ["metrics", "report", "export"])
def test_demo_option_help_names_gpulens_demo(command: str) -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    cmd = group.commands[command]
    [demo] = [p for p in cmd.params if isinstance(p, TyperOption) and "--demo" in p.opts]
    assert demo.help is not None and "`gpulens demo`" in demo.help and "serve --demo" not in demo.help
    [prom] = [p for p in cmd.params if isinstance(p, TyperOption) and "--prometheus-url" in p.opts]
    assert prom.help == "env GPULENS_PROMETHEUS_URL"
