"""The wheel holds the product only: no test-data generator, ground truth or server launcher."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import missing_server

ROOT = Path(__file__).resolve().parent.parent
# what lives in gpulens_testkit (tests and bench), never in the product
TEST_ONLY = ("gpulens_testkit", "synth", "truth", "promload", "k8s", "openmetrics", "scenarios")


def test_wheel_holds_the_demo_and_no_test_kit(tmp_path: Path) -> None:
    project = tmp_path / "project"  # a copy: building writes build/ and *.egg-info next to the sources
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, project / name)
    shutil.copytree(
        ROOT / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.so")
    )
    dist = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*pip, "-w", str(dist), str(project)], check=True, timeout=120)
    (wheel,) = dist.glob("gpulens-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    modules = [n for n in names if n.endswith(".py")]
    assert not [n for n in names if not n.startswith(("gpulens/", "gpulens-"))], "only the gpulens package"
    leaked = [m for m in modules if any(part in m for part in TEST_ONLY)]
    assert not leaked, leaked
    for module in ("__init__", "env", "history", "render", "scenario"):
        assert f"gpulens/demo/{module}.py" in names
    assert "gpulens/cli/demo.py" in names and "gpulens/cli/serving.py" in names
    assert any(n.startswith("gpulens/api/ui/pages/") for n in names)  # package data still ships
    assert "gpulens/api/ui/static/vendor/swagger-ui/swagger-ui-bundle.js" in names  # /docs needs no CDN
    assert any(n.startswith("gpulens/storage/migrations/") for n in names)
    # the compiled grid path, built from its source by the wheel's build (missing fails under CI)
    assert "gpulens/_gridjson.pyi" in names
    if not [n for n in names if n.startswith("gpulens/_gridjson.") and n.endswith(".so")]:
        missing_server("the compiled grid path in the wheel (a C compiler and Python's headers)")
