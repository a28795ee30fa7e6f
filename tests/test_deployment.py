"""The deployment files (Dockerfile, deploy/compose.yaml, deploy/k8s/) against the code they deploy.

Every `GPULENS_*` variable they name is a setting of `gpulens.config.Settings`, and `gpulens serve`
starts with exactly the environment each one gives it: the image's `ENV` alone, plus compose's
`environment`, or plus the Deployment's ConfigMap and Secret. Only what names another machine is
replaced by a stand-in on 127.0.0.1: real PostgreSQL for `postgres`, a real Prometheus for
`prometheus`, a real VictoriaMetrics for the ConfigMap's; the bind address, port and data dir.
The agent DaemonSet's command serves `/metrics` the same way. No container runtime is needed (the
image build itself is not run here).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest
import yaml
from pydantic import AliasChoices

from gpulens.config import Settings
from gpulens_testkit.promload import ServerHandle, free_port, start_prometheus, start_victoria_metrics
from tests.conftest import missing_server
from tests.storage.conftest import postgres_server, postgres_url  # noqa: F401 - fixtures, used by name

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
ENV_EXAMPLE = DEPLOY / "gpulens.env.example"
K8S = DEPLOY / "k8s"
START_TIMEOUT_S = 30.0
SETTING = re.compile(r"\bGPULENS_[A-Z0-9_]+")


def settings_env_names() -> set[str]:
    """Every environment variable `Settings` reads: prefix + field name, or a field's aliases."""
    prefix = str(Settings.model_config.get("env_prefix", ""))
    names: set[str] = set()
    for name, info in Settings.model_fields.items():
        aliases: list[object] = [info.alias, info.validation_alias]
        choices = [c for a in aliases if isinstance(a, AliasChoices) for c in a.choices]
        named = {a.upper() for a in [*aliases, *choices] if isinstance(a, str)}
        names |= named or {f"{prefix}{name}".upper()}
    return names


# -- the Dockerfile ---------------------------------------------------------------------------------
@dataclass
class Stage:
    base: str
    name: str | None
    args: dict[str, str] = field(default_factory=dict)
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]

    def one(self, keyword: str) -> str:
        found = self.all(keyword)
        assert len(found) == 1, (keyword, found)
        return found[0]

    def expand(self, text: str) -> str:
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: self.args[m.group(1) or m.group(2)], text)

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for rest in self.all("ENV"):
            words = shlex.split(rest)
            if "=" not in words[0]:  # the old `ENV NAME value` form
                out[words[0]] = rest.split(None, 1)[1]
                continue
            for word in words:
                key, _, value = word.partition("=")
                out[key] = self.expand(value)
        return out


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, rest) per instruction: continuation lines joined, comments and blank lines dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).partition(" ")
        out.append((keyword.upper(), rest.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def dockerfile_stages() -> tuple[dict[str, str], list[Stage]]:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for keyword, rest in dockerfile_instructions(DOCKERFILE.read_text()):
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            global_args[name] = default
        elif keyword == "FROM":
            words = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m.group(1)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base, name))
        else:
            assert stages, f"{keyword} before FROM"
            if keyword == "ARG":
                name, _, default = rest.partition("=")
                stages[-1].args[name] = default
            stages[-1].instructions.append((keyword, rest))
    return global_args, stages


def image() -> Stage:
    return dockerfile_stages()[1][-1]


def exec_form(text: str) -> list[str]:
    words = json.loads(text)
    assert isinstance(words, list) and all(isinstance(w, str) for w in words), text
    return words


def test_dockerfile_builds_a_wheel_then_runs_it_as_non_root() -> None:
    _, stages = dockerfile_stages()
    assert len(stages) >= 2, "multi-stage: a build stage and the runtime"
    build, runtime = stages[0], stages[-1]
    assert build.name is not None
    assert runtime.base == build.base and re.fullmatch(r"python:3\.11-slim(-\w+)?", runtime.base)
    assert any("pip wheel" in run for run in build.all("RUN"))
    installs = [run for run in runtime.all("RUN") if "pip install" in run]
    assert len(installs) == 1 and f"from={build.name}" in installs[0] and "--no-index" in installs[0]
    assert not runtime.all("COPY") and not runtime.all("ADD"), "the runtime gets the wheels, not the tree"

    user = runtime.expand(runtime.one("USER"))
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) > 0 and (not gid or int(gid) > 0), "a numeric non-root user"
    assert runtime.one("EXPOSE") == "8080"
    env = runtime.env()
    assert env["GPULENS_HOST"] == "0.0.0.0"
    assert env["GPULENS_PORT"] == "8080"
    assert env["GPULENS_DATA_DIR"] == "/var/lib/gpulens"
    assert exec_form(runtime.one("VOLUME")) == ["/var/lib/gpulens"]
    assert exec_form(runtime.one("ENTRYPOINT")) == ["gpulens"]
    assert exec_form(runtime.one("CMD")) == ["serve"]
    check = healthcheck_command()
    assert check[0] == "python" and "/healthz" in check[-1]


def healthcheck_command() -> list[str]:
    rest = image().one("HEALTHCHECK")
    _, _, command = rest.partition(" CMD ")
    return exec_form(command)


def test_dockerignore_sends_only_what_the_wheel_is_built_from() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*", "everything is out unless named"
    allowed = {p.removeprefix("!").rstrip("/") for p in patterns if p.startswith("!")}
    build = dockerfile_stages()[1][0]
    copied: set[str] = set()
    for rest in build.all("COPY"):
        words = [w for w in shlex.split(rest) if not w.startswith("--")]
        copied |= {w.rstrip("/") for w in words[:-1]}  # the sources; the last word is the destination
    assert copied <= allowed, copied - allowed
    pyproject = (ROOT / "pyproject.toml").read_text()
    readme = re.search(r'^readme = "([^"]+)"', pyproject, re.M)
    assert readme is not None and readme.group(1) in allowed
    for kept in allowed:
        assert (ROOT / kept).exists(), kept
    for out in (".git", ".venv", "tests", "bench", "gpulens_testkit", "deploy"):
        assert out not in allowed


# -- compose ----------------------------------------------------------------------------------------
def env_file(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"{path.name}: not KEY=VALUE: {line!r}"
            out[key.strip()] = value
    return out


_INTERPOLATION = re.compile(r"\$\$|\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


def interpolate(text: str, values: Mapping[str, str]) -> str:
    """Compose's `${VAR}`, `${VAR:-default}`, `${VAR:?error}` and `$$` against `values`."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group(1), m.group(2), m.group(3)
        value = values.get(name)
        unset = value is None or (op is not None and op.startswith(":") and value == "")
        if unset and op in ("-", ":-"):
            return arg or ""
        if unset and op in ("?", ":?"):
            raise AssertionError(f"compose would refuse to start: {name}: {arg}")
        return value or ""

    return _INTERPOLATION.sub(one, text)


def compose(values: Mapping[str, str] | None = None) -> dict[str, Any]:
    text = COMPOSE.read_text()
    if values is not None:
        text = interpolate(text, values)
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def test_compose_runs_the_stack_with_healthchecks_and_no_secrets() -> None:
    services = compose()["services"]
    assert set(services) == {"gpulens", "prometheus", "postgres", "node-exporter", "dcgm-exporter"}
    for name, service in services.items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    assert services["dcgm-exporter"]["profiles"] == ["gpu"]
    devices = services["dcgm-exporter"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia"
    assert [p for s in services.values() for p in s.get("profiles", [])] == ["gpu"]

    gpulens = services["gpulens"]
    assert gpulens["build"]["context"] == ".." and gpulens["build"]["dockerfile"] == "Dockerfile"
    assert (DEPLOY / gpulens["build"]["context"] / gpulens["build"]["dockerfile"]).resolve() == DOCKERFILE
    assert gpulens["depends_on"] == {
        "postgres": {"condition": "service_healthy"},
        "prometheus": {"condition": "service_healthy"},
    }
    env = gpulens["environment"]
    assert env["GPULENS_PROMETHEUS_URL"] == "http://prometheus:9090"
    assert (
        env["GPULENS_DATABASE_URL"].startswith("postgresql://")
        and "@postgres:5432/" in env["GPULENS_DATABASE_URL"]
    )
    # secrets come from the env file, never from the compose file; the example leaves them empty
    assert re.fullmatch(r"\$\{GPULENS_JWT_SECRET:\?[^}]+\}", env["GPULENS_JWT_SECRET"])
    assert "${POSTGRES_PASSWORD:?" in env["GPULENS_DATABASE_URL"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSWORD:?")
    example = env_file(ENV_EXAMPLE)
    assert example["GPULENS_JWT_SECRET"] == "" and example["POSTGRES_PASSWORD"] == ""
    used = {m.group(1) for m in _INTERPOLATION.finditer(COMPOSE.read_text()) if m.group(1)}
    assert used == set(example), "the example names every variable the compose file reads, and no other"
    gitignored = subprocess.run(
        ["git", "check-ignore", "-q", "--no-index", str(DEPLOY / "gpulens.env")], cwd=ROOT, check=False
    )
    assert gitignored.returncode == 0, "deploy/gpulens.env (the filled-in copy) must be git-ignored"

    # Prometheus scrapes both exporters at the interval gpulens is told
    mounts = {
        v.split(":")[1]: v.split(":")[0] for v in services["prometheus"]["volumes"] if v.startswith("./")
    }
    config = yaml.safe_load((DEPLOY / mounts["/etc/prometheus/prometheus.yml"]).read_text())
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert {"node-exporter:9100", "dcgm-exporter:9400"} <= targets
    assert config["global"]["scrape_interval"] == env["GPULENS_SCRAPE_INTERVAL"]
    port = gpulens["ports"][0].rsplit(":", 1)[1]
    assert port == image().env()["GPULENS_PORT"]


def test_compose_prometheus_config_is_valid() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        missing_server("promtool (on PATH)")
    check = subprocess.run(
        [promtool, "check", "config", str(DEPLOY / "prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr


# -- Kubernetes ---------------------------------------------------------------------------------------
def k8s_objects() -> dict[tuple[str, str], dict[str, Any]]:
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None and doc.get("kind") != "Kustomization":
                key = (doc["kind"], doc["metadata"]["name"])
                assert key not in objects, key
                objects[key] = doc
    return objects


def pod_spec(kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = k8s_objects()[(kind, name)]["spec"]["template"]["spec"]
    return spec


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_k8s_manifests_run_two_hardened_replicas_and_the_agent() -> None:
    objects = k8s_objects()
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "secret.example.yaml"}
    assert set(kustomization["resources"]) == files, "kustomization.yaml lists every manifest but the example"
    namespace = kustomization["namespace"]
    assert ("Namespace", namespace) in objects
    assert all(
        o["metadata"].get("namespace") == namespace for o in objects.values() if o["kind"] != "Namespace"
    )

    deployment = objects[("Deployment", "gpulens")]
    assert deployment["spec"]["replicas"] == 2
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    spec = deployment["spec"]["template"]["spec"]
    # Kubernetes' service links would set GPULENS_PORT=tcp://<ip>:8080 for the Service `gpulens`
    assert spec["enableServiceLinks"] is False
    uid = int(image().expand(image().one("USER")).split(":")[0])
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == uid
    (container,) = spec["containers"]
    assert container["args"] == exec_form(image().one("CMD"))
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind]), kind
    hardening = container["securityContext"]
    assert hardening["readOnlyRootFilesystem"] is True and hardening["allowPrivilegeEscalation"] is False
    assert hardening["capabilities"]["drop"] == ["ALL"]
    # a read-only root: the data dir and /tmp are volumes
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert {image().env()["GPULENS_DATA_DIR"], "/tmp"} <= set(mounts)
    assert set(mounts.values()) <= {v["name"] for v in spec["volumes"]}
    (http,) = container["ports"]
    assert http["containerPort"] == int(image().env()["GPULENS_PORT"])

    # what every replica shares: the ConfigMap, and the database URL and JWT secret from one Secret
    (source,) = container["envFrom"]
    assert ("ConfigMap", source["configMapRef"]["name"]) in objects
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    assert set(refs) == {"GPULENS_DATABASE_URL", "GPULENS_JWT_SECRET"}
    example = yaml.safe_load((K8S / "secret.example.yaml").read_text())
    assert {r["name"] for r in refs.values()} == {example["metadata"]["name"]}
    assert {r["key"] for r in refs.values()} == set(example["stringData"])

    service = objects[("Service", "gpulens")]
    assert selects(service["spec"]["selector"], labels)
    assert service["spec"]["ports"][0]["targetPort"] == http["name"]
    pdb = objects[("PodDisruptionBudget", "gpulens")]
    assert selects(pdb["spec"]["selector"]["matchLabels"], labels)
    assert pdb["spec"]["minAvailable"] == 1

    daemonset = objects[("DaemonSet", "gpulens-agent")]
    agent_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert not selects(service["spec"]["selector"], agent_labels), "the API Service must not route to agents"
    assert not selects(pdb["spec"]["selector"]["matchLabels"], agent_labels)
    agent_spec = daemonset["spec"]["template"]["spec"]
    assert agent_spec["enableServiceLinks"] is False
    assert agent_spec["securityContext"]["runAsNonRoot"] is True
    (agent,) = agent_spec["containers"]
    assert agent["args"][0] == "agent" and agent["securityContext"]["readOnlyRootFilesystem"] is True


def test_every_setting_they_pass_is_a_setting() -> None:
    known = settings_env_names()
    passed = {name for name in image().env() if name.startswith("GPULENS_")}
    passed |= set(compose()["services"]["gpulens"]["environment"])
    objects = k8s_objects()
    passed |= set(objects[("ConfigMap", "gpulens")]["data"])
    for kind, name in (("Deployment", "gpulens"), ("DaemonSet", "gpulens-agent")):
        for container in pod_spec(kind, name)["containers"]:
            passed |= {e["name"] for e in container.get("env", []) if e["name"].startswith("GPULENS_")}
    mentioned: set[str] = set()
    for path in [DOCKERFILE, *sorted(p for p in DEPLOY.rglob("*") if p.is_file())]:
        mentioned |= set(SETTING.findall(path.read_text()))
    assert passed <= mentioned
    assert {"GPULENS_DATABASE_URL", "GPULENS_JWT_SECRET", "GPULENS_PROMETHEUS_URL"} <= passed
    assert sorted(mentioned - known) == [], "named in the deployment files but not a setting"


# -- they start ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    if shutil.which("prometheus") is None:
        missing_server("prometheus (on PATH)")
    handle = start_prometheus(tmp_path_factory.mktemp("prometheus") / "tsdb", block_s=7200)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="module")
def database(request: pytest.FixtureRequest) -> str:
    """A fresh database on a real PostgreSQL (tests/storage/conftest.py), as a SQLAlchemy URL."""
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture(scope="module")
def victoria_metrics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    if shutil.which("victoria-metrics") is None:
        missing_server("victoria-metrics (on PATH)")
    handle = start_victoria_metrics(tmp_path_factory.mktemp("vm") / "data")
    try:
        yield handle
    finally:
        handle.stop()


def libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def stand_ins(env: Mapping[str, str], tmp: Path, port: int, urls: Mapping[str, str]) -> dict[str, str]:
    """`env` with what names another machine replaced: same names, only the listed values changed."""
    out = dict(env)
    out["GPULENS_HOST"] = "127.0.0.1"
    out["GPULENS_PORT"] = str(port)
    out["GPULENS_DATA_DIR"] = str(tmp)
    out.update(urls)
    assert set(out) == set(env), set(out) ^ set(env)
    return out


def run_serve(argv: list[str], env: Mapping[str, str], cwd: Path) -> str:
    """Start `gpulens <argv>` with exactly `env` (plus PATH), wait for /healthz and /readyz, run the
    image's HEALTHCHECK, stop it with SIGTERM (as a container runtime does); its stderr, checked to
    hold no error (and to be JSON lines when the environment asks for them)."""
    base = f"http://127.0.0.1:{env['GPULENS_PORT']}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulens", *argv],
        env={**env, "PATH": os.environ.get("PATH", "")},
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    healthz = readyz = 0
    probe: subprocess.CompletedProcess[str] | None = None
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                healthz = healthz if healthz == 200 else httpx.get(f"{base}/healthz", timeout=2).status_code
                readyz = httpx.get(f"{base}/readyz", timeout=5).status_code if healthz == 200 else 0
            except httpx.HTTPError:
                pass
            if readyz == 200:
                break
            time.sleep(0.2)
        if readyz == 200:
            check = healthcheck_command()  # the image's HEALTHCHECK, as the runtime would run it
            probe = subprocess.run(
                [sys.executable, *check[1:]],
                env={**env},
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert (healthz, readyz) == (200, 200), f"not ready within {START_TIMEOUT_S} s: {err[-3000:]}"
    assert probe is not None and probe.returncode == 0, probe
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    if env.get("GPULENS_LOG_FORMAT") == "json":
        lines = [orjson.loads(line) for line in err.splitlines() if line.strip()]
        assert lines, "no log line"
        assert [ln for ln in lines if ln["level"] in ("error", "critical")] == []
    else:
        assert re.search(r"\b(ERROR|CRITICAL)\b", err) is None, err[-3000:]
    return err


def test_image_alone_serves_the_embedded_default(tmp_path: Path) -> None:
    """`docker run gpulens`: the image's environment only, so this host is collected into the data dir."""
    env = stand_ins(image().env(), tmp_path, free_port(), {})
    assert not any(name.endswith(("_PROMETHEUS_URL", "_DATABASE_URL")) for name in env)
    run_serve(exec_form(image().one("CMD")), env, tmp_path)
    assert (tmp_path / "gpulens.db").is_file() and (tmp_path / "admin.key").is_file()


def test_compose_gpulens_service_starts_with_its_environment(
    tmp_path: Path, database: str, prometheus: ServerHandle
) -> None:
    service = compose(
        {**env_file(ENV_EXAMPLE), "GPULENS_JWT_SECRET": os.urandom(32).hex(), "POSTGRES_PASSWORD": "x1"}
    )["services"]["gpulens"]
    env = {**image().env(), **{k: str(v) for k, v in service["environment"].items()}}
    db = urlsplit(env["GPULENS_DATABASE_URL"])
    assert (db.scheme, db.username, db.password, db.hostname, db.port, db.path) == (
        "postgresql",
        "gpulens",
        "x1",
        "postgres",
        5432,
        "/gpulens",
    )
    served = stand_ins(
        env,
        tmp_path,
        free_port(),
        {
            "GPULENS_PROMETHEUS_URL": env["GPULENS_PROMETHEUS_URL"].replace(
                "prometheus:9090", prometheus.url[7:]
            ),
            "GPULENS_DATABASE_URL": libpq(database),
        },
    )
    assert served["GPULENS_PROMETHEUS_URL"] == prometheus.url
    run_serve(service.get("command", exec_form(image().one("CMD"))), served, tmp_path)


def test_k8s_deployment_starts_with_its_environment(
    tmp_path: Path, database: str, victoria_metrics: ServerHandle
) -> None:
    objects = k8s_objects()
    (container,) = pod_spec("Deployment", "gpulens")["containers"]
    secret = {"database-url": libpq(database), "jwt-secret": os.urandom(32).hex()}
    env = dict(image().env())
    for source in container["envFrom"]:
        env.update(objects[("ConfigMap", source["configMapRef"]["name"])]["data"])
    for var in container["env"]:
        env[var["name"]] = var["value"] if "value" in var else secret[var["valueFrom"]["secretKeyRef"]["key"]]
    backend = urlsplit(env["GPULENS_PROMETHEUS_URL"])
    served = stand_ins(
        env,
        tmp_path,
        free_port(),
        {
            "GPULENS_PROMETHEUS_URL": env["GPULENS_PROMETHEUS_URL"].replace(
                backend.netloc, victoria_metrics.url[7:]
            )
        },
    )
    run_serve(container["args"], served, tmp_path)


def test_k8s_agent_daemonset_serves_metrics(tmp_path: Path) -> None:
    (container,) = pod_spec("DaemonSet", "gpulens-agent")["containers"]
    downward = {"spec.nodeName": "gpu-node-7"}
    env = dict(image().env())
    for var in container["env"]:
        env[var["name"]] = (
            var["value"] if "value" in var else downward[var["valueFrom"]["fieldRef"]["fieldPath"]]
        )
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]
    (metrics_port,) = container["ports"]
    listen = args.index("--listen") + 1
    assert args[listen] == f"0.0.0.0:{metrics_port['containerPort']}"
    port = free_port()
    args[listen] = f"127.0.0.1:{port}"
    env["GPULENS_DATA_DIR"] = str(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulens", *args],
        env={**env, "PATH": os.environ.get("PATH", "")},
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        body, deadline = "", time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                resp = httpx.get(f"http://127.0.0.1:{port}{container['readinessProbe']['httpGet']['path']}")
                if resp.status_code == 200:
                    body = resp.text
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        assert 'nodename="gpu-node-7"' in body, body[:500]
        live = httpx.get(f"http://127.0.0.1:{port}{container['livenessProbe']['httpGet']['path']}")
        assert live.status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
