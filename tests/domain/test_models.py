"""Decoded samples on a grid: the finite samples inside bounds, found without a Python object each."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.domain.models import finite_inside

T0 = 1_767_225_600_000
STEP = 15_000


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.booleans()), max_size=60),
    st.sampled_from(["1", "NaN", "-Inf", "2.5"]),
    st.integers(-3, 70),
    st.integers(-3, 70),
)
def test_finite_inside_keeps_the_finite_samples_in_bounds(
    steps: list[tuple[int, bool]], special: str, lo_k: int, hi_k: int
) -> None:
    offsets, texts, at = [], [], -1
    for gap, odd in steps:
        at += gap + 1
        offsets.append(at)
        texts.append((special if odd else "1").encode())
    bad = [k for k, t in enumerate(texts) if t in (b"NaN", b"-Inf")]
    lo, hi = T0 + lo_k * STEP, T0 + hi_k * STEP
    got = finite_inside(T0, STEP, offsets, texts, bad, lo, hi)
    pairs = enumerate(zip(offsets, texts, strict=True))
    expected = [(o, t) for k, (o, t) in pairs if lo_k <= o <= hi_k and k not in bad]
    assert list(zip(*got, strict=True)) == expected
