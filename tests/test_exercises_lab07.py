"""The bug zoo of lab 07: the seed's formula and decoder, and the acceptance rules learners write."""

import pytest
import torch

from labkit.core import speculative as sp
from labkit.exercises import exercises, get
from labkit.exercises.checking import check_function
from labkit.exercises.lab07 import best_gamma_here, next_token_probs
from zoo import assert_zoo

EXPECTED = get("07.expected_tokens")
STEP = get("07.next_token_probs")
PREDICT = get("07.predict_optimal_gamma")


def expected_solution(alpha, gamma):
    if alpha == 1:
        return float(gamma + 1)
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def seed_formula(alpha, gamma):
    return alpha * gamma + 1


def no_bonus(alpha, gamma):
    return (1 - alpha**gamma) / (1 - alpha) if alpha < 1 else float(gamma)


def only_drafts(alpha, gamma):
    return sum(alpha**i for i in range(1, gamma + 1))


def boundary_forgotten(alpha, gamma):
    return (1 - alpha ** (gamma + 1)) / (1 - alpha) if alpha < 1 else 0.0


def calls_labkit(alpha, gamma):
    return sp.expected_tokens_per_call(alpha, gamma)


EXPECTED_ZOO = {
    seed_formula: "the optimization module's formula",
    no_bonus: "gamma + 1",
    only_drafts: "starts at 1",
    boundary_forgotten: "0/0",
    calls_labkit: "calls labkit's own",
}


@pytest.mark.parametrize("wrong,pointer", EXPECTED_ZOO.items(), ids=[f.__name__ for f in EXPECTED_ZOO])
def test_every_expected_tokens_bug_fails_with_a_pointed_hint(wrong, pointer):
    assert_zoo(EXPECTED, expected_solution, {wrong: pointer})


def step_solution(target_probs, draft_probs, draft_ids, uniforms):
    for i, token in enumerate(draft_ids):
        if not uniforms[i] < target_probs[i, token] / draft_probs[i, token]:
            excess = torch.clamp(target_probs[i] - draft_probs[i], min=0)
            return excess / excess.sum()
    return target_probs[len(draft_ids)].clone()


def greater_rule(target_probs, draft_probs, draft_ids, uniforms):
    for i, x in enumerate(draft_ids):
        if target_probs[i, x] < draft_probs[i, x]:
            excess = torch.clamp(target_probs[i] - draft_probs[i], min=0)
            return excess / excess.sum()
    return target_probs[len(draft_ids)].clone()


def inverted(target_probs, draft_probs, draft_ids, uniforms):
    for i, x in enumerate(draft_ids):
        if not uniforms[i] < draft_probs[i, x] / target_probs[i, x]:
            excess = torch.clamp(target_probs[i] - draft_probs[i], min=0)
            return excess / excess.sum()
    return target_probs[len(draft_ids)].clone()


def absolute(target_probs, draft_probs, draft_ids, uniforms):
    for i, x in enumerate(draft_ids):
        if not uniforms[i] < target_probs[i, x] / draft_probs[i, x]:
            excess = (target_probs[i] - draft_probs[i]).abs()
            return excess / excess.sum()
    return target_probs[len(draft_ids)].clone()


def from_target(target_probs, draft_probs, draft_ids, uniforms):
    for i, x in enumerate(draft_ids):
        if not uniforms[i] < target_probs[i, x] / draft_probs[i, x]:
            return target_probs[i].clone()
    return target_probs[len(draft_ids)].clone()


def seed_bonus_row(target_probs, draft_probs, draft_ids, uniforms):
    out = step_solution(target_probs, draft_probs, draft_ids, uniforms)
    if all(uniforms[i] < target_probs[i, x] / draft_probs[i, x] for i, x in enumerate(draft_ids)):
        return target_probs[len(draft_ids) - 1].clone()
    return out


def accepts_at_equality(target_probs, draft_probs, draft_ids, uniforms):
    for i, token in enumerate(draft_ids):
        if uniforms[i] > target_probs[i, token] / draft_probs[i, token]:
            excess = torch.clamp(target_probs[i] - draft_probs[i], min=0)
            return excess / excess.sum()
    return target_probs[len(draft_ids)].clone()


def calls_residual(target_probs, draft_probs, draft_ids, uniforms):
    for i, token in enumerate(draft_ids):
        if not uniforms[i] < target_probs[i, token] / draft_probs[i, token]:
            return sp.residual_probs(target_probs[i], draft_probs[i])
    return target_probs[len(draft_ids)].clone()


STEP_ZOO = {
    greater_rule: "ignores the uniform",
    inverted: "target / draft",
    absolute: "not |target - draft|",
    from_target: "not from the target itself",
    seed_bonus_row: "LAST row",
    accepts_at_equality: "strictly",
    calls_residual: "calls labkit's own `labkit.core.speculative.residual_probs`",
}


@pytest.mark.parametrize("wrong,pointer", STEP_ZOO.items(), ids=[f.__name__ for f in STEP_ZOO])
def test_every_step_bug_fails_with_a_pointed_hint(wrong, pointer):
    assert_zoo(STEP, step_solution, {wrong: pointer})


def test_reference_step_by_hand():
    target = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]], dtype=torch.float64)
    draft = torch.tensor([[0.25, 0.25, 0.5]], dtype=torch.float64)
    assert next_token_probs(target, draft, [2], torch.tensor([0.0])).tolist() == [0.5, 0.5, 0.0]
    assert next_token_probs(target, draft, [0], torch.tensor([0.9])).tolist() == [0.2, 0.3, 0.5]


def test_predict_optimal_gamma():
    assert best_gamma_here() == float(sp.optimal_gamma(0.8, 0.05))
    assert best_gamma_here() == 8.0  # improvements 3.082, 3.092, 3.078 at gamma 7, 8, 9
    assert check_function(PREDICT, lambda: 9).close is True  # within one draft
    assert check_function(PREDICT, lambda: 4).close is False


def test_lab07_registers_three_exercises():
    assert [ex.id for ex in exercises("07")] == ["07.expected_tokens", "07.next_token_probs",
                                                 "07.predict_optimal_gamma"]
