"""Whether a speculative round is lossless, by counting: toy Markov targets and drafts, a chi-square test, and the
wrong rounds it catches.

:func:`labkit.core.speculative.speculative_step` is distributed exactly as the target (Leviathan et al. 2023,
appendix A.1); :func:`lossless_test` checks that on a toy language model (a Markov chain: :func:`random_markov_pair`,
or :func:`context_free_pair` where every position has the same alpha) by running a round many times and comparing
the continuations' counts with the target chain's exact probabilities (Pearson chi-square,
:func:`chi_square_p_value`), and tokens per call with their exact expectation. :func:`round_as_step` runs a round
written with its uniforms passed in (lab 07's exercise) through the same test. Wrong variants met in the course's
readings and in learners' code are here too, by name (:data:`STEP_VARIANTS`), so the notebook and the tests can
show them failing it; :func:`sample_first_tokens` draws a round's first token on two fixed rows (lab 07 holds the
real model's first tokens against its target that way). Layer: core (pure math). Used by lab 07.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from labkit.core import validation
from labkit.core.speculative import (checked_probs, draw, residual_probs, speculative_round,
                                     speculative_step)

# ---------------------------------------------------------------------------------------------------------------
# A round written with its uniforms passed in, as a step; the wrong steps


RoundFunction = Callable[[torch.Tensor, torch.Tensor, Sequence[int], torch.Tensor], "list[int]"]


def round_as_step(round_function: RoundFunction) -> Callable[..., list[int]]:
    """A round written with its uniforms passed in (:func:`~labkit.core.speculative.speculative_round`'s
    signature), as a step :func:`lossless_test` can run: each call draws ``gamma + 1`` seeded uniforms and returns
    the emitted tokens.

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
    checked_probs("target_row", target_row), checked_probs("draft_row", draft_row)
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
    gamma = validation.integer("gamma", gamma, min=0)
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
# The first token of one-draft rounds on fixed rows (lab 07 runs it on the real model's two distributions)


def sample_first_tokens(target_probs: torch.Tensor, draft_probs: torch.Tensor, n_samples: int, seed: int,
                        step: StepFunction = speculative_step) -> torch.Tensor:
    """``n_samples`` first tokens from one-draft speculative rounds on fixed rows, ``[n_samples]`` (seeded).

    The first token a round emits is the accepted draft or the residual draw, so it depends only on these two
    rows; the bonus row is never reached with one draft unless it is accepted, and then the draft is the token.

    >>> sample_first_tokens(torch.tensor([0.0, 1.0]), torch.tensor([0.5, 0.5]), 4, seed=0).tolist()
    [1, 1, 1, 1]
    """
    generator = torch.Generator().manual_seed(seed)
    out = torch.empty(n_samples, dtype=torch.long)
    target_rows = torch.stack([target_probs, target_probs])  # the bonus row is not used for the first token
    draft_rows = draft_probs.unsqueeze(0)
    for i in range(n_samples):
        draft = draw(draft_probs, generator)
        n_accepted, token = step(target_rows, draft_rows, [draft], generator)
        out[i] = draft if n_accepted == 1 else token
    return out
