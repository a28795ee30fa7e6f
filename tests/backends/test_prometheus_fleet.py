"""Reaching a fleet's backend: a path prefix, extra headers, basic auth, bearer tokens from rotating
files, redaction of credentials, and the settings that configure them (httpx.MockTransport; the same
against a real Prometheus behind a proxy is tests/integration/test_fleet_proxy.py)."""

from __future__ import annotations

import base64
import logging
import os
import urllib.parse
from collections.abc import Callable, Generator
from pathlib import Path

import httpx
import orjson
import pytest
from pydantic import ValidationError

from gpulens.api.app import backend_access
from gpulens.backends.prometheus import BackendAccess, CredentialUnreadable, PrometheusBackend, Secret
from gpulens.config import Settings, describe_error, parse_headers
from gpulens.domain.errors import BackendBadResponse, BackendUnavailable
from gpulens.domain.models import RangeQuery, Window

OK = {
    "query_range": {"resultType": "matrix", "result": [{"metric": {"a": "b"}, "values": [[1, "2"]]}]},
    "query": {"resultType": "matrix", "result": [{"metric": {"a": "b"}, "values": [[1, "2"]]}]},  # raw
    "series": [{"__name__": "up", "a": "b"}],
}


def recording(seen: list[httpx.Request]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        kind = request.url.path.rsplit("/", 1)[1]
        form = urllib.parse.parse_qs(request.content.decode())
        data = OK[kind]
        if kind == "query" and form["query"] == ["1"]:
            data = {"resultType": "scalar", "result": [1, "1"]}
        elif kind == "query" and "[" not in form["query"][0]:
            data = {"resultType": "vector", "result": [{"metric": {"a": "b"}, "value": [1, "2"]}]}
        return httpx.Response(200, content=orjson.dumps({"status": "success", "data": data}))

    return httpx.MockTransport(handle)


class HeaderAuth(httpx.Auth):
    """`Authorization` on each request from `make()`, as gpulens' own client sets it."""

    def __init__(self, make: Callable[[], str]) -> None:
        self._make = make

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = self._make()
        yield request


def client_for(access: BackendAccess, transport: httpx.MockTransport) -> httpx.Client:
    """A client sending what make_client's clients send (headers and auth), over `transport`."""
    make = access.authorization()
    auth = HeaderAuth(make) if make is not None else None
    return httpx.Client(transport=transport, headers=dict(access.headers), auth=auth)


async def test_every_call_goes_under_the_path_prefix() -> None:
    seen: list[httpx.Request] = []
    backend = PrometheusBackend("http://mimir:9009/prometheus/", httpx.Client(transport=recording(seen)))
    await backend.query_range(RangeQuery("up", Window(0, 60_000, 15_000)))
    await backend.query("up", 60_000)
    await backend.series("up", 0, 60_000)
    await backend.series_labels("up", "a", 0, 60_000)
    await backend.query_raw("up", 0, 60_000)
    await backend.ready()
    paths = [r.url.path for r in seen]
    assert paths == [
        "/prometheus/api/v1/query_range",
        "/prometheus/api/v1/query",
        "/prometheus/api/v1/series",
        "/prometheus/api/v1/series",
        "/prometheus/api/v1/query",
        "/prometheus/api/v1/query",
    ]
    assert all(r.url.host == "mimir" and r.url.port == 9009 for r in seen)


async def test_headers_and_basic_auth_on_every_request() -> None:
    seen: list[httpx.Request] = []
    access = BackendAccess(
        headers={"X-Scope-OrgID": "tenant-a"}, username="gpulens", password=Secret("s3cret-pass")
    )
    backend = PrometheusBackend("http://h/prometheus", client_for(access, recording(seen)), access=access)
    await backend.query_range(RangeQuery("up", Window(0, 60_000, 15_000)))
    await backend.series("up", 0, 60_000)
    await backend.ready()
    expected = "Basic " + base64.b64encode(b"gpulens:s3cret-pass").decode()
    assert len(seen) == 3
    for request in seen:
        assert request.headers["X-Scope-OrgID"] == "tenant-a"
        assert request.headers["Authorization"] == expected


async def test_bearer_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    """Kubernetes rotates a projected token by pointing a symlink at a new directory."""
    for name, token in (("v1", "token-one"), ("v2", "token-two")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "token").write_text(token + "\n")
    os.symlink("v1", tmp_path / "..data")
    os.symlink("..data/token", tmp_path / "token")
    seen: list[httpx.Request] = []
    access = BackendAccess(bearer=Secret(path=tmp_path / "token"))
    backend = PrometheusBackend("http://h", client_for(access, recording(seen)), access=access)
    await backend.ready()
    os.symlink("v2", tmp_path / "..data.new")
    os.replace(tmp_path / "..data.new", tmp_path / "..data")  # the atomic swap the kubelet does
    await backend.ready()
    assert [r.headers["Authorization"] for r in seen] == ["Bearer token-one", "Bearer token-two"]


async def test_a_token_file_rewritten_in_place_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("aaaa")
    secret = Secret(path=path)
    assert secret.get() == "aaaa"
    path.write_text("bbbbbbbb")  # another size: seen even within one mtime tick
    assert secret.get() == "bbbbbbbb"


def test_a_vanished_token_file_keeps_the_last_value_and_a_never_read_one_fails(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first")
    secret = Secret(path=path)
    assert secret.get() == "first"
    path.unlink()  # mid-rotation
    assert secret.get() == "first"
    with pytest.raises(CredentialUnreadable):
        Secret(path=tmp_path / "missing").get()
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(CredentialUnreadable):
        Secret(path=tmp_path / "empty").get()
    assert "first" not in repr(secret) and "s3" not in repr(Secret("s3cret"))


async def test_an_unreadable_credential_is_a_503_naming_no_path(tmp_path: Path) -> None:
    access = BackendAccess(bearer=Secret(path=tmp_path / "nowhere"))
    backend = PrometheusBackend("http://h", client_for(access, recording([])), access=access)
    with pytest.raises(BackendUnavailable) as exc:
        await backend.ready()
    assert "credential" in exc.value.message
    assert str(tmp_path) not in exc.value.message and "http://h" not in exc.value.message


@pytest.mark.parametrize("status", [401, 403])
async def test_a_refusal_is_a_502_without_the_backends_words(
    status: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A proxy quoting what it was sent must not reach the client, nor the log."""

    def refuse(request: httpx.Request) -> httpx.Response:
        sent = request.headers.get("Authorization", "")
        body = {"status": "error", "errorType": "auth", "error": f"bad credentials: {sent}"}
        return httpx.Response(status, content=orjson.dumps(body))

    access = BackendAccess(username="u", password=Secret("hunter2-pw"))
    backend = PrometheusBackend("http://h", client_for(access, httpx.MockTransport(refuse)), access=access)
    caplog.set_level(logging.INFO)
    with pytest.raises(BackendBadResponse) as exc:
        await backend.query_range(RangeQuery("up", Window(0, 60_000, 15_000)))
    assert exc.value.message == f"the metrics backend refused gpulens' credentials (HTTP {status})"
    encoded = base64.b64encode(b"u:hunter2-pw").decode()
    assert "hunter2-pw" not in caplog.text and encoded not in caplog.text
    assert "refused" in caplog.text


async def test_credentials_quoted_in_other_errors_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    def quote(request: httpx.Request) -> httpx.Response:
        sent = request.headers["Authorization"] + " " + request.headers["X-Api-Key"]
        body = {"status": "error", "errorType": "bad_data", "error": f"rejected {sent}"}
        return httpx.Response(400, content=orjson.dumps(body))

    access = BackendAccess(headers={"X-Api-Key": "key-123456"}, bearer=Secret("tok-abcdef"))
    backend = PrometheusBackend("http://h", client_for(access, httpx.MockTransport(quote)), access=access)
    caplog.set_level(logging.INFO)
    with pytest.raises(BackendBadResponse) as exc:
        await backend.query("up", 0)
    assert exc.value.message.count("[redacted]") == 2
    for secret in ("key-123456", "tok-abcdef"):
        assert secret not in exc.value.message and secret not in caplog.text


def test_access_refuses_inconsistent_credentials() -> None:
    with pytest.raises(ValueError, match="exclude"):
        BackendAccess(username="u", password=Secret("p"), bearer=Secret("t"))
    with pytest.raises(ValueError, match="both"):
        BackendAccess(username="u")
    with pytest.raises(ValueError, match="certificate"):
        BackendAccess(key_file=Path("k.pem"))


# -- settings -----------------------------------------------------------------------------------
def settings(**env: str) -> Settings:
    return Settings(prometheus_url="http://h:9009/prometheus", **env)  # type: ignore[arg-type]


def test_headers_as_json_or_lines() -> None:
    assert parse_headers('{"X-Scope-OrgID": "tenant-a", "X-Extra": "1"}') == {
        "X-Scope-OrgID": "tenant-a",
        "X-Extra": "1",
    }
    assert parse_headers("X-Scope-OrgID: tenant-a|tenant-b\n# a comment\n\nX-Extra:  v: w \n") == {
        "X-Scope-OrgID": "tenant-a|tenant-b",
        "X-Extra": "v: w",
    }


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("X-A tenant", "not 'Name: value'"),
        ("Bad Name: v", "not a header name"),
        ('{"X-A": 1}', "printable ASCII"),
        ('{"X-A": "line\\nbreak"}', "printable ASCII"),
        ("Host: elsewhere", "set by gpulens"),
        ("X-A: 1\nx-a: 2", "given twice"),
        ("{not json", "JSON"),
    ],
)
def test_bad_headers_are_refused_without_their_values(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_headers(text)


def test_headers_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPULENS_PROMETHEUS_HEADERS", "X-Scope-OrgID: tenant-a\nX-Team: gpu")
    monkeypatch.setenv("GPULENS_PROMETHEUS_USERNAME", "gpulens")
    (tmp_path / "pw").write_text("pw-from-file\n")
    monkeypatch.setenv("GPULENS_PROMETHEUS_PASSWORD_FILE", str(tmp_path / "pw"))
    conf = Settings(data_dir=tmp_path, prometheus_url="https://mimir/prometheus/")
    assert conf.prometheus_url == "https://mimir/prometheus"
    assert conf.prometheus_header_map == {"X-Scope-OrgID": "tenant-a", "X-Team": "gpu"}
    assert "tenant-a" not in repr(conf)  # header values may be keys
    access = backend_access(conf)
    assert access.username == "gpulens" and access.password is not None
    assert access.password.get() == "pw-from-file"


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"prometheus_username": "u"}, "needs GPULENS_PROMETHEUS_USERNAME and a password"),
        ({"prometheus_password": "p"}, "needs GPULENS_PROMETHEUS_USERNAME and a password"),
        (
            {"prometheus_username": "u", "prometheus_password": "p", "prometheus_bearer_token": "t"},
            "exclude each other",
        ),
        ({"prometheus_headers": "Authorization: Bearer x", "prometheus_bearer_token": "t"}, "Authorization"),
        ({"prometheus_bearer_token_file": "/nonexistent/token"}, "cannot read"),
        ({"prometheus_key_file": "/etc/hostname"}, "needs prometheus_cert_file"),
        ({"prometheus_ca_file": "/etc/hostname"}, "TLS"),
    ],
)
def test_inconsistent_settings_stop_the_start(env: dict[str, str], why: str) -> None:
    with pytest.raises(ValidationError) as exc:
        settings(**env)
    assert why in describe_error(exc.value)


def test_a_url_with_credentials_is_refused_without_echoing_them() -> None:
    with pytest.raises(ValidationError) as exc:
        Settings(prometheus_url="https://admin:hunter2@mimir/prometheus")
    text = describe_error(exc.value)
    assert "GPULENS_PROMETHEUS_USERNAME" in text and "hunter2" not in text
    with pytest.raises(ValidationError) as exc:
        Settings(prometheus_url="https://mimir/prometheus?x=hunter2")
    assert "hunter2" not in describe_error(exc.value)


def test_the_pool_timeout_is_a_setting_defaulting_to_the_request_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpulens.backends.http1 import AsyncHttpClient
    from gpulens.service.wiring import make_backend

    def client(conf: Settings) -> AsyncHttpClient:
        found = make_backend(conf)._client  # type: ignore[attr-defined]
        assert isinstance(found, AsyncHttpClient)
        return found

    assert client(settings(backend_timeout="7")).pool_timeout_s == 7.0
    monkeypatch.setenv("GPULENS_BACKEND_POOL_TIMEOUT", "2.5")
    assert client(settings()).pool_timeout_s == 2.5
