"""Run:ai shaping: decimal text, per-GPU order, exact counts per interval across counter resets."""

from __future__ import annotations

import pytest

from gpulens.domain.models import Series, Window
from gpulens.shaping.runai import bucket_counts, counter_counts, decimal_text, per_gpu


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        ("85", "85"),
        ("97.5", "97.5"),
        ("1.5e+09", "1500000000"),
        ("2.5E-05", "0.000025"),
        ("NaN", None),
        ("+Inf", None),
        ("-Inf", None),
        ("-3", "-3"),
        ("1e+21", "1000000000000000000000"),
    ],
)
def test_decimal_text(raw: str, text: str | None) -> None:
    out = decimal_text(raw)
    assert out == text
    if out is not None:
        assert "e" not in out.lower() and float(out) == float(raw)


def test_per_gpu_sorted_numerically_with_mig_instances() -> None:
    g = Window(0, 0, 1)
    s = [
        Series({"gpu": "10"}, [[0, "1"]]),
        Series({"gpu": "2"}, [[0, "2"]]),
        Series({"gpu": "0", "GPU_I_ID": "2"}, [[0, "3"]]),
        Series({"gpu": "0", "GPU_I_ID": "1"}, [[0, "4"]]),
    ]
    assert [labels for labels, _ in per_gpu(s, g)] == [
        {"gpu": "0", "gpuInstance": "1"},
        {"gpu": "0", "gpuInstance": "2"},
        {"gpu": "2"},
        {"gpu": "10"},
    ]


def test_counter_counts_survive_a_reset_and_sum_engines() -> None:
    ext = Window(0, 40_000, 10_000)  # one point before the grid 10..40 s
    engine0 = Series({"engine": "0"}, [[0, "100"], [10, "110"], [20, "125"], [30, "5"], [40, "8"]])
    engine1 = Series({"engine": "1"}, [[0, "1"], [10, "2"], [20, "3"], [30, "4"], [40, "5"]])
    got = [(p.ms, p.value) for p in counter_counts([engine0, engine1], ext)]
    assert got == [(10_000, "11"), (20_000, "16"), (30_000, "6"), (40_000, "4")]


def test_bucket_counts_cumulative_over_le_with_inf_last() -> None:
    ext = Window(0, 20_000, 10_000)

    def b(le: str, vals: list[float]) -> Series:
        return Series({"le": le}, [[t * 10, str(v)] for t, v in enumerate(vals)])

    series = [b("+Inf", [10, 30, 31]), b("0.1", [2, 5, 5]), b("1.0", [8, 20, 21])]
    got = bucket_counts(series, ext)
    assert [p.ms for p in got] == [10_000, 20_000]
    assert list(got[0].counts.items()) == [("0.1", "3"), ("1.0", "12"), ("+Inf", "20")]
    assert list(got[1].counts.items()) == [("0.1", "0"), ("1.0", "1"), ("+Inf", "1")]
