"""Lab 02's exercises: cross-entropy and perplexity of targets under logits."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from labkit.exercises.checking import Case, Exercise, Mistake
from labkit.core.course import lesson_logits
from labkit.exercises import register
from labkit.core.loss import cross_entropy, perplexity, token_surprisal

_LOG_8421 = lesson_logits(torch.float64)  # the lesson's A, B, C, D


def _random_logits_and_targets(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, str]:
    batched = bool(torch.rand(1, generator=generator) < 0.4)
    seq_len = int(torch.randint(2, 12, (1,), generator=generator))
    vocab = int(torch.randint(2, 40, (1,), generator=generator))
    shape = (int(torch.randint(1, 4, (1,), generator=generator)), seq_len) if batched else (seq_len,)
    scale = float(0.5 + 4.5 * torch.rand(1, generator=generator))
    logits = torch.randn(*shape, vocab, generator=generator, dtype=torch.float64) * scale
    targets = torch.randint(0, vocab, shape, generator=generator)
    return logits, targets, f"random logits {tuple(logits.shape)} with scale {scale:.2f}"


def _random_case(generator: torch.Generator) -> Case:
    logits, targets, label = _random_logits_and_targets(generator)
    return Case((logits, targets), label=label)


_HAND_CASES = (
    Case((torch.zeros(3, 4, dtype=torch.float64), torch.tensor([0, 1, 2])),
         label="four equal logits: every target has probability 1/4, loss ln 4 = 1.3863, perplexity 4"),
    Case((_LOG_8421.repeat(2, 1), torch.tensor([0, 3])),
         label="probabilities (8, 4, 2, 1) / 15, targets 0 and 3: loss (ln 15/8 + ln 15) / 2 = 1.6681"),
    Case((torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]], dtype=torch.float64), torch.tensor([1, 0])),
         label="p = 1/2 then 3/4: loss (ln 2 + ln 4/3) / 2, perplexity sqrt(8/3) = 1.633"),
    Case((torch.tensor([[1000.0, 999.0, 998.0], [-1000.0, 0.0, 1000.0]], dtype=torch.float64), torch.tensor([0, 2])),
         label="large logits must not overflow (subtract each row's maximum, or use log_softmax)"),
    Case((_LOG_8421.repeat(2, 3, 1), torch.tensor([[0, 1, 2], [3, 0, 0]])),
         label="a batch [2, 3, vocab]: the mean runs over every position of every sequence"),
)

# A confident wrong prediction: softmax rounds p(target) = e**-1000 to 0, and log(0) = -inf. The loss is 1000 nats,
# which log_softmax (log p = z - logsumexp(z)) gets exactly. Perplexity e**1000 overflows, so only the loss has it.
_CONFIDENT_AND_WRONG = Case((torch.tensor([[1000.0, 0.0]], dtype=torch.float64), torch.tensor([1])),
                            label="a confident wrong prediction: logits (1000, 0), target 1: loss 1000 nats")


# Deliberately wrong versions: if a learner's output equals one of these on a failing case, its hint is shown.
def _probabilities(logits, targets):
    return -torch.softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).mean()


def _logits_as_probabilities(logits, targets):
    return -logits.log().gather(-1, targets.unsqueeze(-1)).mean()


def _no_minus(logits, targets):
    return -cross_entropy(logits, targets)


def _summed(logits, targets):
    return token_surprisal(logits, targets).sum()


def _bits(logits, targets):
    return cross_entropy(logits, targets, unit="bits")


def _shifted(logits, targets):
    return cross_entropy(logits[..., :-1, :], targets[..., 1:])


def _unstable(logits, targets):
    probs = logits.exp() / logits.exp().sum(dim=-1, keepdim=True)
    return -probs.gather(-1, targets.unsqueeze(-1)).log().mean()


def _log_of_softmax(logits, targets):
    return -torch.log(torch.softmax(logits, dim=-1)).gather(-1, targets.unsqueeze(-1)).mean()


def _whole_columns(logits, targets):
    return -torch.log_softmax(logits, dim=-1)[..., targets].mean()


def _mean_over_vocab(logits, targets):
    return -torch.log_softmax(logits, dim=-1).mean()


CROSS_ENTROPY = register(
    Exercise(
        id="02.cross_entropy",
        title="Cross-entropy of targets under logits",
        function="cross_entropy",
        reference=cross_entropy,
        forbidden=(F.cross_entropy,),
        points=2,
        rtol=1e-5,
        atol=1e-7,
        hand_cases=(*_HAND_CASES, _CONFIDENT_AND_WRONG),
        random_case=_random_case,
        hints=("log_softmax over the last dimension, pick each target's entry (gather), negate, average",),
        mistakes=(
            Mistake("log(softmax) gives log 0 = -inf once a probability rounds to 0: use torch.log_softmax, which "
                    "computes log p = z - logsumexp(z) without forming p", _log_of_softmax),
            Mistake("the logits are not probabilities: turn them into log-probabilities with log_softmax first",
                    _logits_as_probabilities),
            Mistake("exp overflows for large logits: use torch.log_softmax (it subtracts each row's maximum)",
                    _unstable),
            Mistake("the loss averages -log p(target), not -p(target): take the log of the probabilities",
                    _probabilities),
            Mistake("a loss is positive: it is the NEGATIVE mean log-probability (log p <= 0)", _no_minus),
            Mistake("average over positions (mean), don't sum: the loss is per token", _summed),
            Mistake("use the natural logarithm (nats): log2 gives bits, 1.4427 times larger", _bits),
            Mistake("logits[t] already scores targets[t]: do not shift the targets by one here", _shifted),
            Mistake("indexing with [..., targets] takes whole columns: pick one entry per position with gather",
                    _whole_columns),
            Mistake("average the targets' -log p only, not every entry of the vocabulary", _mean_over_vocab),
        ),
    )
)


def _ppl_exp_sum(logits, targets):
    return token_surprisal(logits, targets).sum().exp()


def _ppl_base2(logits, targets):
    return torch.pow(2.0, cross_entropy(logits, targets))


def _ppl_log2_then_exp(logits, targets):
    return cross_entropy(logits, targets, unit="bits").exp()


def _ppl_arithmetic(logits, targets):
    return token_surprisal(logits, targets).exp().mean()


def _ppl_no_minus(logits, targets):
    return (-cross_entropy(logits, targets)).exp()


def _ppl_is_loss(logits, targets):
    return cross_entropy(logits, targets)


def _ppl_mean_probability(logits, targets):
    return 1 / torch.softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).mean()


PERPLEXITY = register(
    Exercise(
        id="02.perplexity",
        title="Perplexity of targets under logits",
        function="perplexity",
        reference=perplexity,
        points=1,
        rtol=1e-5,
        atol=1e-7,
        hand_cases=_HAND_CASES,
        random_case=_random_case,
        hints=("perplexity = exp(mean of -log p(target)) with natural logs (or 2 ** the mean in bits)",),
        mistakes=(
            Mistake("exponentiate the MEAN negative log-likelihood, not the sum: perplexity is per token", _ppl_exp_sum),
            Mistake("base mismatch: the loss is in nats (natural log), so use exp, not 2 **", _ppl_base2),
            Mistake("base mismatch: a loss in bits (log2) goes with 2 **, not exp", _ppl_log2_then_exp),
            Mistake("perplexity is a geometric mean of 1/p: exp of the mean surprisal, not the mean of exp", _ppl_arithmetic),
            Mistake("exp of the NEGATIVE log-likelihood: your answer is 1 / perplexity (it is below 1)", _ppl_no_minus),
            Mistake("that is the cross-entropy itself: perplexity is its exponential", _ppl_is_loss),
            Mistake("not 1 / (mean probability): the geometric mean of 1/p is exp(mean -log p)", _ppl_mean_probability),
        ),
    )
)
