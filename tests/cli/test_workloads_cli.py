"""`gpulens workloads add|list|pods|update-pod`: workload registration from the command line."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from typer.testing import CliRunner, Result

from gpulens.cli.main import app as main_app
from gpulens.cli.workloads import app
from gpulens.domain.workloads import PodPhase
from gpulens.service.workloads import derived_pod_id
from tests.cli.conftest import invoke, invoke_ok, one_line_error

W = "3f2b8c1e-5a4d-4e6f-9b7a-1c2d3e4f5a6b"
P = "7e1d2c3b-4a59-4687-8b9c-0d1e2f3a4b5c"


def run(*args: str) -> Result:
    return invoke(app, *args)


def ok(*args: str) -> Result:
    return invoke_ok(app, *args)


def body_file(tmp_path: Path, **kw: object) -> str:
    body: dict[str, object] = {
        "workload_id": W,
        "name": "llm-serve",
        "org": "acme",
        "project": "team-a",
        "pods": [
            {"pod_id": P, "name": "llm-serve-0", "namespace": "team-a", "node": "gpu-node-1",
             "gpus": ["0", "1"], "start_time": "2026-01-01T09:00:00Z", "phase": "Running"},
            {"name": "llm-serve-1", "namespace": "team-a"},
        ],
    }  # fmt: skip
    body.update(kw)
    path = tmp_path / "body.json"
    path.write_text(json.dumps(body))
    return str(path)


def test_add_from_a_file_then_list(db: str, tmp_path: Path) -> None:
    result = ok("add", "--file", body_file(tmp_path))
    assert result.stdout.strip().splitlines()[-1] == W
    assert "registered workload llm-serve of org acme with 2 pod(s)" in result.stdout
    again = ok("add", "--file", body_file(tmp_path, name="renamed"))
    assert "updated workload renamed" in again.stdout

    listing = json.loads(ok("list", "--json").stdout)
    assert listing["total"] == 1 and listing["workloads"][0]["name"] == "renamed"
    assert "renamed" in ok("list").stdout

    pods = json.loads(ok("pods", W, "--json").stdout)
    assert pods["total"] == 2
    first, second = pods["pods"]
    assert (first["pod_id"], first["gpus"], first["phase"]) == (P, ["0", "1"], "Running")
    assert second["pod_id"] == derived_pod_id(W, "team-a", "llm-serve-1") and second["phase"] == "Pending"
    table = ok("pods", W).stdout
    assert "team-a/llm-serve-0" in table and "by pod labels" in table


def test_add_from_options_with_one_pod(db: str) -> None:
    result = ok(
        "add", "--org", "acme", "--name", "train", "--project", "vision",
        "--pod-name", "train-0", "--namespace", "vision", "--node", "gpu-node-2",
        "--gpu", "0,1", "--gpu", "3",
        "--start-time", "2026-01-01T10:00:00+01:00", "--end-time", "2026-01-01T11:00:00Z",
    )  # fmt: skip
    workload_id = result.stdout.strip().splitlines()[-1]
    assert uuid.UUID(workload_id).version == 4
    pods = json.loads(ok("pods", workload_id, "--json").stdout)["pods"]
    assert pods[0]["gpus"] == ["0", "1", "3"] and pods[0]["start_time"] == "2026-01-01T09:00:00Z"
    assert pods[0]["phase"] == PodPhase.SUCCEEDED.value
    ok("add", "--org", "acme", "--name", "empty")
    assert json.loads(ok("list", "--json", "--org", "acme").stdout)["total"] == 2


def test_update_pod(db: str, tmp_path: Path) -> None:
    ok("add", "--file", body_file(tmp_path))
    result = ok("update-pod", W, P, "--phase", "failed", "--end-time", "2026-01-01T12:00:00Z")
    assert "updated pod team-a/llm-serve-0: Failed, end 2026-01-01T12:00:00Z" in result.stdout
    pods = json.loads(ok("pods", W, "--json").stdout)["pods"]
    assert pods[0]["phase"] == "Failed" and pods[0]["end_time"] == "2026-01-01T12:00:00Z"
    assert "nothing to update" in one_line_error(run("update-pod", W, P), 2)
    assert "Resource id not found." in one_line_error(run("update-pod", W, str(uuid.uuid4()), "--node", "n"))


def test_errors_are_one_line(db: str, tmp_path: Path) -> None:
    assert "--file" in one_line_error(run("add", "--file", str(tmp_path / "missing.json")), 2)
    assert "pods.0.namespace" in one_line_error(
        run("add", "--file", body_file(tmp_path, pods=[{"name": "x", "namespace": "Bad_NS"}])), 2
    )
    assert "excludes" in one_line_error(run("add", "--file", body_file(tmp_path), "--org", "acme"), 2)
    assert "--org and --name" in one_line_error(run("add", "--org", "acme"), 2)
    assert "--namespace" in one_line_error(run("add", "--org", "acme", "--name", "x", "--pod-name", "p"), 2)
    assert "--pod-name" in one_line_error(run("add", "--org", "acme", "--name", "x", "--node", "n"), 2)
    assert "UUID" in one_line_error(run("pods", "not-a-uuid"))
    assert "Resource id not found." in one_line_error(run("pods", str(uuid.uuid4())))
    ok("add", "--file", body_file(tmp_path))
    assert "another org" in one_line_error(run("add", "--file", body_file(tmp_path, org="beta")))


def test_mounted_on_the_main_app(db: str) -> None:
    result = CliRunner().invoke(main_app, ["workloads", "list"])
    assert result.exit_code == 0 and "no workloads" in result.stdout
    result = CliRunner().invoke(main_app, ["discover", "--help"])
    assert result.exit_code == 0 and "kubernetes" in result.stdout
