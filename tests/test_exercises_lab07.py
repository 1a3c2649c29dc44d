"""The bug zoo of lab 07's speculative round: the rules and decoders quoted from the course's readings and the
slips learners make, each failing with its own hint; the reference through the chi-square harness; the prediction."""


import pytest
import torch

from labkit.core import lossless
from labkit.core import speculative as sp
from labkit.core.speedup import expected_tokens_per_call, optimal_gamma
from labkit.exercises import exercises, get
from labkit.exercises.checking import check_function
from labkit.exercises.lab07 import best_gamma_here, prompt_lookup_propose
from labkit.runtime import drafters
from zoo import assert_zoo

ROUND = get("07.speculative_round")
PREDICT = get("07.predict_optimal_gamma")
LOOKUP = get("07.prompt_lookup")
draw = sp.draw_with_uniform  # the one helper the task allows


def round_solution(target_probs, draft_probs, draft_ids, uniforms):
    gamma = len(draft_ids)
    for i, token in enumerate(draft_ids):
        if not uniforms[i] < target_probs[i, token] / draft_probs[i, token]:
            excess = (target_probs[i] - draft_probs[i]).clamp(min=0)
            return list(draft_ids[:i]) + [draw(excess / excess.sum(), uniforms[gamma])]
    return list(draft_ids) + [draw(target_probs[gamma], uniforms[gamma])]


def round_own_draw(target_probs, draft_probs, draft_ids, uniforms):
    """The same, with the inverse-CDF draw written out instead of the allowed helper."""
    def pick(probs, uniform):
        shares = (probs / probs.sum()).cumsum(0)
        return min(int((shares <= uniform).sum()), len(probs) - 1)

    gamma = len(draft_ids)
    for i, token in enumerate(draft_ids):
        if uniforms[i] * draft_probs[i, token] >= target_probs[i, token]:
            return list(draft_ids[:i]) + [pick((target_probs[i] - draft_probs[i]).clamp(min=0), uniforms[gamma])]
    return list(draft_ids) + [pick(target_probs[gamma], uniforms[gamma])]


def no_bonus(target_probs, draft_probs, draft_ids, uniforms):
    gamma = len(draft_ids)
    for i, token in enumerate(draft_ids):
        if not uniforms[i] < target_probs[i, token] / draft_probs[i, token]:
            excess = (target_probs[i] - draft_probs[i]).clamp(min=0)
            return list(draft_ids[:i]) + [draw(excess, uniforms[gamma])]
    return list(draft_ids) if gamma else [draw(target_probs[0], uniforms[0])]


def no_correction(target_probs, draft_probs, draft_ids, uniforms):
    gamma = len(draft_ids)
    for i, token in enumerate(draft_ids):
        if not uniforms[i] < target_probs[i, token] / draft_probs[i, token]:
            return list(draft_ids[:i])
    return list(draft_ids) + [draw(target_probs[gamma], uniforms[gamma])]


def resample_target(target_probs, draft_probs, draft_ids, uniforms):
    gamma = len(draft_ids)
    for i, token in enumerate(draft_ids):
        if not uniforms[i] < target_probs[i, token] / draft_probs[i, token]:
            return list(draft_ids[:i]) + [draw(target_probs[i], uniforms[gamma])]
    return list(draft_ids) + [draw(target_probs[gamma], uniforms[gamma])]


def absolute_residual(target_probs, draft_probs, draft_ids, uniforms):
    gamma = len(draft_ids)
    for i, token in enumerate(draft_ids):
        if not uniforms[i] < target_probs[i, token] / draft_probs[i, token]:
            excess = (target_probs[i] - draft_probs[i]).abs()
            return list(draft_ids[:i]) + [draw(excess / excess.sum(), uniforms[gamma])]
    return list(draft_ids) + [draw(target_probs[gamma], uniforms[gamma])]


def accept_if_greater(target_probs, draft_probs, draft_ids, uniforms):
    gamma = len(draft_ids)
    for i, token in enumerate(draft_ids):
        if target_probs[i, token] < draft_probs[i, token]:
            excess = (target_probs[i] - draft_probs[i]).clamp(min=0)
            return list(draft_ids[:i]) + [draw(excess, uniforms[gamma])]
    return list(draft_ids) + [draw(target_probs[gamma], uniforms[gamma])]


def inverted_ratio(target_probs, draft_probs, draft_ids, uniforms):
    gamma = len(draft_ids)
    for i, token in enumerate(draft_ids):
        if not uniforms[i] < draft_probs[i, token] / target_probs[i, token]:
            excess = (target_probs[i] - draft_probs[i]).clamp(min=0)
            return list(draft_ids[:i]) + [draw(excess, uniforms[gamma])]
    return list(draft_ids) + [draw(target_probs[gamma], uniforms[gamma])]


def keeps_going(target_probs, draft_probs, draft_ids, uniforms):
    gamma, tokens, rejected = len(draft_ids), [], False
    for i, token in enumerate(draft_ids):
        if not uniforms[i] < target_probs[i, token] / draft_probs[i, token]:
            tokens.append(draw((target_probs[i] - draft_probs[i]).clamp(min=0), uniforms[gamma]))
            rejected = True
        else:
            tokens.append(token)
    return tokens if rejected else tokens + [draw(target_probs[gamma], uniforms[gamma])]


def judging_uniform_reused(target_probs, draft_probs, draft_ids, uniforms):
    gamma = len(draft_ids)
    for i, token in enumerate(draft_ids):
        if not uniforms[i] < target_probs[i, token] / draft_probs[i, token]:
            return list(draft_ids[:i]) + [draw((target_probs[i] - draft_probs[i]).clamp(min=0), uniforms[i])]
    return list(draft_ids) + [draw(target_probs[gamma], uniforms[gamma])]


def bonus_wrong_row(target_probs, draft_probs, draft_ids, uniforms):
    gamma = len(draft_ids)
    for i, token in enumerate(draft_ids):
        if not uniforms[i] < target_probs[i, token] / draft_probs[i, token]:
            return list(draft_ids[:i]) + [draw((target_probs[i] - draft_probs[i]).clamp(min=0), uniforms[gamma])]
    return list(draft_ids) + [draw(target_probs[max(gamma - 1, 0)], uniforms[gamma])]


def accepts_at_equality(target_probs, draft_probs, draft_ids, uniforms):
    gamma = len(draft_ids)
    for i, token in enumerate(draft_ids):
        if uniforms[i] > target_probs[i, token] / draft_probs[i, token]:
            return list(draft_ids[:i]) + [draw((target_probs[i] - draft_probs[i]).clamp(min=0), uniforms[gamma])]
    return list(draft_ids) + [draw(target_probs[gamma], uniforms[gamma])]


def calls_residual(target_probs, draft_probs, draft_ids, uniforms):
    gamma = len(draft_ids)
    for i, token in enumerate(draft_ids):
        if not uniforms[i] < target_probs[i, token] / draft_probs[i, token]:
            return list(draft_ids[:i]) + [draw(sp.residual_probs(target_probs[i], draft_probs[i]), uniforms[gamma])]
    return list(draft_ids) + [draw(target_probs[gamma], uniforms[gamma])]


def calls_labkit_round(target_probs, draft_probs, draft_ids, uniforms):
    return sp.speculative_round(target_probs, draft_probs, draft_ids, uniforms)


ROUND_ZOO = {
    no_bonus: "the bonus, drawn from its last row",
    no_correction: "one token of the target's own",
    resample_target: "not from the target itself",
    absolute_residual: "not |target - draft|",
    accept_if_greater: "ignores the uniform",
    inverted_ratio: "the ratio is target / draft",
    keeps_going: "stop at the FIRST rejection",
    judging_uniform_reused: "the last uniform, uniforms[gamma]",
    bonus_wrong_row: "comes from the LAST row",
    accepts_at_equality: "strictly below",
    calls_residual: "calls labkit's own `labkit.core.speculative.residual_probs`",
    calls_labkit_round: "calls labkit's own `labkit.core.speculative.speculative_round`",
}


@pytest.mark.parametrize("wrong,pointer", ROUND_ZOO.items(), ids=[f.__name__ for f in ROUND_ZOO])
def test_every_round_bug_fails_with_a_pointed_hint(wrong, pointer):
    assert_zoo(ROUND, round_solution, {wrong: pointer})


def test_a_round_with_its_own_inverse_cdf_passes_too():
    assert check_function(ROUND, round_own_draw).status == "passed"


def test_the_stub_is_not_attempted():
    def speculative_round(target_probs, draft_probs, draft_ids, uniforms):
        raise NotImplementedError

    assert check_function(ROUND, speculative_round).status == "not attempted"


def test_the_solution_passes_with_a_fixed_seed():
    # (how long a verdict takes is measured by `make bench`, not asserted here)
    assert check_function(ROUND, round_solution, seed=0).status == "passed"


# ----- the same round, run many times: the chi-square harness tells the bugs apart by counting -----
# Context-free tables with alpha = 0.7 at every position (the closed form's setting) and random Markov tables;
# 1,500 runs each. A bug in distribution fails the chi-square (p < 1e-4); the missing bonus token passes it and
# fails the tokens-per-call z-score (|z| > 4).

RUNS = 1500


def _harness(round_function, tables, gamma=3, seed=101):
    target, draft = tables
    return lossless.lossless_test(target, draft, gamma, RUNS, torch.Generator().manual_seed(seed),
                                  step=lossless.round_as_step(round_function))


CONSTANT_PAIR = lossless.context_free_pair(torch.tensor([0.4, 0.3, 0.2, 0.1]), torch.tensor([0.1, 0.3, 0.2, 0.4]))


@pytest.mark.parametrize("tables", [CONSTANT_PAIR, lossless.random_markov_pair(4, torch.Generator().manual_seed(1))],
                         ids=["constant alpha", "markov"])
def test_the_reference_round_is_lossless_and_meets_the_closed_form(tables):
    result = _harness(sp.speculative_round, tables, gamma=4)
    assert result.p_value > 1e-4, result
    assert abs(result.tokens_per_call_z) < 4, result
    if tables is CONSTANT_PAIR:
        assert result.expected_tokens_per_call == pytest.approx(expected_tokens_per_call(0.7, 4))


@pytest.mark.parametrize("wrong", [resample_target, absolute_residual, accept_if_greater, inverted_ratio],
                         ids=lambda f: f.__name__)
def test_a_round_wrong_in_distribution_fails_the_chi_square(wrong):
    result = _harness(wrong, lossless.random_markov_pair(4, torch.Generator().manual_seed(1)))
    assert result.p_value < 1e-4, result


def test_the_missing_bonus_is_exact_but_slower():
    result = _harness(no_bonus, CONSTANT_PAIR, gamma=4)
    assert result.p_value > 1e-4 and result.tokens_per_call_z < -4, result


def test_a_round_that_emits_nothing_is_an_error_not_a_hang():
    with pytest.raises(ValueError, match="emitted no token"):
        _harness(lambda target_probs, draft_probs, draft_ids, uniforms: [], CONSTANT_PAIR)


def test_one_hot_rows_make_the_round_greedy_acceptance():
    # Temperature 0: every row one-hot. The round then keeps drafts while they equal the target's argmax and adds
    # the target's argmax: exactly sp.greedy_accept, whatever the uniforms.
    generator = torch.Generator().manual_seed(5)
    for _ in range(200):
        gamma = int(torch.randint(0, 5, (1,), generator=generator))
        target_choices = torch.randint(0, 4, (gamma + 1,), generator=generator)
        drafts = torch.where(torch.rand(gamma, generator=generator) < 0.7, target_choices[:gamma],
                             torch.randint(0, 4, (gamma,), generator=generator)).tolist()
        target = torch.nn.functional.one_hot(target_choices, 4).double()
        draft = torch.nn.functional.one_hot(torch.tensor(drafts, dtype=torch.long), 4).double().view(gamma, 4)
        uniforms = torch.rand(gamma + 1, generator=generator, dtype=torch.float64)
        accepted, token = sp.greedy_accept(target, drafts)
        assert sp.speculative_round(target, draft, drafts, uniforms) == drafts[:accepted] + [token]


def test_predict_optimal_gamma():
    assert best_gamma_here() == float(optimal_gamma(0.8, 0.05))
    assert best_gamma_here() == 8.0  # improvements 3.082, 3.092, 3.078 at gamma 7, 8, 9
    assert check_function(PREDICT, lambda: 9).close is True  # within one draft
    assert check_function(PREDICT, lambda: 4).close is False


def test_lab07_registers_three_exercises():
    assert [ex.id for ex in exercises("07")] == ["07.predict_optimal_gamma", "07.speculative_round",
                                                 "07.prompt_lookup"]


def test_the_round_on_the_real_models_one_hot_rows_is_greedy_decoding(embedded):
    # Greedy identity on the embedded model: prompt lookup drafts, the target's rows from one uncached pass over
    # context + drafts made one-hot (temperature 0), the learner-style round deciding. The copy prompt's first 8
    # greedy steps are far from a tie (tests/test_runtime_speculative.py checks their margins), so the block pass
    # and plain greedy agree token for token.
    from labkit.runtime import forward
    from labkit.runtime import speculative as rs

    passage = ("The lighthouse keeper climbed the spiral stairs every evening to light the lamp. Ships passing "
               "the rocky coast relied on its beam.")
    prompt = embedded.chat_ids("Copy this text exactly:\n\n" + passage)
    plain = rs.plain_greedy(embedded, prompt, 8, embedded.tokenizer.eos_token_id)[0]
    context, new, calls, generator = prompt[0].tolist(), [], 0, torch.Generator().manual_seed(0)
    while len(new) < 8:
        drafts = drafters.PromptLookup().propose(context, 3)
        with torch.inference_mode():
            logits, _ = forward(embedded, torch.tensor([context + drafts]), positions=len(drafts) + 1)
        vocab = logits.shape[-1]
        target = torch.nn.functional.one_hot(logits[0].argmax(-1), vocab).double()
        draft = torch.zeros(len(drafts), vocab, dtype=torch.float64)
        draft[torch.arange(len(drafts)), torch.tensor(drafts, dtype=torch.long)] = 1.0
        uniforms = torch.rand(len(drafts) + 1, generator=generator, dtype=torch.float64)
        tokens = round_solution(target, draft, drafts, uniforms)
        assert tokens == sp.speculative_round(target, draft, drafts, uniforms)
        context, new, calls = context + tokens, new + tokens, calls + 1
    assert new[:8] == plain
    assert calls < 8  # prompt lookup's drafts were accepted: fewer target passes than tokens


# ----- the prompt-lookup drafter: plain lists of ints, no model -----


def propose(context, gamma, max_ngram):
    for n in range(min(max_ngram, len(context) - 1), 0, -1):
        tail = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start:start + n] == tail:
                return context[start + n:start + n + gamma]
    return []


def propose_with_a_dict(context, gamma, max_ngram):
    """Another correct way: index every n-gram's latest start before the tail, then look the tail up."""
    for n in range(min(max_ngram, len(context) - 1), 0, -1):
        latest = {tuple(context[start:start + n]): start for start in range(len(context) - n)}
        start = latest.get(tuple(context[-n:]))
        if start is not None:
            return list(context[start + n:start + n + gamma])
    return []


def lookup_first_occurrence(context, gamma, max_ngram):
    for n in range(min(max_ngram, len(context) - 1), 0, -1):
        for start in range(len(context) - n):
            if context[start:start + n] == context[-n:]:
                return context[start + n:start + n + gamma]
    return []


def lookup_tail_matches_itself(context, gamma, max_ngram):
    for n in range(min(max_ngram, len(context) - 1), 0, -1):
        for start in range(len(context) - n, -1, -1):
            if context[start:start + n] == context[-n:]:
                return context[start + n:start + n + gamma]
    return []


def lookup_returns_the_match(context, gamma, max_ngram):
    for n in range(min(max_ngram, len(context) - 1), 0, -1):
        for start in range(len(context) - n - 1, -1, -1):
            if context[start:start + n] == context[-n:]:
                return context[start:start + gamma]
    return []


def lookup_shortest_first(context, gamma, max_ngram):
    for n in range(1, min(max_ngram, len(context) - 1) + 1):
        for start in range(len(context) - n - 1, -1, -1):
            if context[start:start + n] == context[-n:]:
                return context[start + n:start + n + gamma]
    return []


def lookup_off_by_one(context, gamma, max_ngram):
    for n in range(min(max_ngram, len(context) - 1), 0, -1):
        for start in range(len(context) - n - 1, -1, -1):
            if context[start:start + n] == context[-n:]:
                return context[start + n + 1:start + n + 1 + gamma]
    return []


def lookup_ignores_gamma(context, gamma, max_ngram):
    for n in range(min(max_ngram, len(context) - 1), 0, -1):
        for start in range(len(context) - n - 1, -1, -1):
            if context[start:start + n] == context[-n:]:
                return context[start + n:]
    return []


def lookup_longest_only(context, gamma, max_ngram):
    n = min(max_ngram, len(context) - 1)
    if n < 1:
        return []
    for start in range(len(context) - n - 1, -1, -1):
        if context[start:start + n] == context[-n:]:
            return context[start + n:start + n + gamma]
    return []


def lookup_calls_labkit(context, gamma, max_ngram):
    return drafters.PromptLookup(max_ngram).propose(context, gamma)


LOOKUP_ZOO = {
    lookup_first_occurrence: "the LATEST earlier occurrence",
    lookup_tail_matches_itself: "the tail itself",
    lookup_returns_the_match: "what FOLLOWS the match",
    lookup_shortest_first: "the LONGEST n-gram first",
    lookup_off_by_one: "at start + n (not start + n + 1)",
    lookup_ignores_gamma: "at most gamma tokens",
    lookup_longest_only: "back off to shorter ones",
    lookup_calls_labkit: "calls labkit's own",
}


@pytest.mark.parametrize("wrong,pointer", LOOKUP_ZOO.items(), ids=[f.__name__ for f in LOOKUP_ZOO])
def test_every_lookup_bug_fails_with_a_pointed_hint(wrong, pointer):
    assert_zoo(LOOKUP, propose, {wrong: pointer})


def test_a_drafter_indexing_ngrams_in_a_dict_passes_too():
    assert check_function(LOOKUP, propose_with_a_dict).status == "passed"


def test_the_lookup_stub_is_not_attempted():
    def propose(context, gamma, max_ngram):
        raise NotImplementedError

    assert check_function(LOOKUP, propose).status == "not attempted"


def test_the_lookup_solution_passes_with_a_fixed_seed():
    assert check_function(LOOKUP, propose, seed=0).status == "passed"


def test_every_lookup_hand_case_tells_the_zoo_apart():
    # each mistake first fails on a hand case (the random cases are not needed to catch it)
    for wrong in LOOKUP_ZOO:
        if wrong is lookup_calls_labkit:
            continue
        assert any(wrong(*case.args) != prompt_lookup_propose(*case.args) for case in LOOKUP.hand_cases), wrong


def test_the_reference_is_labkits_drafter():
    assert prompt_lookup_propose([5, 6, 7, 8, 5, 6], 3, 2) == drafters.PromptLookup(2).propose([5, 6, 7, 8, 5, 6], 3)
    assert [case.args for case in LOOKUP.hand_cases if prompt_lookup_propose(*case.args) == []] == [
        ([1, 2, 3, 4], 3, 3), ([1, 2, 1], 0, 2), ([], 3, 2)]
