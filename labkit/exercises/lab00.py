"""Lab 00's exercises: softmax with temperature (greedy at T = 0), and Lesson 4.1's question on tokenizers."""

from __future__ import annotations

import math

import torch

from labkit.exercises.checking import Case, Exercise, Mistake, prediction
from labkit.core.course import lesson_logits
from labkit.exercises import register
from labkit.core.sampling import apply_temperature, softmax_with_temperature

_LOG_8421 = lesson_logits(torch.float64)  # the lesson's A, B, C, D


def _random_case(generator: torch.Generator) -> Case:
    batch = int(torch.randint(1, 4, (1,), generator=generator))
    vocab = int(torch.randint(2, 40, (1,), generator=generator))
    logits = torch.randn(batch, vocab, generator=generator, dtype=torch.float64) * 3
    if batch == 1 and torch.rand(1, generator=generator) < 0.5:
        logits = logits[0]  # a single [vocab] row must work too
    draw = float(torch.rand(1, generator=generator))
    temperature = 0.0 if draw < 0.1 else round(0.1 + 2.9 * draw, 3)
    return Case((logits, temperature), label=f"random logits at temperature {temperature}")


# Deliberately wrong versions: if a learner's output equals one of these on a failing case, its hint is shown.
def _no_temperature(logits, temperature):
    return torch.softmax(logits, dim=-1)


def _multiplied(logits, temperature):
    return torch.softmax(logits * temperature, dim=-1)


def _zero_divides(logits, temperature):
    return torch.softmax(logits / temperature, dim=-1)


def _greedy_last_tie(logits, temperature):
    if temperature > 0:
        return torch.softmax(logits / temperature, dim=-1)
    last = logits.shape[-1] - 1 - logits.flip(-1).argmax(dim=-1, keepdim=True)
    return torch.zeros_like(logits).scatter(-1, last, 1.0)


def _greedy_split_tie(logits, temperature):
    if temperature > 0:
        return torch.softmax(logits / temperature, dim=-1)
    top = (logits == logits.max(dim=-1, keepdim=True).values).to(logits.dtype)
    return top / top.sum(dim=-1, keepdim=True)


def _wrong_dim(logits, temperature):
    return torch.softmax(apply_temperature(logits, temperature), dim=0)


def _unnormalized(logits, temperature):
    return apply_temperature(logits, temperature).exp()


def _no_max_shift(logits, temperature):
    scaled = apply_temperature(logits, temperature).exp()
    return scaled / scaled.sum(dim=-1, keepdim=True)


SOFTMAX_TEMPERATURE = register(
    Exercise(
        id="00.softmax_temperature",
        title="Softmax with temperature",
        function="softmax_with_temperature",
        reference=softmax_with_temperature,
        allowed=(),  # apply_temperature would do half the exercise
        points=2,
        rtol=1e-5,
        atol=1e-7,
        hand_cases=(
            Case((_LOG_8421, 1.0),
                 label="the worked example's logits log 8, log 4, log 2, log 1 at T = 1: (8, 4, 2, 1) / 15"),
            Case((_LOG_8421, 0.5), label="the same at T = 1/2: (64, 16, 4, 1) / 85"),
            Case((torch.tensor([0.0, math.log(4.0)], dtype=torch.float64), 2.0), label="T = 2 halves the log-odds: (1, 2) / 3"),
            Case((torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]), 1.0), label="a batch: each row is its own distribution"),
            Case((torch.tensor([1000.0, 999.0, 998.0]), 1.0), label="large logits must not overflow"),
            Case((torch.tensor([1.0, 3.0, 3.0, 2.0]), 0.0), label="T = 0 is greedy; a tie goes to the first index"),
            Case((torch.tensor([[5.0, 1.0], [2.0, 2.0]]), 0.0), label="T = 0 on a batch"),
        ),
        random_case=_random_case,
        hints=("softmax(z / T) over the last dimension; T = 0 is a one-hot on the first largest logit",),
        mistakes=(
            Mistake("temperature 0 cannot be divided by: treat it as its own case, a one-hot on the argmax", _zero_divides),
            Mistake("at T = 0 all the probability goes to the FIRST largest logit (torch.argmax picks it)", _greedy_last_tie),
            Mistake("at T = 0 a tie is not shared: all the probability goes to the first largest logit", _greedy_split_tie),
            Mistake("the temperature is not used: divide the logits by T before the softmax", _no_temperature),
            Mistake("divide the logits by T; multiplying by T flattens where it should sharpen", _multiplied),
            Mistake("normalize over the last dimension (dim=-1): each row is one distribution", _wrong_dim),
            Mistake("the probabilities must sum to 1: divide by the sum of the exponentials", _unnormalized),
            Mistake("exp overflows for large logits: subtract each row's maximum first (the result is unchanged)",
                    _no_max_shift),
        ),
    )
)


# --------------------------------------------------------------------------------------------------------------
# 00.predict_tokenizer: Lesson 4.1's retrieve-and-predict question 1, as a choice the checker reads

TOKENIZER_CHOICES = {
    "a": "the embedding matrix gets the wrong shape, so the model cannot run at all",
    "b": "the same token id can stand for a different piece of text, so the model reads a sequence nobody wrote",
    "c": "a tokenizer holds some of the model's weights, so changing it changes the weights",
    "d": "nothing breaks: matching dimensions mean the two tokenizers are compatible",
}


def tokenizer_answer() -> str:
    """The choice that answers "why can a new tokenizer break a run when the embedding dimensions still match?"."""
    return "b"


PREDICT_TOKENIZER = register(prediction(
    "00.predict_tokenizer", "Predict: why a different tokenizer breaks a run whose dimensions match", "tokenizer_choice",
    tokenizer_answer, choices=tuple(TOKENIZER_CHOICES),
    asked="why a tokenizer of the same size can still break a run: one of "
          + ", ".join(f'"{key}"' for key in TOKENIZER_CHOICES),
    hint='return one lower-case letter as a string, e.g. "a"; an embedding row is looked up by id, and the id is all '
         "the model ever sees of the text"))
