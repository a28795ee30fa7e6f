"""The text writers over the default scenario: OpenMetrics files (promtool) and millisecond text
(VictoriaMetrics)."""

from __future__ import annotations

import re
from pathlib import Path

from gpulens.demo.scenario import DEFAULT_END_S, default_scenario
from gpulens_testkit.history import generate
from gpulens_testkit.openmetrics import (
    BLOCK_LADDER_S,
    block_windows,
    choose_block_seconds,
    exposition,
    iter_text,
    write_openmetrics,
)
from gpulens_testkit.scenarios import bench_scenario

SC = default_scenario()
DS = generate(SC)
LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\}) (\S+) (\d+)$")


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    a = write_openmetrics(generate(default_scenario(seed=3, hours=1)), tmp_path / "a")
    b = write_openmetrics(generate(default_scenario(seed=3, hours=1)), tmp_path / "b")
    other = write_openmetrics(generate(default_scenario(seed=4, hours=1)), tmp_path / "c")
    assert [p.name for p in a] == [p.name for p in b]
    assert all(pa.read_bytes() == pb.read_bytes() for pa, pb in zip(a, b, strict=True))
    assert a[0].read_bytes() != other[0].read_bytes()


def test_exposition_writes_labels_in_their_order() -> None:
    s = DS.series[0]
    assert exposition(s) == s.name + "{" + ",".join(f'{k}="{v}"' for k, v in s.labels) + "}"
    assert exposition(s).startswith('DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-')


def test_openmetrics_files(tmp_path: Path) -> None:
    paths = write_openmetrics(DS, tmp_path)
    block = choose_block_seconds(SC.end_s - SC.start_s)
    assert block in BLOCK_LADDER_S
    windows = block_windows(DS, block)
    assert [p.name for p in paths] == [f"default-{w0}.om" for w0, _ in windows]
    total = 0
    for path, (w0, w1) in zip(paths, windows, strict=True):
        text = path.read_text()
        assert text.endswith("\n# EOF\n") and text.count("# EOF") == 1
        last: dict[str, int] = {}
        declared: set[str] = set()
        for line in text.splitlines()[:-1]:
            if line.startswith("# TYPE "):
                _, _, family, kind = line.split(" ")
                assert kind in ("gauge", "counter") and family not in declared
                assert not (kind == "counter" and family.endswith("_total"))
                declared.add(family)
                continue
            m = LINE.match(line)
            assert m, line
            name, labels, value, ts = m.groups()
            assert name in declared or name.removesuffix("_total") in declared
            t = int(ts)  # whole seconds, inside the file's epoch-aligned window
            assert w0 <= t < w1 and SC.start_s <= t <= SC.end_s
            float(value)
            key = name + labels
            assert t > last.get(key, -1)  # per-series time order
            last[key] = t
            total += 1
    assert total == len(DS.series) * SC.sample_count


def test_millisecond_text_for_victoria_metrics() -> None:
    text = "".join(iter_text(DS, 0, 2, millis=True, openmetrics=False))
    assert "# EOF" not in text
    stamps = {int(line.rsplit(" ", 1)[1]) for line in text.splitlines() if not line.startswith("#")}
    assert stamps == {SC.start_s * 1000, (SC.start_s + 15) * 1000}


def test_bench_scenario_streams() -> None:
    sc = bench_scenario(days=0.5)
    ds = generate(sc)
    assert sc.end_s == DEFAULT_END_S and len(sc.hosts) == 1 and len(sc.hosts[0].gpus) == 8
    assert len(ds.series) == 8 * 10 + 16 * 4 + 3
    assert {e.status.value for e in sc.executions} == {"completed", "failed"}
    block = choose_block_seconds(sc.end_s - sc.start_s)
    assert block == 6 * 3600 and choose_block_seconds(30 * 86_400) == 54 * 3600
    s = ds.series[0]
    assert ds.values(s, 1000, 1010) == [ds.value_at(s, k) for k in range(1000, 1010)]
