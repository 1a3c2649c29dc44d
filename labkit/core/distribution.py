"""Measures of a next-token distribution and of what the filters left of it (layer 1, core).

:mod:`labkit.core.sampling` turns logits into the distribution a sampler draws from; this module says what that
distribution is like: how many tokens a filter left possible (:func:`kept_count`) and the probability they held
before it (:func:`kept_mass`), how spread out it is (:func:`entropy_bits`), and how far a greedy choice lies from
a tie (:func:`choice_margin`, with :data:`CLEAR_MARGIN`, the margin no float-order difference between two paths
can overturn).

Used by lab 01 (the sampling explorer's numbers, the tokens a setting keeps) and by every lab that compares the
greedy tokens of two paths (``labkit.runtime.generation.greedy_margins``).
"""

from __future__ import annotations

import math

import torch

from labkit.core import validation


def kept_count(filtered_logits: torch.Tensor) -> torch.Tensor:
    """How many tokens a filter left possible in each row (entries above ``-inf``).

    >>> kept_count(torch.tensor([[0.0, -math.inf, 1.0], [2.0, 3.0, 4.0]]))
    tensor([2, 3])
    """
    return (filtered_logits > -math.inf).sum(dim=-1)


def kept_mass(logits: torch.Tensor, filtered_logits: torch.Tensor) -> torch.Tensor:
    """Probability mass, under ``softmax(logits)`` in float64, of the tokens ``filtered_logits`` kept.

    >>> from labkit.core.sampling import top_p_filter
    >>> logits = torch.tensor([8.0, 4.0, 2.0, 1.0]).log()
    >>> round(kept_mass(logits, top_p_filter(logits, 0.75)).item(), 6)  # 12 / 15
    0.8
    """
    probs = torch.softmax(logits.double(), dim=-1)
    return (probs * (filtered_logits > -math.inf)).sum(dim=-1)


# Two paths that compute the same logits in another order (a copy of the weights, a cache, a batch, another CPU)
# differ in the last float32 bits: on the embedded model by under 1e-3 in a logit (tests/test_runtime_forward.py). A
# greedy choice made with a margin at least ten times that cannot flip between them.
CLEAR_MARGIN = 1e-2


def choice_margin(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """How far the chosen token's logit lies above the best other token's: ``[...]`` for logits ``[..., vocab]``.

    Positive where the chosen token is the unique argmax (a greedy choice), and its size says how much float noise
    the choice survives; zero at a tie, negative where another token scored higher.

    >>> choice_margin(torch.tensor([[1.0, 3.0, 2.5], [4.0, 4.0, 0.0]]), torch.tensor([1, 0]))
    tensor([0.5000, 0.0000])
    """
    validation.tensor("logits", logits, kind="float", shape="[..., vocab]", nonempty=True)
    validation.tensor("token_ids", token_ids, kind="int")
    if logits.shape[-1] < 2 or token_ids.shape != logits.shape[:-1]:
        raise validation.fail(ValueError, "token_ids", f"one id per row of logits {tuple(logits.shape)} (shape "
                              f"{tuple(logits.shape[:-1])}), with at least two tokens to compare",
                              tuple(token_ids.shape))
    chosen = logits.gather(-1, token_ids.unsqueeze(-1))  # [..., 1]
    others = logits.scatter(-1, token_ids.unsqueeze(-1), -math.inf)
    return (chosen - others.amax(dim=-1, keepdim=True)).squeeze(-1)


def entropy_bits(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy ``-sum p log2 p`` of each row, in bits (zero-probability entries add nothing).

    >>> entropy_bits(torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]))
    tensor([1., 0.])
    """
    probs64 = probs.double()
    terms = torch.where(probs64 > 0, -probs64 * probs64.clamp_min(1e-300).log2(), torch.zeros_like(probs64))
    return terms.sum(dim=-1).to(probs.dtype)
