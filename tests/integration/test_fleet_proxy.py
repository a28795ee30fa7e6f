"""gpulens against a real Prometheus behind a gate, as fleets run it: a path prefix (Mimir's
`/prometheus`), a tenant header, basic auth, a bearer token from a rotating file, TLS with a CA of the
test's own and a client certificate. The gate (a small threaded HTTP proxy on 127.0.0.1) refuses what
lacks any of them with a 401 that quotes what it was sent; otherwise it forwards to Prometheus.

Each way through must give the Lyceum metrics route the answer it gives straight from Prometheus; a
wrong or missing credential must be a clean 502 (refused) or 503 (TLS) naming neither the credential
nor where the backend lives.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import ipaddress
import logging
import os
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpulens.api.app import make_backend
from gpulens.backends.prometheus import PrometheusBackend, make_client
from gpulens.config import Settings
from gpulens.domain.models import RangeQuery, Window
from gpulens_testkit.promload import LoadedDataset
from tests.integration.lyceum_app import LiveApi, build

pytestmark = pytest.mark.integration
PREFIX = "/prometheus"
EXECUTION = "healthy"


# -- the gate --------------------------------------------------------------------------------------
@dataclass
class Gate:
    """What the proxy requires (the test may change it while it runs) and what it saw."""

    upstream: str
    headers: dict[str, str] = field(default_factory=dict)
    authorization: str | None = None
    paths: list[str] = field(default_factory=list)
    refused: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self, path: str, sent: Any) -> str | None:
        """None when the request may pass, else why not (quoting what was sent, as careless proxies do)."""
        with self.lock:
            self.paths.append(path)
            if not path.startswith(PREFIX + "/"):
                return f"no route {path}"
            for name, value in self.headers.items():
                if sent.get(name) != value:
                    return f"{name} must be given: got {sent.get(name)!r}"
            if self.authorization is not None and sent.get("Authorization") != self.authorization:
                return f"bad credentials: got {sent.get('Authorization')!r}"
            return None


def handler_for(gate: Gate) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as gpulens' clients expect

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            why = gate.check(self.path, self.headers)
            if why is not None:
                with gate.lock:
                    gate.refused += 1
                status = 404 if why.startswith("no route") else 401
                self._send(status, why.encode(), "text/plain")
                return
            request = urllib.request.Request(
                gate.upstream + self.path[len(PREFIX) :], data=body, method=self.command
            )
            if self.headers.get("Content-Type"):
                request.add_header("Content-Type", self.headers["Content-Type"])
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    status, content = answer.status, answer.read()
                    kind = answer.headers.get("Content-Type", "application/json")
            except urllib.error.HTTPError as exc:
                status, content, kind = exc.code, exc.read(), exc.headers.get("Content-Type", "")
            self._send(status, content, kind)

        def _send(self, status: int, content: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        do_GET = do_POST = _forward

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@dataclass
class Proxy:
    gate: Gate
    url: str  # with the prefix


@dataclass
class Pki:
    """A CA of the test's own, a server certificate for 127.0.0.1 and a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.write_bytes(pem)


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _ca(tmp: Path, common: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(_name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    (tmp / f"{common}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def _leaf(
    tmp: Path, name: str, ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], server: bool
) -> tuple[Path, Path]:
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if server:
        names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    cert_path, key_path = tmp / f"{name}.pem", tmp / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, key_path)
    return cert_path, key_path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    tmp = Path(tmp_path_factory.mktemp("pki"))
    ca = _ca(tmp, "gpulens-test-ca")
    _ca(tmp, "unrelated-ca")
    server_cert, server_key = _leaf(tmp, "proxy", ca, server=True)
    client_cert, client_key = _leaf(tmp, "gpulens", ca, server=False)
    return Pki(
        tmp / "gpulens-test-ca.pem",
        server_cert,
        server_key,
        client_cert,
        client_key,
        tmp / "unrelated-ca.pem",
    )


@pytest.fixture
def start_proxy(prom_dataset: LoadedDataset) -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []

    def start(gate: Gate | None = None, tls: ssl.SSLContext | None = None) -> Proxy:
        gate = gate or Gate(prom_dataset.url)
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(gate))
        server.daemon_threads = True
        if tls is not None:
            server.socket = tls.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        scheme = "https" if tls is not None else "http"
        return Proxy(gate, f"{scheme}://127.0.0.1:{server.server_address[1]}{PREFIX}")

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def server_tls(pki: Pki, client_ca: Path | None = None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(client_ca)
    return context


# -- gpulens through it ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def direct(prom_dataset: LoadedDataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveApi]:
    api = build(prom_dataset, Path(tmp_path_factory.mktemp("direct")))
    yield api
    api.registry.dispose()


@pytest.fixture(scope="module")
def expected(direct: LiveApi) -> Any:
    return direct.metrics(direct.data.scenario.execution(EXECUTION).execution_id, step="1m")


@pytest.fixture
def through(prom_dataset: LoadedDataset, tmp_path: Path) -> Iterator[Any]:
    """Builds gpulens apps whose backend URL is `url` (and `settings`), disposed of after the test."""
    made: list[LiveApi] = []

    def make(url: str, **settings: Any) -> LiveApi:
        where = tmp_path / f"app{len(made)}"
        where.mkdir()
        api = build(dataclasses.replace(prom_dataset, url=url), where, **settings)
        made.append(api)
        return api

    yield make
    for api in made:
        api.registry.dispose()


def metrics_response(api: LiveApi) -> Any:
    execution_id = api.data.scenario.execution(EXECUTION).execution_id
    return api.client.get(
        f"/api/v2/external/execution/{execution_id}/metrics",
        params={"step": "1m"},
        headers={"Authorization": f"Bearer {api.key}"},
    )


def assert_clean_failure(response: Any, status: int, *secrets: str) -> None:
    assert response.status_code == status, response.text
    assert "detail" in response.json()
    for text in (*secrets, "127.0.0.1", PREFIX):
        assert text not in response.text, (text, response.text)


def test_prefix_tenant_header_and_basic_auth_give_the_direct_answer(
    start_proxy: Any, through: Any, expected: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proxy: Proxy = start_proxy()
    proxy.gate.headers = {"X-Scope-OrgID": "tenant-a"}
    proxy.gate.authorization = "Basic " + base64.b64encode(b"gpulens:pw-0123456789").decode()
    (tmp_path / "password").write_text("pw-0123456789\n")
    api = through(
        proxy.url,
        prometheus_headers="X-Scope-OrgID: tenant-a",
        prometheus_username="gpulens",
        prometheus_password_file=tmp_path / "password",
    )
    response = metrics_response(api)
    assert response.status_code == 200, response.text
    assert response.json() == expected
    assert proxy.gate.refused == 0 and proxy.gate.paths
    assert {p.split("?")[0] for p in proxy.gate.paths} <= {
        f"{PREFIX}/api/v1/{call}" for call in ("query", "query_range", "series")
    }
    ready = api.client.get("/readyz")
    assert ready.status_code == 200, ready.text

    # a wrong password, a missing tenant: the gate's 401 (quoting what it got) is a clean 502
    caplog.set_level(logging.INFO)
    (tmp_path / "password").write_text("wrong-pw-987654\n")
    assert_clean_failure(metrics_response(api), 502, "wrong-pw-987654", "pw-0123456789")
    wrong = base64.b64encode(b"gpulens:wrong-pw-987654").decode()
    assert "wrong-pw-987654" not in caplog.text and wrong not in caplog.text
    no_tenant = through(
        proxy.url, prometheus_username="gpulens", prometheus_password_file=tmp_path / "password"
    )
    assert_clean_failure(metrics_response(no_tenant), 502, "wrong-pw-987654")
    assert metrics_response(no_tenant).json()["detail"] == (
        "the metrics backend refused gpulens' credentials (HTTP 401)"
    )
    no_auth = through(proxy.url, prometheus_headers="X-Scope-OrgID: tenant-a")
    assert_clean_failure(metrics_response(no_auth), 502, "tenant-a")


def test_every_backend_call_keeps_the_prefix(start_proxy: Any, prom_dataset: LoadedDataset) -> None:
    """query_range, query, series, raw reads (the archive's) and readiness, through make_backend."""
    proxy: Proxy = start_proxy()
    proxy.gate.headers = {"X-Scope-OrgID": "tenant-a"}
    settings = Settings(prometheus_url=proxy.url, prometheus_headers='{"X-Scope-OrgID": "tenant-a"}')
    gated = make_backend(settings)
    plain = PrometheusBackend(prom_dataset.url, make_client(30, False, 4))
    execution = prom_dataset.scenario.execution(EXECUTION)
    start_ms = int(execution.start.timestamp() * 1000)
    end_ms = start_ms + 3_600_000
    metric = "DCGM_FI_DEV_GPU_UTIL"

    async def both() -> None:
        try:
            for backend in (gated, plain):
                await backend.ready()
            query = RangeQuery(f"avg({metric})", Window(start_ms, end_ms, 60_000))
            assert await gated.query_range(query) == await plain.query_range(query)
            assert await gated.query(f"count({metric})", end_ms) == await plain.query(
                f"count({metric})", end_ms
            )
            assert await gated.series(metric, start_ms, end_ms) == await plain.series(
                metric, start_ms, end_ms
            )
            raw = await gated.query_raw(metric, start_ms, end_ms)
            assert raw and sorted(map(repr, raw)) == sorted(
                map(repr, await plain.query_raw(metric, start_ms, end_ms))
            )
        finally:
            await gated.aclose()
            await plain.aclose()

    anyio.run(both)
    assert proxy.gate.refused == 0
    called = {p.split("?")[0].removeprefix(PREFIX + "/api/v1/") for p in proxy.gate.paths}
    assert called == {"query", "query_range", "series"}


def test_a_rotated_token_file_is_picked_up(
    start_proxy: Any, through: Any, expected: Any, tmp_path: Path
) -> None:
    """As the kubelet rotates a projected token: a new directory, then the `..data` symlink swapped."""
    tokens = tmp_path / "projected"
    tokens.mkdir()

    def project(version: str, token: str) -> None:
        (tokens / version).mkdir()
        (tokens / version / "token").write_text(token)
        os.symlink(version, tokens / "..data.tmp")
        os.replace(tokens / "..data.tmp", tokens / "..data")

    project("v1", "token-one-abcdef")
    os.symlink("..data/token", tokens / "token")
    proxy: Proxy = start_proxy()
    proxy.gate.authorization = "Bearer token-one-abcdef"
    api = through(proxy.url, prometheus_bearer_token_file=tokens / "token")
    assert metrics_response(api).json() == expected

    proxy.gate.authorization = "Bearer token-two-ghijkl"  # the issuer moved on before the file did
    assert_clean_failure(metrics_response(api), 502, "token-one-abcdef", "token-two-ghijkl")
    project("v2", "token-two-ghijkl")
    response = metrics_response(api)  # the same process, no restart
    assert response.status_code == 200, response.text
    assert response.json() == expected


def test_tls_with_the_tests_ca(start_proxy: Any, through: Any, expected: Any, pki: Pki) -> None:
    proxy: Proxy = start_proxy(tls=server_tls(pki))
    proxy.gate.headers = {"X-Scope-OrgID": "tenant-a"}
    api = through(proxy.url, prometheus_ca_file=pki.ca, prometheus_headers="X-Scope-OrgID: tenant-a")
    response = metrics_response(api)
    assert response.status_code == 200, response.text
    assert response.json() == expected

    # a CA that did not sign the proxy's certificate (or none: the system's): refused, a clean 503
    for settings in ({"prometheus_ca_file": pki.other_ca}, {}):
        other = through(proxy.url, prometheus_headers="X-Scope-OrgID: tenant-a", **settings)
        assert_clean_failure(metrics_response(other), 503)


def test_a_client_certificate(start_proxy: Any, through: Any, expected: Any, pki: Pki) -> None:
    proxy: Proxy = start_proxy(tls=server_tls(pki, client_ca=pki.ca))
    api = through(
        proxy.url,
        prometheus_ca_file=pki.ca,
        prometheus_cert_file=pki.client_cert,
        prometheus_key_file=pki.client_key,
    )
    response = metrics_response(api)
    assert response.status_code == 200, response.text
    assert response.json() == expected
    without = through(proxy.url, prometheus_ca_file=pki.ca)
    assert_clean_failure(metrics_response(without), 503)
