"""Debian's Alertmanager (`prometheus-alertmanager`) on 127.0.0.1 for tests: no clustering, a receiver
that sends nothing, its data in a directory of the test's. Started like Prometheus (promload.py)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpulens_testkit.promload import ServerHandle, find_binary, start_server

ALERTMANAGER = "prometheus-alertmanager"

# every alert goes to a receiver without integrations: Alertmanager keeps and shows it, sends nothing
CONFIG = """\
route:
  receiver: "null"
  group_wait: 1h
receivers:
  - name: "null"
"""


def start_alertmanager(
    data_dir: Path, *, port: int | None = None, timeout_s: float = 30.0, extra_args: Sequence[str] = ()
) -> ServerHandle:
    """Alertmanager on 127.0.0.1 over `data_dir` (config, silences and log beside it), ready
    (`/-/ready`) when this returns. Raises MissingBinary without `prometheus-alertmanager`."""
    binary = find_binary(ALERTMANAGER)
    data_dir.mkdir(parents=True, exist_ok=True)
    config = data_dir.parent / f"{data_dir.name}-alertmanager.yml"
    config.write_text(CONFIG)

    def argv(listen_port: int) -> list[str]:
        return [
            binary,
            f"--config.file={config}",
            f"--storage.path={data_dir}",
            f"--web.listen-address=127.0.0.1:{listen_port}",
            "--cluster.listen-address=",  # empty: no gossip port, no peers
            "--log.level=warn",
            *extra_args,
        ]

    log_path = data_dir.parent / f"{data_dir.name}-alertmanager.log"
    return start_server("alertmanager", argv, "/-/ready", data_dir, log_path, port=port, timeout_s=timeout_s)


def alerts(url: str, *, active: bool | None = None, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """`GET /api/v2/alerts` of the Alertmanager at `url` (`active`: only active, or only inactive)."""
    query = "" if active is None else f"?active={str(active).lower()}&inhibited=true&silenced=true"
    with urllib.request.urlopen(f"{url}/api/v2/alerts{query}", timeout=timeout_s) as resp:  # noqa: S310 - 127.0.0.1
        found: list[dict[str, Any]] = json.loads(resp.read())
        return found
