"""labkit.core.lossless: the exact step lossless by chi-square and every wrong variant failing the same seeded test,
the first call's exact expectation, the chi-square tail, the first tokens of one-draft rounds."""

import pytest
import torch

from labkit.core import lossless
from labkit.core.speculative import acceptance_rate
from labkit.core.speedup import expected_tokens_per_call

# Threshold: p < 1e-4 (chi-square) or |z| > 4 (tokens per call) fails. Power: on these tables the weakest wrong
# variant in distribution ("resample from the target") reaches chi-square about 300 at 1,500 runs with 15 degrees
# of freedom (noncentrality ~ 285) against a critical value of 44.3: it cannot pass by chance. The missing bonus
# token leaves the distribution exact and shows in tokens per call (z about -8).

RUNS = 1500


def _pair(seed):
    return lossless.random_markov_pair(4, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_exact_step_is_lossless_on_random_pairs(seed):
    target, draft = _pair(seed)
    result = lossless.lossless_test(target, draft, 3, RUNS, torch.Generator().manual_seed(100 + seed))
    assert result.p_value > 1e-4, result
    assert abs(result.tokens_per_call_z) < 4, result
    assert result.observed.sum() == RUNS


@pytest.mark.parametrize("name", [name for name in lossless.STEP_VARIANTS if name != "exact"])
def test_every_wrong_variant_fails_the_same_test(name):
    target, draft = _pair(1)
    result = lossless.lossless_test(target, draft, 3, RUNS, torch.Generator().manual_seed(101),
                              step=lossless.STEP_VARIANTS[name])
    assert result.p_value < 1e-4 or abs(result.tokens_per_call_z) > 4, result
    if name == "no bonus token":  # exact in distribution, wasteful in calls
        assert result.p_value > 1e-4 and result.tokens_per_call_z < -4


def test_the_first_call_expectation_is_the_varying_alpha_formula_on_a_context_free_chain():
    target_row, draft_row = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64), torch.tensor(
        [0.2, 0.5, 0.3], dtype=torch.float64)
    alpha = float(acceptance_rate(target_row, draft_row))  # 0.2 + 0.3 + 0.1 = 0.6
    exact = lossless._expected_first_call(target_row.expand(3, 3), draft_row.expand(3, 3), 4, 0)
    assert exact == pytest.approx(expected_tokens_per_call(alpha, 4))


def test_chi_square_p_value_at_known_critical_values():
    assert lossless.chi_square_p_value(3.841458820694124, 1) == pytest.approx(0.05, abs=1e-9)
    assert lossless.chi_square_p_value(44.26322, 15) == pytest.approx(1e-4, rel=1e-3)


def test_first_tokens_of_one_draft_rounds_follow_the_target():
    # The target puts all its mass on token 1: a draft of 0 is always rejected and the residual is token 1; a draft
    # of 1 is always accepted. Either way every first token is 1, for the exact step.
    target, draft = torch.tensor([0.0, 1.0], dtype=torch.float64), torch.tensor([0.5, 0.5], dtype=torch.float64)
    assert lossless.sample_first_tokens(target, draft, 50, seed=0).tolist() == [1] * 50
    # a step that accepts every draft leaves the draft's distribution: about half the tokens are 0
    wrong = lossless.sample_first_tokens(target, draft, 200, seed=0, step=lambda t, d, ids, g: (len(ids), 0))
    assert 50 < int((wrong == 0).sum()) < 150
    again = lossless.sample_first_tokens(target, draft, 200, seed=0, step=lambda t, d, ids, g: (len(ids), 0))
    assert torch.equal(wrong, again)  # seeded
