"""The bug zoo of lab 02: wrong cross-entropies and perplexities, each reported as failed with a pointed hint."""

import torch
import torch.nn.functional as F

from labkit.exercises.checking import check_function
from labkit.exercises import exercises, get
from labkit.core.loss import cross_entropy as labkit_cross_entropy
from zoo import assert_zoo

CROSS_ENTROPY = get("02.cross_entropy")
PERPLEXITY = get("02.perplexity")


def solution(logits, targets):
    log_probs = torch.log_softmax(logits, dim=-1)
    return -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1).mean()


def ppl_solution(logits, targets):
    return solution(logits, targets).exp()


def ppl_in_bits(logits, targets):  # right too: 2 ** (mean bits) == e ** (mean nats)
    bits = -torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)) / torch.log(torch.tensor(2.0))
    return 2 ** bits.mean()


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


def exp_of_sum(logits, targets):
    return summed(logits, targets).exp()


def base2_of_nats(logits, targets):
    return 2 ** solution(logits, targets)


def exp_of_bits(logits, targets):
    return log2(logits, targets).exp()


def arithmetic_mean(logits, targets):
    return (1 / _picked(logits, targets)).mean()


def inverse(logits, targets):
    return (-solution(logits, targets)).exp()


def is_the_loss(logits, targets):
    return solution(logits, targets)


PERPLEXITY_ZOO = {
    exp_of_sum: "exponentiate the MEAN negative log-likelihood, not the sum",
    base2_of_nats: "use exp, not 2 **",
    exp_of_bits: "goes with 2 **, not exp",
    arithmetic_mean: "geometric mean of 1/p",
    inverse: "your answer is 1 / perplexity",
    is_the_loss: "perplexity is its exponential",
    calls_labkit: "calls labkit's own `labkit.core.loss.cross_entropy`",
}


def test_the_solutions_pass():
    assert check_function(CROSS_ENTROPY, solution).status == "passed"
    assert check_function(PERPLEXITY, ppl_solution).status == "passed"
    assert check_function(PERPLEXITY, ppl_in_bits).status == "passed"


def test_every_cross_entropy_bug_fails_with_a_message_that_points_at_it():
    assert_zoo(CROSS_ENTROPY, solution, CROSS_ENTROPY_ZOO)


def test_every_perplexity_bug_fails_with_a_message_that_points_at_it():
    assert_zoo(PERPLEXITY, ppl_solution, PERPLEXITY_ZOO)


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
    assert PERPLEXITY.allowed_text.startswith("No labkit function")


def test_the_exercises_are_registered_once_in_their_lab():
    assert [ex.id for ex in exercises("02")] == ["02.cross_entropy", "02.perplexity"]
    assert (CROSS_ENTROPY.function, PERPLEXITY.function) == ("cross_entropy", "perplexity")
