"""gpulens_testkit.damage: the damage is what its docstring claims (restarts per day under new exporter
labels, missed scrapes, NaN bursts), every value it keeps is the original's, and a seed gives the same
damage every time. Small spans: a "day" of one hour (`DamageSpec.day_s`)."""

from __future__ import annotations

import math
from collections import Counter

from gpulens.domain import catalog as c
from gpulens_testkit.damage import (
    POD_PREFIX,
    DamagedSeries,
    DamageSpec,
    damage_history,
    damage_k8s,
    history_plan,
)
from gpulens_testkit.history import generate
from gpulens_testkit.k8s_generate import K8sDataset, SeriesSource
from gpulens_testkit.k8s_scenario import k8s_scenario
from gpulens_testkit.openmetrics import iter_text
from gpulens_testkit.scenarios import bench_scenario

HOUR = DamageSpec(day_s=3600, restart_margin_s=300, nan_bursts_per_day=4)
SC = bench_scenario(days=3 / 24)  # three "days" of an hour, 721 samples
BASE = generate(SC)
DS = damage_history(BASE, HOUR)
HOST = SC.hosts[0].hostname


def _exporter_labels(s: DamagedSeries) -> tuple[tuple[str, str], ...]:
    return tuple((k, v) for k, v in s.labels if k not in (c.LABEL_POD, c.LABEL_INSTANCE))


def test_one_restart_per_host_and_day_with_a_gap() -> None:
    plan = DS.plan
    per_day = HOUR.day_s // SC.scrape_interval_s
    assert plan.sample_count == 3 * per_day + 1  # the first sample is a partial day: no restart there
    days = Counter((r.k_stop - 1) // per_day for r in plan.restarts_of(HOST))
    assert days == {0: 1, 1: 1, 2: 1}
    margin = HOUR.restart_margin_s // SC.scrape_interval_s
    for r in plan.restarts_of(HOST):
        day_lo = 1 + (r.k_stop - 1) // per_day * per_day
        assert day_lo + margin <= r.k_stop and r.k_resume <= day_lo + per_day - margin
        assert r.k_resume - r.k_stop == HOUR.restart_gap_s // SC.scrape_interval_s
    month = history_plan(bench_scenario(days=31), DamageSpec())
    assert len(month.restarts) == 31  # the default: once a day


def test_every_dcgm_series_continues_under_a_new_exporter_pod() -> None:
    plan = DS.plan
    epochs = plan.epochs(HOST)
    assert len(epochs) == 4 and len(set(plan.pods[HOST])) == 4
    pieces: dict[tuple[str, tuple[tuple[str, str], ...]], list[DamagedSeries]] = {}
    for s in DS.series:
        if s.role is not None and s.role.gpu is not None:
            pieces.setdefault((s.name, _exporter_labels(s)), []).append(s)
    assert len(pieces) == sum(1 for s in BASE.series if s.gpu is not None)
    for parts in pieces.values():
        assert [(p.lo, p.hi) for p in parts] == list(epochs)
        pods = [dict(p.labels)[c.LABEL_POD] for p in parts]
        instances = [dict(p.labels)[c.LABEL_INSTANCE] for p in parts]
        assert len(set(pods)) == len(set(instances)) == 4  # a new series after each restart
        assert all(p.startswith(POD_PREFIX) and len(p) == len(POD_PREFIX) + 5 for p in pods)
        assert all(i.endswith(":9400") and i != SC.hosts[0].dcgm_instance for i in instances)
    node = [s for s in DS.series if s.role is not None and s.role.gpu is None]
    assert len(node) == sum(1 for s in BASE.series if s.gpu is None)  # node-exporter: not restarted
    assert all((s.lo, s.hi) == (0, DS.sample_count) for s in node)


def test_kept_samples_are_the_originals_and_gaps_are_missed_scrapes_or_restarts() -> None:
    plan = DS.plan
    missed = set(plan.missed[HOST])
    gaps = {k for r in plan.restarts_of(HOST) for k in range(r.k_stop, r.k_resume)}
    dcgm = [s for s in DS.series if s.role is not None and s.role.gpu is not None]
    assert len(gaps) == 3 * 2 and not any(s.lo <= k < s.hi for s in dcgm for k in gaps)
    nan = {(b.gpu, b.name, k) for b in plan.bursts for k in range(b.k0, b.k1)}
    for s in DS.series[::3]:
        got = DS.values(s)
        want = BASE.values(s.source)
        for k in range(DS.sample_count):
            v = got[k] if k < len(got) else None
            if not s.lo <= k < s.hi or k in missed:
                assert v is None
            elif s.role is not None and s.role.gpu is not None and (s.role.gpu, s.name, k) in nan:
                assert v is not None and math.isnan(v)
            else:
                assert v == want[k]
    first = DS.families[0].series[0]
    assert DS.values(first, 0, 1) == [BASE.values(first.source, 0, 1)[0]]  # series begin with the data


def test_missed_scrapes_are_half_a_percent_of_every_host_series() -> None:
    month = history_plan(bench_scenario(days=31), DamageSpec())
    n = month.sample_count
    assert abs(len(month.missed[HOST]) / n - 0.005) < 0.0001
    assert min(month.missed[HOST]) > 0 and max(month.missed[HOST]) < n - 1
    mem = next(s for s in DS.series if s.name == c.NODE_MEM_TOTAL)
    absent = [k for k, v in enumerate(DS.values(mem)) if v is None]
    assert absent == list(DS.plan.missed[HOST]) and len(absent) == round(DS.sample_count * 0.005)
    util = [s for s in DS.series if s.name == c.DCGM_GPU_UTIL and s.role and s.role.gpu == "0"]
    present = {s.lo + i for s in util for i, v in enumerate(DS.values(s, s.lo)) if v is not None}
    assert not present & set(DS.plan.missed[HOST])  # the whole host misses the scrape


def test_nan_bursts_are_short_and_on_one_gpu_series() -> None:
    plan = DS.plan
    assert len(plan.bursts) == 3 * HOUR.nan_bursts_per_day
    assert all(2 <= b.k1 - b.k0 <= 4 for b in plan.bursts)
    nans = Counter()
    for s in DS.series:
        for v in DS.values(s):
            if v is not None and math.isnan(v):
                assert s.role is not None and s.role.gpu is not None  # only dcgm series
                nans[(s.role.gpu, s.name)] += 1
    assert sum(nans.values()) >= 2 * len(plan.bursts) - 10  # a burst may meet a missed scrape or a gap
    assert set(nans) <= {(b.gpu, b.name) for b in plan.bursts}


def test_the_same_seed_gives_the_same_damage_and_text() -> None:
    again = damage_history(generate(SC), HOUR)
    assert again.plan == DS.plan
    assert "".join(iter_text(again, 0, 240)) == "".join(iter_text(DS, 0, 240))
    other = damage_history(BASE, DamageSpec(seed=18, day_s=3600, restart_margin_s=300))
    assert other.plan.restarts != DS.plan.restarts and other.plan.missed != DS.plan.missed
    text = "".join(iter_text(DS, 0, DS.sample_count))
    assert " nan " in text  # Prometheus and promtool parse it as NaN


def test_k8s_damage_replaces_only_the_exporters_own_labels() -> None:
    scenario = k8s_scenario()  # two hours: two "days" of an hour
    base = K8sDataset(scenario)
    ds = damage_k8s(base, HOUR)
    for node in scenario.nodes:
        restarts = ds.plan.restarts_of(node.hostname)
        assert len(restarts) == 2
        pods = ds.plan.pods[node.hostname]
        assert pods[0].name == node.dcgm_pod and pods[0].instance == node.dcgm_instance
        net = node.dcgm_ip.rsplit(".", 1)[0] + "."
        assert all(p.instance.startswith(net) for p in pods)  # the node's pod network
    for s in ds.series:
        src = s.source
        if src.source is not SeriesSource.DCGM:
            assert s.labels == src.labels and (s.lo, s.hi) == (0, ds.sample_count)
            continue
        node = scenario.node(src.node)
        got, orig = dict(s.labels), dict(src.labels)
        assert {k: v for k, v in got.items() if k not in (c.LABEL_POD, c.LABEL_INSTANCE)} == {
            k: v for k, v in orig.items() if k not in (c.LABEL_POD, c.LABEL_INSTANCE)
        }
        pod = ds.plan.pods[node.hostname][s.epoch]
        assert got[c.LABEL_INSTANCE] == pod.instance
        if orig.get(c.LABEL_POD) == node.dcgm_pod:
            assert got[c.LABEL_POD] == pod.name
        else:  # a workload's pod (honor_labels), or none: kept
            assert got.get(c.LABEL_POD) == orig.get(c.LABEL_POD)
    held = [s for s in ds.series if s.source.source is SeriesSource.DCGM and s.source.pod == "llm-serve-0"]
    assert len({(s.name, s.labels) for s in held}) == 3 * len({s.source for s in held})  # 3 exporter pods
