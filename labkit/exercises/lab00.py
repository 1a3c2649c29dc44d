"""Lab 00's exercises: softmax with temperature (greedy at T = 0), sampling a token by inverse CDF,
and Lesson 4.1's question on tokenizers."""

from __future__ import annotations

import math

import torch

from labkit.exercises.definitions import Case, CodeExercise, Mistake, choice_prediction
from labkit.core.course import lesson_logits
from labkit.exercises import register
from labkit.core.sampling import apply_temperature, softmax_with_temperature
from labkit.core.speculative import draw_with_uniform

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
    CodeExercise(
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
        grader_cases=(  # run by labkit grade only
            Case((torch.tensor([[-math.inf, 1.0, 2.0, -math.inf]]), 0.5), label="masked tokens (-inf) get probability 0"),
            Case((torch.tensor([-1000.0, -1001.0]), 1.0), label="large negative logits must not underflow to 0/0"),
            Case((torch.tensor([[7.0, 7.0, 7.0]]), 0.0), label="T = 0 with every logit tied: the first index"),
        ),
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
# 00.sample_token: one draw from a distribution by inverse CDF, the uniform passed in so the answer is exact

# A float32 softmax output whose running sum ends at 0.99999988 (the double sum of the same values: 0.99999991).
_DRIFTED = (0.20731854438781738, 0.08144457638263702, 0.22873513400554657, 0.48250165581703186)
_ABOVE_DRIFT = 0.99999995


def _sample_case(generator: torch.Generator) -> Case:
    vocab = int(torch.randint(1, 30, (1,), generator=generator))
    if torch.rand(1, generator=generator) < 0.5:
        # dyadic probabilities (integer weights over a power of two): every running sum is exact, and u sits on one
        weights = torch.randint(0, 8, (vocab,), generator=generator)
        weights[int(torch.randint(0, vocab, (1,), generator=generator))] += 1
        scale = 1 << int(weights.sum() - 1).bit_length()
        weights[int(torch.randint(0, vocab, (1,), generator=generator))] += scale - int(weights.sum())
        probs = weights.double() / scale
        last = int(weights.nonzero().max())  # u < 1: at most the running sum before the last token drawn
        boundary = int(torch.randint(0, last + 1, (1,), generator=generator))
        return Case((probs, float(weights[:boundary].sum()) / scale),
                    label=f"{vocab} dyadic probabilities, u on the running sum before token {boundary}")
    probs = torch.softmax(torch.randn(vocab, generator=generator, dtype=torch.float64) * 2, dim=-1)
    probs = probs * (torch.rand(vocab, generator=generator) > 0.3)
    probs[int(torch.randint(0, vocab, (1,), generator=generator))] += 0.1  # at least one token can be drawn
    return Case((probs / probs.sum(), float(torch.rand(1, generator=generator, dtype=torch.float64))),
                label=f"{vocab} random probabilities (some zero), a random u")


# Deliberately wrong versions (the running sum in float64, as the reference computes it).
def _running(probs):
    return probs.double().cumsum(0)


def _sample_on_boundary(probs, u):
    cumulative = _running(probs)
    return int((cumulative < u * cumulative[-1]).sum())  # first i with cumulative[i] >= u: the left token wins


def _sample_argmax(probs, u):
    return int(probs.argmax())


def _sample_token_before(probs, u):
    cumulative = _running(probs)
    return int((cumulative <= u * cumulative[-1]).sum()) - 1


def _sample_skips_zeros(probs, u):
    cumulative = _running(probs[probs > 0])
    return int((cumulative <= u * cumulative[-1]).sum())  # an index into the shortened vector


def _sample_unscaled(probs, u):
    return int((_running(probs) <= u).sum())


def _sample_clamped(probs, u):
    return min(int((_running(probs) <= u).sum()), probs.shape[0] - 1)


SAMPLE_TOKEN = register(
    CodeExercise(
        id="00.sample_token",
        title="Sampling a token by inverse CDF",
        function="sample_token",
        reference=draw_with_uniform,
        forbidden=(torch.multinomial,),
        points=2,
        rtol=0.0,
        atol=0.0,
        hand_cases=(
            Case((torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64), 0.0), label="u = 0 draws the first token"),
            Case((torch.tensor([0.25, 0.25, 0.125, 0.375], dtype=torch.float64), 0.25),
                 label="u exactly on a running sum (0.25) belongs to the next token"),
            Case((torch.tensor([0.0, 0.5, 0.0, 0.5], dtype=torch.float64), 0.0),
                 label="a token of probability 0 is never drawn, not even at u = 0"),
            Case((torch.tensor([0.0, 0.5, 0.0, 0.5], dtype=torch.float64), 0.5),
                 label="u = 0.5 is where the zero-width token 2 would start: token 3"),
            Case((torch.tensor([0.25, 0.75, 0.0], dtype=torch.float64), math.nextafter(1.0, 0.0)),
                 label="u just below 1 draws the last token of probability > 0"),
            Case((torch.tensor([0.0, 0.0, 1.0, 0.0], dtype=torch.float64), 0.3), label="one-hot: every u draws it"),
            Case((torch.tensor(_DRIFTED, dtype=torch.float32), _ABOVE_DRIFT),
                 label="float32 probabilities summing to 0.99999991, u = 0.99999995 above that sum"),
            Case((torch.tensor((*_DRIFTED, 0.0), dtype=torch.float32), _ABOVE_DRIFT),
                 label="the same with a last token of probability 0, which must not be drawn"),
        ),
        random_case=_sample_case,
        grader_cases=(  # run by labkit grade only
            Case((torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64), math.nextafter(1.0, 0.0)),
                 label="u just below 1 with zero-probability tokens at the end: never one of them"),
            Case((torch.full((8,), 0.125, dtype=torch.float64), 0.625), label="u on a boundary of a uniform row"),
        ),
        hints=("the token is the first index i whose running sum (float64) exceeds u times the total",),
        mistakes=(
            Mistake("dropping the zero-probability tokens shifts every index after them: return the index in the "
                    "original vector (a zero-width interval is never hit anyway)", _sample_skips_zeros),
            Mistake("u exactly on a running sum belongs to the NEXT token: take the first i with "
                    "cumsum[i] > u (strictly greater), not >=", _sample_on_boundary),
            Mistake("argmax is greedy decoding: u must decide the token (the first running sum above u)",
                    _sample_argmax),
            Mistake("off by one: the number of running sums <= u is already the (0-based) index of the token",
                    _sample_token_before),
            Mistake("the probabilities may sum to a little less than 1 (a float32 softmax): scale u by their total "
                    "(u * cumsum[-1]) so u always lands inside the last running sum", _sample_unscaled),
            Mistake("clamping to the last index can draw a token of probability 0: scale u by the total "
                    "(u * cumsum[-1]) instead, so u always lands inside an interval", _sample_clamped),
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


PREDICT_TOKENIZER = register(choice_prediction(
    "00.predict_tokenizer", "Predict: why a different tokenizer breaks a run whose dimensions match", "tokenizer_choice",
    tokenizer_answer, choices=TOKENIZER_CHOICES, question="why a tokenizer of the same size can still break a run",
    hint="the letter of the one choice you think explains it",
    reveal="""**b**. The model never reads text: it looks each id up in its embedding matrix, one row per id, and
    nothing in that row says which piece of text the id stood for. A tokenizer of the same size fits every shape,
    yet its ids point at other rows, so the model reads a sequence nobody wrote and answers it.

    The next two cells show it: they read the question's ids through a table shifted by one entry (each id now
    means what the next id meant), as a mismatched tokenizer of the same size would, and ask the model the shifted
    chat prompt. Keep the tokenizer, its special-token rules and the chat template with the weights they were
    trained with.""",
    giveaways=("fit every shape", "fits every shape", "shifted by one entry", "means what the next id meant", "1781",
               "read nonsense", "answered nonsense", "which piece of text the id stood for",
               "what text an id stood for")))
