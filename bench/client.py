"""The backend's HTTP client: gpulens' own (backends/http1.py) against aiohttp's, on the Lyceum reads.

`python -m bench --section client` (or `python -m bench.client`). Both clients in this one process, on
one event loop (uvloop, as uvicorn serves gpulens; `--loop asyncio` for the default loop), against the
bench's Prometheus over bench-data/tsdb:

* `24 h`: the twelve hand-written Lyceum range queries (bench/handwritten.py) of the last day at 15 s;
* `30 d`: the same twelve over the last 30 days at 15 s, each split as gpulens splits it
  (planning/chunking.py `chunks`, 11,000 points a query): 12 x 16 = 192 queries.

A read sends all its queries at once, at most `--concurrency` in flight (GPULENS_QUERY_CONCURRENCY's
default), each under its own deadline as prometheus.py asks them, and returns the bodies' bytes. The
figures are the gpulens side's: this process' CPU time (`time.process_time`: Prometheus is another
process) from the first request to the last body byte, and the wall time, per read; medians over
interleaved rounds (odd rounds in reverse order), after one unmeasured read per client. Decoding the
bodies (promjson, the same whichever client read them) is not in those figures: it is timed once on
its own, for scale. Every client's bodies are checked equal to http1's.

Clients:

* `http1`: `AsyncHttpClient.post_form`, as `make_client` builds it;
* `aiohttp`: one `ClientSession` (connector limit = the concurrency, keep-alive), the form encoded
  as http1 encodes it and sent as bytes, the body read chunk by chunk against the answer cap
  (`iter_any`), as gpulens would use it;
* `aiohttp read()`: the same with `await response.read()` (no cap), for reference.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import sys
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.data import prepare
from bench.handwritten import HostData, lyceum_forms
from gpulens.backends import promjson
from gpulens.backends.http1 import AsyncHttpClient, Origin
from gpulens.backends.prometheus import DEFAULT_MAX_ANSWER_BYTES
from gpulens.domain.models import Window
from gpulens.planning.chunking import chunks
from gpulens_testkit.promload import start_prometheus

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "bench-data"
DAY_MS = 86_400_000
STEP_MS = 15_000
MAX_POINTS = 11_000
CONCURRENCY = 12
TIMEOUT_S = 60.0
PATH = "/api/v1/query_range"

Form = dict[str, str]
Read = Callable[[list[Form]], Awaitable[list[bytes]]]  # the forms -> their bodies


@dataclass
class Side:
    name: str
    read: Read
    cpu: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "cpu_ms_p50": 1000 * statistics.median(self.cpu),
            "wall_ms_p50": 1000 * statistics.median(self.wall),
            "cpu_ms": [round(1000 * x, 2) for x in self.cpu],
            "wall_ms": [round(1000 * x, 2) for x in self.wall],
        }


def forms_for(window: Window) -> list[Form]:
    """The read's queries as POSTed forms, series-major, chunks in order."""
    scenario = prepare(DATA_DIR, log=lambda _: None).scenario
    host = scenario.hosts[0]
    data = HostData(host.hostname, host.host_label, host.power_limit_series, host.pcie_kbps)
    out = []
    for form in lyceum_forms(data, (), window.step_ms, scenario.scrape_interval_s * 1000):
        for part in chunks(window, MAX_POINTS):
            fields = {
                "query": form.expr,
                "start": promjson.prometheus_time(part.start_ms),
                "end": promjson.prometheus_time(part.end_ms),
                "step": promjson.prometheus_time(part.step_ms),
                "nocache": "1",
            }
            out.append(fields)
    return out


async def _gather(forms: list[Form], one: Callable[[Form], Awaitable[bytes]]) -> list[bytes]:
    async def bounded(form: Form) -> bytes:
        async with asyncio.timeout(TIMEOUT_S):  # as prometheus.py bounds each request
            return await one(form)

    return list(await asyncio.gather(*(bounded(f) for f in forms)))


def http1_side(url: str, concurrency: int) -> tuple[Side, Callable[[], Awaitable[None]]]:
    client = AsyncHttpClient(TIMEOUT_S, pool=concurrency)
    origin = Origin.parse(url)

    async def one(form: Form) -> bytes:
        status, body = await client.post_form(origin, origin.prefix + PATH, form, DEFAULT_MAX_ANSWER_BYTES)
        assert status == 200, body[:200]
        return body

    async def close() -> None:
        client.close()

    return Side("http1", lambda forms: _gather(forms, one)), close


def aiohttp_sides(url: str, concurrency: int) -> tuple[list[Side], Callable[[], Awaitable[None]]]:
    holder: dict[str, aiohttp.ClientSession] = {}
    headers = {
        "Accept-Encoding": "identity",
        "User-Agent": "gpulens",
        "Content-Type": "application/x-www-form-urlencoded",
    }
    target = url + PATH

    def session() -> aiohttp.ClientSession:
        if "s" not in holder:  # made on the running loop
            connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
            holder["s"] = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=None), skip_auto_headers=("Accept",)
            )
        return holder["s"]

    async def capped(form: Form) -> bytes:
        cap = DEFAULT_MAX_ANSWER_BYTES
        data = urllib.parse.urlencode(form).encode("ascii")
        async with session().post(target, data=data, headers=headers) as response:
            declared = response.content_length
            assert response.status == 200 and (declared is None or declared <= cap)
            parts, size = [], 0
            async for chunk in response.content.iter_any():
                size += len(chunk)
                assert size <= cap
                parts.append(chunk)
            return b"".join(parts)

    async def whole(form: Form) -> bytes:
        data = urllib.parse.urlencode(form).encode("ascii")
        async with session().post(target, data=data, headers=headers) as response:
            assert response.status == 200
            return await response.read()

    async def close() -> None:
        if "s" in holder:
            await holder["s"].close()

    sides = [
        Side("aiohttp", lambda forms: _gather(forms, capped)),
        Side("aiohttp read()", lambda forms: _gather(forms, whole)),
    ]
    return sides, close


async def _measure(sides: Sequence[Side], forms: list[Form], rounds: int, label: str) -> list[bytes]:
    """Interleaved rounds; returns http1's bodies (the first side's) of its warm-up read."""
    reference = await sides[0].read(forms)
    for side in sides[1:]:
        got = await side.read(forms)
        if got != reference:
            raise AssertionError(f"{label}: {side.name}'s bodies differ from {sides[0].name}'s")
    for i in range(rounds):
        for side in sides if i % 2 == 0 else list(reversed(sides)):
            gc.collect()
            cpu0, wall0 = time.process_time(), time.perf_counter()
            await side.read(forms)
            side.wall.append(time.perf_counter() - wall0)
            side.cpu.append(time.process_time() - cpu0)
        print(f"  {label}: round {i + 1}/{rounds}", file=sys.stderr)
    return reference


def decode_cpu(bodies: list[bytes], step_ms: int, repeats: int = 5) -> float:
    """CPU seconds (median) of cutting and reading the bodies as prometheus.py does (shared work)."""
    times = []
    for _ in range(repeats):
        cpu0 = time.process_time()
        for body in bodies:
            cut = promjson.cut_values(body)
            assert cut is not None
            for array in cut[1]:
                assert promjson.grid_samples(array, step_ms) is not None
        times.append(time.process_time() - cpu0)
    return statistics.median(times)


async def run(url: str, reads: dict[str, tuple[Window, int]], concurrency: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, (window, rounds) in reads.items():
        http1, close_http1 = http1_side(url, concurrency)
        others, close_others = aiohttp_sides(url, concurrency)
        sides = [http1, *others]
        forms = forms_for(window)
        try:
            bodies = await _measure(sides, forms, rounds, label)
        finally:
            await close_http1()
            await close_others()
        out[label] = {
            "queries": len(forms),
            "body_bytes": sum(map(len, bodies)),
            "rounds": rounds,
            "decode_cpu_ms": 1000 * decode_cpu(bodies, window.step_ms),
            "clients": {side.name: side.as_json() for side in sides},
        }
    return out


def _print(results: dict[str, Any]) -> None:
    print(f"{'read':6} {'client':16} {'CPU ms p50':>11} {'vs http1':>9} {'wall ms p50':>12} {'vs http1':>9}")
    for label, read in results.items():
        base = read["clients"]["http1"]
        for name, side in read["clients"].items():
            cpu, wall = side["cpu_ms_p50"], side["wall_ms_p50"]
            print(
                f"{label:6} {name:16} {cpu:11.1f} {cpu / base['cpu_ms_p50']:9.2f} "
                f"{wall:12.1f} {wall / base['wall_ms_p50']:9.2f}"
            )
        print(
            f"{label:6} {read['queries']} queries, {read['body_bytes'] / 1e6:.1f} MB of bodies, "
            f"{read['rounds']} rounds; decoding them (not above): {read['decode_cpu_ms']:.1f} ms CPU"
        )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.client", description=__doc__)
    p.add_argument("--rounds-24h", type=int, default=15, help="measured rounds of the 24 h read")
    p.add_argument("--rounds-30d", type=int, default=7, help="measured rounds of the 30-day read")
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    p.add_argument("--concurrency", type=int, default=CONCURRENCY)
    p.add_argument("--json", type=Path, default=DATA_DIR / "client.json", help="where the figures go")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    data = prepare(DATA_DIR, log=lambda text: print(text, file=sys.stderr))
    end_ms = data.scenario.end_s * 1000
    reads = {
        "24 h": (Window(end_ms - DAY_MS, end_ms, STEP_MS), args.rounds_24h),
        "30 d": (Window(end_ms - 30 * DAY_MS, end_ms, STEP_MS), args.rounds_30d),
    }
    reads = {k: v for k, v in reads.items() if v[1] > 0}
    prom = start_prometheus(
        data.tsdb, block_s=data.block_s, scrape_interval_s=data.scenario.scrape_interval_s
    )
    try:
        coro = run(prom.url, reads, args.concurrency)
        if args.loop == "uvloop":
            import uvloop

            results = uvloop.run(coro)
        else:
            results = asyncio.run(coro)
    finally:
        prom.stop()
    env = {
        "python": platform.python_version(),
        "loop": args.loop,
        "aiohttp": aiohttp.__version__,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "concurrency": args.concurrency,
    }
    _print(results)
    args.json.write_text(json.dumps({"environment": env, "reads": results}, indent=1) + "\n")
    print(f"figures in {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
