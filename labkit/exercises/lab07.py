"""Lab 07's exercises: a prediction of the best draft length, one round of speculative sampling written
from the rule (accept with min(1, target/draft), the residual at the first rejection, the bonus token), and the
prompt-lookup drafter (the latest earlier match of the context's last n-gram, longest n first). The round's
bug zoo holds the rules and decoders quoted in the course's readings and the slips learners make.

Each exercise's task text in ``notebooks/solutions/07_speculative_decoding.ipynb`` states the rules used here.
"""

from __future__ import annotations

import torch

from labkit.core import speculative as sp
from labkit.core.speedup import optimal_gamma
from labkit.exercises import register
from labkit.exercises.definitions import Case, CodeExercise, Mistake, prediction
from labkit.runtime.drafters import PromptLookup

# --------------------------------------------------------------------------------------------------------------
# 07.predict_optimal_gamma


PREDICT_ALPHA, PREDICT_COST = 0.8, 0.05


def best_gamma_here() -> float:
    """The draft length with the largest walltime improvement at alpha = 0.8, c = 0.05."""
    return float(optimal_gamma(PREDICT_ALPHA, PREDICT_COST))


PREDICT_GAMMA = register(prediction(
    "07.predict_optimal_gamma", "Predict, then check: the best draft length at alpha = 0.8, c = 0.05",
    "predicted_gamma", best_gamma_here,
    atol=1.0,  # within one draft of the optimum
    asked=f"alpha = {PREDICT_ALPHA}, c = {PREDICT_COST}",
    hint="return a number of drafts per call, such as 3",
    reveal="""γ = 8. Each draft costs c = 0.05 of a target call, every call, while the k-th draft is used only with
    probability 0.8^k: one more draft gains less and less, until its gain no longer pays for its cost. The optimum
    is flat: one draft either side of it the speedup is within 1 %, and four drafts too few lose more than four too
    many. The next cell prints the speedup at each γ from 4 to 12.""",
    giveaways=("γ = 8", "gamma = 8", "gamma 8", "alpha 0.8, c 0.05: 8", "8 drafts", "eight drafts",
               "optimum is flat")))

# --------------------------------------------------------------------------------------------------------------
# 07.speculative_round: one round, its random numbers passed in so the emitted tokens are exact


def _round_case(generator: torch.Generator) -> Case:
    gamma = int(torch.randint(0, 5, (1,), generator=generator))
    vocab = int(torch.randint(2, 7, (1,), generator=generator))
    scale = 1.0 + 3 * float(torch.rand(1, generator=generator))
    target = torch.softmax(torch.randn(gamma + 1, vocab, generator=generator, dtype=torch.float64) * scale, -1)
    if float(torch.rand(1, generator=generator)) < 0.4:  # a draft close to the target: every draft may pass
        noise = torch.randn(gamma, vocab, generator=generator, dtype=torch.float64) * 0.3
        draft = torch.softmax(target[:gamma].log() + noise, -1)
    else:
        draft = torch.softmax(torch.randn(gamma, vocab, generator=generator, dtype=torch.float64) * scale, -1)
    drafts = [int(torch.multinomial(draft[i], 1, generator=generator)) for i in range(gamma)]
    uniforms = torch.rand(gamma + 1, generator=generator, dtype=torch.float64)
    return Case((target, draft, drafts, uniforms), label=f"gamma = {gamma}, vocab = {vocab}")


def _rejected(target_probs, draft_probs, position, token, uniform) -> bool:
    return float(uniform) * float(draft_probs[position, token]) >= float(target_probs[position, token])


def _residual_draw(target_probs, draft_probs, position, uniform) -> int:
    return sp.draw_with_uniform(sp.residual_probs(target_probs[position], draft_probs[position]), uniform)


def _no_bonus(target_probs, draft_probs, draft_ids, uniforms):
    tokens = sp.speculative_round(target_probs, draft_probs, draft_ids, uniforms)
    return tokens[:-1] if tokens[:-1] == list(draft_ids) else tokens


def _resample_target(target_probs, draft_probs, draft_ids, uniforms):
    gamma = len(draft_ids)
    for i, token in enumerate(draft_ids):
        if _rejected(target_probs, draft_probs, i, token, uniforms[i]):
            return list(draft_ids[:i]) + [sp.draw_with_uniform(target_probs[i], uniforms[gamma])]
    return list(draft_ids) + [sp.draw_with_uniform(target_probs[gamma], uniforms[gamma])]


def _absolute_residual(target_probs, draft_probs, draft_ids, uniforms):
    gamma = len(draft_ids)
    for i, token in enumerate(draft_ids):
        if _rejected(target_probs, draft_probs, i, token, uniforms[i]):
            residual = (target_probs[i] - draft_probs[i]).abs()
            return list(draft_ids[:i]) + [sp.draw_with_uniform(residual, uniforms[gamma])]
    return list(draft_ids) + [sp.draw_with_uniform(target_probs[gamma], uniforms[gamma])]


def _accept_if_greater(target_probs, draft_probs, draft_ids, uniforms):
    gamma = len(draft_ids)
    for i, token in enumerate(draft_ids):
        if float(target_probs[i, token]) < float(draft_probs[i, token]):
            return list(draft_ids[:i]) + [_residual_draw(target_probs, draft_probs, i, uniforms[gamma])]
    return list(draft_ids) + [sp.draw_with_uniform(target_probs[gamma], uniforms[gamma])]


def _inverted_ratio(target_probs, draft_probs, draft_ids, uniforms):
    gamma = len(draft_ids)
    for i, token in enumerate(draft_ids):
        if float(uniforms[i]) * float(target_probs[i, token]) >= float(draft_probs[i, token]):
            return list(draft_ids[:i]) + [_residual_draw(target_probs, draft_probs, i, uniforms[gamma])]
    return list(draft_ids) + [sp.draw_with_uniform(target_probs[gamma], uniforms[gamma])]


def _keeps_going(target_probs, draft_probs, draft_ids, uniforms):
    gamma, tokens, rejected = len(draft_ids), [], False
    for i, token in enumerate(draft_ids):  # no break: a rejection adds its correction and the loop goes on
        if _rejected(target_probs, draft_probs, i, token, uniforms[i]):
            tokens.append(_residual_draw(target_probs, draft_probs, i, uniforms[gamma]))
            rejected = True
        else:
            tokens.append(int(token))
    return tokens if rejected else tokens + [sp.draw_with_uniform(target_probs[gamma], uniforms[gamma])]


def _no_correction(target_probs, draft_probs, draft_ids, uniforms):
    tokens = sp.speculative_round(target_probs, draft_probs, draft_ids, uniforms)
    return tokens[:-1] if len(tokens) <= len(draft_ids) else tokens


def _draw_with_judging_uniform(target_probs, draft_probs, draft_ids, uniforms):
    gamma = len(draft_ids)
    for i, token in enumerate(draft_ids):
        if _rejected(target_probs, draft_probs, i, token, uniforms[i]):
            return list(draft_ids[:i]) + [_residual_draw(target_probs, draft_probs, i, uniforms[i])]
    return list(draft_ids) + [sp.draw_with_uniform(target_probs[gamma], uniforms[gamma])]


def _bonus_wrong_row(target_probs, draft_probs, draft_ids, uniforms):
    tokens = sp.speculative_round(target_probs, draft_probs, draft_ids, uniforms)
    gamma = len(draft_ids)
    if gamma and len(tokens) == gamma + 1:
        return tokens[:-1] + [sp.draw_with_uniform(target_probs[gamma - 1], uniforms[gamma])]
    return tokens


def _accepts_at_equality(target_probs, draft_probs, draft_ids, uniforms):
    gamma = len(draft_ids)
    for i, token in enumerate(draft_ids):
        if float(uniforms[i]) * float(draft_probs[i, token]) > float(target_probs[i, token]):
            return list(draft_ids[:i]) + [_residual_draw(target_probs, draft_probs, i, uniforms[gamma])]
    return list(draft_ids) + [sp.draw_with_uniform(target_probs[gamma], uniforms[gamma])]


def _rows(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def _uniforms(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


# Hand cases over four tokens. Row 0 of the target and the draft: residual max(0, target - draft) is
# [0.3, 0, 0.1, 0] -> cumulative shares [0.75, 0.75, 1, 1]; |target - draft| shares [0.375, 0.625, 0.75, 1];
# the target's own [0.4, 0.7, 0.9, 1]: the last uniform 0.65 picks 0, 2 and 1 from them.
_TARGET_0, _DRAFT_0 = [0.4, 0.3, 0.2, 0.1], [0.1, 0.5, 0.1, 0.3]
_FLAT = [0.25, 0.25, 0.25, 0.25]
_BONUS = [0.1, 0.2, 0.3, 0.4]  # cumulative [0.1, 0.3, 0.6, 1]

ROUND = register(
    CodeExercise(
        id="07.speculative_round",
        title="One round of speculative sampling",
        function="speculative_round",
        reference=sp.speculative_round,
        points=3,
        rtol=0.0,
        atol=0.0,
        allowed=(sp.draw_with_uniform,),
        hand_cases=(
            Case((_rows(_TARGET_0, _BONUS), _rows([0.4, 0.3, 0.2, 0.1]), [1], _uniforms(0.99, 0.5)),
                 label="target = draft at the draft: accepted even at u = 0.99; the bonus token from row 1"),
            Case((_rows(_TARGET_0, _FLAT), _rows(_DRAFT_0), [1], _uniforms(0.7, 0.65)),
                 label="0.7 >= 0.3 / 0.5: rejected; the target's token from the residual max(0, target - draft)"),
            Case((_rows(_TARGET_0, _FLAT), _rows(_DRAFT_0), [1], _uniforms(0.6, 0.65)),
                 label="u exactly equal to the ratio 0.3 / 0.5: rejected (accept only when strictly below)"),
            Case((_rows(_FLAT, _TARGET_0, _BONUS), _rows(_FLAT, _DRAFT_0), [2, 1], _uniforms(0.5, 0.7, 0.65)),
                 label="draft 1 accepted, draft 2 rejected: stop there, one draft and the correction"),
            Case((_rows(_FLAT, _TARGET_0, _FLAT, _BONUS), _rows(_FLAT, _DRAFT_0, _FLAT), [0, 1, 3],
                  _uniforms(0.2, 0.9, 0.1, 0.05)),
                 label="a rejection in the middle: the draft after it is never judged"),
            Case((_rows([0.0, 0.5, 0.5, 0.0], _BONUS), _rows(_FLAT), [0], _uniforms(0.0, 0.3)),
                 label="a draft the target gives probability 0 is rejected even at u = 0"),
            Case((_rows(_BONUS), torch.empty(0, 4, dtype=torch.float64), [], _uniforms(0.35)),
                 label="gamma = 0: no drafts, one token from target_probs[0] (plain sampling)"),
            Case((_rows([0, 0, 1, 0], [1, 0, 0, 0], [0, 1, 0, 0]), _rows([0, 0, 1, 0], [0, 1, 0, 0]), [2, 1],
                  _uniforms(0.9, 0.0, 0.5)),
                 label="greedy (one-hot rows): the target's argmax chain, [2, 0]"),
        ),
        random_case=_round_case,
        hints=("walk the drafts: accept draft i when uniforms[i] < target/draft at its token; at the first "
               "rejection emit the accepted drafts and a token drawn with uniforms[gamma] from "
               "max(0, target_probs[i] - draft_probs[i]); if all pass, the drafts and a token from "
               "target_probs[gamma]",),
        mistakes=(
            Mistake("when every draft passes the target still adds a token: the bonus, drawn from its last row "
                    "target_probs[gamma]. Without it the output keeps the target's distribution but each round "
                    "yields one token fewer (slower, not wrong in distribution)", _no_bonus),
            Mistake("a rejection ends the round with one token of the target's own: the accepted drafts, then "
                    "the correction drawn from the residual", _no_correction),
            Mistake("after a rejection, draw from the residual normalize(max(0, target - draft)), not from the "
                    "target itself: accepted drafts already gave each token min(target, draft), so the target "
                    "counted twice over-produces tokens both models like", _resample_target),
            Mistake("keep only the excess max(0, target - draft) before normalizing, not |target - draft|: "
                    "tokens the draft overrates have no mass left to give back", _absolute_residual),
            Mistake("\"accept where p_target >= p_draft\" ignores the uniform: a draft with ratio 0.5 must be "
                    "accepted half the time", _accept_if_greater),
            Mistake("the ratio is target / draft: accept with probability min(1, target_probs / draft_probs)",
                    _inverted_ratio),
            Mistake("stop at the FIRST rejection: the drafts after it were proposed after a token that is now "
                    "gone, so they are never judged", _keeps_going),
            Mistake("draw the target's token with the last uniform, uniforms[gamma]; uniforms[i] was spent on "
                    "judging draft i (reusing it ties the draw to the rejection)", _draw_with_judging_uniform),
            Mistake("when every draft passes, the bonus token comes from the LAST row, target_probs[gamma]",
                    _bonus_wrong_row),
            Mistake("accept only when uniforms[i] is strictly below the ratio: equal means rejected",
                    _accepts_at_equality),
        ),
    )
)


# --------------------------------------------------------------------------------------------------------------
# 07.prompt_lookup: the drafter that needs no model, on plain lists of token ids


def prompt_lookup_propose(context: list[int], gamma: int, max_ngram: int) -> list[int]:
    """labkit's prompt-lookup drafter with the exercise's signature: ``PromptLookup(max_ngram).propose``.

    >>> prompt_lookup_propose([5, 6, 7, 8, 5, 6], 3, 2)
    [7, 8, 5]
    """
    return PromptLookup(max_ngram).propose(context, gamma)


def _lookup_case(generator: torch.Generator) -> Case:
    vocab = int(torch.randint(2, 5, (1,), generator=generator))  # a small vocabulary: many repeats
    length = int(torch.randint(0, 17, (1,), generator=generator))
    context = torch.randint(0, vocab, (length,), generator=generator).tolist()
    gamma = int(torch.randint(0, 6, (1,), generator=generator))
    max_ngram = int(torch.randint(1, 5, (1,), generator=generator))
    return Case((context, gamma, max_ngram), label=f"{length} tokens over {vocab}, gamma = {gamma}, "
                                                   f"max_ngram = {max_ngram}")


def _lookup_with(context, gamma, max_ngram, *, sizes, starts, follow):
    """A drafter built from parts: which n-gram sizes to try in what order, which starts to scan for each n
    (given len(context) and n), and what to return from a match (given start and n)."""
    for n in sizes(min(max_ngram, len(context) - 1)):
        tail = list(context[-n:])
        for start in starts(len(context), n):
            if list(context[start:start + n]) == tail:
                return list(follow(context, start, n, gamma))
    return []


def _longest_first(top):
    return range(top, 0, -1)


def _latest_first(length, n):
    return range(length - n - 1, -1, -1)


def _continuation(context, start, n, gamma):
    return context[start + n:start + n + gamma]


def _first_occurrence(context, gamma, max_ngram):
    return _lookup_with(context, gamma, max_ngram, sizes=_longest_first,
                        starts=lambda length, n: range(0, length - n), follow=_continuation)


def _tail_matches_itself(context, gamma, max_ngram):
    return _lookup_with(context, gamma, max_ngram, sizes=_longest_first,
                        starts=lambda length, n: range(length - n, -1, -1), follow=_continuation)


def _returns_the_match(context, gamma, max_ngram):
    return _lookup_with(context, gamma, max_ngram, sizes=_longest_first, starts=_latest_first,
                        follow=lambda context, start, n, gamma: context[start:start + gamma])


def _shortest_first(context, gamma, max_ngram):
    return _lookup_with(context, gamma, max_ngram, sizes=lambda top: range(1, top + 1), starts=_latest_first,
                        follow=_continuation)


def _skips_one(context, gamma, max_ngram):
    return _lookup_with(context, gamma, max_ngram, sizes=_longest_first, starts=_latest_first,
                        follow=lambda context, start, n, gamma: context[start + n + 1:start + n + 1 + gamma])


def _ignores_gamma(context, gamma, max_ngram):
    return _lookup_with(context, gamma, max_ngram, sizes=_longest_first, starts=_latest_first,
                        follow=lambda context, start, n, gamma: context[start + n:])


def _longest_only(context, gamma, max_ngram):
    return _lookup_with(context, gamma, max_ngram, sizes=lambda top: range(top, top - 1, -1) if top > 0 else (),
                        starts=_latest_first, follow=_continuation)


LOOKUP = register(
    CodeExercise(
        id="07.prompt_lookup",
        title="The prompt-lookup drafter",
        function="propose",
        reference=prompt_lookup_propose,
        points=2,
        rtol=0.0,
        atol=0.0,
        hand_cases=(
            Case(([1, 2, 3, 4], 3, 3), label="no earlier occurrence of any tail: no drafts, []"),
            Case(([1, 5, 1, 6, 7, 1], 1, 1),
                 label="[1] occurs at 0 and 2 before the tail: the LATEST one (2) is followed by 6"),
            Case(([3, 1, 3, 1], 3, 3),
                 label="the tail [1, 3, 1] only matches itself: that does not count; [3, 1] matches at 0"),
            Case(([1, 2, 9, 5, 2, 7, 1, 2], 2, 2),
                 label="the 2-gram [1, 2] matches at 0: preferred over the later 1-gram [2] at 4"),
            Case(([7, 8, 9, 7], 2, 3), label="a match at the very start: position 0 counts"),
            Case(([1, 2, 3, 1, 2], 5, 2), label="only 3 tokens follow the match: the proposal is cut short"),
            Case(([4, 5, 6, 4, 8, 6], 2, 3),
                 label="no 3-gram or 2-gram matches: back off to the 1-gram [6]"),
            Case(([1, 2, 1], 0, 2), label="gamma = 0: nothing to propose, []"),
            Case(([2, 2], 3, 4), label="max_ngram larger than the context: try n = 1 only; [2] at 0"),
            Case(([], 3, 2), label="an empty context: []"),
        ),
        random_case=_lookup_case,
        n_random=40,
        # a verdict shows the hint of the first mistake that reproduces the learner's output: the back-off's
        # comes before the tail's, whose output ([] on every context of two or more tokens) it shares at times
        mistakes=(
            Mistake("when the longest n-gram has no earlier match, back off to shorter ones (down to n = 1)",
                    _longest_only),
            Mistake("the tail itself (starting at len(context) - n) is not an earlier occurrence: start the "
                    "scan one position before it", _tail_matches_itself),
            Mistake("take the LATEST earlier occurrence (scan from the end backwards): recent text predicts "
                    "best", _first_occurrence),
            Mistake("propose what FOLLOWS the match, context[start + n : start + n + gamma], not the matched "
                    "tokens themselves", _returns_the_match),
            Mistake("try the LONGEST n-gram first (n = max_ngram down to 1): a longer match is a better "
                    "predictor than a later shorter one", _shortest_first),
            Mistake("the continuation starts right after the match, at start + n (not start + n + 1)",
                    _skips_one),
            Mistake("propose at most gamma tokens: context[start + n : start + n + gamma]", _ignores_gamma),
        ),
    )
)


__all__ = ["LOOKUP", "PREDICT_GAMMA", "ROUND", "best_gamma_here", "prompt_lookup_propose"]
