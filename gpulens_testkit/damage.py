"""A generated dataset damaged the way real exporter data is: exporter restarts, missed scrapes, NaN bursts.

`damage_history(dataset)` (a Lyceum host's dcgm-exporter and node-exporter series) and
`damage_k8s(dataset)` (the dcgm-exporter series of every k8s node) wrap a generated dataset as
`Damaged`: an `Exposable` over the same scenario and sample grid that the text writers and loaders
(`openmetrics`, `promload`) accept. Every value it keeps is the original's; the damage is:

* **Exporter restarts**: `restarts_per_day` per host and day, days counted back from the data's end
  (a partial first day has none), none within `restart_margin_s` of a day's ends. dcgm-exporter runs
  as a DaemonSet pod (the GPU Operator's `nvidia-dcgm-exporter`); what restarts it in practice (a
  driver or operator upgrade rolling the DaemonSet out, an eviction, a node drain) replaces the pod:
  the new pod has a new name and a new pod IP. So every dcgm series of the host stops and continues
  as a NEW series, with `pod` (`nvidia-dcgm-exporter-<5 characters>`, the exporter pod's name) and
  `instance` (`<pod IP>:9400`, scraped through the Service's endpoints) changed; every other label
  (GPU, UUID, host label, a workload pod's `exported_pod` ...) stays. The exporter gives no sample
  for `restart_gap_s` while the new pod starts. Backfilled data has no staleness markers: the old
  series stays visible for the 5-minute lookback after its last sample, overlapping the new one.
  On data whose dcgm series carry no exporter `pod` label (the Lyceum bench host, scraped as
  `<host>:9400`) every pod, the first one included, adds `pod` and replaces `instance`; on the k8s
  data the first pod is the scenario's own (`K8sNode.dcgm_pod`, `dcgm_instance`).
* **Missed scrapes**: `missed_fraction` of the scrape times of each host (never its first or last),
  every damaged series of the host missing there: dcgm-exporter and node-exporter on a Lyceum host,
  the dcgm series of a k8s node.
* **NaN bursts**: `nan_bursts_per_day` per host and day, each `nan_burst_samples` consecutive NaN
  samples of one dcgm series name on one GPU (a missed sample stays missing).

node-exporter is not restarted: its CPU counters come from /proc/stat and keep counting across its
own restarts (only a reboot resets them), and a systemd or host-network node-exporter keeps its
`instance`. Its series, like every series of the generated data, begin at the data's start.

The damage is a pure function of the spec and the scenario (`history_plan`, `k8s_plan`: no sample is
computed), so a reader of data built earlier knows where it is without reading it.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpulens.demo.history import GPU_FIELDS, series_name
from gpulens.demo.scenario import Scenario
from gpulens.domain import catalog as c
from gpulens_testkit.k8s_generate import (
    DEVICE_FIELDS,
    MIG_INSTANCE_FIELDS,
    DcgmField,
    K8sDataset,
    K8sSeries,
    SeriesSource,
)
from gpulens_testkit.k8s_scenario import K8sScenario
from gpulens_testkit.openmetrics import Exposable, ScenarioSpan

DAY_S = 86_400
NAN = math.nan
DCGM_PORT = 9400
POD_PREFIX = "nvidia-dcgm-exporter-"
# the characters Kubernetes' generateName suffixes use (no vowels, no 0/1/3)
_SUFFIX_CHARS = "bcdfghjklmnpqrstvwxz2456789"


@dataclass(frozen=True, slots=True)
class DamageSpec:
    seed: int = 17
    restarts_per_day: int = 1
    restart_gap_s: int = 30  # no dcgm sample while the new exporter pod starts
    restart_margin_s: int = 1800  # no restart this close to a day's start or end
    missed_fraction: float = 0.005
    nan_bursts_per_day: int = 6
    nan_burst_samples: tuple[int, int] = (2, 4)  # shortest and longest burst, samples
    day_s: int = DAY_S  # the period the per-day counts are per (tests shorten it)

    def as_json(self) -> dict[str, object]:
        """The fields as JSON reads them back (lists, not tuples): manifests compare equal."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass(frozen=True, slots=True)
class ExporterPod:
    """One dcgm-exporter pod as its series' labels show it (`name` None: the data has no `pod` label)."""

    name: str | None
    instance: str


@dataclass(frozen=True, slots=True)
class Restart:
    host: str
    k_stop: int  # the first sample index the old exporter pod does not give
    k_resume: int  # the new pod's first sample index


@dataclass(frozen=True, slots=True)
class NanBurst:
    host: str
    gpu: str  # GPU key: the index, "<gpu>/<GPU_I_ID>" for a MIG instance
    name: str  # the dcgm series name
    k0: int
    k1: int  # exclusive


@dataclass(frozen=True, slots=True)
class HostDamage:
    """What the plan needs of one host: its dcgm (GPU, series name) pairs, the exporter pod its data
    shows (None: no dcgm-exporter), and its pods' network (`10.42.7.`; None: drawn from the seed)."""

    host: str
    dcgm: tuple[tuple[str, str], ...]
    first_pod: ExporterPod | None
    pod_net: str | None = None


@dataclass(frozen=True)
class DamagePlan:
    """Where the damage is: sample indices on the data's grid (t = start_s + k * interval_s)."""

    spec: DamageSpec
    start_s: int
    interval_s: int
    sample_count: int
    restarts: tuple[Restart, ...]  # by host, then time
    missed: Mapping[str, tuple[int, ...]]  # per host, sorted
    bursts: tuple[NanBurst, ...]
    original: Mapping[str, ExporterPod]  # per host: the exporter pod the generated labels name
    pods: Mapping[str, tuple[ExporterPod, ...]]  # per host: the exporter pod of each epoch

    def time_s(self, k: int) -> int:
        return self.start_s + k * self.interval_s

    def restarts_of(self, host: str) -> tuple[Restart, ...]:
        return tuple(r for r in self.restarts if r.host == host)

    def epochs(self, host: str) -> tuple[tuple[int, int], ...]:
        """[lo, hi) sample ranges of each exporter pod of `host`, oldest first."""
        out, lo = [], 0
        for r in self.restarts_of(host):
            out.append((lo, r.k_stop))
            lo = r.k_resume
        out.append((lo, self.sample_count))
        return tuple(out)

    def next_present(self, host: str, k: int) -> int | None:
        """The first sample index >= k the host's exporter gives (not missed, not in a restart gap)."""
        missed = set(self.missed.get(host, ()))
        for lo, hi in self.epochs(host):
            for j in range(max(k, lo), hi):
                if j not in missed:
                    return j
        return None


def _suffix(rng: random.Random) -> str:
    return "".join(rng.choice(_SUFFIX_CHARS) for _ in range(5))


def _full_days(n: int, per_day: int) -> list[tuple[int, int]]:
    """[lo, hi) sample ranges of whole days counted back from the last sample, oldest first."""
    out = []
    hi = n
    while hi - per_day >= 0:
        out.append((hi - per_day, hi))
        hi -= per_day
    return out[::-1]


def plan_damage(
    spec: DamageSpec, hosts: Sequence[HostDamage], start_s: int, interval_s: int, sample_count: int
) -> DamagePlan:
    """The damage of `hosts` on the grid start_s + k * interval_s (k < sample_count): a pure function
    of its arguments (each host and kind of damage draws from its own seeded generator)."""
    if spec.day_s % interval_s or spec.restart_gap_s % interval_s:
        raise ValueError("the scrape interval must divide a day and the restart gap")
    per_day = spec.day_s // interval_s
    gap = spec.restart_gap_s // interval_s
    margin = spec.restart_margin_s // interval_s
    days = _full_days(sample_count, per_day)
    restarts: list[Restart] = []
    bursts: list[NanBurst] = []
    missed: dict[str, tuple[int, ...]] = {}
    original: dict[str, ExporterPod] = {}
    pods: dict[str, tuple[ExporterPod, ...]] = {}
    for h in hosts:

        def rng(kind: str, host: str = h.host) -> random.Random:
            return random.Random(f"{spec.seed}/{host}/{kind}")  # noqa: S311 - reproducible test data

        count = round(sample_count * spec.missed_fraction)
        missed[h.host] = tuple(sorted(rng("missed").sample(range(1, sample_count - 1), count)))
        if h.first_pod is None:  # no dcgm-exporter on this host: missed scrapes only
            continue
        r_rng = rng("restarts")
        mine: list[Restart] = []
        for lo, _hi in days:
            slot = per_day // max(1, spec.restarts_per_day)
            for i in range(spec.restarts_per_day):
                a, b = lo + i * slot + margin, lo + (i + 1) * slot - margin - gap
                if b <= a:
                    raise ValueError("restart_margin_s leaves no room for the restarts of a day")
                k = r_rng.randrange(a, b)
                mine.append(Restart(h.host, k, k + gap))
        restarts.extend(mine)
        p_rng = rng("pods")
        net = h.pod_net or f"10.42.{p_rng.randrange(256)}."
        used = {h.first_pod.instance}
        epoch_pods = [h.first_pod] if h.first_pod.name is not None else []
        while len(epoch_pods) < len(mine) + 1:
            pod = ExporterPod(POD_PREFIX + _suffix(p_rng), f"{net}{p_rng.randrange(2, 255)}:{DCGM_PORT}")
            if pod.instance not in used and all(pod.name != e.name for e in epoch_pods):
                used.add(pod.instance)
                epoch_pods.append(pod)
        original[h.host] = h.first_pod
        pods[h.host] = tuple(epoch_pods)
        b_rng = rng("nan")
        shortest, longest = spec.nan_burst_samples
        if h.dcgm:
            for lo, hi in days:
                for _ in range(spec.nan_bursts_per_day):
                    length = b_rng.randint(shortest, longest)
                    k0 = b_rng.randrange(lo, hi - length)
                    gpu, name = b_rng.choice(h.dcgm)
                    bursts.append(NanBurst(h.host, gpu, name, k0, k0 + length))
    return DamagePlan(
        spec, start_s, interval_s, sample_count, tuple(restarts), missed, tuple(bursts), original, pods
    )


# -- the damaged dataset ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Role:
    """What the damage does to a series: `host` whose scrapes it shares; `gpu` the dcgm GPU key
    (None: a host series, missed scrapes only)."""

    host: str
    gpu: str | None = None


@dataclass(frozen=True, slots=True, eq=False)
class DamagedSeries:
    """One exposed series: a piece [lo, hi) of an original series, under its exporter pod's labels."""

    name: str
    labels: tuple[tuple[str, str], ...]
    source: Any  # the original dataset's series
    role: Role | None  # None: left as it is
    lo: int
    hi: int
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class DamagedFamily:
    name: str
    metric_type: str
    series: tuple[DamagedSeries, ...]


def relabel(
    labels: tuple[tuple[str, str], ...], old: ExporterPod, new: ExporterPod
) -> tuple[tuple[str, str], ...]:
    """The labels of a dcgm series scraped from exporter pod `new` instead of `old`: `instance`, and
    `pod` where it names the exporter (a workload pod's `pod`, kept with honor_labels, stays); a
    `pod` label is added when the data had none (`old.name` None)."""
    out = []
    for k, v in labels:
        value = v
        if k == c.LABEL_INSTANCE and v == old.instance:
            value = new.instance
        elif k == c.LABEL_POD and old.name is not None and v == old.name and new.name is not None:
            value = new.name
        out.append((k, value))
    if old.name is None and new.name is not None and all(k != c.LABEL_POD for k, _ in labels):
        out.append((c.LABEL_POD, new.name))
    return tuple(out)


class Damaged:
    """`base` as `plan` damages it; `role(series)` says what the damage does to each series.

    `values` follows `Exposable` (samples k0 <= k < k1, None where there is none) but leaves off the
    trailing samples a series piece does not have: a piece outside [k0, k1) is `[]`, so the writers do
    not walk a month of absent samples for each of a host's 31 exporter pods.
    """

    def __init__(self, base: Exposable, plan: DamagePlan, role: Callable[[Any], Role | None]) -> None:
        if (base.scenario.start_s, base.sample_count) != (plan.start_s, plan.sample_count):
            raise ValueError("the plan is for another grid")
        self.base = base
        self.plan = plan
        self.scenario: ScenarioSpan = base.scenario
        self.sample_count = base.sample_count
        n = base.sample_count
        families = []
        for family in base.families:
            out: list[DamagedSeries] = []
            for s in family.series:
                r = role(s)
                if r is None or r.gpu is None or r.host not in plan.pods:
                    out.append(DamagedSeries(s.name, s.labels, s, r, 0, n))
                    continue
                old = plan.original[r.host]
                for epoch, ((lo, hi), pod) in enumerate(
                    zip(plan.epochs(r.host), plan.pods[r.host], strict=True)
                ):
                    labels = s.labels if pod == old else relabel(s.labels, old, pod)
                    out.append(DamagedSeries(s.name, labels, s, r, lo, hi, epoch))
            families.append(DamagedFamily(family.name, family.metric_type, tuple(out)))
        self.families: tuple[DamagedFamily, ...] = tuple(families)
        self._bursts: dict[tuple[str, str, str], list[NanBurst]] = {}
        for b in plan.bursts:
            self._bursts.setdefault((b.host, b.gpu, b.name), []).append(b)

    @property
    def series(self) -> tuple[DamagedSeries, ...]:
        return tuple(s for f in self.families for s in f.series)

    def values(self, series: DamagedSeries, k0: int = 0, k1: int | None = None) -> list[float | None]:
        k1 = self.sample_count if k1 is None else min(k1, self.sample_count)
        k0 = max(0, k0)
        a, b = max(k0, series.lo), min(k1, series.hi)
        if a >= b:
            return []
        out: list[float | None] = [None] * (a - k0)
        out.extend(self.base.values(series.source, a, b))
        role = series.role
        if role is None:
            return out
        missed = self.plan.missed.get(role.host, ())
        for i in range(bisect.bisect_left(missed, a), bisect.bisect_left(missed, b)):
            out[missed[i] - k0] = None
        if role.gpu is not None:
            for burst in self._bursts.get((role.host, role.gpu, series.name), ()):
                for k in range(max(a, burst.k0), min(b, burst.k1)):
                    if out[k - k0] is not None:
                        out[k - k0] = NAN
        return out


# -- adapters: the Lyceum host data and the k8s data -------------------------------------------------


def history_plan(scenario: Scenario, spec: DamageSpec, sample_count: int | None = None) -> DamagePlan:
    """The damage of a `bench`/`default` scenario's hosts (gpulens.demo.history's series)."""
    hosts = []
    for h in scenario.hosts:
        dcgm = tuple((str(g.index), series_name(h, f)) for g in h.gpus for f in GPU_FIELDS)
        first = ExporterPod(None, h.dcgm_instance) if h.gpu_model is not None and h.gpus else None
        hosts.append(HostDamage(h.hostname, dcgm, first))
    n = scenario.sample_count if sample_count is None else sample_count
    return plan_damage(spec, hosts, scenario.start_s, scenario.scrape_interval_s, n)


def _history_role(series: Any) -> Role:
    return Role(series.hostname, None if series.gpu is None else str(series.gpu))


def damage_history(dataset: Exposable, spec: DamageSpec | None = None) -> Damaged:
    """A `gpulens_testkit.history.Dataset` damaged (dcgm and node-exporter series of every host)."""
    scenario = dataset.scenario
    assert isinstance(scenario, Scenario)
    plan = history_plan(scenario, spec or DamageSpec(), dataset.sample_count)
    return Damaged(dataset, plan, _history_role)


def k8s_plan(scenario: K8sScenario, spec: DamageSpec) -> DamagePlan:
    """The damage of a k8s scenario's nodes (their dcgm-exporter series; the rest is left alone)."""
    hosts = []
    for node in scenario.nodes:
        dcgm: list[tuple[str, str]] = []
        for slot in node.slots():
            mig = node.mig_instance(slot) is not None
            dcgm.extend((slot.key, f.value) for f in DcgmField if not mig or f in MIG_INSTANCE_FIELDS)
        for g in node.gpus:
            if node.is_mig(g.index):
                dcgm.extend((str(g.index), f.value) for f in DcgmField if f in DEVICE_FIELDS)
        net = node.dcgm_ip.rsplit(".", 1)[0] + "."
        hosts.append(
            HostDamage(node.hostname, tuple(dcgm), ExporterPod(node.dcgm_pod, node.dcgm_instance), net)
        )
    return plan_damage(spec, hosts, scenario.start_s, scenario.scrape_interval_s, scenario.sample_count)


def _k8s_role(series: K8sSeries) -> Role | None:
    return Role(series.node, series.slot) if series.source is SeriesSource.DCGM else None


def damage_k8s(dataset: K8sDataset, spec: DamageSpec | None = None) -> Damaged:
    """A `K8sDataset` with its dcgm-exporter series damaged (cAdvisor, kube-state-metrics and the
    apps' series as they are)."""
    return Damaged(dataset, k8s_plan(dataset.scenario, spec or DamageSpec()), _k8s_role)
