"""Lab 01's exercises: which tokens survive each order (the lesson's question 4), temperature on logits (greedy at
T = 0), top-k, top-p after temperature, and a prediction on the model.

Each exercise's task text in ``notebooks/solutions/01_sampling.ipynb`` states the rules and tolerances used here.
"""

from __future__ import annotations

import functools
import math

import torch

from labkit.exercises.definitions import Case, CodeExercise, Mistake, prediction
from labkit.core.course import lesson_logits
from labkit.exercises import register
from labkit.core.distribution import kept_count
from labkit.core.sampling import (
    TOP_P_TOLERANCE, apply_temperature, sampling_logits, sampling_probs, softmax_with_temperature,
    top_k_filter, top_p_filter, top_p_filter_reference,
)

_LOG_8421 = lesson_logits(torch.float64)  # the lesson's A, B, C, D
_LOG_8421_F32 = lesson_logits()
_INF = math.inf


def _random_logits(generator: torch.Generator, with_minus_inf: bool = True) -> torch.Tensor:
    """``[batch, vocab]`` or ``[vocab]`` logits; often with ties (integer values), sometimes with -inf entries."""
    batch = int(torch.randint(1, 4, (1,), generator=generator))
    vocab = int(torch.randint(2, 40, (1,), generator=generator))
    dtype = torch.float64 if torch.rand(1, generator=generator) < 0.5 else torch.float32
    if torch.rand(1, generator=generator) < 0.4:  # integer-valued logits: ties that a tie rule must settle
        logits = torch.randint(-3, 4, (batch, vocab), generator=generator).to(dtype)
    else:
        logits = torch.randn(batch, vocab, generator=generator, dtype=dtype) * 3
    if with_minus_inf and vocab > 2 and torch.rand(1, generator=generator) < 0.2:
        logits[:, -1] = -_INF  # a token an earlier step already removed
    if batch == 1 and torch.rand(1, generator=generator) < 0.5:
        logits = logits[0]  # a single [vocab] row must work too
    return logits


def _random_temperature(generator: torch.Generator) -> float:
    draw = float(torch.rand(1, generator=generator))
    return 0.0 if draw < 0.15 else round(0.1 + 2.4 * draw, 3)


# --------------------------------------------------------------------------------------------------------------
# 01.predict_order: Lesson 4.1's retrieve-and-predict question 4, answered before the notebook computes it

ORDER_TEMPERATURE, ORDER_TOP_P = 0.5, 0.75


def survivors_in_each_order() -> tuple[str, str]:
    """The tokens of A, B, C, D that keep a nonzero probability at T = 1/2 and top-p = 3/4: (temperature first,
    filter first), each as letters in alphabetical order.

    >>> survivors_in_each_order()
    ('A', 'AB')
    """
    def letters(probs: torch.Tensor) -> str:
        return "".join(name for name, prob in zip("ABCD", probs.tolist()) if prob > 0)

    settings = dict(temperature=ORDER_TEMPERATURE, top_p=ORDER_TOP_P)
    return (letters(sampling_probs(_LOG_8421, **settings)),
            letters(sampling_probs(_LOG_8421, **settings, order="filters_first")))


PREDICT_ORDER = register(prediction(
    "01.predict_order", "Predict: which tokens survive T = 1/2 and top-p = 3/4, in each order", "predicted_survivors",
    survivors_in_each_order,
    asked="logits (log 8, log 4, log 2, log 1), T = 1/2, top-p = 3/4",
    hint="return two strings of letters in alphabetical order, e.g. (\"ABCD\", \"ABC\"): first the tokens left when "
         "temperature comes first, then when the filter comes first",
    reveal="""("A", "AB"). Temperature first: at T = 1/2 the probabilities are (64, 16, 4, 1)/85, and A alone
    holds 64/85 ≈ 0.753, already at least 3/4, so only A survives. Filter first: the nucleus at T = 1 is {A, B}
    (8/15 + 4/15 = 0.8), and T = 1/2 on those two gives (64, 16)/80 = (4/5, 1/5).

    Two algorithms, hence the `order` parameter of labkit's sampling functions: `"temperature_first"` (the
    default, transformers' order) or `"filters_first"`. The next cell computes both.""",
    giveaways=("only A survives", "only $A$ survives", "64/85", "0.753", "(4/5, 1/5)", "(64, 16)/80")))


# --------------------------------------------------------------------------------------------------------------
# 01.apply_temperature


def _temperature_case(generator: torch.Generator) -> Case:
    logits, temperature = _random_logits(generator), _random_temperature(generator)
    return Case((logits, temperature), label=f"random logits at temperature {temperature}")


def _divides_by_zero(logits, temperature):
    return logits / temperature


def _multiplies(logits, temperature):
    return logits * temperature if temperature else apply_temperature(logits, 0)


def _one_hot_probabilities(logits, temperature):
    if temperature:
        return logits / temperature
    return torch.zeros_like(logits).scatter(-1, logits.argmax(-1, keepdim=True), 1.0)


def _greedy_keeps_the_logit(logits, temperature):
    if temperature:
        return logits / temperature
    first = logits.argmax(-1, keepdim=True)
    return torch.full_like(logits, -_INF).scatter(-1, first, logits.gather(-1, first))


def _greedy_zero_fill(logits, temperature):
    if temperature:
        return logits / temperature
    return torch.full_like(logits, -1e9).scatter(-1, logits.argmax(-1, keepdim=True), 0.0)


def _greedy_last_tie(logits, temperature):
    if temperature:
        return logits / temperature
    last = logits.shape[-1] - 1 - logits.flip(-1).argmax(-1, keepdim=True)
    return torch.full_like(logits, -_INF).scatter(-1, last, 0.0)


def _greedy_keeps_ties(logits, temperature):
    if temperature:
        return logits / temperature
    top = logits == logits.amax(-1, keepdim=True)
    return torch.zeros_like(logits).masked_fill(~top, -_INF)


def _probabilities(logits, temperature):
    return softmax_with_temperature(logits, temperature)


APPLY_TEMPERATURE = register(
    CodeExercise(
        id="01.apply_temperature",
        title="Temperature on logits, greedy at T = 0",
        function="apply_temperature",
        reference=apply_temperature,
        points=1,
        rtol=1e-6,
        atol=1e-9,
        hand_cases=(
            Case((_LOG_8421, 0.5), label="T = 1/2 doubles every logit"),
            Case((torch.tensor([2.0, -1.0, 0.5]), 2.0), label="T = 2 halves every logit"),
            Case((torch.tensor([2.0, -1.0, 0.5]), 1.0), label="T = 1 changes nothing"),
            Case((torch.tensor([1.0, 3.0, 3.0, 2.0]), 0.0), label="T = 0: 0.0 on the FIRST largest, -inf elsewhere"),
            Case((torch.tensor([[5.0, 1.0], [2.0, 2.0]]), 0.0), label="T = 0 on a batch, one row a tie"),
            Case((torch.tensor([-_INF, 2.0, 1.0]), 0.5), label="a removed token (-inf) stays removed"),
            Case((torch.tensor([-_INF, 2.0, 1.0]), 0.0), label="a removed token (-inf) at T = 0"),
        ),
        random_case=_temperature_case,
        hints=("divide by T when T > 0; at T = 0 return 0.0 at the first argmax and -inf everywhere else",),
        mistakes=(
            Mistake("T = 0 cannot be divided by: treat it as its own case (0.0 at the first argmax, -inf elsewhere)",
                    _divides_by_zero),
            Mistake("return logits, not probabilities: at T = 0 that is 0.0 at the argmax and -inf elsewhere "
                    "(softmax turns it into the one-hot)", _one_hot_probabilities),
            Mistake("at T = 0 the kept token's logit is exactly 0.0, whatever its value was", _greedy_keeps_the_logit),
            Mistake("removed tokens must be exactly -inf (exp(-inf) = 0), not a large negative number",
                    _greedy_zero_fill),
            Mistake("at T = 0 the FIRST largest logit wins a tie (torch.argmax picks it)", _greedy_last_tie),
            Mistake("at T = 0 only one token is kept: the first of the tied largest logits", _greedy_keeps_ties),
            Mistake("divide the logits by T; multiplying by T flattens where it should sharpen", _multiplies),
            Mistake("return the scaled logits; the softmax comes later", _probabilities),
        ),
    )
)


# --------------------------------------------------------------------------------------------------------------
# 01.top_k_filter


def _top_k_case(generator: torch.Generator) -> Case:
    logits = _random_logits(generator)
    k = int(torch.randint(0, logits.shape[-1] + 4, (1,), generator=generator))
    return Case((logits, k), label=f"random logits, k = {k}")


def _keeps_every_tie(logits, k):
    if k == 0 or k >= logits.shape[-1]:
        return logits.clone()
    kth = logits.topk(k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, -_INF)


def _topk_indices(logits, k):
    if k == 0 or k >= logits.shape[-1]:
        return logits.clone()
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, logits.topk(k, dim=-1).indices, True)
    return logits.masked_fill(~keep, -_INF)


def _ties_to_higher_id(logits, k):
    flipped = top_k_filter(logits.flip(-1), k)  # the same rule on the reversed vocabulary
    return flipped.flip(-1)


def _strictly_above(logits, k):
    if k == 0 or k >= logits.shape[-1]:
        return logits.clone()
    kth = logits.topk(k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits <= kth, -_INF)


def _zero_instead_of_minus_inf(logits, k):
    filtered = top_k_filter(logits, k)
    return filtered.masked_fill(filtered.isinf() & logits.isfinite(), 0.0)


def _k_probabilities(logits, k):
    return torch.softmax(top_k_filter(logits, k), dim=-1)


def _k_zero_removes_all(logits, k):
    return torch.full_like(logits, -_INF) if k == 0 else top_k_filter(logits, k)


TOP_K = register(
    CodeExercise(
        id="01.top_k_filter",
        title="Top-k filter",
        function="top_k_filter",
        reference=top_k_filter,
        points=2,
        rtol=1e-6,
        atol=1e-9,
        hand_cases=(
            Case((_LOG_8421, 2), label="the lesson's k = 2 keeps A and B"),
            Case((torch.tensor([2.0, 8.0, 1.0, 4.0]).log(), 2), label="the same tokens in another order"),
            Case((_LOG_8421, 1), label="k = 1 is greedy"),
            Case((_LOG_8421, 0), label="k = 0 switches the filter off"),
            Case((_LOG_8421, 4), label="k equal to the vocabulary keeps everything"),
            Case((_LOG_8421, 10), label="k larger than the vocabulary keeps everything"),
            Case((torch.tensor([1.0, 2.0, 2.0, 2.0, 0.0]), 2), label="a tie at the cut: the lower ids win"),
            Case((torch.tensor([[5.0, 5.0, 5.0, 5.0, 5.0], [0.0, 3.0, 1.0, 3.0, 2.0]]), 2),
                 label="a batch: each row keeps its own k"),
            Case((torch.tensor([-_INF, 1.0, -_INF, 0.0]), 3), label="removed tokens (-inf) stay removed"),
        ),
        random_case=_top_k_case,
        hints=("k = 0 means no filtering, and k larger than the vocabulary keeps every token (torch.topk raises "
               "when k > vocab: use min(k, vocab)); then keep exactly k tokens, ties to the lower id",),
        mistakes=(
            Mistake("keep exactly k tokens: of the logits tied at the cut, the lower token ids win",
                    _keeps_every_tie),
            Mistake("torch.topk does not promise which of several tied logits it returns; the rule here is "
                    "lower token id first", _topk_indices),
            Mistake("ties go to the LOWER token id (the earlier position in the row)", _ties_to_higher_id),
            Mistake("the k-th largest logit itself stays: compare with >=, then settle ties", _strictly_above),
            Mistake("removed tokens must be -inf (exp(-inf) = 0); 0.0 keeps them possible",
                    _zero_instead_of_minus_inf),
            Mistake("return the filtered logits, not probabilities", _k_probabilities),
            Mistake("k = 0 means the filter is off: return the logits unchanged", _k_zero_removes_all),
        ),
    )
)


# --------------------------------------------------------------------------------------------------------------
# 01.nucleus_probs: temperature, then top-p, then renormalize


def nucleus_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The exercise's reference: labkit's temperature, then the plain top-p rule (not the fast path), renormalized.

    ``labkit.core.sampling.top_p_filter`` is a faster route to the same cut, tested equal to this rule."""
    return torch.softmax(top_p_filter_reference(apply_temperature(logits, temperature), top_p), dim=-1)


def _far_from_every_boundary(logits: torch.Tensor, temperature: float, top_p: float, margin: float = 1e-4) -> bool:
    """No ranked prefix of the tempered distribution has a mass within ``margin`` of ``top_p``."""
    ranked = torch.sort(apply_temperature(logits, temperature).double(), dim=-1, descending=True).values
    mass = torch.softmax(ranked, dim=-1).cumsum(dim=-1)
    return bool(((mass - top_p).abs() > margin).all())


def _nucleus_case(generator: torch.Generator) -> Case:
    logits, temperature = _random_logits(generator), _random_temperature(generator)
    for _ in range(50):  # a p whose cut is clear: rounding must not decide a random case
        top_p = round(0.05 + 0.9 * float(torch.rand(1, generator=generator)), 4)
        if _far_from_every_boundary(logits, temperature, top_p):
            break
    return Case((logits, temperature, top_p), label=f"random logits, T = {temperature}, top_p = {top_p}")


def _ranked_probs(logits, temperature):
    probs = softmax_with_temperature(logits, temperature)
    ranked, token_ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    return probs.gather(-1, token_ids), token_ids


def _keep_where(logits, temperature, keep_ranked, token_ids, renormalize=True):
    keep_ranked[..., 0] = True
    keep = keep_ranked.scatter(-1, token_ids, keep_ranked)
    probs = softmax_with_temperature(logits, temperature) * keep
    return probs / probs.sum(-1, keepdim=True) if renormalize else probs


def _drops_the_crossing_token(logits, temperature, top_p):
    ranked, token_ids = _ranked_probs(logits, temperature)
    return _keep_where(logits, temperature, ranked.cumsum(-1) <= top_p, token_ids)


def _keeps_one_past_the_boundary(logits, temperature, top_p):
    ranked, token_ids = _ranked_probs(logits, temperature)
    mass_before = ranked.cumsum(-1) - ranked
    return _keep_where(logits, temperature, mass_before <= top_p, token_ids)


def _no_sort(logits, temperature, top_p):
    probs = softmax_with_temperature(logits, temperature)
    mass_before = probs.cumsum(-1) - probs
    keep = mass_before < top_p
    return probs * keep / (probs * keep).sum(-1, keepdim=True)


def _ascending(logits, temperature, top_p):
    probs = softmax_with_temperature(logits, temperature)
    ranked, token_ids = torch.sort(probs, dim=-1, stable=True)
    return _keep_where(logits, temperature, ranked.cumsum(-1) - ranked < top_p, token_ids)


def _not_renormalized(logits, temperature, top_p):
    return softmax_with_temperature(logits, temperature) * top_p_filter(apply_temperature(logits, temperature),
                                                                        top_p).isfinite()


def _temperature_after_filtering(logits, temperature, top_p):
    return sampling_probs(logits, temperature=temperature, top_p=top_p, order="filters_first")


def _no_temperature(logits, temperature, top_p):
    return sampling_probs(logits, top_p=top_p)


def _ties_to_higher_id(logits, temperature, top_p):
    return nucleus_probs(logits.flip(-1), temperature, top_p).flip(-1)


def _unnormalized_mass(logits, temperature, top_p):
    scaled = apply_temperature(logits, temperature)
    weights = scaled.exp()
    ranked, token_ids = torch.sort(scaled, dim=-1, descending=True, stable=True)
    ranked_weights = weights.gather(-1, token_ids)
    return _keep_where(logits, temperature, ranked_weights.cumsum(-1) - ranked_weights < top_p, token_ids)


NUCLEUS = register(
    CodeExercise(
        id="01.nucleus_probs",
        title="Temperature, then top-p, renormalized",
        function="nucleus_probs",
        reference=nucleus_probs,
        allowed=(apply_temperature,),  # lab 01's first exercise: the learner has written it already
        points=3,
        rtol=1e-5,
        atol=1e-7,
        hand_cases=(
            Case((_LOG_8421, 1.0, 0.9), label="the lesson's logits, top-p 0.9 keeps A, B, C -> (8, 4, 2, 0) / 14"),
            Case((_LOG_8421, 1.0, 0.75), label="the lesson: top-p 3/4 keeps A, B -> (2/3, 1/3, 0, 0)"),
            Case((_LOG_8421, 1.0, 0.8), label="the exact boundary p = 4/5: 12/15 reaches it, still only A, B"),
            Case((_LOG_8421_F32, 1.0, 0.8), label="the same boundary in float32"),
            Case((_LOG_8421, 0.5, 0.75), label="T = 1/2 first: 64/85 > 3/4, so A alone"),
            Case((torch.tensor([2.0, 8.0, 1.0, 4.0], dtype=torch.float64).log(), 1.0, 0.75),
                 label="the same tokens in another order: rank them first"),
            Case((_LOG_8421, 1.0, 1.0), label="p = 1 keeps everything"),
            Case((_LOG_8421, 0.0, 0.9), label="T = 0 is greedy: a one-hot on A"),
            Case((torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0]), 1.0, 0.5), label="ties are ranked by lower id first"),
            Case((torch.tensor([[3.0, 1.0, 0.0], [0.0, 0.0, 0.0]]), 1.0, 0.6), label="a batch: one nucleus per row"),
        ),
        random_case=_nucleus_case,
        hints=("T first (T = 0 greedy), then rank by probability (ties: lower id first), keep tokens while the "
               "mass before them is below top_p, and renormalize",),
        mistakes=(
            Mistake("keep the token that reaches or crosses top_p: a token stays while the mass ranked BEFORE it "
                    "is still below top_p", _drops_the_crossing_token),
            Mistake("a prefix whose mass equals top_p exactly already reaches it: keep a token only while the "
                    "mass before it is < top_p (minus the stated tolerance)", _keeps_one_past_the_boundary),
            Mistake("rank the tokens by probability (highest first) before accumulating the mass", _no_sort),
            Mistake("rank from the MOST probable token down (descending)", _ascending),
            Mistake("after removing tokens, renormalize: the kept probabilities must sum to 1", _not_renormalized),
            Mistake("apply the temperature first, then choose the nucleus on the tempered distribution",
                    _temperature_after_filtering),
            Mistake("the temperature is not used: divide the logits by T first (T = 0: greedy)", _no_temperature),
            Mistake("equal probabilities are ranked by LOWER token id first (torch.sort(..., stable=True))",
                    _ties_to_higher_id),
            Mistake("accumulate probabilities (softmax), not raw exp(logits): the mass must be out of 1",
                    _unnormalized_mass),
        ),
    )
)


# --------------------------------------------------------------------------------------------------------------
# 01.predict_kept_tokens: predict, then check


PREDICT_PROMPT = "Give me a name for a cat."
PREDICT_TEMPERATURE, PREDICT_TOP_P = 0.7, 0.9


@functools.lru_cache(maxsize=1)
def _first_reply_logits() -> torch.Tensor:
    from labkit import runtime
    from labkit.runtime.models import load_model

    lm = load_model(progress=False)
    next_logits, _ = runtime.forward(lm, lm.chat_ids(PREDICT_PROMPT), use_cache=False)  # [1, vocab]
    return next_logits[0].cpu()  # [vocab]


def kept_tokens_on_the_model() -> float:
    """How many tokens survive T = 0.7, then top-p = 0.9, for the embedded model's first reply token."""
    filtered = sampling_logits(_first_reply_logits(), temperature=PREDICT_TEMPERATURE, top_p=PREDICT_TOP_P)
    return float(kept_count(filtered))


PREDICT = register(prediction(
    "01.predict_kept_tokens", "Predict, then check: tokens kept at T = 0.7, top-p = 0.9", "predicted_kept_tokens",
    kept_tokens_on_the_model,
    rtol=0.5,  # within a factor of two: |prediction - truth| <= max(prediction, truth) / 2
    asked=f"the prompt {PREDICT_PROMPT!r} at T = {PREDICT_TEMPERATURE}, top-p = {PREDICT_TOP_P}",
    hint="return your prediction as a number of tokens, such as 12",
    reveal="""Dividing the logits by 0.7 stretches every gap between them by 1/0.7 ≈ 1.43: the leading tokens take
    a much larger share of the mass, so far fewer of them are needed to reach 90 % than the 121 kept at T = 1. The
    next cell prints how much of the mass the top three tokens hold at each temperature, and the count.""",
    giveaways=("1/0.7", "1.43", "far fewer", "keeps 24", "24 tokens")))

__all__ = ["APPLY_TEMPERATURE", "NUCLEUS", "PREDICT", "PREDICT_ORDER", "TOP_K", "survivors_in_each_order", "nucleus_probs", "kept_tokens_on_the_model",
           "TOP_P_TOLERANCE"]
