"""The PromQL subset parser: every planner expression parses; the AST is what Prometheus would build."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulens.backends.embedded.promql import (
    Aggregate,
    Binary,
    Call,
    MatrixSelector,
    NumberLiteral,
    PromQLError,
    StringLiteral,
    VectorSelector,
    parse,
    parse_duration,
)
from gpulens.domain import catalog as c
from gpulens.domain.models import Window
from gpulens.planning import hosts, pods
from gpulens.planning.promql import quote


def test_selector_with_matchers() -> None:
    e = parse('m{a="x",b=~"y|z",c!="",d!~"q"}')
    assert e == VectorSelector("m", (("a", "=", "x"), ("b", "=~", "y|z"), ("c", "!=", ""), ("d", "!~", "q")))


def test_name_only_selector_and_name_matcher() -> None:
    assert parse('{__name__="m",a="b"}') == VectorSelector("m", (("a", "=", "b"),))
    assert parse('{__name__=~"a|b"}') == VectorSelector("", (("__name__", "=~", "a|b"),))
    with pytest.raises(PromQLError):
        parse('{a=~".*"}')  # matches the empty label set


def test_precedence_and_associativity() -> None:
    e = parse("100 * (1 - avg(rate(x[1m])))")
    assert isinstance(e, Binary) and e.op == "*" and e.lhs == NumberLiteral(100.0)
    inner = e.rhs
    assert isinstance(inner, Binary) and inner.op == "-"
    assert inner.rhs == Aggregate(
        "avg", None, Call("rate", (MatrixSelector(VectorSelector("x", ()), 60_000),))
    )
    e = parse("a - b - c or d * e / f")
    assert isinstance(e, Binary) and e.op == "or"
    assert isinstance(e.lhs, Binary) and isinstance(e.lhs.lhs, Binary) and e.lhs.lhs.op == "-"
    assert isinstance(e.rhs, Binary) and e.rhs.op == "/"


def test_grouping_before_or_after() -> None:
    a = parse("max by (gpu, UUID) (m)")
    b = parse("max(m) by (gpu, UUID)")
    assert a == b == Aggregate("max", ("gpu", "UUID"), VectorSelector("m", ()))


def test_functions() -> None:
    e = parse('label_replace(histogram_quantile(0.5, sum by (le) (rate(b[2m]))), "q", "p50", "", "")')
    assert isinstance(e, Call) and e.func == "label_replace"
    assert e.args[1:] == (StringLiteral("q"), StringLiteral("p50"), StringLiteral(""), StringLiteral(""))
    with pytest.raises(PromQLError):
        parse("rate(x)")
    with pytest.raises(PromQLError):
        parse("rate((a or b)[1m])")  # Prometheus: ranges only allowed for vector selectors


@pytest.mark.parametrize(
    ("text", "ms"),
    [("5m", 300_000), ("1h30m", 5_400_000), ("250ms", 250), ("15s", 15_000), ("1d", 86_400_000)],
)
def test_durations(text: str, ms: int) -> None:
    assert parse_duration(text) == ms
    assert parse(f"rate(x[{text}])") == Call("rate", (MatrixSelector(VectorSelector("x", ()), ms),))


def test_numbers() -> None:
    assert parse("1e3") == NumberLiteral(1000.0)
    assert parse("-2.5") == NumberLiteral(-2.5)
    assert parse("0x10") == NumberLiteral(16.0)
    e = parse("NaN")
    assert isinstance(e, NumberLiteral) and math.isnan(e.value)


def test_go_string_escapes() -> None:
    e = parse(r'm{a="q\"b\\c\n\x41\u00e9\101", b=' + "'s\\'q'" + ", c=`raw\\n`}")
    assert isinstance(e, VectorSelector)
    assert e.matchers == (("a", "=", 'q"b\\c\nAéA'), ("b", "=", "s'q"), ("c", "=", "raw\\n"))


@given(st.text(max_size=40))
def test_quote_round_trips(value: str) -> None:
    e = parse(f"m{{a={quote(value)}}}")
    assert isinstance(e, VectorSelector) and e.matchers == (("a", "=", value),)


@pytest.mark.parametrize("bad", ["", "m{", "sum(", "m{a=b}", "1 +", "rate(x[5])x", "foo(bar)"])
def test_errors(bad: str) -> None:
    with pytest.raises(PromQLError):
        parse(bad)


def test_every_host_plan_parses() -> None:
    target = hosts.HostTarget("h-1.example", ("0", "3", "GPU-8a1b-2c"), ("10.0.0.7:9100",))
    for step in (1_000, 15_000, 300_000):
        for match in ("auto", "instance", "nodename"):
            for planned in hosts.plan_host(
                c.LYCEUM_METRICS, target, step, hosts.HostPlanOptions(node_match=match)
            ):
                parse(planned.expr)


def test_every_pod_plan_parses() -> None:
    """Single pods and workloads whose pods share a namespace (several namespaces: see the report)."""
    targets = [pods.PodTarget.one("ns", "p-1"), pods.PodTarget((("ns", "a"), ("ns", "b")))]
    grids = [Window(0, 3_600_000, 60_000), Window(3_600_000, 3_600_000, 1)]
    count = 0
    for defs in (c.POD_METRICS, c.WORKLOAD_METRICS):
        for metric in defs:
            for target in targets:
                for grid in grids:
                    for q in pods.plan_pod_metric(
                        metric, target, grid, 60_000, pods.PodPlanOptions(), histogram_series="h_bucket"
                    ):
                        parse(q.expr)
                        count += 1
    assert count > 100
