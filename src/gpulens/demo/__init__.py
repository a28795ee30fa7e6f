"""`gpulens demo`'s data: generated GPU history of a few runs in an embedded store, with its registry and key.

`scenario` describes the runs (hosts, GPUs, phases), `history` computes every exporter series of them,
`env` writes them into a sample store once and opens it with a registry and an org key, and `render`
says how to use it. The command itself (`gpulens demo`) is `gpulens.cli.demo`.
"""

from __future__ import annotations

from gpulens.demo.env import DEMO_ORG, DemoEnv, DemoError, DemoExecution, prepare
from gpulens.demo.render import base_url, render

__all__ = ["DEMO_ORG", "DemoEnv", "DemoError", "DemoExecution", "base_url", "prepare", "render"]
