"""Scoring text with a model: one prompt's next-token scores, and a long text in windows (layer 2, runtime).

:func:`next_token_scores` runs the model once on a prompt and keeps the next token's logits and its top candidates
(lab 01's real next-token distribution, what the sampling explorer's sliders act on). :func:`score_text` runs one
forward pass per window of a long text and keeps every token's surprisal, entropy and rank; its windows are 512
tokens by default, cut to the model's context (:func:`scoring_window`: a model trained on 256 positions is never
asked to read 512).

The arithmetic (alignment, surprisal, the window rule, :class:`labkit.core.loss.TextScore`) is the core's
``labkit.core.loss``; this module only runs the passes, through ``labkit.runtime`` like every model call.

Used by lab 01 (the sampling explorer's distribution), lab 02 (perplexity of the evaluation text) and lab 04 (what quantization costs in perplexity). Lab 02's
one scoring of the evaluation text (:func:`eval_text_scores`, with its window, stride and settings) lives here, so
the notebook and its checker read the same numbers of the embedded model, and a learner's own model is scored the
same way, its text cut by its own tokenizer; :class:`ScoringModel` is the model as a learner's own windowed
scorer sees it (every position's logits of one piece of text).
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from labkit.core import validation
from labkit.core.loss import TextScore, Window, score_windows, token_surprisal, truncated_log_probs
from labkit.runtime import forward, full_logits, module_of
from labkit.core.validation import real, tensor


@dataclass(frozen=True)
class NextTokenScores:
    """One prompt's next-token logits and the texts of its top candidates."""

    prompt: str
    input_ids: torch.Tensor  # [1, seq_len] token ids the model read (chat template applied or raw text)
    next_token_logits: torch.Tensor  # [vocab] float32
    top_ids: tuple[int, ...]  # the first n_show token ids of the ranking (highest logit first, ties by lower id)
    top_texts: tuple[str, ...]  # each decoded on its own
    top_model_probs: tuple[float, ...]  # their probabilities at T = 1, no filter


def next_token_scores(lm: Any, prompt: str, chat: bool = True, n_show: int = 12) -> NextTokenScores:
    """Run the model once on ``prompt`` (as a one-turn chat, or as raw text to continue) and keep the scores."""
    validation.instance("prompt", prompt, str, "a non-empty string")
    if not prompt:
        raise validation.fail(ValueError, "prompt", "a non-empty string", prompt)
    n_show = validation.integer("n_show", n_show, min=1)
    token_ids = lm.chat_ids(prompt) if chat else lm.text_ids(prompt)  # [1, seq_len]
    next_logits, _ = forward(lm, token_ids, use_cache=False)  # [1, vocab]: the scores for the next token
    logits = next_logits[0].cpu()  # [vocab]
    ranked = torch.sort(logits, descending=True, stable=True).indices[:n_show].tolist()
    texts = tuple(lm.tokenizer.decode([token_id]) for token_id in ranked)
    model_probs = tuple(torch.softmax(logits, dim=-1)[ranked].tolist())
    return NextTokenScores(prompt, token_ids, logits.clone(), tuple(ranked), texts, model_probs)


def _pass_logits(lm: Any, token_ids: torch.Tensor, piece: Window, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [n_targets, vocab], targets [n_targets]) of one window, in float32, where the model runs."""
    inputs = token_ids[piece.input_start : piece.input_end].unsqueeze(0)  # [1, seq_len]
    if isinstance(lm, ScoringModel):  # the same passes, shared with whoever else asked for them
        logits = lm.logits(inputs[0])
    else:
        logits = full_logits(lm, inputs, device=device)[0]  # [seq_len, vocab]
    first = piece.targets_start - 1 - piece.input_start  # the output that predicts targets_start
    return logits[first:], token_ids[piece.targets_start : piece.input_end + 1].to(logits.device)


class ScoringModel:
    """A model seen as one function: ``logits(token_ids)`` gives every position's logits of one piece of text.

    ``ids`` is ``[seq_len]`` (token ids, ``torch.long``); the result is ``[seq_len, vocab]`` float32 on the CPU,
    row ``t`` scoring the token at ``t + 1``: one forward pass, no cache. ``lm`` is a LoadedModel or a
    transformers causal LM; without one, the embedded model, loaded at the first pass. The last ``memory``
    results are kept (keyed by the token ids), so the same piece asked twice runs the model once: a grader's reference
    and a learner's function that read the same windows share their passes. ``copy.deepcopy`` gives the same
    object: it stands for a model, which is not copied.
    """

    def __init__(self, lm: Any = None, memory: int = 48):
        self.lm = lm
        self.memory = memory
        self._kept: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()

    def logits(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Every position's logits ``[seq_len, vocab]`` of ``token_ids`` ``[seq_len]`` (one pass, no cache)."""
        tensor("token_ids", token_ids, kind="int", ndim=1, shape="[seq_len]", nonempty=True)
        key = tuple(token_ids.tolist())
        if key in self._kept:
            self._kept.move_to_end(key)
            return self._kept[key].clone()
        if self.lm is None:
            from labkit.runtime.models import load_model

            self.lm = load_model(progress=False)
        with torch.inference_mode():
            logits = full_logits(self.lm, token_ids.unsqueeze(0))[0].float().cpu()  # [seq_len, vocab]
        self._kept[key] = logits
        while len(self._kept) > self.memory:
            self._kept.popitem(last=False)
        return logits.clone()

    def __deepcopy__(self, memo: dict) -> "ScoringModel":
        return self

    def __repr__(self) -> str:
        name = "the embedded model" if self.lm is None else getattr(self.lm, "name", type(self.lm).__name__)
        return f"ScoringModel({name})"


def context_length(lm: Any) -> int | None:
    """The most tokens one pass of the model may read (its config's ``max_position_embeddings``, or ``n_positions``
    for GPT-2-style configs); None when nothing says (a module without a config, a ScoringModel not loaded yet)."""
    if isinstance(lm, ScoringModel):
        lm = lm.lm
    if lm is None:
        return None
    try:
        config = getattr(module_of(lm), "config", None)
    except TypeError:
        return None
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def scoring_window(lm: Any, window: int | None = None) -> int:
    """The tokens per scoring pass: ``window``, or by default :data:`WINDOW` (512) cut to the model's context
    (a model with a 256-token context gets 256-token windows). A ``window`` longer than the context is refused:
    positions past it were never trained, and the scores would be silently wrong.

    >>> from types import SimpleNamespace
    >>> module = torch.nn.Linear(2, 2)  # stands for a model: its config says how far it reads
    >>> module.config = SimpleNamespace(max_position_embeddings=256)
    >>> scoring_window(module), scoring_window(module, 128)
    (256, 128)
    >>> scoring_window(module, 512)
    Traceback (most recent call last):
    ...
    ValueError: window must be an int in [1, 256] (at most the model's context, max_position_embeddings), got 512
    """
    context = context_length(lm)
    if window is None:
        return WINDOW if context is None else min(WINDOW, context)
    note = "" if context is None else "at most the model's context, max_position_embeddings"
    return validation.integer("window", window, min=1, max=context, note=note)


def score_text(lm: Any, token_ids: torch.Tensor, window: int | None = None, stride: int | None = None, *,
               temperatures: tuple[float, ...] = (), truncations: dict[str, dict] | None = None,
               progress: bool = True, device: Any = None) -> TextScore:
    """Score every token of a text (from position 1) with a causal LM, in windows (:func:`score_windows`).

    ``window``: tokens per pass, by default 512 cut to the model's context (:func:`scoring_window`); ``stride``:
    targets per pass, by default ``window``. One forward pass per window; from its logits are derived the
    surprisal, the entropy and the rank of each target, its surprisal at each of ``temperatures``, and its
    log-probability under each named sampling setting in ``truncations`` (keyword arguments of
    ``labkit.core.sampling.sampling_probs``; ``-inf`` where cut).

    ``token_ids``: ``[n_tokens]``. ``lm``: a LoadedModel, a transformers causal LM or a :class:`ScoringModel`. The
    statistics are computed where the model runs (``device``, default its own) and returned on the CPU.
    """
    from tqdm.auto import tqdm

    tensor("token_ids", token_ids, kind="int", ndim=1, shape="[n_tokens]")
    window = scoring_window(lm, window)
    for index, temperature in enumerate(temperatures):
        real(f"temperatures[{index}]", temperature, min=0, min_open=True)
    truncations = dict(truncations or {})
    n_tokens = int(token_ids.numel())

    def unscored(dtype=torch.float32, value=math.nan):
        return torch.full((n_tokens,), value, dtype=dtype)

    surprisal, entropies, ranks = unscored(), unscored(), unscored(torch.long, -1)
    at_temperature = {t: unscored() for t in temperatures}
    truncated = {name: unscored() for name in truncations}
    passes = score_windows(n_tokens, window, stride)
    with torch.inference_mode():
        for piece in tqdm(passes, desc="scoring windows", unit="window", disable=not progress):
            logits, targets = _pass_logits(lm, token_ids, piece, device)
            span = slice(piece.targets_start, piece.input_end + 1)
            log_probs = torch.log_softmax(logits, dim=-1)  # [n, vocab]
            surprisal[span] = -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1).cpu()
            # Entropy -sum p log p in float32 (no softmax underflows to a NaN term: log_probs stay finite).
            entropies[span] = -(log_probs.exp() * log_probs).sum(dim=-1).cpu()
            target_logits = logits.gather(-1, targets.unsqueeze(-1))  # [n, 1]
            ranks[span] = (logits > target_logits).sum(dim=-1).cpu()
            for temperature in temperatures:
                at_temperature[temperature][span] = token_surprisal(logits / temperature, targets).cpu()
            for name, settings in truncations.items():
                truncated[name][span] = truncated_log_probs(logits, targets, **settings).cpu()
    return TextScore(token_ids, surprisal, entropies, ranks, at_temperature, truncated, window,
                     window if stride is None else stride)


# --------------------------------------------------------------------------------------------------------------
# Lab 02's one scoring of the evaluation text, shared by its notebook and its checker

WINDOW, STRIDE = 512, 256  # every token from position STRIDE on is predicted from >= WINDOW - STRIDE + 1 tokens
TEMPERATURES = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.4, 1.6, 1.8, 2.0)
TRUNCATIONS = {"top-k 50": dict(top_k=50), "top-p 0.9": dict(top_p=0.9)}


def eval_text_scores(lm: Any = None):
    """(corpus, scores): the evaluation text tokenized by section with ``lm``'s tokenizer and scored by ``lm``.

    ``lm``: a LoadedModel; None (the default) is the embedded model, whose scoring lab 02's checker grades the
    predictions against. ``score_text(lm, corpus.token_ids, window=WINDOW, stride=STRIDE,
    temperatures=TEMPERATURES, truncations=TRUNCATIONS)``, the window cut to the model's context
    (:func:`scoring_window`) and the stride kept at half the window. The corpus and its scores always come from one
    tokenizer: a genre's span is a stretch of that tokenizer's tokens and slices only its own model's scores
    (``labkit.core.loss.scored_spans`` refuses any other pair). The embedded model's scores are kept in labkit's
    cache folder (``scores/``), keyed by everything they depend on (:func:`_scores_key`), so the notebook's two
    copies, its checker and the tests read one scoring instead of each running the nine passes and their
    statistics again; any change to the model's cache, the code, the versions or the settings scores afresh.
    Another model is scored afresh each call (nothing says what its numbers depend on).
    """
    if lm is None:
        return _embedded_eval_text_scores()
    from labkit.core.texts import load_eval_text, tokenize_sections

    corpus = tokenize_sections(lm.tokenizer, load_eval_text())
    path = _scores_path(lm, corpus.token_ids)
    scores = _load_scores(path, corpus.token_ids)
    if scores is None:
        window = scoring_window(lm)  # WINDOW, or the model's context when shorter
        scores = score_text(lm, corpus.token_ids, window=window, stride=max(1, window * STRIDE // WINDOW),
                            temperatures=TEMPERATURES, truncations=TRUNCATIONS, progress=False)
        _save_scores(path, scores)
    return corpus, scores


@functools.lru_cache(maxsize=1)
def _embedded_eval_text_scores():
    """:func:`eval_text_scores` of the embedded model, once per process."""
    from labkit.runtime.models import load_model

    return eval_text_scores(load_model(progress=False))


# The files whose code decides the numbers: the passes, the statistics, the filters, the window rule.
_SCORING_CODE = ("labkit.runtime.scoring", "labkit.runtime.forward", "labkit.core.loss", "labkit.core.sampling")


def _scores_key(lm: Any, token_ids: torch.Tensor) -> str | None:
    """A digest of what eval_text_scores' numbers depend on: the embedded model's verified cache (its manifest
    of checksums), the scoring code, the torch and transformers versions, the settings and the token ids. None
    where the model has no such cache (a hub model): then nothing is kept."""
    import hashlib
    import importlib
    from pathlib import Path

    import transformers

    from labkit.runtime.weights_cache import MANIFEST, cache_dir

    manifest = cache_dir(lm.source) / MANIFEST if getattr(lm, "origin", "") in ("cache", "converted") else None
    if manifest is None or not manifest.is_file():
        return None
    digest = hashlib.sha256(manifest.read_bytes())
    for name in _SCORING_CODE:
        digest.update(Path(importlib.import_module(name).__file__).read_bytes())
    settings = (WINDOW, STRIDE, TEMPERATURES, sorted(TRUNCATIONS.items()), torch.__version__, transformers.__version__)
    digest.update(repr(settings).encode())
    digest.update(token_ids.numpy().tobytes())
    return digest.hexdigest()


def _scores_path(lm: Any, token_ids: torch.Tensor):
    from labkit.core.resources import cache_root

    key = _scores_key(lm, token_ids)
    return None if key is None else cache_root() / "scores" / f"eval_text-{key[:32]}.pt"


def _load_scores(path: Any, token_ids: torch.Tensor) -> TextScore | None:
    """The kept scores, or None when there are none or they do not read back whole (then they are scored again)."""
    if path is None or not path.is_file():
        return None
    try:
        fields = torch.load(path, weights_only=True)  # tensors, numbers, strings and dicts only
        scores = TextScore(**fields)
    except Exception:  # noqa: BLE001 - a damaged or foreign file is ignored and replaced
        return None
    return scores if torch.equal(scores.token_ids, token_ids) else None


def _save_scores(path: Any, scores: TextScore) -> None:
    """Keep the scores for the next process: written to a temporary name, then renamed (a reader never sees half a
    file); a folder that cannot be written keeps nothing."""
    import dataclasses
    import os
    import tempfile

    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(handle, "wb") as file:
            torch.save({f.name: getattr(scores, f.name) for f in dataclasses.fields(scores)}, file)
        os.replace(temporary, path)
    except OSError:
        return
