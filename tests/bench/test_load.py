"""The load section's pure parts: percentiles, the route mix, /proc status parsing, windows, the combined
TSDB's overlap check and block links, and a real (small) run of the client loop against a local server."""

from __future__ import annotations

import http.server
import json
import random
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench.load import Job, ThroughputResult, route_mix, run_jobs
from bench.measure import percentile
from bench.mixload import LoadResult, block_ranges, link_blocks, overlapping, post_jobs, windows_in
from bench.servers import Rss, parse_status_kib, proc_status_kib
from bench.summary import parse_window

from gpulens.domain.models import Window

STATUS = """Name:\tgpulens
Umask:\t0022
State:\tS (sleeping)
VmPeak:\t 1234567 kB
VmHWM:\t  204800 kB
VmRSS:\t  153600 kB
Threads:\t14
"""


def test_percentile_interpolates_between_closest_ranks() -> None:
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile(list(map(float, range(101))), 0.99) == pytest.approx(99.0)
    assert percentile([5.0], 0.99) == 5.0
    assert percentile([], 0.5) != percentile([], 0.5)  # NaN


def test_parse_status_reads_kib_fields() -> None:
    assert parse_status_kib(STATUS, "VmRSS") == 153_600
    assert parse_status_kib(STATUS, "VmHWM") == 204_800
    with pytest.raises(KeyError):
        parse_status_kib(STATUS, "VmSwap")
    with pytest.raises(KeyError):  # a prefix of another field is not that field
        parse_status_kib(STATUS, "Vm")
    with pytest.raises(ValueError, match="unit"):
        parse_status_kib("VmRSS:\t 12 MB\n", "VmRSS")


def test_rss_of_this_process() -> None:
    rss = Rss.of(__import__("os").getpid())
    assert 0 < rss.rss_kib <= rss.peak_kib
    assert proc_status_kib(__import__("os").getpid(), "VmRSS") > 0


def _jobs(route: str, n: int) -> list[Job]:
    return [Job.get(route, f"/{route}/{i}", {}) for i in range(n)]


def test_route_mix_follows_the_weights_in_every_cycle() -> None:
    a, b, c = _jobs("a", 5), _jobs("b", 2), _jobs("c", 1)
    mix = route_mix([(a, 3), (b, 2), (c, 1), ([], 4), (_jobs("d", 3), 0)], 60)
    assert len(mix) == 60
    for start in range(0, 60, 6):  # every run of sum(weights) jobs has each route weight times
        assert Counter(j.route for j in mix[start : start + 6]) == {"a": 3, "b": 2, "c": 1}
    # spread out: the heaviest route never runs three in a row
    routes = "".join(j.route for j in mix)
    assert "aaa" not in routes
    # each route's jobs taken in turn
    assert [j.requests[0][1] for j in mix if j.route == "a"][:7] == [f"/a/{i % 5}" for i in range(7)]
    assert route_mix([], 10) == [] and route_mix([(a, 1)], 0) == []


def test_windows_in_stay_inside_and_on_the_step() -> None:
    rng = random.Random(1)
    lo, hi = 1_000_000, 1_000_000 + 7 * 86_400
    for w in windows_in(rng, lo, hi, 3600, 60, 200):
        assert w.end_ms - w.start_ms == 3_600_000 and w.step_ms == 60_000
        assert lo * 1000 <= w.start_ms and w.end_ms <= hi * 1000
        assert w.end_ms % 60_000 == 0
    with pytest.raises(ValueError):
        windows_in(rng, 0, 100, 3600, 15, 1)


def test_post_jobs_send_each_request_s_queries_in_order() -> None:
    [job] = post_jobs("r", [[b"query=a", b"query=b"]])
    assert job.route == "r"
    assert [(m, p, b) for m, p, b in job.requests] == [
        ("POST", "/api/v1/query_range", b"query=a"),
        ("POST", "/api/v1/query_range", b"query=b"),
    ]
    assert job.headers["Content-Type"] == "application/x-www-form-urlencoded"


def _block(root: Path, name: str, lo: int, hi: int) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "meta.json").write_text(json.dumps({"minTime": lo, "maxTime": hi}))
    (root / name / "index").write_bytes(b"x" * 10)


def test_overlap_check_and_block_links(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _block(a, "01A", 0, 100)
    _block(a, "01B", 100, 200)
    _block(b, "01C", 150, 300)
    _block(b, "01D.tmp-for-creation", 0, 1000)  # being written: neither linked nor counted
    assert not overlapping(block_ranges(a))
    assert link_blocks([a, b], tmp_path / "both") == 3
    both = tmp_path / "both"
    assert sorted(block_ranges(both)) == [(0, 100), (100, 200), (150, 300)]
    assert overlapping(block_ranges(both))
    assert (both / "01C" / "index").stat().st_ino == (b / "01C" / "index").stat().st_ino  # a hard link
    assert not overlapping([(0, 10), (10, 20)]) and overlapping([(10, 20), (0, 11)])


def test_summary_window_from_its_answer() -> None:
    doc = {
        "timeRange": {"start": "2026-01-01T00:00:00.000Z", "end": "2026-01-01T01:00:00Z"},
        "stepSeconds": 15.0,
    }
    w = parse_window(doc)
    assert w == Window(1_767_225_600_000, 1_767_229_200_000, 15_000)


def test_load_result_ratios() -> None:
    api = ThroughputResult("Load", "mix", 2, 0.0, 1.0, 0)
    api.by_route = {"m": [1.0, 2.0, 3.0], "list": [0.1]}
    base = ThroughputResult("Load baseline", "hand", 2, 0.0, 1.0, 0)
    base.by_route = {"m": [1.0, 1.0, 1.0]}
    base.latencies = [1.0, 1.0, 1.0]
    r = LoadResult(2, 0.0, 1.0, {"m": 1, "list": 1}, api, base)
    assert r.route_ratio("m") == 2.0
    assert r.route_ratio("list") != r.route_ratio("list")  # no baseline: NaN
    assert r.baselined_ratio() == 2.0
    assert json.loads(json.dumps(r.as_json(), default=str))["routes"]["m"]["p50_ratio"] == 2.0


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        status = 500 if self.path.startswith("/bad") else 200
        body = b"ok" if status == 200 else b"no"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def local_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_run_jobs_counts_routes_and_errors(local_server: int) -> None:
    jobs = route_mix(
        [
            (_jobs("good", 3), 2),
            ([Job("multi", (("POST", "/x", b"12345"), ("POST", "/y", b"678")), {})], 1),
            ([Job.get("bad", "/bad", {})], 1),
        ],
        16,
    )
    result = ThroughputResult("t", "test", 3, 0.2, 0.6, 0)
    run_jobs(result, "127.0.0.1", local_server, jobs, {}, lambda _: None)
    assert set(result.by_route) == {"good", "multi", "bad"}
    assert result.by_route["bad"] == [] and result.route_errors["bad"] == result.errors > 0
    assert result.by_route["good"] and result.by_route["multi"]
    assert result.requests == len(result.by_route["good"]) + len(result.by_route["multi"])
    assert "500" in result.error_samples[0]
    assert result.paths == 5  # distinct jobs: 3 good, 1 multi, 1 bad


def test_build_routes_mix_and_baselines() -> None:
    from bench.handwritten import HostData, PodData
    from bench.mixload import LYCEUM_WINDOWS, POD_TYPES, build_routes, mixed, mixed_baseline
    from bench.runai import RegisteredPod

    from gpulens_testkit.k8s_scenario import k8s_scenario

    scenario = k8s_scenario(seed=21, hours=26)
    spec = next(p for p in scenario.pods if p.name == "llm-serve-0")
    pod = RegisteredPod(spec, "wl-1")
    end_s = 1_767_225_600
    routes = build_routes(
        execution_id="e-1",
        host=HostData("bench-node-1", "Hostname"),
        lyceum_end_s=end_s,
        scrape_s=15,
        pod=pod,
        pod_data=PodData(spec.namespace, spec.name),
        pod_window=(max(spec.start_s, scenario.end_s - 86_400), scenario.pod_end_s(spec)),
        headers={"Authorization": "Bearer k"},
        count=16,
    )
    by_name = {r.name: r for r in routes}
    assert [lw.name for lw in LYCEUM_WINDOWS] == [r.name for r in routes[:3]]
    assert sum(r.weight for r in routes) == 15
    with_baseline = {r.name for r in routes if r.baseline is not None}
    assert with_baseline == {*(lw.name for lw in LYCEUM_WINDOWS), "Run:ai pod metrics 15 min, 20 samples"}
    for lw in LYCEUM_WINDOWS:
        r = by_name[lw.name]
        assert len(r.jobs) == 16 and r.baseline is not None and len(r.baseline) == 16
        path = r.jobs[0].requests[0][1]
        assert path.startswith("/api/v2/external/execution/e-1/metrics?") and f"step={lw.step_s}s" in path
        assert len(r.baseline[0].requests) == 12  # one query per series; these windows need no chunks
    pods = by_name["Run:ai pod metrics 15 min, 20 samples"]
    assert f"metricType={','.join(POD_TYPES)}" in pods.jobs[0].requests[0][1]
    assert pods.baseline is not None and len(pods.baseline[0].requests) == len(POD_TYPES)
    mix = mixed(routes, 32)
    assert {j.route for j in mix} == set(by_name)
    assert {j.route for j in mixed_baseline(routes, 32)} == with_baseline
    assert all(j.headers == {"Authorization": "Bearer k"} for j in mix)


def test_run_jobs_samples_the_measured_window(local_server: int) -> None:
    seen: list[float] = []
    result = ThroughputResult("t", "test", 2, 0.1, 2.5, 0)
    run_jobs(result, "127.0.0.1", local_server, _jobs("good", 2), {}, lambda _: None, seen.append)
    assert seen == pytest.approx([1.0, 2.0, 2.5], abs=1e-9)
    r = LoadResult(2, 0.1, 2.5, {}, rss_samples=[(1.0, 100), (2.0, 150), (2.5, 160)])
    assert r.rss_at(0.25) is None and r.rss_at(0.5) == 100 and r.rss_at(0.8) == 150 and r.rss_at(1.0) == 160


METRICS_TEXT = """# HELP gpulens_backend_query_duration_seconds Time of one metrics-backend call.
# TYPE gpulens_backend_query_duration_seconds histogram
gpulens_backend_query_duration_seconds_bucket{backend="prometheus",le="+Inf",outcome="ok"} 40.0
gpulens_backend_query_duration_seconds_count{backend="prometheus",outcome="ok"} 40.0
gpulens_backend_query_duration_seconds_sum{backend="prometheus",outcome="ok"} 2.5
gpulens_backend_query_duration_seconds_count{backend="prometheus",outcome="timeout"} 2.0
# HELP gpulens_cache_lookups_total Cache look-ups by cache and result (hit, miss).
# TYPE gpulens_cache_lookups_total counter
gpulens_cache_lookups_total{cache="host_layouts",result="hit"} 3.0
gpulens_cache_lookups_total{cache="host_layouts",result="miss"} 7.0
# HELP gpulens_http_request_duration_seconds x
# TYPE gpulens_http_request_duration_seconds histogram
gpulens_http_request_duration_seconds_count{method="GET",route="/x",status="200"} 99.0
"""


def test_server_counters_and_deltas() -> None:
    from bench.mixload import counter_deltas, server_counters

    after = server_counters(METRICS_TEXT)
    assert after == {"backend calls": 42.0, "cache host_layouts hit": 3.0, "cache host_layouts miss": 7.0}
    before = {"backend calls": 2.0, "cache host_layouts hit": 1.0}
    assert counter_deltas(before, after) == {
        "backend calls": 40.0,
        "cache host_layouts hit": 2.0,
        "cache host_layouts miss": 7.0,
    }
    api = ThroughputResult("Load", "mix", 2, 0.0, 1.0, 0, latencies=[1.0] * 6, warmup_requests=2, errors=2)
    r = LoadResult(2, 0.0, 1.0, {}, api, server_counters={"backend calls": 40.0})
    assert r.jobs_done == 10 and r.backend_calls_per_request == 4.0
