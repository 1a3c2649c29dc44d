"""labkit.core.latency_model: the calibrated latency model — fits, standard errors, identifiability, ranges."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.core.latency_model import (
    DECODE_TERMS, LatencyModel, fit_latency, fit_latency_model, fit_linear, nonnegative_least_squares,
    prediction_ratio,
)


def test_nonnegative_least_squares_drops_a_column_that_would_go_negative():
    features = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    assert nonnegative_least_squares(features, np.array([1.0, 2.0, 3.0])) == pytest.approx([0.0, 1.0])
    assert nonnegative_least_squares(features, np.array([3.0, 2.0, 1.0])).tolist() == [2.0, 0.0]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0, 0.1), min_size=5, max_size=5))
def test_fit_recovers_a_model_it_was_given(coefficients):
    coefficients[0] += 1e-4  # every real call has some fixed cost: times > 0 (the fit weighs relative errors)
    coefficients[2] += 1e-4
    truth = LatencyModel(*coefficients)
    prefill = [(p, b, truth.prefill_s(p, b)) for p in (4, 32, 128) for b in (1, 3)]
    decode = [(b, c, truth.decode_step_s(b, c)) for b in (1, 2, 5) for c in (4, 64, 300)]
    fitted = fit_latency_model(prefill, decode)
    for p, b, s in prefill:
        assert fitted.prefill_s(p, b) == pytest.approx(s, abs=1e-9)
    for b, c, s in decode:
        assert fitted.decode_step_s(b, c) == pytest.approx(s, abs=1e-9)


def test_prediction_follows_eq_8_1_and_batching_trades_latency_for_throughput():
    latency = LatencyModel(0.002, 0.0005, 0.030, 0.002, 1e-6)
    one, eight = latency.predict(32, 20), latency.predict(32, 20, batch_size=8)
    assert one.e2e_s == pytest.approx(one.ttft_s + 19 * one.tpot_s)
    assert eight.e2e_s > one.e2e_s and eight.tokens_per_s > one.tokens_per_s
    single = latency.predict(32, 1)
    assert single.tpot_s is None and single.e2e_s == single.ttft_s
    with pytest.raises(ValueError, match="fit_latency_model needs"):
        fit_latency_model([], [(1, 1, 0.1)])


# A decode step like this machine's: 65 ms fixed, 5 ms per sequence, 20 us per cached token (per sequence).
TRUTH = LatencyModel(0.1, 0.0013, 0.065, 0.005, 20e-6)


def _noisy_decode(pairs, noise, rng):
    """(batch, context, seconds) with multiplicative noise of relative size ``noise`` (a shared machine's)."""
    return [(b, c, TRUTH.decode_step_s(b, c) * (1 + noise * rng.standard_normal())) for b, c in pairs]


def test_a_noisy_linear_cost_is_recovered_within_its_standard_errors():
    rng = np.random.default_rng(0)
    pairs = [(b, c) for b in (1, 3) for c in (16, 256, 1024)] * 3
    prefill = [(p, 1, TRUTH.prefill_s(p)) for p in (8, 64, 1024)]
    truth = (TRUTH.decode_fixed_s, TRUTH.decode_per_sequence_s, TRUTH.decode_per_cached_token_s)
    fits = [fit_latency(prefill, _noisy_decode(pairs, 0.03, rng)).decode for _ in range(200)]
    assert fits[0].names == DECODE_TERMS and fits[0].n_points == 18 and all(fits[0].identifiable)
    values, errors = np.array([f.coefficients for f in fits]), np.array([f.standard_errors for f in fits])
    # The errors a fit reports match the real scatter of its coefficients, and +-2 of them cover the truth about
    # 95 % of the time (a t distribution with 18 - 3 degrees of freedom: 93.6 %).
    covered = np.mean(np.abs(values - truth) < 2 * errors, axis=0)
    assert np.all((covered > 0.88) & (covered < 0.99)), covered
    assert np.std(values, axis=0) == pytest.approx(np.mean(errors, axis=0), rel=0.2)
    assert np.mean(values, axis=0) == pytest.approx(truth, rel=0.05)


def test_one_context_per_batch_leaves_the_per_cached_token_cost_unidentifiable():
    rng = np.random.default_rng(1)
    prefill = [(p, 1, TRUTH.prefill_s(p)) for p in (8, 64)]
    # Every batch decoded at the same context: b x c is a multiple of b, so the two columns are collinear.
    collinear = fit_latency(prefill, _noisy_decode([(b, 9) for b in (1, 3)] * 4, 0.03, rng)).decode
    assert collinear.identifiable == (True, False, False)
    assert collinear.error("per cached token") == math.inf == collinear.error("per sequence")
    assert math.isfinite(collinear.error("fixed"))
    # Contexts 7-10 per batch (one short generation): identifiable in principle, determined by nothing.
    narrow = fit_latency(prefill, _noisy_decode([(b, c) for b in (1, 3) for c in range(7, 11)], 0.03, rng)).decode
    assert all(narrow.identifiable) and narrow.error("per cached token") > 2 * TRUTH.decode_per_cached_token_s
    wide = fit_latency(prefill, _noisy_decode([(b, c) for b in (1, 3) for c in (16, 256, 1024)], 0.03, rng)).decode
    assert wide.error("per cached token") < 0.5 * TRUTH.decode_per_cached_token_s


def test_linear_fit_by_hand_and_at_its_edges():
    exact = fit_linear([[1, 2], [1, 5]], [7.0, 13.0], ("fixed", "slope"))  # two points, two coefficients
    assert exact.coefficients == pytest.approx((3.0, 2.0)) and exact.rms_residual == pytest.approx(0, abs=1e-12)
    assert all(math.isnan(e) for e in exact.standard_errors) and exact.identifiable == (True, True)
    zero_column = fit_linear([[1, 0], [1, 0], [1, 0]], [1.0, 2.0, 3.0], ("fixed", "never varied"))
    assert zero_column.identifiable == (True, False) and zero_column.value("fixed") == pytest.approx(2.0)
    with pytest.raises(ValueError, match="fit_linear needs features"):
        fit_linear([[1, 2]], [1.0, 2.0], ("a", "b"))
    with pytest.raises(ValueError, match=r"name must be one of \['fixed', 'slope'\]"):
        exact.value("slop")
    with pytest.raises(ValueError, match="needs every target > 0"):
        fit_linear([[1, 2], [1, 3]], [1.0, 0.0], ("a", "b"), relative=True)


def test_extrapolation_is_named_exactly_outside_the_measured_range():
    fit = fit_latency([(8, 1, 0.1), (32, 2, 0.2)], [(1, 10, 0.05), (3, 10, 0.06), (1, 500, 0.07)])
    assert (fit.prefill_tokens, fit.batch_sizes, fit.context_lens) == ((8, 64), (1, 3), (10, 500))
    assert fit.extrapolations(10, 492) == ()  # contexts 10 .. 500, prefill 10 tokens: on the edges
    assert fit.extrapolations(10, 493) == ("context up to 501 tokens > 500 measured",)
    assert fit.extrapolations(9, 2) == ("context from 9 tokens < 10 measured",)
    assert fit.extrapolations(7, 1) == ("prefill of 7 tokens < 8 measured",)  # one token: no decode step
    assert fit.extrapolations(20, 1, batch_size=4) == ("prefill of 80 tokens (4 x 20) > 64 measured",)
    assert prediction_ratio(0.1, 0.08) == pytest.approx(1.25)
    with pytest.raises(ValueError, match="measured_s must be"):
        prediction_ratio(0.1, 0)
