"""The bug zoo of lab 01: wrong implementations learners write, each reported as failed with a pointed hint."""

import math

import torch

import labkit.core.sampling as labkit_sampling
from labkit.exercises.checking import check_function
from labkit.exercises import exercises, get
from labkit.exercises.lab01 import PREDICT_PROMPT, kept_tokens_on_the_model
from zoo import assert_zoo

INF = math.inf
TEMPERATURE = get("01.apply_temperature")
TOP_K = get("01.top_k_filter")
NUCLEUS = get("01.nucleus_probs")
PREDICT = get("01.predict_kept_tokens")


# ----- 01.apply_temperature -----

def temperature_solution(logits, temperature):
    if temperature == 0:
        first = logits.argmax(dim=-1, keepdim=True)
        return torch.full_like(logits, -INF).scatter(-1, first, 0.0)
    return logits / temperature


def divides_by_zero(logits, temperature):
    return logits / temperature


def one_hot_probabilities(logits, temperature):
    if temperature == 0:
        return torch.zeros_like(logits).scatter(-1, logits.argmax(-1, keepdim=True), 1.0)
    return logits / temperature


def keeps_the_logit(logits, temperature):
    if temperature == 0:
        mask = torch.ones_like(logits, dtype=torch.bool).scatter(-1, logits.argmax(-1, keepdim=True), False)
        return logits.masked_fill(mask, -INF)
    return logits / temperature


def large_negative(logits, temperature):
    if temperature == 0:
        return torch.full_like(logits, -1e9).scatter(-1, logits.argmax(-1, keepdim=True), 0.0)
    return logits / temperature


def last_tie(logits, temperature):
    if temperature == 0:
        last = logits.shape[-1] - 1 - logits.flip(-1).argmax(-1, keepdim=True)
        return torch.full_like(logits, -INF).scatter(-1, last, 0.0)
    return logits / temperature


def multiplies(logits, temperature):
    return logits * temperature if temperature else temperature_solution(logits, 0)


def returns_probabilities(logits, temperature):
    return torch.softmax(temperature_solution(logits, temperature), dim=-1)


def divides_in_place(logits, temperature):
    if temperature == 0:
        return temperature_solution(logits, 0)
    logits /= temperature
    return logits


def calls_labkit(logits, temperature):
    return labkit_sampling.apply_temperature(logits, temperature)


def test_apply_temperature_zoo():
    assert_zoo(TEMPERATURE, temperature_solution, {
        divides_by_zero: "T = 0 cannot be divided by",
        one_hot_probabilities: "return logits, not probabilities",
        keeps_the_logit: "exactly 0.0",
        large_negative: "exactly -inf",
        last_tie: "FIRST largest logit wins a tie",
        multiplies: "multiplying by T flattens",
        returns_probabilities: "the softmax comes later",
        divides_in_place: "changed its input in place",
        calls_labkit: "calls labkit's own `labkit.core.sampling.apply_temperature`",
    })


# ----- 01.top_k_filter -----

def top_k_solution(logits, k):
    vocab = logits.shape[-1]
    if k == 0 or k >= vocab:
        return logits.clone()
    ranked_ids = torch.sort(logits, dim=-1, descending=True, stable=True).indices
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, ranked_ids[..., :k], True)
    return logits.masked_fill(~keep, -INF)


def keeps_every_tie(logits, k):  # transformers' rule
    if k == 0 or k >= logits.shape[-1]:
        return logits.clone()
    kth = logits.topk(k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, -INF)


def crashes_when_k_exceeds_the_vocabulary(logits, k):
    if k == 0:
        return logits.clone()
    ranked_ids = torch.sort(logits, dim=-1, descending=True, stable=True).indices
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, ranked_ids[..., :k], True)
    torch.topk(logits, k)  # a check that raises when k > vocab
    return logits.masked_fill(~keep, -INF)


def ties_to_the_higher_id(logits, k):
    return top_k_solution(logits.flip(-1), k).flip(-1)


def strictly_above_the_kth(logits, k):
    if k == 0 or k >= logits.shape[-1]:
        return logits.clone()
    kth = logits.topk(k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits <= kth, -INF)


def zero_for_removed(logits, k):
    filtered = top_k_solution(logits, k)
    return filtered.masked_fill(filtered.isinf() & logits.isfinite(), 0.0)


def k_zero_removes_everything(logits, k):
    return torch.full_like(logits, -INF) if k == 0 else top_k_solution(logits, k)


def fills_in_place(logits, k):
    logits.copy_(top_k_solution(logits, k))
    return logits


def test_a_kept_tie_is_shown_where_it_is_kept():
    verdict = str(check_function(TOP_K, keeps_every_tie, seed=0))
    assert "a tie at the cut: the lower ids win" in verdict
    assert "largest difference at index (3,): expected -inf (removed), got 2 (kept)" in verdict


def test_top_k_zoo():
    assert_zoo(TOP_K, top_k_solution, {
        keeps_every_tie: "keep exactly k tokens",
        crashes_when_k_exceeds_the_vocabulary: "use min(k, vocab)",
        ties_to_the_higher_id: "LOWER token id",
        strictly_above_the_kth: "compare with >=",
        zero_for_removed: "0.0 keeps them possible",
        k_zero_removes_everything: "k = 0 means the filter is off",
        fills_in_place: "changed its input in place",
    })


# ----- 01.nucleus_probs -----

def nucleus_solution(logits, temperature, top_p):
    if temperature == 0:
        return torch.zeros_like(logits).scatter(-1, logits.argmax(-1, keepdim=True), 1.0)
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    ranked, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    mass_before = ranked.cumsum(-1) - ranked
    keep_ranked = mass_before < top_p - 1e-6
    keep_ranked[..., 0] = True
    keep = keep_ranked.scatter(-1, ids, keep_ranked)
    kept = probs * keep
    return (kept / kept.sum(-1, keepdim=True)).to(logits.dtype)


def drops_the_crossing_token(logits, temperature, top_p):
    probs = torch.softmax(logits / temperature, -1) if temperature else nucleus_solution(logits, 0, 1)
    ranked, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    keep_ranked = ranked.cumsum(-1) <= top_p
    keep_ranked[..., 0] = True
    kept = probs * keep_ranked.scatter(-1, ids, keep_ranked)
    return kept / kept.sum(-1, keepdim=True)


def seed_snippet_boundary(logits, temperature, top_p):  # cumulative > p, shifted right: mass before <= p
    probs = torch.softmax(logits / temperature, -1) if temperature else nucleus_solution(logits, 0, 1)
    ranked, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    remove = ranked.cumsum(-1) > top_p
    remove = torch.cat([torch.zeros_like(remove[..., :1]), remove[..., :-1]], dim=-1)
    kept = probs.masked_fill(remove.scatter(-1, ids, remove), 0.0)
    return kept / kept.sum(-1, keepdim=True)


def forgets_to_sort(logits, temperature, top_p):
    probs = torch.softmax(logits / temperature, -1) if temperature else nucleus_solution(logits, 0, 1)
    keep = probs.cumsum(-1) - probs < top_p
    kept = probs * keep
    return kept / kept.sum(-1, keepdim=True)


def forgets_to_renormalize(logits, temperature, top_p):
    full = nucleus_solution(logits, temperature, 1.0)
    return full * (nucleus_solution(logits, temperature, top_p) > 0)


def temperature_after_filtering(logits, temperature, top_p):
    nucleus = nucleus_solution(logits, 1.0, top_p) > 0
    return nucleus_solution(logits.masked_fill(~nucleus, -INF), temperature, 1.0)


def ignores_temperature(logits, temperature, top_p):
    return nucleus_solution(logits, 1.0, top_p)


def ties_by_the_higher_id(logits, temperature, top_p):
    return nucleus_solution(logits.flip(-1), temperature, top_p).flip(-1)


def unnormalized_mass(logits, temperature, top_p):
    if temperature == 0:
        return nucleus_solution(logits, 0, top_p)
    weights = (logits / temperature).exp()
    ranked, ids = torch.sort(weights, dim=-1, descending=True, stable=True)
    keep_ranked = ranked.cumsum(-1) - ranked < top_p
    keep_ranked[..., 0] = True
    kept = weights * keep_ranked.scatter(-1, ids, keep_ranked)
    return kept / kept.sum(-1, keepdim=True)


def calls_top_p_filter(logits, temperature, top_p):
    tempered = labkit_sampling.apply_temperature(logits, temperature)
    return torch.softmax(labkit_sampling.top_p_filter(tempered, top_p), dim=-1)


def test_nucleus_zoo():
    assert_zoo(NUCLEUS, nucleus_solution, {
        drops_the_crossing_token: "keep the token that reaches or crosses top_p",
        seed_snippet_boundary: "equals top_p exactly already reaches it",
        forgets_to_sort: "rank the tokens by probability",
        forgets_to_renormalize: "renormalize",
        temperature_after_filtering: "apply the temperature first",
        ignores_temperature: "the temperature is not used",
        ties_by_the_higher_id: "LOWER token id first",
        unnormalized_mass: "accumulate probabilities",
        calls_top_p_filter: "calls labkit's own `labkit.core.sampling.top_p_filter`",
    })


def test_labkit_apply_temperature_is_allowed_in_the_nucleus_exercise():
    def with_labkit_temperature(logits, temperature, top_p):
        tempered = labkit_sampling.apply_temperature(logits, temperature)
        return nucleus_solution(tempered, 1.0, top_p) if temperature else nucleus_solution(logits, 0, top_p)

    def notebook_solution(logits, temperature, top_p):  # notebooks/solutions/01_sampling.ipynb, as written there
        probs = torch.softmax(labkit_sampling.apply_temperature(logits, temperature).double(), dim=-1)
        ranked, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
        mass_before = ranked.cumsum(dim=-1) - ranked
        keep_ranked = mass_before < top_p - 1e-6
        keep_ranked[..., 0] = True
        keep = keep_ranked.scatter(-1, ids, keep_ranked)
        kept = probs * keep
        return (kept / kept.sum(dim=-1, keepdim=True)).to(logits.dtype)

    def with_labkit_probabilities(logits, temperature, top_p):
        probs = labkit_sampling.softmax_with_temperature(logits, temperature)
        return nucleus_solution(probs.log(), 1.0, top_p) if temperature else probs

    assert check_function(NUCLEUS, with_labkit_temperature).status == "passed"
    assert check_function(NUCLEUS, notebook_solution).status == "passed"
    assert "calls labkit's own `labkit.core.sampling.softmax_with_temperature`" in str(
        check_function(NUCLEUS, with_labkit_probabilities))
    assert NUCLEUS.allowed_text == ("You may call `labkit.core.sampling.apply_temperature`; any other labkit function "
                                    "is reported by the check.")


def test_the_other_sampling_exercises_allow_no_labkit_function(embedded):
    for exercise in (TEMPERATURE, TOP_K, PREDICT):
        assert exercise.allowed == () and exercise.allowed_text.startswith("No labkit function")
    verdict = check_function(PREDICT, lambda: __import__("labkit").exercises.lab01.kept_tokens_on_the_model())
    assert "calls labkit's own `labkit.exercises.lab01.kept_tokens_on_the_model`" in str(verdict)


# ----- 01.predict_kept_tokens -----

def test_predictions_pass_within_a_factor_of_two(embedded):
    truth = kept_tokens_on_the_model()
    assert truth == 24, f"the model's count for {PREDICT_PROMPT!r} moved: update the notebook's solution"
    for guess, close in [(24, True), (12, True), (48, True), (11, False), (49, False), (121, False)]:
        verdict = check_function(PREDICT, lambda: guess)
        assert (verdict.status, verdict.close) == ("passed", close), guess
    assert "your answer must be a number, got str" in str(check_function(PREDICT, lambda: "24"))


# ----- 01.predict_order (Lesson 4.1, question 4) -----

def test_the_order_question_has_the_lessons_answer():
    order = get("01.predict_order")
    assert check_function(order, lambda: ("A", "AB")).close is True
    assert check_function(order, lambda: ["A", "AB"]).close is True
    for wrong in [("AB", "AB"), ("A", "A"), ("AB", "A"), ("A", "BA")]:
        verdict = check_function(order, lambda: wrong)
        assert (verdict.status, verdict.close) == ("passed", False) and "labkit's answer: ('A', 'AB')" in str(verdict)
    assert check_function(order, lambda: "A, AB").status == "failed"  # not two strings

    def stub():
        raise NotImplementedError("your code here")

    assert check_function(order, stub).status == "not attempted"


def test_the_lab_registers_its_exercises_in_order():
    assert [ex.id for ex in exercises("01")] == ["01.predict_order", "01.apply_temperature", "01.top_k_filter",
                                                 "01.nucleus_probs", "01.predict_kept_tokens"]
    assert [ex.points for ex in exercises("01")] == [1, 1, 2, 3, 1]
