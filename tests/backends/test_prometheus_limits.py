"""The Prometheus backend's bounds: a deadline for a whole request, a cap on an answer's size, and
sample values checked before anything copies them into JSON; failures name no address."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest

from gpulens.backends.prometheus import PrometheusBackend, make_client, valid_samples
from gpulens.domain.errors import BackendBadResponse, BackendTimeout
from gpulens.domain.models import RangeQuery, Window

QUERY = RangeQuery("x", Window(0, 1000, 1000))
ANSWER = orjson.dumps(
    {"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [[0, "1"]]}]}}
)


def trickle_server(head: bytes, body: bytes, every_s: float) -> Iterator[str]:
    """Serves `head` at once, then `body` one byte every `every_s` seconds, to every connection."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.1)
    stop = threading.Event()

    def request(conn: socket.socket, buffered: bytes) -> bytes | None:
        """Reads one request (headers, then Content-Length bytes); returns what followed it."""
        while b"\r\n\r\n" not in buffered:
            data = conn.recv(65536)
            if not data:
                return None
            buffered += data
        headers, rest = buffered.split(b"\r\n\r\n", 1)
        length = next(
            (
                int(line.split(b":")[1])
                for line in headers.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        while len(rest) < length:
            data = conn.recv(65536)
            if not data:
                return None
            rest += data
        return rest[length:]

    def serve(conn: socket.socket) -> None:
        """Answers each request of a keep-alive connection until the client closes it."""
        buffered: bytes | None = b""
        conn.settimeout(30)
        with conn:
            try:
                while (buffered := request(conn, buffered or b"")) is not None:
                    conn.sendall(head)
                    for i in range(len(body)):
                        if stop.wait(every_s):
                            return
                        conn.sendall(body[i : i + 1])
            except OSError:
                return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        srv.close()


@pytest.fixture
def trickling_body() -> Iterator[str]:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(ANSWER)
    yield from trickle_server(head, ANSWER, 0.2)


@pytest.fixture
def trickling_head() -> Iterator[str]:
    yield from trickle_server(b"", b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n", 0.2)


@pytest.mark.parametrize("fixture", ["trickling_body", "trickling_head"])
async def test_a_trickling_backend_times_out_at_the_deadline_not_per_read(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    # one byte every 0.2 s never trips a 1 s read timeout: only a deadline for the whole request ends it
    url = request.getfixturevalue(fixture)
    backend = PrometheusBackend(url, make_client(1.0, False, 4))
    started = time.monotonic()
    with pytest.raises(BackendTimeout) as exc:
        await backend.query_range(QUERY)
    elapsed = time.monotonic() - started
    await backend.aclose()
    assert 0.9 < elapsed < 2.0, elapsed
    assert exc.value.message.startswith("the metrics backend did not answer in time")
    assert "127.0.0.1" not in exc.value.message


async def test_the_deadline_allows_a_prompt_answer_and_a_reused_connection() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(ANSWER)
    for url in trickle_server(head + ANSWER, b"", 0):
        backend = PrometheusBackend(url, make_client(1.0, False, 4))
        for _ in range(3):
            out = await backend.query_range(QUERY)
            assert out[0].samples == [[0, "1"]]
        await backend.aclose()


def streamed(body: bytes, chunk: int, sent: list[int], length: bool = False) -> httpx.MockTransport:
    class Body(httpx.SyncByteStream):
        def __iter__(self) -> Iterator[bytes]:
            for i in range(0, len(body), chunk):
                sent.append(chunk)
                yield body[i : i + chunk]

    def handle(request: httpx.Request) -> httpx.Response:
        headers = {"Content-Length": str(len(body))} if length else {}
        return httpx.Response(200, headers=headers, stream=Body())

    return httpx.MockTransport(handle)


async def test_an_answer_over_the_cap_is_a_bad_response_read_no_further() -> None:
    values = [[i, "1.5"] for i in range(100_000)]
    body = orjson.dumps(
        {"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": values}]}}
    )
    assert len(body) > 1_000_000
    sent: list[int] = []
    backend = PrometheusBackend(
        "http://prom:9090", httpx.Client(transport=streamed(body, 4096, sent)), max_answer_bytes=64 << 10
    )
    with pytest.raises(BackendBadResponse) as exc:
        await backend.query_range(QUERY)
    assert "answered more than 65536 bytes" in exc.value.message and "prom" not in exc.value.message
    assert sum(sent) <= (64 << 10) + 4096  # stopped at the cap, not after the whole body
    sent.clear()
    declared = PrometheusBackend(
        "http://prom:9090",
        httpx.Client(transport=streamed(body, 4096, sent, length=True)),
        max_answer_bytes=64 << 10,
    )
    with pytest.raises(BackendBadResponse):
        await declared.query_range(QUERY)
    assert sent == []  # a declared length over the cap: not a byte read
    # under the cap the same answer reads whole
    ok = PrometheusBackend("http://prom:9090", httpx.Client(transport=streamed(body, 65536, [])))
    assert len((await ok.query_range(QUERY))[0].samples) == 100_000


def matrix(*values: object) -> bytes:
    result = [{"metric": {"gpu": "0"}, "values": [[1767225600 + 15 * i, v] for i, v in enumerate(values)]}]
    return orjson.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}})


def answering(body: bytes) -> PrometheusBackend:
    return PrometheusBackend(
        "http://prom:9090",
        httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200, content=body))),
    )


GOOD = ["97.5", "0", "-0", "-3", "0.000001", "1e+06", "1.5E-07", "NaN", "+Inf", "-Inf", "1" * 300]
BAD = [
    '1},{"timestamp":"FORGED","value":666',
    "abc",
    "1e999",
    "-1e400",
    "9" * 400,
    "",
    " 1",
    "1 ",
    "01",
    ".5",
    "+1",
    "1.",
    "Inf",
    "nan",
    "0x10",
    "1\n2",
    "1_000",
    "١",  # an Arabic-Indic digit: not ASCII
    97.5,
    1,
    None,
    True,
    ["1"],
]


async def test_every_value_prometheus_writes_is_accepted() -> None:
    out = await answering(matrix(*GOOD)).query_range(QUERY)
    assert [v for _, v in out[0].samples] == GOOD


@pytest.mark.parametrize("value", BAD, ids=repr)
async def test_a_value_that_is_no_decimal_text_is_a_bad_response(value: object) -> None:
    # the bad value among good ones, anywhere in the series
    for values in ((value,), ("1", value), (value, "2", "3"), ("1", value, "NaN")):
        with pytest.raises(BackendBadResponse) as exc:
            await answering(matrix(*values)).query_range(QUERY)
        assert "malformed" in exc.value.message and "prom" not in exc.value.message


@pytest.mark.parametrize(
    "points",
    [
        [[1, "1"], [2]],
        [[1, "1"], [2, "2", "3"]],
        [[1, "1", "x"], [2]],
        [["1", "1"]],
        [[None, "1"]],
        [{"0": 1, "1": "2"}],
        ["12"],
        [1],
        "12",
        {"a": 1},
    ],
    ids=repr,
)
def test_points_that_are_no_pairs_of_time_and_text_are_refused(points: object) -> None:
    assert not valid_samples(points)


async def test_instant_and_raw_answers_are_checked_too() -> None:
    vector = {"resultType": "vector", "result": [{"metric": {}, "value": [1, "1},{"]}]}
    scalar = {"resultType": "scalar", "result": [1, 5]}
    for data in (vector, scalar):
        body = orjson.dumps({"status": "success", "data": data})
        with pytest.raises(BackendBadResponse):
            await answering(body).query("x", 1000)
    with pytest.raises(BackendBadResponse):
        await answering(matrix("1", "x")).query_raw("up", 0, 1000)
    labels = orjson.dumps(
        {
            "status": "success",
            "data": {"resultType": "matrix", "result": [{"metric": {"a": 1}, "values": []}]},
        }
    )
    with pytest.raises(BackendBadResponse):
        await answering(labels).query_range(QUERY)


def test_checking_a_day_of_values_is_cheap() -> None:
    """A 24 h Lyceum read holds ~70,000 values: checking them costs a few milliseconds."""
    samples = [[1767225600 + 15 * i, f"{(i * 7919) % 10000 / 100}"] for i in range(70_000)]
    assert valid_samples(samples)
    best = min(timed(samples) for _ in range(5))
    assert best < 0.1, (
        best
    )  # 5-14 ms measured here (loaded 2-core machine); bounds a regression to regex speed


def timed(samples: list[list[object]]) -> float:
    started = time.perf_counter()
    valid_samples(samples)
    return time.perf_counter() - started


def test_a_closed_loops_connections_are_closed() -> None:
    """`anyio.run` per call (a CLI, a test) opens a loop each time: the connections of loops that have
    closed must not stay open behind them (else one open connection per dead loop, until Prometheus'
    connection limit fills and new requests hang until the timeout)."""
    import anyio

    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(ANSWER)
    for url in trickle_server(head + ANSWER, b"", 0):
        client = make_client(5.0, False, 4)
        backend = PrometheusBackend(url, client)
        for _ in range(20):
            assert anyio.run(backend.query_range, QUERY)[0].samples == [[0, "1"]]
            assert client.open_connections <= 1
        anyio.run(backend.aclose)
        assert client.open_connections == 0
