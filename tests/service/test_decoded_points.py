"""The summary's and the archive's readers of decoded samples: a grid with gaps and NaN (as the
Prometheus backend hands VictoriaMetrics' answers on) reads as the listed samples do."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.backends import promjson
from gpulens.domain.models import GridPoints, Series, Window
from gpulens.service.archive import _arrays
from gpulens.service.summary import points

# every test here runs on the compiled grid path and on the Python one (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("grid_path")

T0 = 1_767_225_600_000
STEP = 15_000


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 3), st.sampled_from(["1", "2.5", "NaN", "+Inf", "-Inf", "1e-05"])),
        min_size=2,
        max_size=40,
    ),
    st.integers(-3, 3),
    st.integers(-3, 3),
)
def test_grid_points_read_as_their_listed_samples(steps: list[tuple[int, str]], lo: int, hi: int) -> None:
    listed: list[list[float | str]] = []
    ms = T0
    for gap, text in steps:
        ms += gap * STEP
        listed.append([ms / 1000, text])
    decoded = promjson.grid_samples(orjson.dumps(listed), STEP)
    assert decoded is not None
    first, last = round(float(listed[0][0]) * 1000), round(float(listed[-1][0]) * 1000)
    window = Window(first + lo * STEP, max(first + lo * STEP, last + hi * STEP), STEP)
    got, want = points(decoded, window), points(listed, window)  # type: ignore[arg-type]
    assert np.array_equal(got.t, want.t) and np.array_equal(got.v, want.v)
    if isinstance(decoded, GridPoints):
        _, t, v = _arrays(Series({"a": "1"}, decoded))
        _, t2, v2 = _arrays(Series({"a": "1"}, listed))  # type: ignore[arg-type]
        assert np.array_equal(t, t2) and np.array_equal(v, v2, equal_nan=True)
