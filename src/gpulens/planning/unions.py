"""Many expressions in one query: each tagged with a label of its own, joined by `or`.

A live alerts pass reads a few series for each of hundreds of executions on a handful of hosts. Sent
one by one, that is thousands of small queries whose cost is the round trip, not the work; tagged and
joined, it is a few queries per host, each branch evaluated by the backend exactly as it would be
alone (the tag makes every branch's series distinct, so `or` drops none of them).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpulens.planning.promql import check_label_name, quote

TAG_LABEL = "gpulens_part"
# VictoriaMetrics refuses a query longer than 16 KiB by default (-search.maxQueryLen); Prometheus has
# no limit. A branch longer than this is sent alone.
MAX_QUERY_CHARS = 12_000
# branches a query at most: the backend's `or` work grows faster than the branches (see balanced_or)
MAX_BRANCHES = 16
JOIN_CHARS = len(" or ") + 2 * 4  # added per branch at most: a tree of 16 branches is 4 deep


def tagged(expr: str, tag: str, label: str = TAG_LABEL) -> str:
    """`expr` with `label="tag"` added to each of its series."""
    return f'label_replace({expr}, {quote(check_label_name(label))}, {quote(tag)}, "", "")'


def unions(
    items: Sequence[tuple[str, str]],
    max_chars: int = MAX_QUERY_CHARS,
    max_branches: int = MAX_BRANCHES,
    label: str = TAG_LABEL,
) -> list[tuple[str, list[str]]]:
    """(tag, expression) pairs packed in order into queries of at most `max_branches` branches and
    `max_chars` characters (a branch longer than that alone): each query and the tags it holds."""
    out: list[tuple[str, list[str]]] = []
    parts: list[str] = []
    tags: list[str] = []
    size = 0
    for tag, expr in items:
        branch = tagged(expr, tag, label)
        if parts and (len(parts) >= max_branches or size + len(branch) + JOIN_CHARS > max_chars):
            out.append((balanced_or(parts), tags))
            parts, tags, size = [], [], 0
        size += len(branch) + JOIN_CHARS
        parts.append(branch)
        tags.append(tag)
    if parts:
        out.append((balanced_or(parts), tags))
    return out


def balanced_or(parts: Sequence[str]) -> str:
    """The parts (single function calls or selectors) joined by `or` as a balanced tree: each `or`
    matches its left side's series against the right's at every step, so a chain of n costs the
    backend n^2 / 2 matches and a tree n log n."""
    if len(parts) == 1:
        return parts[0]
    mid = len(parts) // 2
    left, right = balanced_or(parts[:mid]), balanced_or(parts[mid:])
    return f"{_grouped(left, mid)} or {_grouped(right, len(parts) - mid)}"


def _grouped(expr: str, branches: int) -> str:
    return expr if branches == 1 else f"({expr})"
