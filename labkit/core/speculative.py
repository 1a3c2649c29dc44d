"""Speculative decoding as arithmetic: the closed forms, a simulator, the exact sampling step, greedy acceptance.

A cheap *draft* proposes ``gamma`` tokens; the *target* scores all of them in one pass and keeps a prefix. Leviathan,
Kalman and Matias (2023, "Fast Inference from Transformers via Speculative Decoding", section 3) give, for a
per-token acceptance rate ``alpha`` that is the same at every position:

* expected tokens per target call ``(1 - alpha**(gamma + 1)) / (1 - alpha)`` (``gamma + 1`` at ``alpha = 1``): the
  accepted drafts plus the one token the target always adds (the correction, or the *bonus* when all pass);
* walltime improvement ``(1 - alpha**(gamma + 1)) / ((1 - alpha) (gamma * c + 1))`` where ``c`` is the cost of one
  draft step over the cost of one target step;
* ``alpha = sum(min(target_probs, draft_probs)) = 1 - total variation`` between the two next-token distributions.

Names: the paper writes the target as ``p`` and the draft as ``q``; Chen et al. (2023, "Accelerating Large Language
Model Decoding with Speculative Sampling") swap them. labkit never uses either letter: ``target_probs`` and
``draft_probs``.

The sampling step (:func:`speculative_step`) accepts draft token ``x`` with probability
``min(1, target_probs[x] / draft_probs[x])``; at the first rejection it draws from the residual
``normalize(max(0, target_probs - draft_probs))``; when every draft passes it draws the bonus token from the target's
next row. Its output is distributed exactly as the target's (Leviathan et al., appendix A.1); :func:`lossless_test`
checks that by counting. :func:`speculative_round` is the same round with its random numbers passed in (lab 07's
exercise; :func:`round_as_step` runs such a round through the counting test). Greedy acceptance
(:func:`greedy_accept`) keeps drafts while they equal the target's argmax, so greedy speculative decoding is greedy
decoding, token for token.

Wrong variants met in the course's readings and in learners' code are here too, by name (:data:`STEP_VARIANTS`), so the
notebook and the tests can show them failing the same test. Left out: tree drafts (several branches per call),
batches whose rows accept different numbers of drafts, and a verification cost above one target step (the runtime
measures it). Used by lab 07.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

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
# alpha from two distributions


def _probs(name: str, probs: torch.Tensor) -> torch.Tensor:
    validation.tensor(name, probs, kind="float", shape="[..., vocab]", nonempty=True)
    if bool((probs < 0).any()) or not bool(torch.isfinite(probs).all()):
        raise validation.fail(ValueError, name, "finite probabilities >= 0", probs)
    return probs


def acceptance_rate(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """alpha for one position: ``sum(min(target_probs, draft_probs))`` over the last axis, ``[...]``.

    >>> acceptance_rate(torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.25, 0.25, 0.5]))
    tensor(0.5000)
    """
    return torch.minimum(_probs("target_probs", target_probs), _probs("draft_probs", draft_probs)).sum(-1)


def total_variation(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """Half the L1 distance over the last axis; ``1 - acceptance_rate`` for two distributions.

    >>> total_variation(torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.25, 0.25, 0.5]))
    tensor(0.5000)
    """
    return 0.5 * (_probs("target_probs", target_probs) - _probs("draft_probs", draft_probs)).abs().sum(-1)


def residual_probs(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """Where a rejected draft sends the sample: ``normalize(max(0, target_probs - draft_probs))``.

    When the two are equal there is nothing left (and no draft is ever rejected); the target is returned then.

    >>> residual_probs(torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.25, 0.25, 0.5]))
    tensor([0.5000, 0.5000, 0.0000])
    """
    excess = (_probs("target_probs", target_probs) - _probs("draft_probs", draft_probs)).clamp(min=0)
    mass = excess.sum(-1, keepdim=True)
    return torch.where(mass > 0, excess / mass.clamp(min=torch.finfo(excess.dtype).tiny), target_probs)


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


# ---------------------------------------------------------------------------------------------------------------
# The exact speculative sampling step, and the wrong ones


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


RoundFunction = Callable[[torch.Tensor, torch.Tensor, Sequence[int], torch.Tensor], "list[int]"]


def round_as_step(round_function: RoundFunction) -> Callable[..., list[int]]:
    """A round written with its uniforms passed in (:func:`speculative_round`'s signature), as a step
    :func:`lossless_test` can run: each call draws ``gamma + 1`` seeded uniforms and returns the emitted tokens.

    >>> step = round_as_step(speculative_round)
    >>> target = torch.tensor([[0.0, 1.0], [0.0, 1.0]], dtype=torch.float64)
    >>> step(target, torch.tensor([[0.5, 0.5]], dtype=torch.float64), [0], torch.Generator().manual_seed(0))
    [1]
    """
    def step(target_probs, draft_probs, draft_ids, generator):
        uniforms = torch.rand(len(draft_ids) + 1, generator=generator, dtype=torch.float64)
        return [int(token) for token in round_function(target_probs, draft_probs, list(draft_ids), uniforms)]

    return step


def _step_no_bonus(target_probs, draft_probs, draft_ids, generator):
    """The readings' decoder: when every draft passes, no bonus token (still exact in distribution, but slower)."""
    n, token = speculative_step(target_probs, draft_probs, draft_ids, generator)
    return (n, None) if n == len(draft_ids) else (n, token)


def _step_resample_target(target_probs, draft_probs, draft_ids, generator):
    """Accept correctly, but draw a rejected position from the target itself rather than the residual."""
    for position, token in enumerate(draft_ids):
        ratio = float(target_probs[position, token]) / float(draft_probs[position, token])
        if float(torch.rand((), generator=generator, dtype=torch.float64)) >= min(1.0, ratio):
            return position, draw(target_probs[position], generator)
    return len(draft_ids), draw(target_probs[len(draft_ids)], generator)


def _step_absolute_residual(target_probs, draft_probs, draft_ids, generator):
    """No max(0, .): the residual taken as |target - draft| (what one writes to make it non-negative)."""
    for position, token in enumerate(draft_ids):
        ratio = float(target_probs[position, token]) / float(draft_probs[position, token])
        if float(torch.rand((), generator=generator, dtype=torch.float64)) >= min(1.0, ratio):
            return position, draw((target_probs[position] - draft_probs[position]).abs(), generator)
    return len(draft_ids), draw(target_probs[len(draft_ids)], generator)


def _step_accept_if_greater(target_probs, draft_probs, draft_ids, generator):
    """The readings' interview answer: accept where p_target >= p_draft, with no random draw."""
    for position, token in enumerate(draft_ids):
        if float(target_probs[position, token]) < float(draft_probs[position, token]):
            return position, draw(residual_probs(target_probs[position], draft_probs[position]), generator)
    return len(draft_ids), draw(target_probs[len(draft_ids)], generator)


def _step_inverted_ratio(target_probs, draft_probs, draft_ids, generator):
    """The ratio upside down: accept with min(1, p_draft / p_target)."""
    for position, token in enumerate(draft_ids):
        target_p, draft_p = float(target_probs[position, token]), float(draft_probs[position, token])
        if float(torch.rand((), generator=generator, dtype=torch.float64)) * target_p >= draft_p:
            return position, draw(residual_probs(target_probs[position], draft_probs[position]), generator)
    return len(draft_ids), draw(target_probs[len(draft_ids)], generator)


StepFunction = Callable[[torch.Tensor, torch.Tensor, Sequence[int], torch.Generator], "tuple[int, int | None]"]

STEP_VARIANTS: dict[str, StepFunction] = {
    "exact": speculative_step,
    "no bonus token": _step_no_bonus,
    "resample from the target": _step_resample_target,
    "no max(0, .): |target - draft|": _step_absolute_residual,
    "accept where p_target >= p_draft": _step_accept_if_greater,
    "ratio upside down": _step_inverted_ratio,
}


# ---------------------------------------------------------------------------------------------------------------
# A toy language model (a Markov chain) to test a step against: lossless or not, by counting


def random_markov_pair(vocab: int, generator: torch.Generator, sharpness: float = 1.5
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """A random target and draft next-token table, each ``[vocab, vocab]`` float64 (row = previous token):
    softmax of seeded normal scores times ``sharpness`` (larger: more peaked rows)."""
    vocab = validation.integer("vocab", vocab, min=2)
    sharpness = validation.real("sharpness", sharpness, min=0)
    scores = torch.randn(2, vocab, vocab, generator=generator, dtype=torch.float64) * sharpness
    target_table, draft_table = torch.softmax(scores, dim=-1)
    return target_table, draft_table


def context_free_pair(target_row: torch.Tensor, draft_row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft tables ``[vocab, vocab]`` float64 whose every row is the same distribution: each draft
    position is then accepted with the same ``alpha = acceptance_rate(target_row, draft_row)``, the closed form's
    setting, so a round's measured tokens per call can be held against ``expected_tokens_per_call``.

    >>> target, draft = context_free_pair(torch.tensor([0.5, 0.5]), torch.tensor([0.25, 0.75]))
    >>> target.tolist(), draft.tolist()
    ([[0.5, 0.5], [0.5, 0.5]], [[0.25, 0.75], [0.25, 0.75]])
    """
    _probs("target_row", target_row), _probs("draft_row", draft_row)
    if target_row.dim() != 1 or target_row.shape != draft_row.shape:
        raise ValueError(f"target_row and draft_row must be two [vocab] tensors of the same length, got shapes "
                         f"{tuple(target_row.shape)} and {tuple(draft_row.shape)}")
    vocab = target_row.shape[0]
    return (target_row.double().expand(vocab, vocab).clone(), draft_row.double().expand(vocab, vocab).clone())


@dataclass(frozen=True)
class LosslessTest:
    """Counts of the first ``n_tokens`` tokens speculative decoding produced from one start, against the target."""

    observed: torch.Tensor  # [vocab ** n_tokens] counts of each continuation
    expected: torch.Tensor  # [vocab ** n_tokens] n_runs x its probability under the target
    chi_square: float
    degrees_of_freedom: int
    p_value: float
    tokens_per_call: float  # measured
    expected_tokens_per_call: float  # exact, for these tables (by the varying-alpha formula along the chain)
    tokens_per_call_z: float  # (measured - exact) / standard error


def chi_square_p_value(chi_square: float, degrees_of_freedom: int) -> float:
    """Upper tail of the chi-square distribution (regularized upper incomplete gamma; no scipy needed).

    >>> round(chi_square_p_value(3.841458820694124, 1), 6)  # the 5 % critical value at one degree of freedom
    0.05
    """
    return float(torch.special.gammaincc(torch.tensor(degrees_of_freedom / 2, dtype=torch.float64),
                                         torch.tensor(chi_square / 2, dtype=torch.float64)))


def lossless_test(target_table: torch.Tensor, draft_table: torch.Tensor, gamma: int, n_runs: int,
                  generator: torch.Generator, *, step: StepFunction = speculative_step, start: int = 0,
                  n_tokens: int = 2) -> LosslessTest:
    """Run speculative decoding ``n_runs`` times from token ``start`` until ``n_tokens`` tokens exist, and compare
    the continuations' counts with the target chain's exact probabilities (Pearson chi-square).

    Also counts tokens per target call in each run's first call, against the exact expectation for these tables,
    so a step that is lossless but wastes tokens (no bonus) shows up too. ``step`` returns ``(drafts accepted,
    the added token or None)`` like :func:`speculative_step`, or the list of emitted tokens (:func:`round_as_step`).
    """
    vocab = target_table.shape[0]
    gamma = _gamma(gamma)
    n_runs = validation.integer("n_runs", n_runs, min=1)
    counts = torch.zeros(vocab ** n_tokens, dtype=torch.float64)
    first_call_tokens = torch.zeros(n_runs, dtype=torch.float64)
    for run in range(n_runs):
        produced: list[int] = []
        first = True
        while len(produced) < n_tokens:
            context = produced[-1] if produced else start
            draft_ids, draft_rows = [], []
            for _ in range(gamma):  # the draft proposes, feeding itself
                row = draft_table[context]
                token = draw(row, generator)
                draft_ids.append(token)
                draft_rows.append(row)
                context = token
            chain = [produced[-1] if produced else start, *draft_ids]
            target_rows = target_table[torch.tensor(chain)]  # [gamma + 1, vocab]
            draft_probs = torch.stack(draft_rows) if draft_rows else torch.empty(0, vocab, dtype=target_table.dtype)
            result = step(target_rows, draft_probs, draft_ids, generator)
            if isinstance(result, list):  # a round that returns the tokens it emits (round_as_step)
                new = result
            else:
                n_accepted, extra = result
                new = draft_ids[:n_accepted] + ([] if extra is None else [extra])
            if not new:
                raise ValueError("a speculative round emitted no token: every round must add at least one")
            if first:
                first_call_tokens[run] = len(new)
                first = False
            produced.extend(new)
        index = 0
        for token in produced[:n_tokens]:
            index = index * vocab + token
        counts[index] += 1
    # exact probabilities of each continuation under the target chain
    probs = target_table[start]
    for _ in range(n_tokens - 1):
        probs = (probs.unsqueeze(-1) * target_table[torch.arange(probs.numel()) % vocab]).flatten()
    expected = probs * n_runs
    keep = expected > 0
    chi_square = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    dof = int(keep.sum()) - 1
    # exact tokens per first call: position i's acceptance chance given the path so far, averaged over the draft
    exact = _expected_first_call(target_table, draft_table, gamma, start)
    se = float(first_call_tokens.std() / math.sqrt(n_runs)) if n_runs > 1 else math.inf
    measured = float(first_call_tokens.mean())
    # With no spread (every run's first call made the same count) the z-score is 0 or infinite; the exact value is
    # a float64 sum of products, so it is compared within rounding, not bit for bit.
    z = (measured - exact) / se if se > 0 else (0.0 if math.isclose(measured, exact, rel_tol=1e-9) else math.inf)
    return LosslessTest(counts, expected, chi_square, dof, chi_square_p_value(chi_square, dof),
                        float(first_call_tokens.mean()), exact, z)


def _expected_first_call(target_table, draft_table, gamma, start) -> float:
    """Expected tokens of one exact call with a Markov target and draft: 1 + sum over k of P(first k accepted).

    A step that skips the bonus token falls short of this by P(all accepted).
    """
    vocab = target_table.shape[0]
    # state: probability of (still accepting, current context) after i drafts
    alive = torch.zeros(vocab, dtype=torch.float64)
    alive[start] = 1.0
    total = 1.0
    for _ in range(gamma):
        # from context c, draft x ~ draft[c], accepted with min(1, target[c,x]/draft[c,x]): joint min(target, draft)
        alive = alive @ torch.minimum(target_table, draft_table)
        total += float(alive.sum())
    return total


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
    max_new_tokens, gamma = validation.integer("max_new_tokens", max_new_tokens, min=0), _gamma(gamma)
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
