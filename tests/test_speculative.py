"""labkit.core.speculative: closed forms by hand, properties, the simulator against the closed forms, the exact step
lossless by chi-square and every wrong variant failing the same seeded test, greedy speculation equal to greedy."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.core import speculative as sp

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


def test_alpha_is_one_minus_total_variation_by_hand():
    target, draft = torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.25, 0.25, 0.5])
    assert float(sp.acceptance_rate(target, draft)) == 0.5
    assert float(sp.total_variation(target, draft)) == 0.5
    assert sp.residual_probs(target, draft).tolist() == [0.5, 0.5, 0.0]
    assert sp.residual_probs(target, target).tolist() == target.tolist()  # nothing left: never used


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


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 30), st.integers(0, 10_000))
def test_alpha_is_one_minus_tv_and_the_residual_is_a_distribution(vocab, seed):
    generator = torch.Generator().manual_seed(seed)
    target, draft = torch.softmax(torch.randn(2, vocab, generator=generator, dtype=torch.float64) * 2, dim=-1)
    alpha = sp.acceptance_rate(target, draft)
    assert float(alpha) == pytest.approx(1 - float(sp.total_variation(target, draft)), abs=1e-12)
    residual = sp.residual_probs(target, draft)
    assert float(residual.sum()) == pytest.approx(1.0, abs=1e-12) and bool((residual >= 0).all())
    # the one-step output law, exactly: min(target, draft) + (1 - alpha) residual = target (Leviathan, A.1)
    assert torch.allclose(torch.minimum(target, draft) + (1 - alpha) * residual, target, atol=1e-12)


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


# ----- lossless: the exact step passes the chi-square test, the wrong ones fail it -----
# Threshold: p < 1e-4 (chi-square) or |z| > 4 (tokens per call) fails. Power: on these tables the weakest wrong
# variant in distribution ("resample from the target") reaches chi-square about 300 at 1,500 runs with 15 degrees
# of freedom (noncentrality ~ 285) against a critical value of 44.3: it cannot pass by chance. The missing bonus
# token leaves the distribution exact and shows in tokens per call (z about -8).

RUNS = 1500


def _pair(seed):
    return sp.random_markov_pair(4, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_exact_step_is_lossless_on_random_pairs(seed):
    target, draft = _pair(seed)
    result = sp.lossless_test(target, draft, 3, RUNS, torch.Generator().manual_seed(100 + seed))
    assert result.p_value > 1e-4, result
    assert abs(result.tokens_per_call_z) < 4, result
    assert result.observed.sum() == RUNS


@pytest.mark.parametrize("name", [name for name in sp.STEP_VARIANTS if name != "exact"])
def test_every_wrong_variant_fails_the_same_test(name):
    target, draft = _pair(1)
    result = sp.lossless_test(target, draft, 3, RUNS, torch.Generator().manual_seed(101),
                              step=sp.STEP_VARIANTS[name])
    assert result.p_value < 1e-4 or abs(result.tokens_per_call_z) > 4, result
    if name == "no bonus token":  # exact in distribution, wasteful in calls
        assert result.p_value > 1e-4 and result.tokens_per_call_z < -4


def test_the_first_call_expectation_is_the_varying_alpha_formula_on_a_context_free_chain():
    target_row, draft_row = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64), torch.tensor(
        [0.2, 0.5, 0.3], dtype=torch.float64)
    alpha = float(sp.acceptance_rate(target_row, draft_row))  # 0.2 + 0.3 + 0.1 = 0.6
    exact = sp._expected_first_call(target_row.expand(3, 3), draft_row.expand(3, 3), 4, 0)
    assert exact == pytest.approx(sp.expected_tokens_per_call(alpha, 4))


def test_chi_square_p_value_at_known_critical_values():
    assert sp.chi_square_p_value(3.841458820694124, 1) == pytest.approx(0.05, abs=1e-9)
    assert sp.chi_square_p_value(44.26322, 15) == pytest.approx(1e-4, rel=1e-3)


def test_speculative_step_with_zero_draft_probability_is_never_accepted_wrongly():
    # a draft token the target cannot produce is always rejected; the residual then never picks it
    target, draft = torch.tensor([[0.0, 1.0], [0.5, 0.5]]), torch.tensor([[1.0, 0.0]])
    for seed in range(20):
        assert sp.speculative_step(target, draft, [0], torch.Generator().manual_seed(seed)) == (0, 1)


# ----- greedy speculative decoding is greedy decoding -----

def _toy_model(seed, vocab=7):
    table = torch.randn(vocab, vocab, vocab, generator=torch.Generator().manual_seed(seed))

    def next_logits(ids):
        previous = ids[-2] if len(ids) > 1 else 0
        return table[previous, ids[-1]]
    return next_logits


@pytest.mark.parametrize("gamma", [0, 1, 3, 6])
def test_greedy_speculative_equals_greedy_token_for_token(gamma):
    target, draft = _toy_model(1), _toy_model(2)
    plain, context = [], [3]
    for _ in range(25):
        plain.append(int(target(context + plain).argmax()))
    tokens, calls = sp.greedy_speculative_decode(target, draft, [3], 25, gamma)
    assert tokens == plain
    assert calls <= 25
    same, calls_same = sp.greedy_speculative_decode(target, target, [3], 25, gamma)
    assert same == plain and calls_same == math.ceil(25 / (gamma + 1))  # a perfect draft: gamma + 1 per call


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
