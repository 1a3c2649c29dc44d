"""Lab 07's exercises: expected tokens per target call, the speculative acceptance step, and a prediction of the
best draft length. The bug zoos hold the seed course's formula and decoder and the rules learners write.

Each exercise's task text in ``notebooks/solutions/07_speculative_decoding.ipynb`` states the rules used here.
"""

from __future__ import annotations

import torch

from labkit.core import speculative as sp
from labkit.exercises import register
from labkit.exercises.checking import Case, Exercise, Mistake, prediction

# --------------------------------------------------------------------------------------------------------------
# 07.expected_tokens


def _expected_case(generator: torch.Generator) -> Case:
    draw = float(torch.rand(1, generator=generator))
    alpha = 1.0 if draw < 0.1 else round(float(torch.rand(1, generator=generator)), 4)
    gamma = int(torch.randint(0, 12, (1,), generator=generator))
    return Case((alpha, gamma), label=f"alpha = {alpha}, gamma = {gamma}")


def _seed_formula(alpha, gamma):
    return alpha * gamma + 1


def _no_bonus(alpha, gamma):
    return (1 - alpha**gamma) / (1 - alpha) if alpha < 1 else float(gamma)


def _only_drafts(alpha, gamma):
    return (1 - alpha ** (gamma + 1)) / (1 - alpha) - 1 if alpha < 1 else float(gamma)


def _boundary_forgotten(alpha, gamma):
    return (1 - alpha ** (gamma + 1)) / (1 - alpha) if alpha < 1 else 0.0


def _gamma_powers(alpha, gamma):
    return (1 - alpha**gamma) / (1 - alpha) + alpha**gamma * gamma if alpha < 1 else float(gamma + 1)


EXPECTED_TOKENS = register(
    Exercise(
        id="07.expected_tokens",
        title="Expected tokens per target call",
        function="expected_tokens",
        reference=sp.expected_tokens_per_call,
        points=1,
        rtol=1e-9,
        atol=1e-12,
        hand_cases=(
            Case((0.5, 2), label="1 + 1/2 + 1/4"),
            Case((0.7, 4), label="the optimization module's example: about 2.7731, not 3.8"),
            Case((1.0, 4), label="alpha = 1: every draft and the bonus, gamma + 1"),
            Case((0.0, 5), label="alpha = 0: only the target's own token"),
            Case((0.9, 0), label="gamma = 0: plain decoding"),
        ),
        random_case=_expected_case,
        hints=("sum alpha**i for i = 0..gamma; the closed form (1 - alpha**(gamma + 1)) / (1 - alpha) needs a "
               "separate answer at alpha = 1",),
        mistakes=(
            Mistake("alpha * gamma + 1 (the optimization module's formula) counts drafts after a rejection, which are never "
                    "examined: the k-th draft survives with probability alpha**k", _seed_formula),
            Mistake("every call adds one target token, the bonus included when all gamma pass: the power is "
                    "gamma + 1", _no_bonus),
            Mistake("count the token the target adds (correction or bonus) too: the sum starts at 1", _only_drafts),
            Mistake("at alpha = 1 the closed form is 0/0; the limit is gamma + 1 (every draft and the bonus)", _boundary_forgotten),
        ),
    )
)


# --------------------------------------------------------------------------------------------------------------
# 07.next_token_probs: the acceptance step, made deterministic by passing the uniforms


def next_token_probs(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_ids: list,
                     uniforms: torch.Tensor) -> torch.Tensor:
    """labkit's answer: the distribution the target's added token is drawn from, ``[vocab]``.

    Draft ``i`` is accepted when ``uniforms[i] < target_probs[i, x] / draft_probs[i, x]`` (strictly). At the first
    rejection: ``normalize(max(0, target_probs[i] - draft_probs[i]))``; when all pass: ``target_probs[gamma]``.
    """
    for position, token in enumerate(draft_ids):
        if float(uniforms[position]) * float(draft_probs[position, token]) >= float(target_probs[position, token]):
            return sp.residual_probs(target_probs[position], draft_probs[position])
    return target_probs[len(draft_ids)].clone()


def _step_case(generator: torch.Generator) -> Case:
    gamma = int(torch.randint(1, 5, (1,), generator=generator))
    vocab = int(torch.randint(2, 7, (1,), generator=generator))
    scale = 1.0 + 3 * float(torch.rand(1, generator=generator))
    target = torch.softmax(torch.randn(gamma + 1, vocab, generator=generator, dtype=torch.float64) * scale, -1)
    draft = torch.softmax(torch.randn(gamma, vocab, generator=generator, dtype=torch.float64) * scale, -1)
    drafts = [int(torch.multinomial(draft[i], 1, generator=generator)) for i in range(gamma)]
    uniforms = torch.rand(gamma, generator=generator, dtype=torch.float64)
    return Case((target, draft, drafts, uniforms), label=f"gamma = {gamma}, vocab = {vocab}")


def _greater_rule(target_probs, draft_probs, draft_ids, uniforms):
    for i, x in enumerate(draft_ids):
        if target_probs[i, x] < draft_probs[i, x]:
            return sp.residual_probs(target_probs[i], draft_probs[i])
    return target_probs[len(draft_ids)].clone()


def _inverted(target_probs, draft_probs, draft_ids, uniforms):
    for i, x in enumerate(draft_ids):
        if uniforms[i] * target_probs[i, x] >= draft_probs[i, x]:
            return sp.residual_probs(target_probs[i], draft_probs[i])
    return target_probs[len(draft_ids)].clone()


def _no_max(target_probs, draft_probs, draft_ids, uniforms):
    for i, x in enumerate(draft_ids):
        if uniforms[i] * draft_probs[i, x] >= target_probs[i, x]:
            excess = (target_probs[i] - draft_probs[i]).abs()
            return excess / excess.sum()
    return target_probs[len(draft_ids)].clone()


def _from_target(target_probs, draft_probs, draft_ids, uniforms):
    for i, x in enumerate(draft_ids):
        if uniforms[i] * draft_probs[i, x] >= target_probs[i, x]:
            return target_probs[i].clone()
    return target_probs[len(draft_ids)].clone()


def _bonus_wrong_row(target_probs, draft_probs, draft_ids, uniforms):
    for i, x in enumerate(draft_ids):
        if uniforms[i] * draft_probs[i, x] >= target_probs[i, x]:
            return sp.residual_probs(target_probs[i], draft_probs[i])
    return target_probs[len(draft_ids) - 1].clone()


def _no_bonus_zeros(target_probs, draft_probs, draft_ids, uniforms):
    for i, x in enumerate(draft_ids):
        if uniforms[i] * draft_probs[i, x] >= target_probs[i, x]:
            return sp.residual_probs(target_probs[i], draft_probs[i])
    return torch.zeros_like(target_probs[0])


def _keeps_going(target_probs, draft_probs, draft_ids, uniforms):
    last = None
    for i, x in enumerate(draft_ids):
        if uniforms[i] * draft_probs[i, x] >= target_probs[i, x]:
            last = sp.residual_probs(target_probs[i], draft_probs[i])  # keeps judging later drafts
    return last if last is not None else target_probs[len(draft_ids)].clone()


_T = torch.tensor([[0.25, 0.75], [0.6, 0.4]], dtype=torch.float64)
_D = torch.tensor([[0.5, 0.5]], dtype=torch.float64)

NEXT_TOKEN_PROBS = register(
    Exercise(
        id="07.next_token_probs",
        title="The speculative acceptance step: where the target's token comes from",
        function="next_token_probs",
        reference=next_token_probs,
        points=2,
        rtol=1e-9,
        atol=1e-12,
        allowed=(),
        hand_cases=(
            Case((_T, _D, [0], torch.tensor([0.49], dtype=torch.float64)),
                 label="0.49 < 0.25 / 0.5: accepted, the bonus row"),
            Case((_T, _D, [0], torch.tensor([0.5], dtype=torch.float64)),
                 label="u exactly equal to the ratio 0.5: rejected (accept only when strictly below)"),
            Case((_T, _D, [1], torch.tensor([0.99], dtype=torch.float64)),
                 label="target 0.75 >= draft 0.5: always accepted"),
            Case((torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [1.0, 0.0, 0.0]], dtype=torch.float64),
                  torch.tensor([[0.25, 0.25, 0.5], [0.2, 0.3, 0.5]], dtype=torch.float64), [2, 1],
                  torch.tensor([0.0, 0.0], dtype=torch.float64)),
                 label="a draft the target cannot produce (target 0) is rejected even at u = 0"),
        ),
        random_case=_step_case,
        hints=("accept draft i when uniforms[i] < target/draft at that token; stop at the first rejection and "
               "return normalize(max(0, target_probs[i] - draft_probs[i])); if all pass, target_probs[gamma]",),
        mistakes=(
            Mistake("\"accept where p_target >= p_draft\" ignores the uniform: a draft with ratio 0.5 must be "
                    "accepted half the time", _greater_rule),
            Mistake("the ratio is target / draft: accept with probability min(1, target_probs / draft_probs)",
                    _inverted),
            Mistake("keep only the excess max(0, target - draft) before normalizing, not |target - draft|",
                    _no_max),
            Mistake("after a rejection, draw from the residual normalize(max(0, target - draft)), not from the "
                    "target itself (that double-counts what the draft already proposed)", _from_target),
            Mistake("when every draft passes, the bonus token comes from the LAST row, target_probs[gamma]",
                    _bonus_wrong_row),
            Mistake("when every draft passes the target still adds a token: the bonus, from target_probs[gamma]",
                    _no_bonus_zeros),
            Mistake("stop at the FIRST rejection: later drafts were proposed after a token that is now gone",
                    _keeps_going),
        ),
    )
)


# --------------------------------------------------------------------------------------------------------------
# 07.predict_optimal_gamma


PREDICT_ALPHA, PREDICT_COST = 0.8, 0.05


def best_gamma_here() -> float:
    """The draft length with the largest walltime improvement at alpha = 0.8, c = 0.05."""
    return float(sp.optimal_gamma(PREDICT_ALPHA, PREDICT_COST))


PREDICT_GAMMA = register(prediction(
    "07.predict_optimal_gamma", "Predict, then check: the best draft length at alpha = 0.8, c = 0.05",
    "predicted_gamma", best_gamma_here,
    atol=1.0,  # within one draft of the optimum
    asked=f"alpha = {PREDICT_ALPHA}, c = {PREDICT_COST}",
    hint="return a number; more drafts cost gamma * c each call but the k-th draft only survives with probability "
         "alpha**k"))

__all__ = ["EXPECTED_TOKENS", "NEXT_TOKEN_PROBS", "PREDICT_GAMMA", "best_gamma_here", "next_token_probs"]
