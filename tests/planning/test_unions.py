"""Tagged unions (planning/unions.py): every (tag, expression) pair lands in exactly one query, in
order, within the branch and character limits; the `or` tree is balanced; every query parses with
the embedded PromQL parser, each branch reading back as its own expression with its own tag (quotes,
backslashes and control characters in a tag escaped); and a union evaluated on the embedded store
answers, tag by tag, what each branch answers alone."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.agent.samples import Sample
from gpulens.backends.embedded.backend import EmbeddedBackend
from gpulens.backends.embedded.promql import Binary, Call, Expr, StringLiteral, parse
from gpulens.domain.models import RangeQuery, Window
from gpulens.planning.promql import quote
from gpulens.planning.unions import (
    JOIN_CHARS,
    MAX_BRANCHES,
    MAX_QUERY_CHARS,
    TAG_LABEL,
    balanced_or,
    tagged,
    unions,
)
from gpulens.storage.samples import SampleStore

# -- expressions of the planners' shapes ------------------------------------------------------------

_names = st.from_regex(r"m_[a-zA-Z0-9_:]{0,12}", fullmatch=True)
_labels = st.from_regex(r"l_[a-zA-Z0-9_]{0,8}", fullmatch=True)
# any text a label value may hold: quotes, backslashes, newlines, control characters, non-ASCII
_values = st.text(max_size=40)


@st.composite
def selectors(draw: st.DrawFn) -> str:
    matchers = draw(st.lists(st.tuples(_labels, st.sampled_from(["=", "!=", "=~"]), _values), max_size=4))
    body = ",".join(f"{label}{op}{quote(value if op != '=~' else 'x')}" for label, op, value in matchers)
    return f"{draw(_names)}{{{body}}}" if body else draw(_names)


@st.composite
def expressions(draw: st.DrawFn) -> str:
    sel = draw(selectors())
    form = draw(st.integers(0, 6))
    if form == 0:
        return sel
    if form == 1:
        return f"avg({sel})"
    if form == 2:
        return f"max by (gpu, UUID) ({sel})"
    if form == 3:
        return f"sum(rate({sel}[1m]))"
    if form == 4:
        return f"100 * sum({sel}) / sum({draw(selectors())})"
    if form == 5:  # an `or` inside a branch stays inside its label_replace
        return f"max by (gpu) (({sel} or {draw(selectors())}))"
    return f'label_replace({sel}, "dst", "v", "", "")'


def _or_leaves(expr: Expr, depth: int = 0) -> tuple[list[Expr], int]:
    """The leaves of the top-level `or` tree in order, and its depth (a single leaf: 0)."""
    if isinstance(expr, Binary) and expr.op == "or":
        left, dl = _or_leaves(expr.lhs, depth + 1)
        right, dr = _or_leaves(expr.rhs, depth + 1)
        return left + right, max(dl, dr)
    return [expr], depth


def _paren_depth(text: str) -> int:
    """The deepest nesting of parentheses in `text` (used on parts holding none: only those
    `balanced_or` writes are counted)."""
    deepest = depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    assert depth == 0
    return deepest


def _log2_ceil(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


# -- balanced_or ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [*range(1, 40), 63, 64, 65, 100, 127, 128, 129, 500])
def test_balanced_or_joins_n_parts_with_n_minus_one_ors_at_log_depth(n: int) -> None:
    parts = [f"a{k}" for k in range(n)]
    joined = balanced_or(parts)
    assert joined.count(" or ") == n - 1
    assert _paren_depth(joined) <= max(0, _log2_ceil(n) - 1)
    leaves, depth = _or_leaves(parse(joined))
    assert depth <= _log2_ceil(n)
    assert [getattr(leaf, "name", None) for leaf in leaves] == parts  # in order, each once


# -- unions -----------------------------------------------------------------------------------------


def _check(items: list[tuple[str, str]], max_chars: int, max_branches: int) -> None:
    out = unions(items, max_chars=max_chars, max_branches=max_branches)
    assert [tag for _, tags in out for tag in tags] == [tag for tag, _ in items]  # each once, in order
    by_tag = dict(items)
    for query, tags in out:
        assert tags, query
        assert len(tags) <= max_branches
        assert len(query) <= max_chars or len(tags) == 1, (len(query), len(tags))
        leaves, depth = _or_leaves(parse(query))
        assert depth <= _log2_ceil(len(tags))
        assert len(leaves) == len(tags)
        for leaf, tag in zip(leaves, tags, strict=True):
            # label_replace(<expr>, "gpulens_part", "<tag>", "", ""), the tag read back as written
            assert isinstance(leaf, Call) and leaf.func == "label_replace", leaf
            assert leaf.args[1:] == (
                StringLiteral(TAG_LABEL),
                StringLiteral(tag),
                StringLiteral(""),
                StringLiteral(""),
            )
            assert leaf.args[0] == parse(by_tag[tag])
            assert quote(tag) in query
    # packed greedily: a query ends only when the next branch would take it past a limit
    for (_, tags), (_, after) in itertools.pairwise(out):
        size = sum(len(tagged(by_tag[tag], tag)) + JOIN_CHARS for tag in tags)
        nxt = len(tagged(by_tag[after[0]], after[0])) + JOIN_CHARS
        assert len(tags) == max_branches or size + nxt > max_chars, (size, nxt, max_chars)


@settings(max_examples=100, deadline=None)
@given(
    tagged_exprs=st.lists(
        st.tuples(st.text(max_size=12), expressions()), max_size=60, unique_by=lambda p: p[0]
    ),
    max_chars=st.integers(150, MAX_QUERY_CHARS),
    max_branches=st.integers(1, MAX_BRANCHES),
)
def test_unions_keep_every_tag_once_in_order_within_the_limits(
    tagged_exprs: list[tuple[str, str]], max_chars: int, max_branches: int
) -> None:
    _check(tagged_exprs, max_chars, max_branches)


@settings(max_examples=50, deadline=None)
@given(tags=st.lists(st.text(alphabet="\"\\\n\t\r\x00\x1f\x7f`'é{}()", max_size=8), unique=True, max_size=40))
def test_tags_with_quotes_and_backslashes_are_escaped(tags: list[str]) -> None:
    items = [(tag, f'm_x{{l_a="{k}"}}') for k, tag in enumerate(tags)]
    _check(items, MAX_QUERY_CHARS, MAX_BRANCHES)
    for tag in tags:
        assert quote(tag) in tagged("m_x", tag)


def test_defaults_and_a_branch_longer_than_the_limit_goes_alone() -> None:
    long_expr = "sum(m_big{" + ",".join(f'l_{k}="{"v" * 50}"' for k in range(300)) + "})"
    assert len(long_expr) > MAX_QUERY_CHARS
    items = [("a", "m_a"), ("b", "m_b"), ("big", long_expr), ("c", "m_c")]
    out = unions(items)
    assert [tags for _, tags in out] == [["a", "b"], ["big"], ["c"]]
    assert out[1][0] == tagged(long_expr, "big")
    many = [(str(k), f"m_{k}") for k in range(3 * MAX_BRANCHES + 1)]
    assert [len(tags) for _, tags in unions(many)] == [MAX_BRANCHES] * 3 + [1]
    assert unions([]) == []
    with pytest.raises(ValueError, match="label name"):
        tagged("m_a", "x", label="not a label")


# -- evaluated: each branch answers what it answers alone ---------------------------------------------

T0_MS = 1_700_000_000_000


@pytest.fixture
def backend(tmp_path: Path) -> EmbeddedBackend:
    store = SampleStore.from_path(tmp_path / "samples.db")
    samples = []
    for k in range(40):
        t = T0_MS + k * 15_000
        for gpu in ("0", "1", "2"):
            labels = (("h", "x"), ("gpu", gpu))
            samples.append(Sample("m_util", labels, float((k * 7 + int(gpu) * 13) % 100), t))
            samples.append(Sample("m_count_total", labels, float(k * 30 + int(gpu)), t))
        if k % 3:
            samples.append(Sample("m_util", (("h", "y"), ("gpu", "0")), 50.0 + k, t))
    store.write(samples)
    store.flush()
    return EmbeddedBackend(store)


def test_a_union_answers_each_branch_as_alone(backend: EmbeddedBackend) -> None:
    exprs = [
        'm_util{h="x"}',
        'm_util{h="x"}',  # the same series under another tag: `or` keeps both
        'avg(m_util{h="x"})',
        "max by (gpu) (m_util)",
        'sum(rate(m_count_total{h="x"}[1m]))',
        'm_util{h="y"} or m_util{h="x",gpu="2"}',
        'm_util{h="nowhere"}',
        'avg(m_util{h="x",gpu=~"0|1"})',
    ]
    tags = ["0", "1", 'q"uote', "back\\slash", "4", "5", "6", "7"]
    window = Window(T0_MS + 60_000, T0_MS + 500_000, 15_000)

    def key(labels: dict[str, str], samples: object) -> tuple[object, ...]:
        return (tuple(sorted(labels.items())), tuple((float(t), float(v)) for t, v in samples))  # type: ignore[attr-defined]

    async def read() -> None:
        for max_branches in (1, 3, 16):
            got: dict[str, set[tuple[object, ...]]] = {tag: set() for tag in tags}
            for query, _ in unions(list(zip(tags, exprs, strict=True)), max_branches=max_branches):
                for series in await backend.query_range(RangeQuery(query, window)):
                    labels = dict(series.labels)
                    got[labels.pop(TAG_LABEL)].add(key(labels, series.samples))
            for tag, expr in zip(tags, exprs, strict=True):
                alone = {
                    key(dict(s.labels), s.samples)
                    for s in await backend.query_range(RangeQuery(expr, window))
                }
                assert got[tag] == alone, (max_branches, tag, expr)
        assert got["6"] == set() and len(got["0"]) == 3

    anyio.run(read)
