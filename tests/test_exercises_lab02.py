"""The bug zoo of lab 02: wrong cross-entropies and perplexities, each reported as failed with a pointed hint."""

import torch
import torch.nn.functional as F

from labkit.exercises.checking import check_function
from labkit.exercises import exercises, get
from labkit.core.loss import cross_entropy as labkit_cross_entropy
from zoo import assert_zoo

CROSS_ENTROPY = get("02.cross_entropy")
NEXT_TOKEN = get("02.next_token_loss")


def solution(logits, targets):
    log_probs = torch.log_softmax(logits, dim=-1)
    return -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1).mean()


def _picked(logits, targets):
    return torch.softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def probabilities(logits, targets):
    return -_picked(logits, targets).mean()


def logits_as_probabilities(logits, targets):
    return -logits.log().gather(-1, targets.unsqueeze(-1)).mean()


def no_minus(logits, targets):
    return -solution(logits, targets)


def summed(logits, targets):
    return -torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).sum()


def log2(logits, targets):
    return -_picked(logits, targets).log2().mean()


def shifted(logits, targets):
    return solution(logits[..., :-1, :], targets[..., 1:])


def unstable(logits, targets):
    weights = logits.exp()
    return -(weights / weights.sum(-1, keepdim=True)).gather(-1, targets.unsqueeze(-1)).log().mean()


def log_of_softmax(logits, targets):  # stable softmax, but log(0) = -inf once p rounds to 0
    return -torch.log(torch.softmax(logits, -1)).gather(-1, targets.unsqueeze(-1)).mean()


def whole_columns(logits, targets):
    return -torch.log_softmax(logits, dim=-1)[..., targets].mean()


def in_place(logits, targets):
    logits -= logits.max(dim=-1, keepdim=True).values
    return solution(logits, targets)


def torch_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def calls_labkit(logits, targets):
    return labkit_cross_entropy(logits, targets)


CROSS_ENTROPY_ZOO = {
    probabilities: "take the log of the probabilities",
    logits_as_probabilities: "the logits are not probabilities",
    no_minus: "NEGATIVE mean log-probability",
    summed: "average over positions (mean), don't sum",
    log2: "use the natural logarithm (nats)",
    shifted: "do not shift the targets by one",
    unstable: "exp overflows for large logits",
    log_of_softmax: "use torch.log_softmax, which computes log p = z - logsumexp(z)",
    whole_columns: "pick one entry per position with gather",
    in_place: "changed its input in place",
    torch_loss: "calls the ready-made `torch.nn.functional.cross_entropy`",
    calls_labkit: "calls labkit's own `labkit.core.loss.cross_entropy`",
}


def next_token_solution(logits, input_ids, attention_mask):
    log_probs = torch.log_softmax(logits[:, :-1, :], dim=-1)  # row t predicts token t + 1
    surprisal = -log_probs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    pairs = attention_mask[:, :-1].bool() & attention_mask[:, 1:].bool()
    return surprisal[pairs].mean()


def with_labkit_surprisal(logits, input_ids, attention_mask):  # allowed: labkit's per-token surprisal
    from labkit.core.loss import token_surprisal

    pairs = (attention_mask[:, :-1] * attention_mask[:, 1:]).bool()
    return token_surprisal(logits[:, :-1], input_ids[:, 1:])[pairs].mean()


def _surprisal(logits, targets):
    return -torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def no_shift(logits, input_ids, attention_mask):
    return _surprisal(logits, input_ids)[attention_mask.bool()].mean()


def wrong_side(logits, input_ids, attention_mask):
    pairs = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
    return _surprisal(logits[:, 1:], input_ids[:, :-1])[pairs].mean()


def ignores_padding(logits, input_ids, attention_mask):
    return _surprisal(logits[:, :-1], input_ids[:, 1:]).mean()


def masks_targets_only(logits, input_ids, attention_mask):  # transformers' labels=-100 rule, wrong with left padding
    return _surprisal(logits[:, :-1], input_ids[:, 1:])[attention_mask[:, 1:] == 1].mean()


def masks_inputs_only(logits, input_ids, attention_mask):
    return _surprisal(logits[:, :-1], input_ids[:, 1:])[attention_mask[:, :-1] == 1].mean()


def row_means(logits, input_ids, attention_mask):
    pairs = (attention_mask[:, :-1] * attention_mask[:, 1:]).to(logits.dtype)
    per_row = (_surprisal(logits[:, :-1], input_ids[:, 1:]) * pairs).sum(-1) / pairs.sum(-1).clamp_min(1)
    return per_row[pairs.sum(-1) > 0].mean()


def every_position(logits, input_ids, attention_mask):
    pairs = (attention_mask[:, :-1] * attention_mask[:, 1:]).to(logits.dtype)
    return (_surprisal(logits[:, :-1], input_ids[:, 1:]) * pairs).sum() / pairs.numel()


def torch_ignore_index(logits, input_ids, attention_mask):
    labels = input_ids.masked_fill(attention_mask == 0, -100)[:, 1:]
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels.reshape(-1))


def calls_the_reference(logits, input_ids, attention_mask):
    from labkit.exercises.lab02 import next_token_loss

    return next_token_loss(logits, input_ids, attention_mask)


NEXT_TOKEN_ZOO = {
    no_shift: "row t of the logits predicts the token at t + 1",
    wrong_side: "shifted the wrong way",
    ignores_padding: "pairs that touch padding must not count",
    masks_targets_only: "with left padding, the pad just before the first real token",
    masks_inputs_only: "a pad is never a target",
    row_means: "not per sequence",
    every_position: "divide by the number of counted pairs",
    torch_ignore_index: "calls the ready-made `torch.nn.functional.cross_entropy`",
    calls_the_reference: "calls labkit's own `labkit.exercises.lab02.next_token_loss`",
}


def test_the_solutions_pass():
    assert check_function(CROSS_ENTROPY, solution).status == "passed"
    assert check_function(NEXT_TOKEN, next_token_solution).status == "passed"
    assert check_function(NEXT_TOKEN, with_labkit_surprisal).status == "passed"


def test_every_cross_entropy_bug_fails_with_a_message_that_points_at_it():
    assert_zoo(CROSS_ENTROPY, solution, CROSS_ENTROPY_ZOO)


def test_every_alignment_bug_fails_with_a_message_that_points_at_it():
    assert_zoo(NEXT_TOKEN, next_token_solution, NEXT_TOKEN_ZOO)


def test_the_alignment_hand_cases_are_what_their_labels_say():
    import math

    from labkit.exercises.lab02 import next_token_loss

    first, second = NEXT_TOKEN.hand_cases[:2]
    assert abs(next_token_loss(*first.args).item() - (math.log(15 / 4) + math.log(15)) / 2) < 1e-12
    assert abs(next_token_loss(*second.args).item() - math.log(15 / 8)) < 1e-12
    assert abs(next_token_loss(*first.args).item() - 2.0149) < 1e-4
    # the random cases carry both paddings and at least one pair
    generator = torch.Generator().manual_seed(0)
    labels = [NEXT_TOKEN.random_case(generator).label for _ in range(40)]
    assert any("left-padded" in label for label in labels) and any("right-padded" in label for label in labels)


def test_a_stub_is_not_attempted_and_a_memorized_answer_fails():
    def stub(logits, targets):
        raise NotImplementedError("your code here")

    assert check_function(CROSS_ENTROPY, stub).status == "not attempted"
    answers = [(case.args, labkit_cross_entropy(*case.args)) for case in CROSS_ENTROPY.hand_cases]

    def memorized(logits, targets):
        for (known_logits, known_targets), answer in answers:
            if known_logits.shape == logits.shape and torch.equal(known_logits, logits) and torch.equal(
                    known_targets, targets):
                return answer.clone()
        return torch.tensor(1.0, dtype=logits.dtype)

    assert "random case 1 of 25 (seed 0)" in str(check_function(CROSS_ENTROPY, memorized, seed=0))


def test_a_confident_wrong_prediction_costs_1000_nats():
    verdict = str(check_function(CROSS_ENTROPY, log_of_softmax, seed=0))
    assert "a confident wrong prediction: logits (1000, 0), target 1" in verdict
    assert "expected 1000, got inf" in verdict
    assert labkit_cross_entropy(torch.tensor([[1000.0, 0.0]], dtype=torch.float64), torch.tensor([1])).item() == 1000


def test_the_task_texts_say_what_is_allowed():
    assert CROSS_ENTROPY.allowed_text == (
        "Neither labkit's functions nor torch's ready-made `torch.nn.functional.cross_entropy` may be called inside "
        "your function: the check reports any such call.")
    assert NEXT_TOKEN.allowed_text == (
        "You may call `labkit.core.loss.token_surprisal` and `labkit.core.loss.cross_entropy`; any other labkit "
        "function, and torch's ready-made `torch.nn.functional.cross_entropy`, is reported by the check.")


def test_the_exercises_are_registered_once_in_their_lab():
    assert [ex.id for ex in exercises("02")] == ["02.cross_entropy", "02.next_token_loss", "02.strided_perplexity",
                                                 "02.predict_genre_order", "02.predict_best_temperature",
                                                 "02.predict_cache_test"]
    assert (CROSS_ENTROPY.function, NEXT_TOKEN.function) == ("cross_entropy", "next_token_loss")


class _FakeScores:
    """Stands in for the evaluation text's scores: a perplexity per genre span and per temperature."""

    def __init__(self, by_span, by_temperature):
        self.by_span, self.by_temperature = by_span, by_temperature

    def perplexity(self, start=1, end=None, temperature=None):
        return self.by_temperature[temperature] if temperature is not None else self.by_span[(start, end)]


def test_the_genre_order_passes_within_two_places(monkeypatch):
    from types import SimpleNamespace

    from labkit.exercises import lab02

    truth = ["code", "recipe", "encyclopedia", "dialogue", "news", "story", "poem"]
    spans = {genre: (10 * n, 10 * n + 10) for n, genre in enumerate(["story", "encyclopedia", "recipe", "dialogue",
                                                                      "code", "poem", "news"])}
    by_span = {spans[genre]: 5.0 + 10 * place for place, genre in enumerate(truth)}
    fake = (SimpleNamespace(spans=spans), _FakeScores(by_span, {}))
    monkeypatch.setattr(lab02, "eval_text_scores", lambda: fake)
    order = get("02.predict_genre_order")
    moved_two = ["recipe", "encyclopedia", "code", "dialogue", "news", "story", "poem"]
    moved_three = ["recipe", "encyclopedia", "dialogue", "code", "news", "story", "poem"]
    for guess, close in [(truth, True), (tuple(truth), True), (moved_two, True), (moved_three, False),
                         (truth[::-1], False)]:
        verdict = check_function(order, lambda: guess)
        assert (verdict.status, verdict.close) == ("passed", close), (guess, str(verdict))
    reversed_order = str(check_function(order, lambda: truth[::-1]))
    assert "labkit's answer: ['code', 'recipe'" in reversed_order
    assert "3 of 7 genres within 2 places of their own; furthest: code, 6 places away" in reversed_order
    for malformed in (truth[:-1], truth[:-1] + ["code"], ", ".join(truth)):  # not the seven genres once each
        verdict = check_function(order, lambda: malformed)
        assert verdict.status == "failed" and "labkit's answer" not in str(verdict), malformed


def test_the_best_temperature_passes_within_a_tenth(monkeypatch):
    from types import SimpleNamespace

    from labkit.exercises import lab02

    curve = {t: 20 + 30 * (t - 1.1) ** 2 for t in lab02.TEMPERATURES}  # lowest at 1.1
    monkeypatch.setattr(lab02, "eval_text_scores", lambda: (SimpleNamespace(spans={}), _FakeScores({}, curve)))
    best = get("02.predict_best_temperature")
    for guess, close in [(1.1, True), (1.0, True), (1.2, True), (1, True), (0.9, False), (1.4, False)]:
        verdict = check_function(best, lambda: guess)
        assert (verdict.status, verdict.close) == ("passed", close), guess
    for malformed in ("1.1", 1.05, 3.0):  # a temperature of the grid is asked for
        assert check_function(best, lambda: malformed).status == "failed", malformed


def test_the_lessons_question_5():
    cache = get("02.predict_cache_test")
    assert check_function(cache, lambda: "b").close is True
    wrong = check_function(cache, lambda: "d")
    assert (wrong.status, wrong.close) == ("passed", False) and "labkit's answer: 'b'" in str(wrong)


# ----- 02.strided_perplexity: the windowed scoring loop on the embedded model -----

STRIDED = get("02.strided_perplexity")


def strided_solution(model, token_ids, window, stride):
    import math

    losses = []
    for first in range(1, len(token_ids), stride):  # each block of `stride` targets
        last = min(first + stride, len(token_ids)) - 1
        start = max(0, last - window)  # the pass ends just before the block's last target
        logits = model.logits(token_ids[start:last])  # row t predicts token start + t + 1
        log_probs = torch.log_softmax(logits[first - 1 - start:], dim=-1)
        losses.append(-log_probs.gather(-1, token_ids[first:last + 1, None])[:, 0])
    return math.exp(torch.cat(losses).double().mean())


def strided_with_labkit_surprisal(model, token_ids, window, stride):  # allowed: labkit's per-token surprisal
    import math

    from labkit.core.loss import token_surprisal

    total, count = 0.0, 0
    for first in range(1, len(token_ids), stride):
        last = min(first + stride, len(token_ids)) - 1
        start = max(0, last - window)
        rows = model.logits(token_ids[start:last])[first - 1 - start:]
        surprisal = token_surprisal(rows, token_ids[first:last + 1])
        total, count = total + float(surprisal.double().sum()), count + surprisal.numel()
    return math.exp(total / count)


def _strided_losses(model, token_ids, read, targets):
    logits = model.logits(token_ids[read[0]:read[1]])
    rows = logits[targets[0] - 1 - read[0]: targets[1] - read[0]]
    picked = torch.log_softmax(rows, -1).gather(-1, token_ids[targets[0]:targets[1] + 1, None])[:, 0]
    return -picked


def _perplexity(losses):
    import math

    return math.exp(torch.cat(losses).double().mean())


def overlap_twice(model, token_ids, window, stride):
    n_tokens = len(token_ids)
    return _perplexity([_strided_losses(model, token_ids, (start, min(start + window, n_tokens) - 1),
                                        (start + 1, min(start + window, n_tokens) - 1))
                        for start in range(0, n_tokens - 1, stride)])


def first_window_dropped(model, token_ids, window, stride):
    n_tokens, losses = len(token_ids), []
    for start in range(0, n_tokens - 1, stride):
        end = min(start + window, n_tokens)
        losses.append(_strided_losses(model, token_ids, (start, end - 1), (max(start + 1, end - stride), end - 1)))
        if end == n_tokens:
            break
    return _perplexity(losses)


def hugging_face_guide(model, token_ids, window, stride):
    n_tokens, losses, previous_end = len(token_ids), [], 0
    for begin in range(0, n_tokens - 1, stride):
        end = min(begin + window, n_tokens)
        losses.append(_strided_losses(model, token_ids, (begin, end - 1), (max(previous_end, begin + 1), end - 1)))
        previous_end = end
        if end == n_tokens:
            break
    return _perplexity(losses)


def _blocks(n_tokens, stride):
    return [(first, min(first + stride, n_tokens) - 1) for first in range(1, n_tokens, stride)]


def reads_window_minus_one(model, token_ids, window, stride):
    return _perplexity([_strided_losses(model, token_ids, (max(0, last - window + 1), last), (first, last))
                        for first, last in _blocks(len(token_ids), stride)])


def window_means(model, token_ids, window, stride):
    import math

    means = [_strided_losses(model, token_ids, (max(0, last - window), last), (first, last)).double().mean()
             for first, last in _blocks(len(token_ids), stride)]
    return math.exp(sum(means) / len(means))


def unshifted(model, token_ids, window, stride):
    losses = []
    for first, last in _blocks(len(token_ids), stride):
        start = max(0, last - window)
        logits = model.logits(token_ids[start:last + 1])
        picked = torch.log_softmax(logits[first - start:], -1).gather(-1, token_ids[first:last + 1, None])[:, 0]
        losses.append(-picked)
    return _perplexity(losses)


def mean_loss_returned(model, token_ids, window, stride):
    import math

    return math.log(strided_solution(model, token_ids, window, stride))


def calls_score_text(model, token_ids, window, stride):
    from labkit.runtime.scoring import score_text

    return score_text(model, token_ids, window, stride, progress=False).perplexity()


def calls_full_logits(model, token_ids, window, stride):
    from labkit import runtime

    class Direct:
        def logits(self, ids):
            return runtime.full_logits(model.lm, ids[None])[0]

    model.logits(token_ids[:1])  # loads the model
    return strided_solution(Direct(), token_ids, window, stride)


STRIDED_ZOO = {
    overlap_twice: "scored twice",
    first_window_dropped: "the first window's early tokens were never scored",
    hugging_face_guide: "the Hugging Face guide's layout",
    reads_window_minus_one: "the pass read one token too few",
    window_means: "not the mean of each window's mean",
    unshifted: "row t of the logits predicts the token at t + 1",
    mean_loss_returned: "not the mean loss itself",
    calls_score_text: "calls labkit's own `labkit.runtime.scoring.score_text`",
    calls_full_logits: "calls labkit's own `labkit.runtime.forward.full_logits`",
}


def test_the_strided_text_is_the_start_of_the_evaluation_text():
    from labkit.core.texts import load_eval_text, tokenize_sections
    from labkit.exercises.lab02 import STRIDED_TEXT_IDS
    from labkit.runtime.models import load_model

    corpus = tokenize_sections(load_model(progress=False).tokenizer, load_eval_text())
    assert torch.equal(STRIDED_TEXT_IDS, corpus.token_ids[:32])


def test_a_second_strided_check_reads_the_kept_passes():
    from labkit.exercises.lab02 import EMBEDDED

    check_function(STRIDED, strided_solution, seed=0)  # the embedded model loaded, the hand cases' passes kept
    kept = len(EMBEDDED._kept)
    verdict = check_function(STRIDED, strided_solution, seed=0)  # the same cases: no new pass
    assert verdict.status == "passed", str(verdict)
    assert len(EMBEDDED._kept) == kept > 0  # speed itself is make bench's to measure


def test_every_strided_bug_fails_with_a_message_that_points_at_it():
    assert check_function(STRIDED, strided_with_labkit_surprisal).status == "passed"
    assert_zoo(STRIDED, strided_solution, STRIDED_ZOO)


def test_a_strided_stub_is_not_attempted_and_the_task_text_says_what_is_allowed():
    def stub(model, token_ids, window, stride):
        raise NotImplementedError("your code here")

    assert check_function(STRIDED, stub).status == "not attempted"
    assert STRIDED.allowed_text == (
        "You may call `labkit.runtime.scoring.ScoringModel` (its methods and properties), "
        "`labkit.core.loss.token_surprisal` and `labkit.core.loss.cross_entropy`; any other labkit function is "
        "reported by the check.")


def test_the_scoring_model_keeps_recent_passes_and_is_not_copied():
    import copy

    from labkit import runtime
    from labkit.exercises.lab02 import STRIDED_TEXT_IDS
    from labkit.runtime.models import load_model
    from labkit.runtime.scoring import ScoringModel

    lm = load_model(progress=False)
    model = ScoringModel(lm, memory=2)
    assert copy.deepcopy(model) is model
    first = model.logits(STRIDED_TEXT_IDS[:5])
    # two forward passes with their own buffers: equal within float noise, not bit for bit (MKL's kernels may
    # take another path on differently aligned memory)
    fresh = runtime.full_logits(lm, STRIDED_TEXT_IDS[None, :5])[0]
    torch.testing.assert_close(first, fresh, rtol=1e-5, atol=1e-4)
    first[0, 0] = 1e9  # a caller's edit does not reach the kept copy
    torch.testing.assert_close(model.logits(STRIDED_TEXT_IDS[:5]), fresh, rtol=1e-5, atol=1e-4)
    model.logits(STRIDED_TEXT_IDS[:3]), model.logits(STRIDED_TEXT_IDS[:4])
    assert len(model._kept) == 2
