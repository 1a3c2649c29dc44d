"""labkit.core.speculative: alpha, total variation and the residual by hand and as properties, the exact step on a
draft the target cannot produce, greedy speculation equal to greedy."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.core import speculative as sp


def test_alpha_is_one_minus_total_variation_by_hand():
    target, draft = torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.25, 0.25, 0.5])
    assert float(sp.acceptance_rate(target, draft)) == 0.5
    assert float(sp.total_variation(target, draft)) == 0.5
    assert sp.residual_probs(target, draft).tolist() == [0.5, 0.5, 0.0]
    assert sp.residual_probs(target, target).tolist() == target.tolist()  # nothing left: never used


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
