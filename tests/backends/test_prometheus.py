"""Prometheus backend against recorded envelopes (httpx.MockTransport)."""

from __future__ import annotations

import urllib.parse

import httpx
import orjson
import pytest

from gpulens.backends.prometheus import PrometheusBackend
from gpulens.domain.errors import BackendBadResponse, BackendTimeout, BackendUnavailable
from gpulens.domain.models import RangeQuery, Window

MATRIX = {
    "status": "success",
    "data": {
        "resultType": "matrix",
        "result": [{"metric": {}, "values": [[1767225600, "97.5"], [1767225615.5, "NaN"]]}],
    },
}


def backend(handler: httpx.MockTransport | None = None, **kw: object) -> PrometheusBackend:
    return PrometheusBackend("http://prom:9090/", httpx.Client(transport=handler), **kw)  # type: ignore[arg-type]


def respond(status: int, body: object, seen: list[httpx.Request] | None = None) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        content = body if isinstance(body, bytes) else orjson.dumps(body)
        return httpx.Response(status, content=content)

    return httpx.MockTransport(handle)


async def test_range_query_is_a_post_form_with_ms_exact_times() -> None:
    seen: list[httpx.Request] = []
    b = backend(respond(200, MATRIX, seen))
    out = await b.query_range(RangeQuery('up{a="b"}', Window(1767225600123, 1767229200123, 500)))
    assert list(out[0].samples[0]) == [1767225600, "97.5"]
    req = seen[0]
    assert req.method == "POST" and req.url.path == "/api/v1/query_range"
    form = urllib.parse.parse_qs(req.content.decode())
    assert form == {
        "query": ['up{a="b"}'],
        "start": ["1767225600.123"],
        "end": ["1767229200.123"],
        "step": ["0.500"],
        "nocache": ["1"],
    }


async def test_error_envelope_is_a_bad_response_with_the_message() -> None:
    body = {"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}
    with pytest.raises(BackendBadResponse) as exc:
        await backend(respond(400, body)).query_range(RangeQuery("x", Window(0, 1000, 1000)))
    assert "bad_data" in exc.value.message and "parse error at char 3" in exc.value.message
    assert "prom:9090" not in exc.value.message and exc.value.message.startswith("the metrics backend")


async def test_non_json_is_a_bad_response_and_5xx_unavailable() -> None:
    with pytest.raises(BackendBadResponse):
        await backend(respond(200, b"<html>")).query_range(RangeQuery("x", Window(0, 1000, 1000)))
    with pytest.raises(BackendUnavailable):
        await backend(respond(503, b"Service Unavailable")).query_range(
            RangeQuery("x", Window(0, 1000, 1000))
        )


async def test_transport_errors_map_to_the_tree() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with pytest.raises(BackendUnavailable) as exc:
        await backend(httpx.MockTransport(refuse)).ready()
    assert exc.value.message == "the metrics backend is unreachable (ConnectError)"
    with pytest.raises(BackendTimeout):
        await backend(httpx.MockTransport(slow)).ready()


async def test_series_labels() -> None:
    body = {
        "status": "success",
        "data": [{"instance": "10.0.0.5:9100"}, {"instance": "10.0.0.5:9100"}, {"job": "x"}],
    }
    assert await backend(respond(200, body)).series_labels("m", "instance", 0, 1000) == ["10.0.0.5:9100"]


async def test_vector_where_matrix_expected() -> None:
    body = {"status": "success", "data": {"resultType": "vector", "result": []}}
    with pytest.raises(BackendBadResponse):
        await backend(respond(200, body)).query_range(RangeQuery("x", Window(0, 1000, 1000)))


@pytest.mark.parametrize("error", [httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError])
async def test_a_closed_pooled_connection_is_retried_once(error: type[httpx.TransportError]) -> None:
    calls: list[int] = []

    def flaky(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:
            raise error("[Errno 9] Bad file descriptor", request=request)
        return httpx.Response(200, content=orjson.dumps(MATRIX))

    out = await backend(httpx.MockTransport(flaky)).query_range(RangeQuery("x", Window(0, 1000, 1000)))
    assert len(calls) == 2 and out[0].samples[0] == [1767225600, "97.5"]

    def broken(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise error("connection reset", request=request)

    calls.clear()
    with pytest.raises(BackendUnavailable):
        await backend(httpx.MockTransport(broken)).query_range(RangeQuery("x", Window(0, 1000, 1000)))
    assert len(calls) == 2  # once more, never a loop


async def test_a_timeout_is_not_retried() -> None:
    calls: list[int] = []

    def slow(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise httpx.ReadTimeout("timed out", request=request)

    with pytest.raises(BackendTimeout):
        await backend(httpx.MockTransport(slow)).query_range(RangeQuery("x", Window(0, 1000, 1000)))
    assert calls == [1]
