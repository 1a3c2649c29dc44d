"""The bug zoo of lab 00: wrong implementations learners write, each reported as failed with a pointed hint."""

import math

import pytest
import torch

import labkit.core.sampling
import labkit.core.speculative
from labkit.exercises.checking import check_function
from labkit.exercises import exercises, get
from labkit.core.sampling import softmax_with_temperature as labkit_softmax
from zoo import assert_zoo

EXERCISE = get("00.softmax_temperature")


def solution(logits, temperature):
    if temperature == 0:
        return torch.zeros_like(logits).scatter(-1, logits.argmax(-1, keepdim=True), 1.0)
    return torch.softmax(logits / temperature, dim=-1)


def no_temperature(logits, temperature):
    return torch.softmax(logits, dim=-1)


def multiplies(logits, temperature):
    return torch.softmax(logits * temperature, dim=-1) if temperature else solution(logits, 0)


def divides_by_zero(logits, temperature):
    return torch.softmax(logits / temperature, dim=-1)


def greedy_last_tie(logits, temperature):
    if temperature == 0:
        last = logits.shape[-1] - 1 - logits.flip(-1).argmax(-1, keepdim=True)
        return torch.zeros_like(logits).scatter(-1, last, 1.0)
    return solution(logits, temperature)


def greedy_shares_ties(logits, temperature):
    if temperature == 0:
        top = (logits == logits.max(-1, keepdim=True).values).float()
        return top / top.sum(-1, keepdim=True)
    return solution(logits, temperature)


def first_dimension(logits, temperature):
    return torch.softmax(logits / temperature, dim=0) if temperature else solution(logits, 0)


def no_normalization(logits, temperature):
    return (logits / temperature).exp() if temperature else solution(logits, 0)


def overflows(logits, temperature):
    if temperature == 0:
        return solution(logits, 0)
    weights = (logits / temperature).exp()
    return weights / weights.sum(-1, keepdim=True)


def in_place(logits, temperature):
    if temperature == 0:
        return solution(logits, 0)
    logits /= temperature
    return torch.softmax(logits, dim=-1)


def calls_labkit(logits, temperature):
    return labkit_softmax(logits, temperature)


def calls_another_labkit_function(logits, temperature):  # not the reference, but it does the whole job
    return labkit.core.sampling.sampling_probs(logits, temperature=temperature)


def does_half_with_labkit(logits, temperature):
    return torch.softmax(labkit.core.sampling.apply_temperature(logits, temperature), dim=-1)


# Answers of every hand case, written down in advance: what hard-coding looks like.
_ANSWERS = [(case.args, labkit_softmax(*case.args)) for case in EXERCISE.hand_cases]


def memorized(logits, temperature):
    for (known_logits, known_temperature), answer in _ANSWERS:
        if known_logits.shape == logits.shape and torch.equal(known_logits, logits) and known_temperature == temperature:
            return answer.clone()
    return torch.full_like(logits, 1.0 / logits.shape[-1])


ZOO = {
    no_temperature: "divide the logits by T before the softmax",
    multiplies: "multiplying by T flattens where it should sharpen",
    divides_by_zero: "temperature 0 cannot be divided by",
    greedy_last_tie: "FIRST largest logit",
    greedy_shares_ties: "a tie is not shared",
    first_dimension: "normalize over the last dimension",
    no_normalization: "must sum to 1",
    overflows: "subtract each row's maximum",
    in_place: "changed its input in place",
    calls_labkit: "calls labkit's own `labkit.core.sampling.softmax_with_temperature`",
    calls_another_labkit_function: "calls labkit's own `labkit.core.sampling.sampling_probs`",
    does_half_with_labkit: "calls labkit's own `labkit.core.sampling.apply_temperature`",
    memorized: "random case 1 of 25 (seed 0)",
}


def test_the_solution_passes_and_every_bug_fails_with_a_message_that_points_at_it():
    assert_zoo(EXERCISE, solution, ZOO)


def test_the_task_text_can_say_what_is_allowed():
    assert EXERCISE.allowed == ()
    assert EXERCISE.allowed_text == ("No labkit function may be called inside your function: the check reports any "
                                     "call into labkit.")


def test_the_exercise_is_registered_once_in_its_lab():
    assert [ex.id for ex in exercises("00")] == ["00.softmax_temperature", "00.sample_token", "00.predict_tokenizer"]


def test_the_tokenizer_question_reads_one_letter():
    question = get("00.predict_tokenizer")
    right = check_function(question, lambda: "b")
    assert (right.status, right.close) == ("passed", True)
    for wrong in ["a", "c", "d"]:  # a wrong letter is an answer: the point, not close, the truth shown
        verdict = check_function(question, lambda: wrong)
        assert (verdict.status, verdict.close) == ("passed", False) and "labkit's answer: 'b'" in str(verdict), wrong
    for malformed in ["B", 2, "b)"]:  # not one of the choices: no point, and the answer is not shown
        verdict = check_function(question, lambda: malformed)
        assert verdict.status == "failed" and "'b'" not in str(verdict).split("must be one of")[0], malformed
    assert EXERCISE.points == 2 and EXERCISE.function == "softmax_with_temperature"


# --------------------------------------------------------------------------------------------------------------
# 00.sample_token: inverse-CDF sampling with the uniform passed in

SAMPLE = get("00.sample_token")


def sample_solution(probs, u):
    cumulative = probs.double().cumsum(0)
    return int((cumulative <= u * cumulative[-1]).sum())


def sample_loop(probs, u):  # the same rule written as a loop, running sum in Python floats
    point, running = u * float(probs.double().sum()), 0.0
    for index, probability in enumerate(probs.tolist()):
        running += probability
        if point < running:
            return index
    return len(probs) - 1


def sample_normalizing_first(probs, u):  # divides by the total first, then searches, in the input's dtype
    cumulative = (probs / probs.sum()).cumsum(0)
    return int(torch.searchsorted(cumulative, torch.tensor([u], dtype=cumulative.dtype), right=True)[0])


def sample_left_of_boundary(probs, u):
    cumulative = probs.double().cumsum(0)
    return int(torch.searchsorted(cumulative, torch.tensor([u * float(cumulative[-1])], dtype=torch.float64))[0])


def sample_greedy(probs, u):
    return int(probs.argmax())


def sample_token_before(probs, u):
    cumulative = probs.double().cumsum(0)
    for index in range(len(probs)):
        if cumulative[index] > u * cumulative[-1]:
            return index - 1


def sample_without_zeros(probs, u):
    kept = probs[probs != 0]
    cumulative = kept.double().cumsum(0) / kept.double().sum()
    return int((cumulative <= u).sum())


def sample_unscaled(probs, u):
    for index, running in enumerate(probs.cumsum(0).tolist()):
        if u < running:
            return index
    return len(probs)  # u fell past the last running sum


def sample_clamped(probs, u):
    return min(int((probs.double().cumsum(0) <= u).sum()), len(probs) - 1)


def sample_in_place(probs, u):
    probs /= probs.sum()
    return sample_solution(probs, u)


def sample_with_labkit(probs, u):
    return labkit.core.speculative.draw_with_uniform(probs, u)


def sample_with_multinomial(probs, u):
    return int(torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(int(u * 2**31))))


_SAMPLE_ANSWERS = [(case.args, SAMPLE.reference(*case.args)) for case in SAMPLE.hand_cases]


def sample_memorized(probs, u):
    for (known_probs, known_u), answer in _SAMPLE_ANSWERS:
        if known_probs.dtype == probs.dtype and torch.equal(known_probs, probs) and known_u == u:
            return answer
    return 0


SAMPLE_ZOO = {
    sample_left_of_boundary: "belongs to the NEXT token",
    sample_greedy: "argmax is greedy decoding",
    sample_token_before: "off by one",
    sample_without_zeros: "dropping the zero-probability tokens shifts every index",
    sample_unscaled: "may sum to a little less than 1",
    sample_clamped: "clamping to the last index can draw a token of probability 0",
    sample_in_place: "changed its input in place",
    sample_with_labkit: "calls labkit's own `labkit.core.speculative.draw_with_uniform`",
    sample_with_multinomial: "calls the ready-made `torch.multinomial`",
    sample_memorized: "random case",
}


def test_sample_token_solution_passes_and_every_bug_fails_with_its_hint():
    assert_zoo(SAMPLE, sample_solution, SAMPLE_ZOO)


@pytest.mark.parametrize("variant", [sample_loop, sample_normalizing_first])
def test_other_correct_ways_of_sampling_pass(variant):
    for seed in (0, 1, 2):
        assert check_function(SAMPLE, variant, seed=seed).status == "passed", check_function(SAMPLE, variant, seed=seed)


def test_the_sample_token_stub_is_not_attempted():
    def sample_token(probs, u):
        raise NotImplementedError("your code here")

    assert check_function(SAMPLE, sample_token, seed=0).status == "not attempted"


def test_the_reference_on_the_hand_figures():
    probs = torch.tensor([0.5, 0.25, 0.0, 0.25], dtype=torch.float64)  # running sums 0.5, 0.75, 0.75, 1
    draws = [SAMPLE.reference(probs, u) for u in (0.0, 0.3, 0.5, 0.75, 0.9, math.nextafter(1.0, 0.0))]
    assert draws == [0, 0, 1, 3, 3, 3]
    drifted = SAMPLE.hand_cases[-2].args[0]
    assert float(drifted.cumsum(0)[-1]) < SAMPLE.hand_cases[-2].args[1] and float(drifted.double().sum()) < 1
    assert [SAMPLE.reference(*case.args) for case in SAMPLE.hand_cases[-2:]] == [3, 3]


def test_random_cases_draw_a_token_of_positive_probability_with_u_below_1():
    generator = torch.Generator().manual_seed(0)
    for _ in range(2000):
        probs, u = SAMPLE.random_case(generator).args
        assert 0.0 <= u < 1.0 and probs.dtype == torch.float64 and abs(float(probs.sum()) - 1) < 1e-12
        assert probs[SAMPLE.reference(probs, u)] > 0


def test_what_sample_token_may_call():
    assert SAMPLE.points == 2 and SAMPLE.function == "sample_token" and (SAMPLE.rtol, SAMPLE.atol) == (0.0, 0.0)
    assert SAMPLE.allowed_text == ("Neither labkit's functions nor torch's ready-made `torch.multinomial` may be "
                                   "called inside your function: the check reports any such call.")
