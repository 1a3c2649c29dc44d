"""The bug zoo of lab 00: wrong implementations learners write, each reported as failed with a pointed hint."""

import torch

import labkit.core.sampling
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
    assert [ex.id for ex in exercises("00")] == ["00.softmax_temperature", "00.predict_tokenizer"]


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
