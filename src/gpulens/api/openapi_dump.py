"""Print the OpenAPI document (`make openapi` writes it to openapi.json; a test checks for drift)."""

from __future__ import annotations

import sys
from typing import Any

import orjson

from gpulens.api.app import create_app
from gpulens.config import Settings


def document() -> dict[str, Any]:
    # Nothing is contacted: the registry is an unopened in-memory SQLite, the backend client lazy.
    settings = Settings(prometheus_url="http://127.0.0.1:9", database_url="sqlite://")
    return create_app(settings).openapi()


def main() -> int:
    sys.stdout.write(
        orjson.dumps(document(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode() + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
