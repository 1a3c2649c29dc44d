"""Lab 02's exercises: cross-entropy, the next-token loss of a padded batch, the strided-window scoring loop on
the embedded model, and predictions the checker reads.

The predictions about the evaluation text (which genre the model finds easiest, which temperature scores it
best) are graded against :func:`labkit.runtime.scoring.eval_text_scores`, the one measurement the notebook shows
too: computed once per process, so a check costs nothing after the notebook's own scoring cell. How to test a
KV cache is graded against a stated answer.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from labkit.exercises.definitions import Case, CodeExercise, Mistake, choice_prediction, prediction
from labkit.core.course import lesson_logits
from labkit.exercises import register
from labkit.core.loss import cross_entropy, token_surprisal
from labkit.runtime.scoring import (STRIDE, TEMPERATURES, TRUNCATIONS, WINDOW, ScoringModel,  # noqa: F401
                                    eval_text_scores, score_text)

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
    CodeExercise(
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




# --------------------------------------------------------------------------------------------------------------
# 02.next_token_loss: the shift, on a padded batch


def next_token_loss(logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) of a padded batch, from a causal model's own output.

    logits ``[batch, seq_len, vocab]`` come from reading ``input_ids [batch, seq_len]``; ``attention_mask`` is 1 on
    real tokens, 0 on padding (on either side). The row at position ``t`` predicts the token at ``t + 1``, and a
    pair counts only when both are real tokens; the mean runs over every counted pair of the batch.

    >>> logits = torch.zeros(1, 3, 4)  # four equal logits everywhere: every pair costs ln 4
    >>> round(next_token_loss(logits, torch.tensor([[1, 2, 0]]), torch.tensor([[1, 1, 0]])).item(), 4)
    1.3863
    """
    surprisal = token_surprisal(logits[:, :-1, :], input_ids[:, 1:])  # [batch, seq_len - 1]: row t scores t + 1
    pairs = attention_mask[:, :-1].bool() & attention_mask[:, 1:].bool()  # both ends of the pair are real tokens
    return surprisal[pairs].mean()


PAD_ID = 0  # what sits under the padding; any valid id (the mask, not the id, says it is padding)


def _padded_case(generator: torch.Generator) -> Case:
    batch = int(torch.randint(1, 4, (1,), generator=generator))
    seq_len = int(torch.randint(3, 10, (1,), generator=generator))
    vocab = int(torch.randint(2, 30, (1,), generator=generator))
    scale = float(0.5 + 4.5 * torch.rand(1, generator=generator))
    logits = torch.randn(batch, seq_len, vocab, generator=generator, dtype=torch.float64) * scale
    input_ids = torch.randint(0, vocab, (batch, seq_len), generator=generator)
    left = bool(torch.rand(1, generator=generator) < 0.5)
    lengths = torch.randint(2, seq_len + 1, (batch,), generator=generator)
    lengths[int(torch.randint(0, batch, (1,), generator=generator))] = int(torch.randint(2, seq_len, (1,), generator=generator))
    positions = torch.arange(seq_len)
    real = (positions >= seq_len - lengths[:, None]) if left else (positions < lengths[:, None])
    input_ids = input_ids.masked_fill(~real, PAD_ID)
    side = "left" if left else "right"
    return Case((logits, input_ids, real.long()), label=f"random {side}-padded batch, logits {tuple(logits.shape)}")


def _lesson_rows(n: int) -> torch.Tensor:
    return _LOG_8421.repeat(1, n, 1)  # [1, n, 4]: (8, 4, 2, 1) / 15 at every position


# At padded positions the logits are loud nonsense, so a loss that reads them is far off.
_LOUD = torch.tensor([0.0, 0.0, 0.0, 40.0], dtype=torch.float64)
_RIGHT_PADDED = torch.stack([_LOG_8421, _LOG_8421, _LOG_8421, _LOUD])[None].repeat(2, 1, 1)  # [2, 4, 4]
_RIGHT_PADDED[1, 2] = _LOUD
_LEFT_PADDED = _RIGHT_PADDED.flip(1).clone()

_ALIGNMENT_CASES = (
    Case((_lesson_rows(3), torch.tensor([[0, 1, 3]]), torch.ones(1, 3, dtype=torch.long)),
         label="one text A B D, no padding: rows 0 and 1 score B and D, loss (ln 15/4 + ln 15) / 2 = 2.0149"),
    Case((_lesson_rows(2), torch.tensor([[2, 0]]), torch.ones(1, 2, dtype=torch.long)),
         label="two tokens make one pair: row 0 scores A, loss ln 15/8 = 0.6286"),
    Case((_RIGHT_PADDED, torch.tensor([[0, 1, 0, 3], [1, 2, PAD_ID, PAD_ID]]), torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])),
         label="right padding: 2 pairs in row 0, 1 in row 1; the padded rows' logits must not count"),
    Case((_LEFT_PADDED, torch.tensor([[3, 0, 1, 0], [PAD_ID, PAD_ID, 2, 1]]), torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1]])),
         label="left padding: the pad before the first real token predicts nothing that counts"),
    Case((_lesson_rows(4).repeat(2, 1, 1), torch.tensor([[0, 0, 1, 3], [2, PAD_ID, PAD_ID, PAD_ID]]),
          torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])),
         label="a row with one real token has no pair: the mean is over row 0's 3 pairs"),
)


def _no_shift(logits, input_ids, attention_mask):
    return token_surprisal(logits, input_ids)[attention_mask.bool()].mean()


def _wrong_side(logits, input_ids, attention_mask):
    pairs = attention_mask[:, :-1].bool() & attention_mask[:, 1:].bool()
    return token_surprisal(logits[:, 1:, :], input_ids[:, :-1])[pairs].mean()


def _ignores_padding(logits, input_ids, attention_mask):
    return token_surprisal(logits[:, :-1, :], input_ids[:, 1:]).mean()


def _target_mask_only(logits, input_ids, attention_mask):
    return token_surprisal(logits[:, :-1, :], input_ids[:, 1:])[attention_mask[:, 1:].bool()].mean()


def _input_mask_only(logits, input_ids, attention_mask):
    return token_surprisal(logits[:, :-1, :], input_ids[:, 1:])[attention_mask[:, :-1].bool()].mean()


def _mean_of_row_means(logits, input_ids, attention_mask):
    pairs = (attention_mask[:, :-1].bool() & attention_mask[:, 1:].bool()).double()
    surprisal = token_surprisal(logits[:, :-1, :], input_ids[:, 1:])
    rows = pairs.sum(-1) > 0
    return ((surprisal * pairs).sum(-1)[rows] / pairs.sum(-1)[rows]).mean().to(logits.dtype)


def _divides_by_every_pair(logits, input_ids, attention_mask):
    pairs = attention_mask[:, :-1].bool() & attention_mask[:, 1:].bool()
    return (token_surprisal(logits[:, :-1, :], input_ids[:, 1:]) * pairs).sum() / pairs.numel()


NEXT_TOKEN_LOSS = register(
    CodeExercise(
        id="02.next_token_loss",
        title="Next-token loss of a padded batch",
        function="next_token_loss",
        reference=next_token_loss,
        allowed=(token_surprisal, cross_entropy),
        forbidden=(F.cross_entropy,),
        points=2,
        rtol=1e-5,
        atol=1e-7,
        hand_cases=_ALIGNMENT_CASES,
        random_case=_padded_case,
        hints=("score logits[:, :-1] against input_ids[:, 1:], keep the pairs whose two positions are both real "
               "tokens, and average over those pairs",),
        mistakes=(
            Mistake("row t of the logits predicts the token at t + 1: shift, scoring logits[:, :-1] against "
                    "input_ids[:, 1:]", _no_shift),
            Mistake("shifted the wrong way: the LAST row of logits predicts nothing we have and the FIRST token is "
                    "predicted by nothing, so drop those (logits[:, :-1] against input_ids[:, 1:])", _wrong_side),
            Mistake("pairs that touch padding must not count: keep a pair only where attention_mask is 1 at both "
                    "positions", _ignores_padding),
            Mistake("a pair needs a real token on BOTH ends: with left padding, the pad just before the first real "
                    "token would 'predict' it (mask[:, :-1] & mask[:, 1:])", _target_mask_only),
            Mistake("a pad is never a target: with right padding, the last real token's row would be scored on the pad "
                    "after it (mask[:, :-1] & mask[:, 1:])", _input_mask_only),
            Mistake("average over every counted pair of the batch, not per sequence: rows with more pairs weigh more",
                    _mean_of_row_means),
            Mistake("divide by the number of counted pairs, not by every position of the batch", _divides_by_every_pair),
        ),
    )
)


# --------------------------------------------------------------------------------------------------------------
# 02.strided_perplexity: the windowed scoring loop, on the real model

# The first 32 tokens of the evaluation text ("Every evening at six, Ines climbed the ninety-one steps of the
# lighthouse to wind the clock ..."), as the embedded model's tokenizer splits them (a test checks it). Every case
# is a prefix of it, so the passes of different cases overlap and ScoringModel's memory answers many of them.
STRIDED_TEXT_IDS = torch.tensor([8600, 9053, 418, 2976, 28, 533, 266, 30324, 260, 34069, 29, 537, 3301, 282, 260, 33059,
                                 288, 2251, 260, 9191, 338, 14938, 804, 13532, 30, 378, 17559, 761, 719, 3099, 327,
                                 11591])
EMBEDDED = ScoringModel()  # the embedded model, loaded at its first pass (not when this module is imported)


def strided_perplexity(model: ScoringModel, token_ids: torch.Tensor, window: int, stride: int) -> float:
    """Perplexity of ``token_ids`` ``[n_tokens]`` scored in windows, by labkit's :func:`score_text` (same rule)."""
    return score_text(model, token_ids, window=window, stride=stride, progress=False).perplexity()


def _strided_case(generator: torch.Generator) -> Case:
    window = int(torch.randint(2, 9, (1,), generator=generator))
    stride = int(torch.randint(2, window + 1, (1,), generator=generator))
    n_tokens = min(int(torch.randint(2, 4 * stride + 2, (1,), generator=generator)),  # at most 4 passes
                   len(STRIDED_TEXT_IDS))
    return Case((EMBEDDED, STRIDED_TEXT_IDS[:n_tokens], window, stride),
                label=f"random: the first {n_tokens} tokens, window {window}, stride {stride}")


_STRIDED_CASES = (
    Case((EMBEDDED, STRIDED_TEXT_IDS[:2], 4, 2), label="two tokens: one target, token 1, predicted from token 0"),
    Case((EMBEDDED, STRIDED_TEXT_IDS[:6], 8, 8),
         label="a text shorter than the window: one pass reads tokens 0-4 and scores tokens 1-5"),
    Case((EMBEDDED, STRIDED_TEXT_IDS[:15], 8, 4),
         label="window 8, stride 4: blocks 1-4, 5-8, 9-12 and a last block 13-14; passes read 0-3, 0-7, 4-11, "
               "6-13"),
    Case((EMBEDDED, STRIDED_TEXT_IDS[:13], 4, 4),
         label="stride equal to window: passes read 0-3, 4-7, 8-11; token 5 is predicted from token 4 alone"),
    Case((EMBEDDED, STRIDED_TEXT_IDS[:7], 4, 1),
         label="stride 1: six passes, token t predicted from the (up to) 4 tokens before it"),
)


# The learner's loop written wrong, each the way people write it. Shared pieces: a pass and its token losses.
def _losses(model, token_ids, read_start, read_end, first_target, last_target):
    """-log p of tokens first_target..last_target from one pass over token_ids[read_start:read_end]."""
    logits = model.logits(token_ids[read_start:read_end])
    rows = logits[first_target - 1 - read_start : last_target - read_start]
    return token_surprisal(rows, token_ids[first_target : last_target + 1])


def _blocks(n_tokens, stride):
    return [(first, min(first + stride, n_tokens) - 1) for first in range(1, n_tokens, stride)]


def _counts_overlap_twice(model, token_ids, window, stride):
    n_tokens = len(token_ids)
    losses = []
    for start in range(0, n_tokens - 1, stride):  # windows of `window` tokens moving by `stride`, all scored
        end = min(start + window, n_tokens)
        losses.append(_losses(model, token_ids, start, end - 1, start + 1, end - 1))
    return math.exp(torch.cat(losses).double().mean())


def _drops_first_window(model, token_ids, window, stride):
    n_tokens = len(token_ids)
    losses = []
    for start in range(0, n_tokens - 1, stride):  # every window keeps only its last `stride` targets, the first too
        end = min(start + window, n_tokens)
        first = max(start + 1, end - stride)
        losses.append(_losses(model, token_ids, start, end - 1, first, end - 1))
        if end == n_tokens:
            break
    return math.exp(torch.cat(losses).double().mean())


def _hugging_face_layout(model, token_ids, window, stride):
    n_tokens = len(token_ids)
    losses, scored_to = [], 0  # windows [start, start + window); each scores the targets not scored yet
    for start in range(0, n_tokens - 1, stride):
        end = min(start + window, n_tokens)
        losses.append(_losses(model, token_ids, start, end - 1, max(scored_to + 1, start + 1), end - 1))
        scored_to = end - 1
        if end == n_tokens:
            break
    return math.exp(torch.cat(losses).double().mean())


def _one_token_short(model, token_ids, window, stride):
    losses = [_losses(model, token_ids, max(0, last - window + 1), last, first, last)
              for first, last in _blocks(len(token_ids), stride)]
    return math.exp(torch.cat(losses).double().mean())


def _mean_of_window_means(model, token_ids, window, stride):
    means = [_losses(model, token_ids, max(0, last - window), last, first, last).double().mean()
             for first, last in _blocks(len(token_ids), stride)]
    return math.exp(torch.stack(means).mean())


def _no_shift(model, token_ids, window, stride):
    losses = []
    for first, last in _blocks(len(token_ids), stride):
        start = max(0, last - window)
        logits = model.logits(token_ids[start:last + 1])  # row t scored on token t itself
        losses.append(token_surprisal(logits[first - start:], token_ids[first : last + 1]))
    return math.exp(torch.cat(losses).double().mean())


def _mean_loss(model, token_ids, window, stride):
    return math.log(strided_perplexity(model, token_ids, window, stride))


STRIDED_PERPLEXITY = register(
    CodeExercise(
        id="02.strided_perplexity",
        title="Perplexity of a text in strided windows, on the model",
        function="strided_perplexity",
        reference=strided_perplexity,
        allowed=(ScoringModel, token_surprisal, cross_entropy),
        forbidden=(score_text,),
        points=3,
        n_random=3,
        rtol=1e-4,
        atol=0.0,
        time_limit_s=60.0,  # a cold case runs up to six passes of the model; a loaded 2-core machine is slow
        hand_cases=_STRIDED_CASES,
        random_case=_strided_case,
        hints=("cut the targets 1 .. n_tokens - 1 into blocks of `stride`; score each block from one pass over the "
               "`window` tokens that end just before its last target; exp of the mean over all targets",),
        mistakes=(
            Mistake("a token in the overlap of two windows was scored twice: each pass scores only its own block of "
                    "`stride` targets, the last outputs of the pass", _counts_overlap_twice),
            Mistake("the first window's early tokens were never scored: every target from token 1 on counts once, "
                    "the first pass scores its whole block", _drops_first_window),
            Mistake("windows that start at multiples of the stride (the Hugging Face guide's layout) give each "
                    "block's first target window - stride tokens of context, one too few (and skip the token at each "
                    "window's start when stride = window): let each pass end just before its block's last target, "
                    "token_ids[last - window:last]", _hugging_face_layout),
            Mistake("the pass read one token too few: it reads the `window` tokens token_ids[last - window:last] "
                    "(clipped at 0), where last is the block's last target", _one_token_short),
            Mistake("average the token losses of the whole text, not the mean of each window's mean: a short last "
                    "block would weigh as much as a full one", _mean_of_window_means),
            Mistake("row t of the logits predicts the token at t + 1: score the row before each target, not the "
                    "target's own row", _no_shift),
            Mistake("return the perplexity, exp of the mean loss, not the mean loss itself", _mean_loss),
        ),
    )
)


# --------------------------------------------------------------------------------------------------------------
# Predictions about the evaluation text, graded against the lab's one measurement of it

def genre_perplexities() -> dict[str, float]:
    """Each genre's perplexity in :func:`eval_text_scores`."""
    corpus, scores = eval_text_scores()
    return {genre: scores.perplexity(start, end) for genre, (start, end) in corpus.spans.items()}


GENRE_SLACK = 2  # a predicted order passes when every genre is at most this many places from its true place


class _OrderWithin:
    """A true order that a predicted one matches when every genre sits within GENRE_SLACK places of its own."""

    def __init__(self, truth: list[str]):
        self.truth = truth

    def __eq__(self, other) -> bool:
        if not isinstance(other, (list, tuple)) or sorted(map(str, other)) != sorted(self.truth):
            return False
        return all(abs(list(other).index(genre) - place) <= GENRE_SLACK for place, genre in enumerate(self.truth))

    def __repr__(self) -> str:
        return f"{self.truth} (within {GENRE_SLACK} places each)"

    def prediction_problem(self, other) -> str | None:
        """Why ``other`` is not an order of the genres (None when it is): each genre once, nothing else."""
        if not isinstance(other, (list, tuple)) or sorted(map(str, other)) != sorted(self.truth) or not all(
                isinstance(genre, str) for genre in other):
            return f"your answer must list the {len(self.truth)} genre names, each once, got {other!r}"[:300]
        return None

    def distance_words(self, other) -> str:
        """How far each genre is from its place, e.g. "5 of 7 genres within 2 places; furthest: code, 4 places"."""
        gaps = {genre: abs(list(other).index(genre) - place) for place, genre in enumerate(self.truth)}
        furthest = max(gaps, key=gaps.get)
        near = sum(gap <= GENRE_SLACK for gap in gaps.values())
        return (f"{near} of {len(gaps)} genres within {GENRE_SLACK} places of their own; furthest: {furthest}, "
                f"{gaps[furthest]} places away")


def genre_order() -> _OrderWithin:
    """The genres from the lowest perplexity (most predictable) to the highest."""
    ranked = genre_perplexities()
    return _OrderWithin(sorted(ranked, key=ranked.get))


PREDICT_GENRES = register(prediction(
    "02.predict_genre_order", "Predict: the genres from most to least predictable", "predicted_genre_order",
    genre_order,
    asked="the seven genres of the evaluation text, lowest perplexity first",
    hint="return a list of the seven genre names (story, encyclopedia, recipe, dialogue, code, poem, news), each "
         "once, the most predictable first",
    reveal="""Text that follows fixed forms is the easiest: code repeats its names and syntax, and the recipe its
    set phrases, so code and the recipe come first; the poem, which picks unexpected words on purpose, comes last.
    The table below gives each genre's perplexity beside the model's own expectation, exp(entropy).""",
    giveaways=("code and the recipe", "code is the most", "poem is the least", "the poem the least", "code, recipe",
               "poem comes last", "poem, which picks unexpected words")))


def best_temperature() -> float:
    """The temperature of the grid at which the evaluation text's perplexity is lowest."""
    _, scores = eval_text_scores()
    return min(TEMPERATURES, key=lambda temperature: scores.perplexity(temperature=temperature))


PREDICT_TEMPERATURE = register(prediction(
    "02.predict_best_temperature", "Predict: the temperature that gives the text its lowest perplexity",
    "predicted_best_temperature", best_temperature, choices=TEMPERATURES,
    atol=0.101,  # within 0.1 (the grid's step near 1), with room for 0.9's binary rounding
    asked=f"the grid {TEMPERATURES}",
    hint="return one temperature of the grid as a number, such as 0.8",
    reveal="""The lowest perplexity is at T = 1, with T = 1.1 a hair behind (about 17.9 and 18.0): the model was
    trained to minimise cross-entropy at T = 1, so scoring at any other temperature costs. Below 1 the model is
    over-confident (a wrong favourite costs more); above 1 it spreads probability onto tokens that did not come.

    Per unit of T the perplexity climbs faster below 1 than above (T = 0.5, half a unit below, reaches about 61;
    T = 2, a whole unit above, about 67); per factor it does not: halving T costs less than doubling it. The next
    cells print the grid and draw the curve.""",
    giveaways=("lowest perplexity is at", "minimum is at", "trained to minimise cross-entropy at",
               "trained to minimize cross-entropy at", "17.9", "lowest on this grid at T = 1")))


# --------------------------------------------------------------------------------------------------------------
# Lesson 4.1's retrieve-and-predict question 5 (question 2 is lab 06's, where decode is taught)

CACHE_TEST_CHOICES = {
    "a": "sample 20 tokens with each path from the same seed and compare the two texts",
    "b": "give both paths the same prefix at every step and compare their next-token logits within a tolerance",
    "c": "compare the perplexity of each path's own generated text",
    "d": "generate greedily with each path and require bit-identical logits at every step",
}


def cache_test_answer() -> str:
    """The choice that isolates the cache: identical prefixes, logits compared within a tolerance."""
    return "b"


PREDICT_CACHE_TEST = register(choice_prediction(
    "02.predict_cache_test", "Predict: the comparison that tests a KV cache", "cache_test_choice", cache_test_answer,
    choices=CACHE_TEST_CHOICES, question="the lesson's retrieve-and-predict question 5",
    hint="once two runs pick different tokens, what are their next steps still comparing?",
    reveal="""**b**. Fed the same tokens at every step, the cached and the recomputing paths answer the same
    question, and they agree within float rounding, not bit for bit (the cache adds the same numbers in a different
    order). Free-running samples (a) stop testing the cache at the first different token, perplexities (c) average
    the evidence away, and bit-identical logits (d) fail a correct cache. The next cell runs the uncached path on
    the same tokens and compares every step's logits.""",
    giveaways=("answer **b**", "within float rounding", "uncached path on the same tokens", "two answers to one question",
               "fail a correct cache", "average the evidence away")))
