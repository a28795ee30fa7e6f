"""A throwaway PostgreSQL server on 127.0.0.1 for the tests and the bench: the local `initdb`/`pg_ctl`
(found via `GPULENS_PG_BIN`, `pg_config --bindir`, /usr/lib/postgresql/*/bin or PATH) in a temp
directory, as an unprivileged user when run as root, fsync off."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulens_testkit.promload import free_port


class PostgresUnavailable(Exception):
    pass


def _bindir() -> Path:
    candidates: list[Path] = []
    if os.environ.get("GPULENS_PG_BIN"):
        candidates.append(Path(os.environ["GPULENS_PG_BIN"]))
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run(  # noqa: S603 - the local pg_config, no shell
            [pg_config, "--bindir"], capture_output=True, text=True, check=False
        )
        candidates.append(Path(out.stdout.strip()))
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    candidates.extend(reversed(versions))
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).parent)
    for path in candidates:
        if (path / "initdb").is_file() and (path / "pg_ctl").is_file():
            return path
    raise PostgresUnavailable("no initdb/pg_ctl found (set GPULENS_PG_BIN or GPULENS_TEST_POSTGRES_URL)")


def _run_as() -> dict[str, Any]:
    """PostgreSQL refuses to run as root: drop to an unprivileged user in the child processes."""
    if os.geteuid() != 0:
        return {}
    for name in filter(None, (os.environ.get("GPULENS_PG_USER"), "postgres", "nobody")):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    raise PostgresUnavailable(
        "running as root and no unprivileged user (postgres, nobody) to run PostgreSQL as"
    )


@dataclass
class LocalPostgres:
    bindir: Path
    data: Path
    port: int
    demote: dict[str, Any]

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://gpulens@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        subprocess.run(  # noqa: S603 - the local pg_ctl, no shell
            [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"],
            capture_output=True,
            check=False,
            timeout=30,
            **self.demote,
        )
        shutil.rmtree(self.data.parent, ignore_errors=True)


def start_postgres() -> LocalPostgres:
    """A throwaway PostgreSQL on 127.0.0.1 (trust auth, user gpulens, fsync off): `stop()` removes it."""
    bindir = _bindir()
    demote = _run_as()
    root = Path(tempfile.mkdtemp(prefix="gpulens-pg-"))
    data = root / "data"
    if demote:
        os.chown(root, demote["user"], demote["group"])
    init = subprocess.run(  # noqa: S603 - the local initdb, no shell
        [
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "gpulens",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        **demote,
    )
    if init.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise PostgresUnavailable(f"initdb failed: {init.stderr.strip()[-500:]}")
    last_error = ""
    for _attempt in range(3):  # another process may take the free port before the server binds it
        port = free_port()
        options = (
            f"-h 127.0.0.1 -p {port} -k {root} -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        start = subprocess.run(  # noqa: S603 - the local pg_ctl, no shell
            [
                str(bindir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(root / "server.log"),
                "-w",
                "-t",
                "60",
                "-o",
                options,
                "start",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=90,
            **demote,
        )
        if start.returncode == 0:
            return LocalPostgres(bindir, data, port, demote)
        log = root / "server.log"
        last_error = (start.stderr.strip() + " " + (log.read_text()[-500:] if log.exists() else "")).strip()
    shutil.rmtree(root, ignore_errors=True)
    raise PostgresUnavailable(f"pg_ctl start failed: {last_error}")
