"""What every CLI command shares: settings from flags + environment, one-line errors, the registry."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from sqlalchemy.exc import SQLAlchemyError

from gpulens.config import Settings, describe_error
from gpulens.domain.errors import GpulensError, InvalidParameter
from gpulens.domain.models import Principal
from gpulens.domain.timeparse import ms_to_datetime, parse_timestamp_ms
from gpulens.storage.registry import Registry

err_console = Console(stderr=True, highlight=False)


def out_console() -> Console:
    """Stdout console; tables get 140 columns when stdout is not a terminal (pipes, logs, tests)."""
    probe = Console(highlight=False)
    return probe if probe.is_terminal else Console(highlight=False, width=140)


DatabaseOpt = Annotated[
    str | None,
    typer.Option(
        "--database", help="Registry URL (sqlite:///file or postgresql://...); env GPULENS_DATABASE_URL"
    ),
]
PrometheusOpt = Annotated[str | None, typer.Option("--prometheus-url", help="env GPULENS_PROMETHEUS_URL")]
DemoOpt = Annotated[
    bool,
    typer.Option("--demo", help="Read the demo's executions (`gpulens demo`; built on first use)"),
]


def fail(message: str, code: int = 1) -> NoReturn:
    err_console.print(f"[red]error:[/red] {message}", soft_wrap=True)
    raise typer.Exit(code)


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment, with the command's flags (those not None) on top."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        fail(describe_error(exc), 2)


def open_registry(settings: Settings) -> Registry:
    """The registry, migrated to the current schema (creating the SQLite file's folder if needed)."""
    if settings.resolved_database_url.startswith("sqlite:///"):
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    from alembic.util import CommandError

    registry = Registry.from_url(settings.resolved_database_url)
    try:
        registry.migrate()
    except CommandError as exc:  # e.g. a registry migrated by a newer gpulens (a rollback)
        registry.dispose()
        fail(
            f"the registry's schema cannot be brought to this gpulens' version ({exc}); a registry "
            "written by a newer release needs that release, or the backup taken before the upgrade",
            2,
        )
    return registry


@contextmanager
def registry_errors(flags: Mapping[str, str] | None = None) -> Iterator[None]:
    """Domain and database errors become one red line: a refused input exits 2 and names the option
    (`flags` maps the service's field names to the command's options, where they differ), the
    others exit 1."""
    try:
        yield
    except InvalidParameter as exc:
        given = (flags or {}).get(exc.name)
        option = given or (f"--{exc.name.replace('_', '-')}" if exc.name.isidentifier() else exc.name)
        fail(f"{option}: {exc.message}", 2)
    except GpulensError as exc:
        fail(exc.message)
    except SQLAlchemyError as exc:
        detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        fail(f"registry: {type(exc).__name__}: {detail[0] if detail else ''}")


@contextmanager
def registry_for(database: str | None) -> Iterator[Registry]:
    settings = load_settings(database_url=database)
    with registry_errors():
        registry = open_registry(settings)
        try:
            yield registry
        finally:
            registry.dispose()


def parse_time(raw: str, option: str) -> datetime:
    """RFC 3339 (any offset; no zone means UTC), Unix seconds, or `now`."""
    if raw.strip().lower() == "now":
        return datetime.now(UTC)
    try:
        return ms_to_datetime(parse_timestamp_ms(raw))
    except ValueError as exc:
        fail(f"{option}: {exc}", 2)


def short_time(value: datetime | None) -> str:
    """For tables: minutes are enough, and UTC is the rule."""
    return "—" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M")


def optional_time(raw: str | None, option: str) -> datetime | None:
    """`parse_time`, with `none`/`null` for clearing a time."""
    if raw is None or raw.strip().lower() in ("none", "null"):
        return None
    return parse_time(raw, option)


def split_list(values: list[str] | None) -> list[str]:
    """Repeatable, comma-separated option values as one list (`--gpu 0 --gpu 1,2`)."""
    return [v.strip() for item in values or () for v in item.split(",") if v.strip()]


def page_json(key: str, items: list[dict[str, object]], total: int, limit: int, offset: int) -> str:
    """A page of a list command as the admin API answers it."""
    return json.dumps({key: items, "total": total, "limit": limit, "offset": offset}, indent=2)


# Whoever can open the registry administers it: the CLI calls the services the API calls, as an
# admin of every org (so the same checks hold), with no key of its own (nothing to clamp to).
CLI_ADMIN = Principal(org="cli", subject="cli", is_admin=True)
