"""How well a model predicted a text: surprisal, cross-entropy and perplexity, and scoring a long text in windows.

Alignment rule, written down once: ``logits[..., t, :]`` are the scores for ``targets[..., t]``. A causal model's
output at position ``t`` predicts the token at ``t + 1``, so for a model's own output use
:func:`align_next_token` first; the first token of a text is never scored (nothing predicts it).

Units: natural logarithms give *nats*, base-2 logarithms give *bits* (1 nat = 1 / ln 2 = 1.4427 bits). The
perplexity is the same number either way: ``e ** nats == 2 ** bits``.

Long texts are scored in windows of at most ``window`` tokens per forward pass (see :func:`score_windows`); the
passes themselves run in ``labkit.runtime.scoring.score_text`` (the runtime layer), which fills a :class:`TextScore`.
Left out: padding, masks and ``ignore_index`` (one unpadded sequence is what the lab needs).

Used by lab 02; lab 04 reuses the perplexity of a text to measure what quantization costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from labkit.core.sampling import sampling_logits
from labkit.core.validation import choice, integer, real, tensor

UNITS = ("nats", "bits")


def _check_unit(unit: str) -> None:
    choice("unit", unit, UNITS)


def _check_pair(logits: torch.Tensor, targets: torch.Tensor) -> None:
    tensor("logits", logits, kind="float")
    tensor("targets", targets, kind="int")
    if logits.ndim < 2 or logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits [..., seq_len, vocab] and targets [..., seq_len] must agree, got logits "
                         f"{tuple(logits.shape)} and targets {tuple(targets.shape)}")
    if targets.numel() == 0:
        raise ValueError("targets is empty: a mean over zero positions is undefined")
    if bool((targets < 0).any()) or bool((targets >= logits.shape[-1]).any()):
        raise ValueError(f"targets must be token ids in [0, {logits.shape[-1]}), got values from "
                         f"{int(targets.min())} to {int(targets.max())}")


def _in_unit(nats: torch.Tensor, unit: str) -> torch.Tensor:
    return nats / math.log(2) if unit == "bits" else nats


def align_next_token(logits: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pair a causal model's output with what it predicts: ``logits[..., :-1, :]`` scores ``token_ids[..., 1:]``.

    >>> logits, targets = align_next_token(torch.zeros(1, 4, 10), torch.tensor([[5, 6, 7, 8]]))
    >>> tuple(logits.shape), targets.tolist()
    ((1, 3, 10), [[6, 7, 8]])
    """
    if logits.shape[:-1] != token_ids.shape:
        raise ValueError(f"logits [..., seq_len, vocab] and token_ids [..., seq_len] must agree, got logits "
                         f"{tuple(logits.shape)} and token_ids {tuple(token_ids.shape)}")
    return logits[..., :-1, :], token_ids[..., 1:]


def token_surprisal(logits: torch.Tensor, targets: torch.Tensor, unit: str = "nats") -> torch.Tensor:
    """``-log p(target)`` at every position: how surprised the model was by each token.

    logits: ``[..., seq_len, vocab]``; targets: ``[..., seq_len]``; returns ``[..., seq_len]``.
    Two equal logits give each token probability 1/2, so a surprisal of exactly 1 bit:

    >>> token_surprisal(torch.zeros(1, 2), torch.tensor([1]), unit="bits")
    tensor([1.])
    """
    _check_pair(logits, targets)
    _check_unit(unit)
    # log_softmax subtracts the row maximum before exponentiating: large logits do not overflow.
    log_probs = torch.log_softmax(logits, dim=-1)
    nats = -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return _in_unit(nats, unit)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, unit: str = "nats") -> torch.Tensor:
    """Mean negative log-likelihood of the targets over every position (a 0-dim tensor), like torch's own.

    Four equal logits: every token has probability 1/4, a loss of ln 4 = 1.386 nats, or 2 bits.

    >>> cross_entropy(torch.zeros(3, 4), torch.tensor([0, 1, 2]))  # ln 4
    tensor(1.3863)
    >>> cross_entropy(torch.zeros(3, 4), torch.tensor([0, 1, 2]), unit="bits")
    tensor(2.)
    """
    return token_surprisal(logits, targets, unit).mean()


def perplexity_from_nll(mean_nll: float | torch.Tensor, unit: str = "nats") -> float | torch.Tensor:
    """Perplexity from a mean negative log-likelihood: ``e ** nll`` for nats, ``2 ** nll`` for bits.

    >>> perplexity_from_nll(2.0, unit="bits")
    4.0
    >>> round(perplexity_from_nll(math.log(4)), 12)
    4.0
    """
    _check_unit(unit)
    base = 2.0 if unit == "bits" else math.e
    if isinstance(mean_nll, torch.Tensor):
        return torch.pow(base, mean_nll)
    return base ** float(mean_nll) if unit == "bits" else math.exp(mean_nll)


def perplexity(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``exp(cross_entropy)``: the geometric mean of ``1 / p(target)``, the model's effective branching factor.

    A uniform guess among 4 tokens has perplexity 4, whatever the targets:

    >>> perplexity(torch.zeros(3, 4), torch.tensor([0, 1, 2]))
    tensor(4.)
    """
    return cross_entropy(logits, targets).exp()


def truncated_log_probs(logits: torch.Tensor, targets: torch.Tensor, **settings: Any) -> torch.Tensor:
    """Log-probability of each target under a sampling distribution (``labkit.core.sampling.sampling_logits``).

    ``settings`` are the keyword arguments of ``labkit.core.sampling.sampling_probs`` (temperature, top_k, top_p,
    min_p, order). A target that top-k, top-p or min-p cuts gets probability exactly 0, so log-probability
    ``-inf``: the truncated model calls the reference text impossible, and its cross-entropy on it is infinite.

    logits: ``[n, vocab]``; targets: ``[n]``; returns ``[n]``.

    >>> truncated_log_probs(torch.tensor([[2.0, 1.0, 0.0]]), torch.tensor([2]), top_k=2)
    tensor([-inf])
    >>> truncated_log_probs(torch.tensor([[2.0, 2.0, 0.0]]), torch.tensor([1]), top_k=2)  # log 1/2
    tensor([-0.6931])
    """
    _check_pair(logits, targets)
    if logits.ndim != 2:
        raise ValueError(f"logits must have shape [n, vocab], got {tuple(logits.shape)}")
    # Removed tokens sit at -inf, so log_softmax gives them exactly -inf and renormalizes over the kept ones.
    log_probs = torch.log_softmax(sampling_logits(logits, **settings), dim=-1)
    return log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


# ---------------------------------------------------------------------------------------------------------------
# A long text, scored in windows


@dataclass(frozen=True)
class Window:
    """One forward pass of a long text: the model reads ``token_ids[input_start:input_end]`` and its outputs
    score the targets ``token_ids[targets_start:input_end + 1]`` (the last output predicts ``input_end``)."""

    input_start: int
    input_end: int  # exclusive; input_end - input_start <= window
    targets_start: int  # first target scored by this pass; the last one is input_end

    @property
    def context(self) -> int:
        """How many tokens the first target of this pass is predicted from."""
        return self.targets_start - self.input_start


def score_windows(n_tokens: int, window: int = 512, stride: int | None = None) -> list[Window]:
    """The forward passes that score every token from position 1 to ``n_tokens - 1`` exactly once.

    Rule: the targets are cut into consecutive blocks of ``stride`` tokens (default ``stride = window``); each
    block is scored by one pass that reads at most ``window`` tokens, ending just before the block's last
    target. So a target is predicted from at least ``min(position, window - stride + 1)`` tokens. With
    ``stride == window`` the passes do not overlap (each token is read once, the cheapest rule) but the first
    target of every block sees a single token of context; a smaller stride re-reads ``window - stride``
    tokens per pass to give every target a longer context, at ``window / stride`` times the cost.

    The last block may be shorter; its pass still reads up to ``window`` tokens (more context, same cost).

    >>> [(w.input_start, w.input_end, w.targets_start) for w in score_windows(10, window=4)]
    [(0, 4, 1), (4, 8, 5), (5, 9, 9)]
    >>> [(w.input_start, w.input_end, w.targets_start) for w in score_windows(8, window=4, stride=2)]
    [(0, 2, 1), (0, 4, 3), (2, 6, 5), (3, 7, 7)]
    """
    window = integer("window", window, min=1, note="tokens per forward pass")
    stride = window if stride is None else integer("stride", stride, min=1, max=window, note="at most window")
    n_tokens = integer("n_tokens", n_tokens, min=2, note="a context token and a target")
    windows = []
    for targets_start in range(1, n_tokens, stride):
        input_end = min(targets_start + stride, n_tokens) - 1  # the block's last target is input_end
        windows.append(Window(max(0, input_end - window), input_end, targets_start))
    return windows


@dataclass(frozen=True)
class TextScore:
    """Per-token results of scoring a text; every array is aligned with ``token_ids`` (position 0 is unscored:
    NaN surprisal, rank -1)."""

    token_ids: torch.Tensor  # [n_tokens]
    surprisal_nats: torch.Tensor  # [n_tokens] -log p(token | tokens before it) at temperature 1
    entropy_nats: torch.Tensor  # [n_tokens] entropy of the distribution that predicted the token
    rank: torch.Tensor  # [n_tokens] tokens the model ranked strictly above it (0 = its top choice)
    surprisal_at: dict[float, torch.Tensor] = field(default_factory=dict)  # temperature -> [n_tokens] nats
    truncated_log_probs: dict[str, torch.Tensor] = field(default_factory=dict)  # setting name -> [n_tokens]
    window: int = 0
    stride: int = 0

    def mean_nll(self, start: int = 1, end: int | None = None, temperature: float | None = None) -> float:
        """Mean surprisal in nats of the scored tokens in ``[start, end)`` (at a precomputed temperature)."""
        values = self.surprisal_nats if temperature is None else self.surprisal_at[temperature]
        chosen = values[max(start, 1) : end]
        if chosen.numel() == 0:
            raise ValueError(f"no scored token in [{start}, {end}); token 0 is never scored")
        return float(chosen.double().mean())

    def perplexity(self, start: int = 1, end: int | None = None, temperature: float | None = None) -> float:
        """``exp`` of :meth:`mean_nll`."""
        return math.exp(self.mean_nll(start, end, temperature))

    @property
    def n_scored(self) -> int:
        return int(self.token_ids.numel()) - 1


def scored_spans(corpus: Any, scores: TextScore) -> dict[str, tuple[int, int]]:
    """Each section's token span to slice ``scores`` with (``corpus.spans``: genre -> (start, end), end exclusive),
    once ``scores`` is shown to have scored ``corpus``'s very tokens.

    A span is a stretch of one tokenizer's ids: another tokenizer cuts the same text into other tokens, so its
    scores sliced at these spans would average the wrong tokens, with no error. ``corpus`` is a
    ``labkit.core.texts.TokenizedText`` (anything with ``token_ids`` and ``spans``).

    >>> from types import SimpleNamespace
    >>> corpus = SimpleNamespace(token_ids=torch.tensor([5, 6, 7]), spans={"poem": (0, 3)})
    >>> scored_spans(corpus, SimpleNamespace(token_ids=torch.tensor([5, 6, 7])))
    {'poem': (0, 3)}
    >>> scored_spans(corpus, SimpleNamespace(token_ids=torch.tensor([5, 9, 7, 8])))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: scores must have scored corpus's own tokens (...), got 4 token ids ..., the first different at ...
    """
    scored, own = scores.token_ids.reshape(-1), corpus.token_ids.reshape(-1)
    if torch.equal(scored, own):
        return dict(corpus.spans)
    shared = min(scored.numel(), own.numel())
    different = (scored[:shared] != own[:shared]).nonzero()
    where = ("the first different at position "
             f"{int(different[0])} (scores {int(scored[different[0]])}, corpus {int(own[different[0]])})"
             if different.numel() else f"the first {shared} alike")
    raise ValueError("scores must have scored corpus's own tokens (scores.token_ids equal to corpus.token_ids, the "
                     "same text through the same tokenizer: spans sliced into another tokenizer's scores pick the "
                     f"wrong tokens), got {scored.numel()} token ids against corpus's {own.numel()}, {where}")
