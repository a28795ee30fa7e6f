"""What `gpulens demo` prints: where to call, the key, the executions, commands to paste."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from gpulens.demo.env import DEMO_ORG, DemoEnv, DemoExecution
from gpulens.domain.timeparse import format_rfc3339

LYCEUM = ".venv-lyceum/bin/lyceum"
HEALTHY = "healthy"
THROTTLED = "throttled"


def base_url(host: str, port: int) -> str:
    """The URL to call a server bound to host:port (a wildcard address is reached on loopback)."""
    if host in ("", "0.0.0.0"):  # noqa: S104 - mapping a wildcard to loopback, not binding to it
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _window(e: DemoExecution) -> str:
    start, end = e.spec.start, e.spec.end
    tail = f"{end:%H:%M}" if end.date() == start.date() else f"{end:%Y-%m-%d %H:%M}"
    return f"{start:%Y-%m-%d %H:%M} - {tail}"


def _gpus(e: DemoExecution) -> str:
    if not e.gpus:
        return "-"
    listed = ",".join(str(g) for g in e.gpus)
    return listed if e.spec.gpus else f"{listed} (all)"


def render(env: DemoEnv, url: str, *, serving: bool, lyceum: str = LYCEUM) -> str:
    """The block `gpulens demo` prints: where to call, the key, the executions, commands to paste."""
    sc = env.scenario
    rows = [("name", "execution id", "host", "GPUs", "status", "window (UTC)")]
    rows += [
        (e.name, e.execution_id, e.spec.hostname, _gpus(e), e.execution.status.value, _window(e))
        for e in env.executions
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    table = [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows
    ]
    healthy = env.execution(HEALTHY).execution_id
    throttled = env.execution(THROTTLED).execution_id
    config = json.dumps({"api_key": env.key, "base_url": url})
    lyceum_note = "" if Path(lyceum).exists() else " (install it with `make lyceum-cli`)"
    hours = (sc.end_s - sc.start_s) / 3600
    # the demo's history: its usage lies there, not in the last week
    day = 86_400
    first, last = datetime.fromtimestamp(sc.start_s // day * day, UTC), datetime.fromtimestamp(sc.end_s, UTC)
    window = f"start={format_rfc3339(first)}&end={format_rfc3339(last)}"
    lines = [
        "",
        f"gpulens demo: {hours:g} h of generated GPU history on {len(sc.hosts)} hosts "
        f"({sc.start:%Y-%m-%d %H:%M} - {sc.end:%Y-%m-%d %H:%M} UTC), "
        f"in the embedded store at {env.store_path}",
        "",
        f"  API        {url}",
        f"  API key    {env.key}   (org {DEMO_ORG}; kept in {env.key_path})",
        f"  dashboard  {url}/   (sign in with the key)",
        f"             {url}/ui/executions/{throttled}   (the throttled run's charts)",
        f"             {url}/ui/usage?{window}   (who used and who wasted which GPU-hours)",
        "",
        *table,
        "",
        "Try it:",
        "",
        f'  curl -s -H "Authorization: Bearer {env.key}" '
        f'"{url}/api/v2/external/execution/{healthy}/metrics?step=1m" | head -c 600',
        "",
        f"  # the public lyceum CLI{lyceum_note}; this replaces ~/.lyceum/config.json",
        f"  mkdir -p ~/.lyceum && echo '{config}' > ~/.lyceum/config.json",
        f"  {lyceum} jobs metrics {healthy}",
        "",
        "  # fleet usage per project and user over the demo's window (JSON; format=csv for a spreadsheet)",
        f'  curl -s -H "Authorization: Bearer {env.key}" '
        f'"{url}/api/v2/external/usage?group_by=project,user&{window}"',
        "",
        "  # each run's summary and findings from the CLI (no server needed; the default --data-dir)",
        f"  gpulens report {throttled} --demo",
        "",
        "Serving until Ctrl-C."
        if serving
        else "Not serving (--no-serve): run without --no-serve to try the commands.",
        "",
    ]
    return "\n".join(lines)
