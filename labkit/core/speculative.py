"""One round of speculative decoding, as rules on two distributions: what is accepted, what is drawn instead.

A cheap *draft* proposes ``gamma`` tokens; the *target* scores all of them in one pass and keeps a prefix. Per
position, the draft's token ``x`` is accepted with probability ``min(1, target_probs[x] / draft_probs[x])``; at the
first rejection the target's own token is drawn from the residual ``normalize(max(0, target_probs - draft_probs))``;
when every draft passes, the *bonus* token is drawn from the target's next row (Leviathan, Kalman and Matias 2023,
"Fast Inference from Transformers via Speculative Decoding", section 2.3 and appendix A.1: the output is
distributed exactly as the target's). A position is accepted with probability ``alpha = sum(min(target_probs,
draft_probs)) = 1 - total variation`` between the two next-token distributions.

Names: the paper writes the target as ``p`` and the draft as ``q``; Chen et al. (2023, "Accelerating Large Language
Model Decoding with Speculative Sampling") swap them. labkit never uses either letter: ``target_probs`` and
``draft_probs``.

Here: alpha, total variation and the residual (:func:`acceptance_rate`, :func:`total_variation`,
:func:`residual_probs`); drawing a token (:func:`draw`, and :func:`draw_with_uniform` with its uniform passed in);
the sampling round (:func:`speculative_step` with a generator, :func:`speculative_round` with its random numbers
passed in: lab 07's exercise); greedy acceptance (:func:`greedy_accept`: keep drafts while they equal the target's
argmax, so greedy speculative decoding is greedy decoding, token for token) and a greedy decoder over toy models.
What a round yields on average is in :mod:`labkit.core.speedup`; the counting test that a round is lossless, and
the wrong rounds it catches, in :mod:`labkit.core.lossless`; the real model's drafters and loop in
:mod:`labkit.runtime.speculative`. Left out: tree drafts (several branches per call), batches whose rows accept
different numbers of drafts. Layer: core (pure math). Used by lab 07 (and lab 00's sampling exercise).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from labkit.core import validation

# ---------------------------------------------------------------------------------------------------------------
# alpha from two distributions


def checked_probs(name: str, probs: torch.Tensor) -> torch.Tensor:
    """``probs`` (``[..., vocab]`` float) when its entries are finite and >= 0; else a ValueError naming ``name``.

    >>> checked_probs("draft_probs", torch.tensor([0.5, 0.5]))
    tensor([0.5000, 0.5000])
    """
    validation.tensor(name, probs, kind="float", shape="[..., vocab]", nonempty=True)
    if bool((probs < 0).any()) or not bool(torch.isfinite(probs).all()):
        raise validation.fail(ValueError, name, "finite probabilities >= 0", probs)
    return probs


def acceptance_rate(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """alpha for one position: ``sum(min(target_probs, draft_probs))`` over the last axis, ``[...]``.

    >>> acceptance_rate(torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.25, 0.25, 0.5]))
    tensor(0.5000)
    """
    target_probs, draft_probs = checked_probs("target_probs", target_probs), checked_probs("draft_probs", draft_probs)
    return torch.minimum(target_probs, draft_probs).sum(-1)


def total_variation(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """Half the L1 distance over the last axis; ``1 - acceptance_rate`` for two distributions.

    >>> total_variation(torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.25, 0.25, 0.5]))
    tensor(0.5000)
    """
    target_probs, draft_probs = checked_probs("target_probs", target_probs), checked_probs("draft_probs", draft_probs)
    return 0.5 * (target_probs - draft_probs).abs().sum(-1)


def residual_probs(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """Where a rejected draft sends the sample: ``normalize(max(0, target_probs - draft_probs))``.

    When the two are equal there is nothing left (and no draft is ever rejected); the target is returned then.

    >>> residual_probs(torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.25, 0.25, 0.5]))
    tensor([0.5000, 0.5000, 0.0000])
    """
    target_probs, draft_probs = checked_probs("target_probs", target_probs), checked_probs("draft_probs", draft_probs)
    excess = (target_probs - draft_probs).clamp(min=0)
    mass = excess.sum(-1, keepdim=True)
    return torch.where(mass > 0, excess / mass.clamp(min=torch.finfo(excess.dtype).tiny), target_probs)


# ---------------------------------------------------------------------------------------------------------------
# The exact speculative sampling round


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from ``probs`` ``[vocab]`` (need not sum to one) by inverting the cumulative sum: exact, and
    about 25x faster than ``torch.multinomial`` over a 49,152-token vocabulary. A zero entry is never drawn."""
    cumulative = probs.double().cumsum(0)
    point = torch.rand(1, generator=generator, dtype=torch.float64) * cumulative[-1]
    return min(int(torch.searchsorted(cumulative, point, right=True)), probs.shape[0] - 1)


def speculative_step(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_ids: Sequence[int],
                     generator: torch.Generator) -> tuple[int, int]:
    """One round of speculative sampling: ``(drafts accepted, the token the target adds)``.

    ``target_probs`` is ``[gamma + 1, vocab]`` (row ``i`` judges draft ``i``; the last row is the bonus row),
    ``draft_probs`` is ``[gamma, vocab]``, ``draft_ids`` the ``gamma`` drafted tokens (drawn from ``draft_probs``).

    >>> target = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    >>> speculative_step(target, torch.tensor([[0.5, 0.5]]), [0], torch.Generator().manual_seed(0))
    (0, 1)
    """
    for position, token in enumerate(draft_ids):
        target_p, draft_p = float(target_probs[position, token]), float(draft_probs[position, token])
        uniform = float(torch.rand((), generator=generator, dtype=torch.float64))
        if uniform * draft_p >= target_p:  # rejected: u >= target/draft, written without dividing by zero
            return position, draw(residual_probs(target_probs[position], draft_probs[position]), generator)
    return len(draft_ids), draw(target_probs[len(draft_ids)], generator)  # every draft passed: the bonus token


def draw_with_uniform(probs: torch.Tensor, uniform: float | torch.Tensor) -> int:
    """The token a number ``uniform`` in [0, 1) picks from ``probs`` ``[vocab]`` (need not sum to one): the first
    token whose cumulative share of the total exceeds it (inverse-CDF sampling). A zero entry is never picked.

    >>> probs = torch.tensor([0.5, 0.0, 0.5], dtype=torch.float64)
    >>> draw_with_uniform(probs, 0.25), draw_with_uniform(probs, 0.5), draw_with_uniform(2 * probs, 0.75)
    (0, 2, 2)
    """
    cumulative = probs.double().cumsum(0)
    point = torch.tensor([float(uniform)], dtype=torch.float64) * cumulative[-1]
    return min(int(torch.searchsorted(cumulative, point, right=True)[0]), probs.shape[0] - 1)


def speculative_round(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_ids: Sequence[int],
                      uniforms: torch.Tensor) -> list[int]:
    """One round of speculative sampling with its random numbers passed in: the tokens it emits, in order.

    ``target_probs`` ``[gamma + 1, vocab]``, ``draft_probs`` ``[gamma, vocab]``, ``draft_ids`` the ``gamma`` drafted
    tokens, ``uniforms`` ``[gamma + 1]`` numbers in [0, 1). ``uniforms[i]`` judges draft ``i`` (accepted when
    ``uniforms[i] < target_probs[i, x] / draft_probs[i, x]``, strictly); ``uniforms[gamma]`` picks the target's own
    token with :func:`draw_with_uniform`: from the residual at the first rejection, from the bonus row
    ``target_probs[gamma]`` when every draft passes. The same rule as :func:`speculative_step`, made deterministic.

    >>> target = torch.tensor([[0.0, 1.0], [0.3, 0.7]], dtype=torch.float64)
    >>> draft = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    >>> speculative_round(target, draft, [0], torch.tensor([0.1, 0.2])), speculative_round(
    ...     target, draft, [1], torch.tensor([0.1, 0.2]))
    ([1], [1, 0])
    """
    gamma = len(draft_ids)
    for position, token in enumerate(draft_ids):
        target_p, draft_p = float(target_probs[position, token]), float(draft_probs[position, token])
        if float(uniforms[position]) * draft_p >= target_p:  # rejected: u >= target/draft, without dividing
            residual = residual_probs(target_probs[position], draft_probs[position])
            return [int(token) for token in draft_ids[:position]] + [draw_with_uniform(residual, uniforms[gamma])]
    return [int(token) for token in draft_ids] + [draw_with_uniform(target_probs[gamma], uniforms[gamma])]


# ---------------------------------------------------------------------------------------------------------------
# Greedy


def greedy_accept(target_logits: torch.Tensor, draft_ids: Sequence[int]) -> tuple[int, int]:
    """Greedy verification: keep drafts while each equals the target's argmax; ``(accepted, next token)``.

    ``target_logits`` is ``[k + 1, vocab]`` (row ``i`` after draft ``i``, as ``runtime.verify`` returns). The next
    token is the target's argmax at the first mismatch (or the bonus row), so the output equals greedy decoding.

    >>> logits = torch.tensor([[0.0, 5.0], [5.0, 0.0], [0.0, 5.0]])
    >>> greedy_accept(logits, [1, 1])  # draft 1 matches, draft 2 (1) is not the argmax (0)
    (1, 0)
    >>> greedy_accept(logits, [1, 0])  # both match: the bonus row's argmax is added
    (2, 1)
    """
    choices = target_logits.argmax(dim=-1).tolist()  # [k + 1]
    for position, token in enumerate(draft_ids):
        if int(token) != choices[position]:
            return position, choices[position]
    return len(draft_ids), choices[len(draft_ids)]


def greedy_speculative_decode(target_next: Callable[[Sequence[int]], torch.Tensor],
                              draft_next: Callable[[Sequence[int]], torch.Tensor], prompt: Sequence[int],
                              max_new_tokens: int, gamma: int) -> tuple[list[int], int]:
    """Greedy speculative decoding with two functions from a context to next-token logits (toy models for the
    tests and the notebook; the runtime runs the real model). Returns (new tokens, target calls).

    >>> table = torch.eye(3).roll(1, dims=1)  # token t is always followed by t + 1 (mod 3)
    >>> greedy_speculative_decode(lambda ids: table[ids[-1]], lambda ids: table[ids[-1]], [0], 5, 2)
    ([1, 2, 0, 1, 2], 2)
    """
    max_new_tokens = validation.integer("max_new_tokens", max_new_tokens, min=0)
    gamma = validation.integer("gamma", gamma, min=0)
    context, new, calls = list(prompt), [], 0
    while len(new) < max_new_tokens:
        drafts: list[int] = []
        for _ in range(gamma):
            drafts.append(int(draft_next(context + drafts).argmax()))
        rows = torch.stack([target_next(context + drafts[:i]) for i in range(gamma + 1)])  # one "call" in a model
        calls += 1
        n_accepted, token = greedy_accept(rows, drafts)
        step = drafts[:n_accepted] + [token]
        context += step
        new += step
    return new[:max_new_tokens], calls
