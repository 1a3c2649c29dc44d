"""labkit.core.uncertainty: paired block and unpaired bootstrap intervals, and the comparison word."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.core.uncertainty import (
    Interval, comparison_word, delta_ppl_interval, paired_bootstrap, ratio_of_medians_interval, unpaired_bootstrap,
)


def mean_difference(b, s):
    return s.mean(-1) - b.mean(-1)


def ar1(n, phi, rng):
    """A correlated series (AR(1), unit innovations): neighbours share most of their value when phi is near 1."""
    noise = rng.standard_normal(n)
    out = np.empty(n)
    out[0] = noise[0] / math.sqrt(1 - phi**2)
    for i in range(1, n):
        out[i] = phi * out[i - 1] + noise[i]
    return out


def test_comparison_word_sits_exactly_on_the_null():
    assert comparison_word(Interval(1.0, 0.1, 2.0, 0.95)) == "larger"
    assert comparison_word(Interval(-1.0, -2.0, -0.1, 0.95)) == "smaller"
    assert comparison_word(Interval(1.0, 0.0, 2.0, 0.95)) == "indistinguishable"  # touching 0 does not resolve it
    assert comparison_word(Interval(-1.0, -2.0, 0.0, 0.95)) == "indistinguishable"
    assert comparison_word(Interval(1.3, 1.0, 1.6, 0.95), null=1.0) == "indistinguishable"
    assert comparison_word(Interval(1.3, 1.01, 1.6, 0.95), null=1.0) == "larger"


def test_a_constant_difference_has_a_zero_width_interval():
    nll = np.linspace(1.0, 6.0, 300)  # varying difficulty, shared by both: it cancels in the pairs
    interval = delta_ppl_interval(nll, nll + math.log(1.02), block_size=16)
    assert interval.estimate == pytest.approx(2.0, abs=1e-9)
    assert interval.low == pytest.approx(2.0, abs=1e-9) and interval.high == pytest.approx(2.0, abs=1e-9)


def test_delta_ppl_estimate_is_the_perplexity_ratio():
    rng = np.random.default_rng(1)
    base, scheme = rng.gamma(2.0, 1.5, 500), rng.gamma(2.0, 1.6, 500)
    expected = 100 * (math.exp(scheme.mean()) / math.exp(base.mean()) - 1)
    interval = delta_ppl_interval(base, scheme)
    assert interval.estimate == pytest.approx(expected, rel=1e-12)
    assert interval.low < interval.estimate < interval.high


def test_pairing_removes_the_shared_variation():
    rng = np.random.default_rng(2)
    difficulty = rng.gamma(2.0, 2.0, 1000)  # large, shared
    base, scheme = difficulty, difficulty + 0.05 + 0.05 * rng.standard_normal(1000)
    paired = paired_bootstrap(base, scheme, mean_difference)
    unpaired = unpaired_bootstrap(base, scheme, lambda a, b: b.mean(-1) - a.mean(-1))
    assert comparison_word(paired) == "larger" and comparison_word(unpaired) == "indistinguishable"
    assert (paired.high - paired.low) < (unpaired.high - unpaired.low) / 20


def test_iid_interval_width_matches_the_standard_error():
    rng = np.random.default_rng(3)
    diff = rng.standard_normal(2000)
    interval = paired_bootstrap(np.zeros(2000), diff, mean_difference, n_resamples=4000)
    expected_half_width = 1.96 * diff.std(ddof=1) / math.sqrt(2000)
    assert (interval.high - interval.low) / 2 == pytest.approx(expected_half_width, rel=0.1)


def test_blocks_widen_the_interval_of_a_correlated_series_to_its_true_spread():
    # AR(1) with phi = 0.8: the mean's variance is (1 + phi) / (1 - phi) = 9 times the i.i.d. formula's.
    rng = np.random.default_rng(4)
    diff = ar1(4000, 0.8, rng)
    single = paired_bootstrap(np.zeros(4000), diff, mean_difference, block_size=1)
    blocks = paired_bootstrap(np.zeros(4000), diff, mean_difference, block_size=64)
    ratio = (blocks.high - blocks.low) / (single.high - single.low)
    assert 2.3 < ratio < 3.7  # sqrt(9) = 3; one-at-a-time resampling understates it threefold


def test_block_intervals_cover_the_truth_about_as_often_as_they_say():
    rng = np.random.default_rng(5)
    covered = 0
    for trial in range(120):
        diff = 0.3 + ar1(600, 0.5, rng)  # true mean 0.3
        interval = paired_bootstrap(np.zeros(600), diff, mean_difference, block_size=20, n_resamples=500,
                                    seed=trial)
        covered += interval.contains(0.3)
    assert 0.85 <= covered / 120 <= 1.0  # nominal 0.95; a block bootstrap undercovers slightly


def test_too_few_blocks_are_refused_because_they_understate_the_spread():
    # Two blocks of 64 among 128 i.i.d. values: the resampled means spread far less than the standard error says.
    rng = np.random.default_rng(9)
    diff = rng.standard_normal(128)
    with pytest.raises(ValueError, match="10 blocks or more"):
        paired_bootstrap(np.zeros(128), diff, mean_difference, block_size=64)
    allowed = paired_bootstrap(np.zeros(128), diff, mean_difference, block_size=12)  # 11 blocks
    half_width = (allowed.high - allowed.low) / 2
    assert half_width == pytest.approx(1.96 * diff.std(ddof=1) / math.sqrt(128), rel=0.3)


def test_ratio_of_medians_and_its_null():
    rng = np.random.default_rng(6)
    slow, fast = 2.0 + 0.1 * rng.random(15), 1.0 + 0.1 * rng.random(15)
    speedup = ratio_of_medians_interval(slow, fast)
    assert speedup.estimate == pytest.approx(np.median(slow) / np.median(fast), rel=1e-12)
    assert comparison_word(speedup, null=1.0) == "larger"
    same = ratio_of_medians_interval(fast, 1.0 + 0.1 * rng.random(15))
    assert comparison_word(same, null=1.0) == "indistinguishable"


def test_same_inputs_same_interval_and_the_seed_matters():
    rng = np.random.default_rng(7)
    base, scheme = rng.random(300), rng.random(300)
    first = delta_ppl_interval(base, scheme, seed=3)
    assert delta_ppl_interval(base, scheme, seed=3) == first
    assert delta_ppl_interval(torch.tensor(base), torch.tensor(scheme), seed=3) == first
    assert delta_ppl_interval(base, scheme, seed=4) != first


def test_chunked_resampling_gives_the_same_draws(monkeypatch):
    import labkit.core.uncertainty as uncertainty
    rng = np.random.default_rng(8)
    base, scheme = rng.random(100), rng.random(100)
    whole = paired_bootstrap(base, scheme, mean_difference, block_size=7, n_resamples=300)
    monkeypatch.setattr(uncertainty, "_CHUNK_VALUES", 1000)  # ten resamples per chunk
    assert paired_bootstrap(base, scheme, mean_difference, block_size=7, n_resamples=300) == whole


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=10, max_size=80), st.integers(1, 8), st.floats(0.5, 0.99))
def test_interval_brackets_a_mean_difference_and_narrows_with_confidence(diff, block_size, confidence):
    diff = np.array(diff)
    block_size = min(block_size, diff.size // 10)
    wide = paired_bootstrap(np.zeros(diff.size), diff, mean_difference, block_size=block_size, confidence=confidence,
                            n_resamples=200)
    narrow = paired_bootstrap(np.zeros(diff.size), diff, mean_difference, block_size=block_size,
                              confidence=confidence / 2, n_resamples=200)
    assert diff.min() - 1e-9 <= wide.low <= wide.high <= diff.max() + 1e-9
    assert wide.low <= narrow.low + 1e-12 and narrow.high <= wide.high + 1e-12


TEN = [float(i) for i in range(10)]


@pytest.mark.parametrize("call,error,words", [
    (lambda: delta_ppl_interval(TEN, TEN + [1.0], block_size=1), ValueError,
     "scheme must be as many items as baseline (10"),
    (lambda: delta_ppl_interval(TEN[:-1] + [float("nan")], TEN, block_size=1), ValueError,
     "baseline must be a 1-D sequence of at least 10 finite numbers"),
    (lambda: delta_ppl_interval(TEN[:9], TEN[:9], block_size=1), ValueError, "at least 10 finite numbers"),
    (lambda: delta_ppl_interval("ab", "cd"), TypeError, "baseline must be a 1-D sequence"),
    (lambda: delta_ppl_interval(np.zeros((2, 2)), np.zeros((2, 2))), ValueError, "baseline must be a 1-D"),
    (lambda: delta_ppl_interval(TEN * 3, TEN * 3), ValueError,
     "block_size must be an int in [1, 3] (10 blocks or more of the 30 items), got 16"),
    (lambda: delta_ppl_interval(TEN, TEN, block_size=1, confidence=1.0), ValueError,
     "confidence must be a real number in (0, 1)"),
    (lambda: delta_ppl_interval(TEN, TEN, block_size=1, n_resamples=10), ValueError,
     "n_resamples must be an int >= 100"),
    (lambda: delta_ppl_interval(TEN, TEN, block_size=1, seed=1.5), TypeError, "seed must be an int >= 0"),
    (lambda: ratio_of_medians_interval([1.0, 2.0, 0.0], [1.0, 1.0, 1.0]), ValueError, "numerator must be positive"),
    (lambda: ratio_of_medians_interval([1.0, 2.0], [1.0, 1.0, 1.0]), ValueError, "at least 3 finite numbers"),
    (lambda: paired_bootstrap(TEN, TEN, "mean"), TypeError, "statistic must be a function"),
    (lambda: paired_bootstrap(TEN, TEN, lambda b, s: s - b), ValueError, "returning one number"),
    (lambda: comparison_word((0.0, 1.0)), TypeError, "interval must be a labkit.core.uncertainty.Interval"),
])
def test_bad_input_names_the_argument(call, error, words):
    with pytest.raises(error) as raised:
        call()
    assert words in str(raised.value)
