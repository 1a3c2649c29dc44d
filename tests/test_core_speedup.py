"""labkit.core.speedup: the closed forms by hand, their properties, the simulator against them, a whole request."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.core import speedup as sp

alphas = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
gammas = st.integers(min_value=0, max_value=20)
costs = st.floats(min_value=0.0, max_value=2.0, allow_nan=False)


# ----- closed forms by hand -----

def test_expected_tokens_by_hand():
    assert sp.expected_tokens_per_call(0.5, 2) == 1.75
    assert sp.expected_tokens_per_call(0.7, 4) == pytest.approx(1 + 0.7 + 0.49 + 0.343 + 0.2401, abs=1e-15)
    assert sp.expected_tokens_per_call(1.0, 4) == 5.0  # the boundary: gamma + 1, not 0/0
    assert sp.expected_tokens_per_call(0.0, 7) == 1.0
    assert sp.expected_tokens_per_call(0.9, 0) == 1.0  # no drafts: one token per call
    # close to 1 the closed form has no cancellation: compare with the plain sum
    assert sp.expected_tokens_per_call(1 - 1e-12, 4) == pytest.approx(5.0, rel=1e-11)


def test_the_popular_formula_against_the_paper():
    assert sp.popular_expected_tokens(0.7, 4) == pytest.approx(3.8)
    assert round(sp.expected_tokens_per_call(0.7, 4), 4) == 2.7731
    assert sp.walltime_improvement(0.7, 4, 0.1) == pytest.approx(2.77309 / 1.4, abs=1e-5)
    assert sp.popular_speedup(0.7, 4, 0.1) == pytest.approx(3.8 / 1.4)


def test_optimal_gamma_and_break_even_by_hand():
    # at alpha 0.7, c 0.1: gamma 2 -> 2.19/1.2 = 1.825, 3 -> 2.533/1.3 = 1.948, 4 -> 1.981, 5 -> 2.294/1.5 ...
    values = [sp.walltime_improvement(0.7, g, 0.1) for g in range(8)]
    assert sp.optimal_gamma(0.7, 0.1) == max(range(8), key=values.__getitem__)
    assert sp.optimal_gamma(0.1, 0.5) == 0  # alpha below c: speculation never pays
    assert sp.optimal_gamma(1.0, 0.0, max_gamma=8) == 8
    assert sp.break_even_alpha(1, 0.1) == pytest.approx(0.1)
    root = sp.break_even_alpha(4, 0.1)
    assert root + root**2 + root**3 + root**4 == pytest.approx(0.4, abs=1e-9)
    assert sp.break_even_alpha(3, 0.5) == 1.0 or sp.walltime_improvement(1.0, 3, 0.5) > 1
    assert sp.break_even_alpha(4, 1.0) == 1.0  # 5 tokens for the cost of 5 steps: never better


def test_varying_alpha_by_hand():
    assert sp.expected_tokens_varying([0.9, 0.5, 0.0]) == pytest.approx(1 + 0.9 + 0.45)
    assert sp.expected_tokens_varying([]) == 1.0


@pytest.mark.parametrize("call,message", [
    (lambda: sp.expected_tokens_per_call(1.5, 2), "alpha must be a real number"),
    (lambda: sp.expected_tokens_per_call(0.5, -1), "gamma must be an int >= 0"),
    (lambda: sp.walltime_improvement(0.5, 2, -0.1), "cost_ratio must be a real number >= 0"),
    (lambda: sp.simulate([0.5], 2, 10, torch.Generator()), "gamma = 2 numbers"),
])
def test_bad_arguments_name_themselves(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        call()


def test_wrong_types_raise_type_errors():
    with pytest.raises(TypeError, match="gamma must be an int"):
        sp.expected_tokens_per_call(0.5, 2.0)
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        sp.simulate(0.5, 2, 10, generator=0)


# ----- properties -----

@settings(max_examples=60, deadline=None)
@given(alphas, gammas)
def test_closed_form_equals_the_sum_and_lies_between_1_and_gamma_plus_1(alpha, gamma):
    value = sp.expected_tokens_per_call(alpha, gamma)
    assert value == pytest.approx(sum(alpha**i for i in range(gamma + 1)), rel=1e-9)
    assert 1.0 <= value <= gamma + 1 + 1e-12
    assert value <= sp.popular_expected_tokens(alpha, gamma) + 1e-12  # the popular formula always overestimates (or ties)
    assert sp.expected_tokens_varying([alpha] * gamma) == pytest.approx(value, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(alphas, alphas, gammas)
def test_more_acceptance_never_hurts(a, b, gamma):
    low, high = sorted((a, b))
    assert sp.expected_tokens_per_call(low, gamma) <= sp.expected_tokens_per_call(high, gamma) + 1e-12


@settings(max_examples=40, deadline=None)
@given(alphas, costs)
def test_optimal_gamma_is_optimal(alpha, cost):
    best = sp.optimal_gamma(alpha, cost, max_gamma=16)
    values = [sp.walltime_improvement(alpha, g, cost) for g in range(17)]
    assert values[best] == max(values)
    if alpha <= cost:  # Leviathan et al., corollary 3.9: no gain unless alpha > c
        assert max(values) <= 1.0 + 1e-12


# ----- simulator against the closed forms -----

@pytest.mark.parametrize("alpha,gamma", [(0.3, 2), (0.7, 4), (0.9, 8), (1.0, 3), (0.0, 5)])
def test_simulator_matches_the_closed_form_within_its_standard_error(alpha, gamma):
    sim = sp.simulate(alpha, gamma, 20_000, torch.Generator().manual_seed(6))
    exact = sp.expected_tokens_per_call(alpha, gamma)
    if alpha in (0.0, 1.0):
        assert sim.mean_tokens == exact
    else:
        assert abs(sim.mean_tokens - exact) < 4 * sim.standard_error


def test_simulator_with_alpha_varying_by_position():
    alphas = [0.95, 0.8, 0.6, 0.4, 0.2]
    sim = sp.simulate(alphas, 5, 20_000, torch.Generator().manual_seed(7))
    assert abs(sim.mean_tokens - sp.expected_tokens_varying(alphas)) < 4 * sim.standard_error
    # a mean alpha in the i.i.d. formula is NOT the same thing
    mean_alpha = sum(alphas) / len(alphas)
    assert abs(sp.expected_tokens_per_call(mean_alpha, 5) - sp.expected_tokens_varying(alphas)) > 0.2


def test_simulator_is_reproducible_for_a_seed():
    first = sp.simulate(0.6, 4, 100, torch.Generator().manual_seed(3)).accepted
    assert torch.equal(first, sp.simulate(0.6, 4, 100, torch.Generator().manual_seed(3)).accepted)


# ----- a whole request -----

@given(st.floats(0, 1), st.integers(0, 12), st.floats(0, 1), st.integers(2, 500))
def test_a_request_without_prefill_and_with_a_one_step_verify_is_the_papers_ratio(alpha, gamma, cost, n_tokens):
    assert sp.request_speedup(alpha, gamma, cost, n_tokens) == pytest.approx(sp.walltime_improvement(alpha, gamma, cost))


@given(st.floats(0.05, 1), st.integers(1, 8), st.floats(0, 0.5), st.floats(0.1, 50))
def test_a_prefill_both_pay_pulls_the_speedup_toward_one(alpha, gamma, cost, prefill):
    bare = sp.request_speedup(alpha, gamma, cost, 64)
    with_prefill = sp.request_speedup(alpha, gamma, cost, 64, prefill_ratio=prefill)
    assert min(bare, 1.0) - 1e-12 <= with_prefill <= max(bare, 1.0) + 1e-12


def test_a_verify_that_costs_more_than_a_step_lowers_the_speedup_in_proportion():
    # Every draft accepted (5 tokens a call), verify 1.6 steps, no prefill: 5 / 1.6.
    assert sp.request_speedup(1.0, 4, 0.0, 41, verify_ratio=1.6) == pytest.approx(5 / 1.6)
    with pytest.raises(ValueError, match="verify_ratio must be a real number > 0, got 0"):
        sp.request_speedup(1.0, 4, 0.0, 41, verify_ratio=0)
    with pytest.raises(ValueError, match="n_tokens must be an int >= 1, got 0"):
        sp.request_speedup(1.0, 4, 0.0, 0)
