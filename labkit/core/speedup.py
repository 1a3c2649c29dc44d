"""What speculative decoding buys, as arithmetic: Leviathan et al.'s closed forms and a simulator of them.

For a per-token acceptance rate ``alpha`` that is the same at every position, Leviathan, Kalman and Matias (2023,
"Fast Inference from Transformers via Speculative Decoding", section 3) give:

* expected tokens per target call ``(1 - alpha**(gamma + 1)) / (1 - alpha)`` (``gamma + 1`` at ``alpha = 1``): the
  accepted drafts plus the one token the target always adds (the correction, or the *bonus* when all pass);
* walltime improvement ``(1 - alpha**(gamma + 1)) / ((1 - alpha) (gamma * c + 1))`` where ``c`` is the cost of one
  draft step over the cost of one target step;
* ``alpha = sum(min(target_probs, draft_probs))`` (:func:`labkit.core.speculative.acceptance_rate`).

Here: those closed forms and the popular formula's wrong ``alpha * gamma + 1`` beside them, the best draft length,
the break-even acceptance rate, a whole request as a stopwatch measures it, acceptance that varies by position, and
a seeded Monte Carlo of the acceptance process (:func:`simulate`) to hold them against. The rules of one round are
in :mod:`labkit.core.speculative`. Left out: tree drafts, batches whose rows accept different numbers of drafts, and
a verification cost above one target step in the paper's ratio (:func:`request_speedup` takes a measured one).
Layer: core (pure math). Used by lab 07.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from labkit.core import validation

# ---------------------------------------------------------------------------------------------------------------
# Closed forms (Leviathan et al. 2023, equations 1 and the walltime theorem 3.8)


def _alpha(alpha: float) -> float:
    return validation.real("alpha", alpha, min=0, max=1)


def _gamma(gamma: int) -> int:
    return validation.integer("gamma", gamma, min=0)


def _cost(cost_ratio: float) -> float:
    return validation.real("cost_ratio", cost_ratio, min=0, note="draft step time / target step time")


def expected_tokens_per_call(alpha: float, gamma: int) -> float:
    """Expected tokens produced by one target call with ``gamma`` drafts accepted at rate ``alpha`` each.

    ``(1 - alpha**(gamma + 1)) / (1 - alpha)``, and ``gamma + 1`` at ``alpha = 1`` (every draft and the bonus).

    >>> expected_tokens_per_call(0.5, 2)  # 1 + 1/2 + 1/4
    1.75
    >>> expected_tokens_per_call(1.0, 4), expected_tokens_per_call(0.0, 4)
    (5.0, 1.0)
    """
    alpha, gamma = _alpha(alpha), _gamma(gamma)
    if alpha == 1.0:
        return float(gamma + 1)
    if alpha == 0.0 or gamma == 0:  # no draft: the call yields its own token only
        return 1.0
    # 1 - alpha**n as -expm1(n log alpha): no cancellation when alpha is close to 1 (1 - alpha is exact there)
    return -math.expm1((gamma + 1) * math.log(alpha)) / (1.0 - alpha)


def popular_expected_tokens(alpha: float, gamma: int) -> float:
    """A popular formula's ``alpha * gamma + 1``: wrong, it ignores that drafts after a rejection are never examined.

    >>> popular_expected_tokens(0.7, 4)  # the paper's formula gives 2.7731
    3.8
    """
    return _alpha(alpha) * _gamma(gamma) + 1.0


def walltime_improvement(alpha: float, gamma: int, cost_ratio: float) -> float:
    """Expected speedup over plain decoding: tokens per call over the call's cost in target steps, ``gamma c + 1``.

    >>> round(walltime_improvement(0.7, 4, 0.1), 4)  # 2.77309 / 1.4
    1.9808
    >>> walltime_improvement(0.0, 3, 0.0)  # drafts that are never accepted cost nothing here, and win nothing
    1.0
    """
    gamma, cost_ratio = _gamma(gamma), _cost(cost_ratio)
    return expected_tokens_per_call(alpha, gamma) / (gamma * cost_ratio + 1.0)


def request_speedup(alpha: float, gamma: int, cost_ratio: float, n_tokens: int, *, verify_ratio: float = 1.0,
                    prefill_ratio: float = 0.0) -> float:
    """The closed form applied to a whole request, as a stopwatch measures it (all costs in decode steps).

    Leviathan et al.'s ratio is per decode step and assumes the target scores gamma + 1 tokens in the time of one.
    A measured request also pays the prefill (``prefill_ratio`` steps) on both sides, and on a CPU scoring
    gamma + 1 tokens takes longer than one step (``verify_ratio``: a measured verify pass / a measured step).
    Plain decoding: ``prefill + (n - 1)`` steps; speculative: ``prefill + (n - 1) / E[tokens per call]`` calls of
    ``gamma c + verify_ratio`` steps each.

    >>> round(request_speedup(0.7, 4, 0.1, 48), 4) == round(walltime_improvement(0.7, 4, 0.1), 4)  # no prefill
    True
    >>> round(request_speedup(1.0, 4, 0.0, 41, verify_ratio=1.6, prefill_ratio=3.0), 4)  # 43 / (3 + 40 / 5 x 1.6)
    2.7215
    """
    gamma, cost_ratio = _gamma(gamma), _cost(cost_ratio)
    n_tokens = validation.integer("n_tokens", n_tokens, min=1)
    verify_ratio = validation.real("verify_ratio", verify_ratio, min=0, min_open=True)
    prefill_ratio = validation.real("prefill_ratio", prefill_ratio, min=0)
    decode_steps = n_tokens - 1
    calls = decode_steps / expected_tokens_per_call(alpha, gamma)
    return (prefill_ratio + decode_steps) / (prefill_ratio + calls * (gamma * cost_ratio + verify_ratio))


def popular_speedup(alpha: float, gamma: int, cost_ratio: float) -> float:
    """The popular formula's speedup (an ``analyze_speedup`` in the course's readings): the same cost, with the
    wrong ``alpha * gamma + 1`` tokens per call.

    >>> round(popular_speedup(0.7, 4, 0.1), 4)  # 3.8 / 1.4
    2.7143
    """
    return popular_expected_tokens(alpha, gamma) / (_gamma(gamma) * _cost(cost_ratio) + 1.0)


def optimal_gamma(alpha: float, cost_ratio: float, max_gamma: int = 64) -> int:
    """The draft length with the largest walltime improvement (0: do not speculate); the smallest on a tie.

    >>> optimal_gamma(0.7, 0.1), optimal_gamma(0.1, 0.5), optimal_gamma(1.0, 0.0, max_gamma=8)
    (4, 0, 8)
    """
    alpha, cost_ratio = _alpha(alpha), _cost(cost_ratio)
    max_gamma = validation.integer("max_gamma", max_gamma, min=0)
    improvements = [walltime_improvement(alpha, gamma, cost_ratio) for gamma in range(max_gamma + 1)]
    return max(range(max_gamma + 1), key=lambda gamma: (improvements[gamma], -gamma))


def break_even_alpha(gamma: int, cost_ratio: float) -> float:
    """The acceptance rate at which ``gamma`` drafts of relative cost ``cost_ratio`` exactly pay for themselves.

    The improvement grows with alpha, so bisection finds the root of ``improvement = 1`` (1 when even alpha = 1
    does not pay; 0 when drafts are free). At ``gamma = 1`` it is ``cost_ratio`` itself, the popular rule.

    >>> break_even_alpha(1, 0.1)
    0.1
    >>> round(break_even_alpha(4, 0.1), 4)  # alpha + alpha**2 + alpha**3 + alpha**4 = 0.4
    0.2871
    """
    gamma, cost_ratio = _gamma(gamma), _cost(cost_ratio)
    if gamma == 0 or cost_ratio == 0:
        return 0.0
    if walltime_improvement(1.0, gamma, cost_ratio) <= 1.0:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(60):  # 2**-60: below float64 resolution at 1
        middle = (low + high) / 2
        low, high = (middle, high) if walltime_improvement(middle, gamma, cost_ratio) < 1.0 else (low, middle)
    return round(high, 12)


def expected_tokens_varying(alphas: Sequence[float]) -> float:
    """Expected tokens per call when draft position ``i`` is accepted with probability ``alphas[i]`` (given the
    earlier ones were): ``1 + a1 + a1 a2 + ... + a1 ... a_gamma``. Equal to the closed form for equal alphas.

    >>> expected_tokens_varying([0.5, 0.5]), expected_tokens_varying([0.9, 0.5, 0.0])
    (1.75, 2.35)
    """
    total, survive = 1.0, 1.0
    for position, alpha in enumerate(alphas):
        survive *= validation.real(f"alphas[{position}]", alpha, min=0, max=1)
        total += survive
    return total


# ---------------------------------------------------------------------------------------------------------------
# The acceptance process, simulated


@dataclass(frozen=True)
class Simulation:
    """Seeded Monte Carlo of the acceptance process: one row per target call."""

    accepted: torch.Tensor  # [n_calls] int: drafts accepted in each call (0..gamma)
    gamma: int

    @property
    def tokens(self) -> torch.Tensor:
        """Tokens each call produced: the accepted drafts plus one (correction or bonus), ``[n_calls]``."""
        return self.accepted + 1

    @property
    def mean_tokens(self) -> float:
        return float(self.tokens.double().mean())

    @property
    def standard_error(self) -> float:
        """Standard error of :attr:`mean_tokens` (sample standard deviation over the square root of the calls)."""
        n = self.tokens.numel()
        return float(self.tokens.double().std() / math.sqrt(n)) if n > 1 else math.inf


def simulate(alpha: float | Sequence[float], gamma: int, n_calls: int, generator: torch.Generator) -> Simulation:
    """Simulate ``n_calls`` target calls: draft ``i`` passes with probability ``alpha`` (or ``alpha[i]``, by
    position), and the first failure ends the call.

    >>> sim = simulate(1.0, 3, 5, torch.Generator().manual_seed(0))
    >>> sim.accepted.tolist(), sim.mean_tokens
    ([3, 3, 3, 3, 3], 4.0)
    """
    gamma = _gamma(gamma)
    n_calls = validation.integer("n_calls", n_calls, min=1)
    validation.instance("generator", generator, torch.Generator, "a torch.Generator (seed it with manual_seed)")
    if isinstance(alpha, (int, float)) and not isinstance(alpha, bool):
        alphas = [_alpha(alpha)] * gamma
    else:
        alphas = [validation.real(f"alpha[{i}]", a, min=0, max=1) for i, a in enumerate(alpha)]
        if len(alphas) != gamma:
            raise ValueError(f"alpha must be one number or gamma = {gamma} numbers, got {len(alphas)} numbers")
    uniforms = torch.rand(n_calls, gamma, generator=generator, dtype=torch.float64)
    passed = uniforms < torch.tensor(alphas, dtype=torch.float64)  # [n_calls, gamma]
    accepted = passed.long().cumprod(dim=1).sum(dim=1)  # drafts before the first failure
    return Simulation(accepted, gamma)
