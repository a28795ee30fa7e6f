"""The text exposition: parses as Prometheus text, HELP/TYPE right, escaping, and the HTTP endpoint."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulens.agent.collector import Collector
from gpulens.agent.exposition import ExpositionSink, exposition_value, render
from gpulens.agent.readers.fake import FakeGpuReader
from gpulens.agent.readers.system import SystemReader
from gpulens.agent.samples import SERIES, Sample
from gpulens.agent.server import MetricsServer, parse_listen
from gpulens.domain import catalog as c

NOW = 1_767_225_600_000


def one_pass(gpus: int = 2) -> list[Sample]:
    return Collector([FakeGpuReader("gpu-node-1", gpus), SystemReader("gpu-node-1")]).collect()


def test_parses_with_prometheus_client_with_the_right_types() -> None:
    samples = one_pass()
    families = {f.name: f for f in text_string_to_metric_families(render(samples))}
    # the parser files counters under the name without `_total`
    types = {name: fam.type for name, fam in families.items()}
    assert types["DCGM_FI_DEV_GPU_UTIL"] == "gauge"
    assert types["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
    assert types["node_cpu_seconds"] == "counter"
    assert types["node_memory_MemTotal_bytes"] == "gauge"
    assert types["DCGM_FI_PROF_PCIE_RX_BYTES"] == "gauge"  # a rate, not a counter (dcgm-exporter's type)
    parsed = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples
    }
    assert len(parsed) == len(samples)
    for s in samples:
        # prometheus_client's parser appends `_total` to counter samples that lack it (DCGM's counters
        # do); Prometheus itself keeps the name as exposed
        name = s.name if s.name.endswith("_total") or SERIES[s.name].type != "counter" else s.name + "_total"
        assert parsed[(name, tuple(sorted(s.labels)))] == pytest.approx(s.value)
    util = [s for s in families["DCGM_FI_DEV_GPU_UTIL"].samples]
    assert len(util) == 2 and util[0].labels["Hostname"] == "gpu-node-1"
    assert families["node_uname_info"].samples[0].labels["nodename"] == "gpu-node-1"


def test_help_and_type_once_per_name_in_first_seen_order() -> None:
    text = render(one_pass())
    lines = text.splitlines()
    types = [line.split()[2] for line in lines if line.startswith("# TYPE")]
    assert len(types) == len(set(types))
    assert types[0] == c.DCGM_GPU_UTIL
    assert f"# TYPE {c.NODE_CPU_SECONDS} counter" in lines
    assert f"# HELP {c.NODE_CPU_SECONDS} {SERIES[c.NODE_CPU_SECONDS].help}" in lines
    assert text.endswith("\n") and " 1767225600000" not in text  # no timestamps


def test_escaping_and_values() -> None:
    s = Sample("x_metric", (("a", 'q"uo\\te\nnl'),), 0.5, NOW)
    text = render([s])
    assert 'x_metric{a="q\\"uo\\\\te\\nnl"} 0.5' in text and "# TYPE x_metric untyped" in text
    [family] = text_string_to_metric_families(text)
    assert family.samples[0].labels["a"] == 'q"uo\\te\nnl'
    assert [exposition_value(v) for v in (3.0, 2.5, 1e20, float("nan"), float("inf"), -float("inf"))] == [
        "3",
        "2.5",
        "1e+20",
        "NaN",
        "+Inf",
        "-Inf",
    ]


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:9400") == ("127.0.0.1", 9400)
    assert parse_listen(":9400") == ("0.0.0.0", 9400)
    assert parse_listen("[::1]:9400") == ("::1", 9400)
    for bad in ("9400", "host:", "host:99999", "a:b:c"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_listen(bad)


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.headers["Content-Type"], exc.read()


def test_http_endpoint_serves_the_latest_pass() -> None:
    sink = ExpositionSink()
    with MetricsServer(sink, "127.0.0.1", 0) as server:
        assert get(server.url + "/metrics")[0] == 503  # nothing collected yet
        Collector([FakeGpuReader("h", 1)], [sink]).collect()
        status, ctype, body = get(server.url + "/metrics")
        assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
        assert body.decode() == sink.body().decode()  # type: ignore[union-attr]
        assert b'DCGM_FI_DEV_GPU_UTIL{gpu="0"' in body
        assert get(server.url + "/nope")[0] == 404
        assert get(server.url + "/")[0] == 200


def test_a_pass_is_a_prometheus_client_collector() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from gpulens.agent.exposition import PassCollector

    samples = one_pass()
    families = {m.name: m for m in PassCollector(samples).collect()}
    assert families["DCGM_FI_DEV_GPU_UTIL"].type == "gauge"
    assert families["node_cpu_seconds"].type == "counter"  # prometheus_client names counters without _total
    assert {s.name for s in families["node_cpu_seconds"].samples} == {"node_cpu_seconds_total"}
    assert sum(len(m.samples) for m in families.values()) == len(samples)
    first = families["DCGM_FI_DEV_GPU_UTIL"].samples[0]
    assert next(iter(first.labels)) == "gpu"  # the exporter's label order, kept in the text too
    assert 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID=' in render(samples)

    sink = ExpositionSink()
    registry = CollectorRegistry()
    registry.register(sink)
    assert generate_latest(registry) == b""  # before the first pass
    Collector([FakeGpuReader("h", 1), SystemReader("h")], [sink]).collect()
    text = generate_latest(registry).decode()
    parsed = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert parsed["node_cpu_seconds"] == "counter" and parsed["DCGM_FI_DEV_GPU_UTIL"] == "gauge"
