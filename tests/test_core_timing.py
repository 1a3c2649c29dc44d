"""labkit.core.timing: request metrics (TTFT, ITL, TPOT, E2E), percentiles, spreads, the scripted clock."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.core.timing import (
    RequestMetrics, e2e_estimate, inter_token_latencies, itl_percentiles, percentile, request_metrics, spread, tpot,
)

times = st.lists(st.floats(0, 1e3, allow_nan=False), min_size=1, max_size=40).map(sorted)


def test_chapter_8_example_is_exact():
    assert e2e_estimate(700, 35, 20) == 1365  # ints in, an exact int out
    assert e2e_estimate(0.7, 0.035, 20) == pytest.approx(1.365, abs=1e-12)
    assert e2e_estimate(700, None, 1) == 700  # one token: TTFT is the whole answer


def test_tpot_uses_the_n_minus_1_intervals_after_the_first_token():
    emitted = [700, 735, 770, 805]  # arrival at 0
    assert tpot(emitted) == 35.0
    assert (805 - 0) / 4 != 35.0 and (805 - 700) / 4 != 35.0  # total / n and divide-by-n are both wrong
    assert tpot([700]) is None and tpot([1.0, 1.0]) == 0.0


def test_request_metrics_by_hand():
    m = request_metrics([1.0, 1.5, 2.5], start_s=0.25)
    assert (m.n_tokens, m.ttft_s, m.itl_s, m.tpot_s, m.e2e_s) == (3, 0.75, (0.5, 1.0), 0.75, 2.25)
    assert m.tokens_per_s == 3 / 2.25 and m.decode_tokens_per_s == 1 / 0.75
    one = request_metrics([0.4], start_s=0.0)
    assert one.tpot_s is None and one.itl_s == () and one.decode_tokens_per_s is None and one.e2e_s == 0.4


@pytest.mark.parametrize("bad,error", [([], ValueError), ([2.0, 1.0], ValueError), ("12", TypeError),
                                       ([1.0, float("nan")], ValueError), (3.0, TypeError)])
def test_bad_timestamps_are_refused(bad, error):
    with pytest.raises(error, match="token_times"):
        tpot(bad)


def test_start_after_first_token_is_refused():
    with pytest.raises(ValueError, match=r"start_s must be no later than the first emission \(1.0\), got 2.0"):
        request_metrics([1.0], start_s=2.0)
    with pytest.raises(ValueError, match="tpot must be a number when n_tokens > 1"):
        e2e_estimate(1.0, None, 2)


@settings(max_examples=80, deadline=None)
@given(times, st.floats(0, 10))
def test_e2e_is_ttft_plus_n_minus_1_tpot(emitted, lead):
    start = emitted[0] - lead
    m = request_metrics(emitted, start_s=start)
    assert len(m.itl_s) == m.n_tokens - 1 and all(gap >= 0 for gap in m.itl_s)
    assert math.isclose(e2e_estimate(m.ttft_s, m.tpot_s, m.n_tokens), m.e2e_s, rel_tol=1e-9, abs_tol=1e-9)
    if m.tpot_s is not None:
        assert math.isclose(m.tpot_s, float(np.mean(m.itl_s)), rel_tol=1e-9, abs_tol=1e-9)
        assert min(m.itl_s) - 1e-9 <= m.tpot_s <= max(m.itl_s) + 1e-9


def test_itl_percentiles_pool_every_request_like_vllm():
    requests = [request_metrics([0, 1, 3, 6]), request_metrics([0, 10]), request_metrics([5])]
    pooled = [1, 2, 3, 10]
    assert itl_percentiles(requests, (50, 99)) == {50: np.percentile(pooled, 50), 99: np.percentile(pooled, 99)}
    assert itl_percentiles([request_metrics([5])]) == {50: None, 99: None}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=30), st.floats(0, 100))
def test_percentile_agrees_with_numpy(values, q):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12, abs=1e-9)


def test_spread_by_hand():
    s = spread([4.0, 1.0, 3.0, 2.0, 100.0])
    assert (s.median, s.minimum, s.maximum, s.n, s.p25, s.p75) == (3.0, 1.0, 100.0, 5, 2.0, 4.0)
    assert s.relative_spread == 33.0
    with pytest.raises(ValueError, match="samples must be a non-empty"):
        spread([])


def test_request_metrics_is_a_plain_dataclass():
    assert RequestMetrics(1, 0.1, (), None, 0.1).tokens_per_s == 10
    assert inter_token_latencies([1.0]) == ()


def test_a_scripted_clock_moves_only_with_its_steps():
    from copy import deepcopy

    from labkit.core.timing import ScriptedClock, ScriptedSteps

    clock = ScriptedClock(10.0)
    step = ScriptedSteps(clock, [[1.0, 0.5], [0.25]])
    copied_step, copied_clock = deepcopy((step, clock))
    assert copied_step.clock is copied_clock  # copied together, they stay joined
    for k in range(3):
        step(k)
    assert clock() == 12.0 and step.requests == 1
    step(0), step(5)
    assert clock() == 12.5 and step.requests == 2  # request 2 uses the last row, its last value
    assert copied_clock == clock and copied_clock() == 10.0 and copied_step == step  # equal: same script
    with pytest.raises(ValueError):
        clock.advance(-1.0)
    with pytest.raises(ValueError):
        ScriptedSteps(clock, [[]])
