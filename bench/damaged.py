"""The bench on damaged data: the damage it uses, the windows anchored on it, and where the hand-written
forms are known wrong on it (the zones bench/handwritten.py's checks skip; its docstring says why each).

Every Lyceum and Run:ai case runs twice, on the clean data (bench-data/) and on the same data damaged
by gpulens_testkit/damage.py with `DAMAGE` (bench-data/damaged/): one dcgm-exporter restart per host
and day under new `pod`/`instance` labels, 0.5 % missed scrapes, six short NaN bursts per host and
day, and series that begin with the data. Both ratios are reported side by side; the damaged one is
what the targets are for.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.handwritten import HandForm, Tolerance
from gpulens.domain import catalog as c
from gpulens_testkit.damage import DamagePlan, DamageSpec

CLEAN, DAMAGED = "clean", "damaged"
DATA_SETS = (CLEAN, DAMAGED)
DAMAGE = DamageSpec(seed=17)
# the clean data as a damage plan: nothing damaged, but its series begin with the data all the same
NO_DAMAGE = DamageSpec(seed=17, restarts_per_day=0, missed_fraction=0.0, nan_bursts_per_day=0)


def _ms(plan: DamagePlan, k: int) -> int:
    return plan.time_s(k) * 1000


def tolerance(
    plan: DamagePlan,
    host: str,
    forms: Sequence[HandForm],
    rate_window_ms: int,
    gpus: Sequence[str] | None = None,
) -> Tolerance:
    """The zones of `host`'s damage where each form is known wrong: after a dcgm-exporter restart
    (every form over a DCGM series), a NaN burst on one of `gpus` (None: all; forms over that series),
    and the rate window after the CPU counters' start and after each missed scrape (forms over
    node_cpu_seconds_total)."""
    restarts = [
        (_ms(plan, r.k_stop), _ms(plan, r.k_stop - 1) + c.LOOKBACK_MS) for r in plan.restarts_of(host)
    ]
    bursts: dict[str, list[tuple[int, int]]] = {}
    for b in plan.bursts:
        if b.host != host or (gpus is not None and b.gpu not in gpus):
            continue
        after = plan.next_present(host, b.k1)
        end = _ms(plan, b.k1 - 1) + c.LOOKBACK_MS if after is None else _ms(plan, after) - 1
        bursts.setdefault(b.name, []).append((_ms(plan, b.k0), end))
    starts = [0, *plan.missed.get(host, ())]
    cpu = [(_ms(plan, k), _ms(plan, k) + rate_window_ms) for k in starts]
    zones: dict[str, list[tuple[int, int]]] = {}
    for form in forms:
        mine: list[tuple[int, int]] = []
        if "DCGM_" in form.expr:
            mine.extend(restarts)
        for name, spans in bursts.items():
            if f"{name}{{" in form.expr:
                mine.extend(spans)
        if f"{c.NODE_CPU_SECONDS}{{" in form.expr and "rate(" in form.expr:
            mine.extend(cpu)
        if mine:
            zones.setdefault(form.key, []).extend(mine)
    return Tolerance(zones)


def restart_window(plan: DamagePlan, host: str, span_s: int, step_s: int, end_s: int) -> tuple[int, int]:
    """[start, end] (s) of a `span_s` window centred on the latest dcgm-exporter restart of `host` that
    such a window holds whole, its start on the data's step grid."""
    for r in reversed(plan.restarts_of(host)):
        at = plan.time_s(r.k_stop)
        start = at - span_s // 2
        start -= (start - plan.start_s) % step_s
        if start >= plan.start_s and start + span_s <= end_s:
            return start, start + span_s
    raise ValueError(f"no restart of {host} with a {span_s} s window around it in the data")
