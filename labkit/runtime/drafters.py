"""Drafters for speculative decoding: what the loop asks of one (:class:`Drafter`), and two that need no second model.

* :class:`PromptLookup` (Saxena 2023, "prompt lookup decoding"; transformers' ``prompt_lookup_num_tokens``): find
  an earlier occurrence of the context's last n-gram (n from 3 down to 1) and propose what followed it. labkit
  takes the latest occurrence by default; ``occurrence="first"`` takes the earliest, as transformers'
  ``PromptLookupCandidateGenerator`` (with n-grams of at most 2, 4.57 to 5.24) and the original write-up do. The
  two may propose different drafts; both verify them against the same greedy choice. Free to run, and
  right whenever the output copies the input (editing, quoting, code).
* :class:`EarlyExit`: the target's own first ``n_layers`` blocks, then its final norm and head (a self-draft that
  shares every weight, with its own KV cache: :func:`truncated_model`). The model was not trained to exit early, so
  its acceptance is low.
* :class:`DraftModel`: a separate small model with the target's tokenizer (a 135M model drafting for its 360M
  sibling), any architecture, with its own KV cache. Where the draft and the target first meet (its
  :meth:`~DraftModel.reset`, before any pass) their vocabularies are compared (:func:`check_same_vocabulary`): a
  draft whose token ids mean other tokens is refused with the first token that differs.

A model whose attention slides over a window (Mistral, Gemma 2) drops keys older than the window, and transformers'
cache then cannot be cut back past a rejected draft; :func:`labkit.runtime.forward.rollback_cache` gives such a
model a cache that keeps them until it is cropped (what transformers' assisted generation does).

The loop that verifies their drafts is :func:`labkit.runtime.speculative.speculative_generate`. Layer: runtime
(runs the model). Used by lab 07.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch

from labkit.core import sampling, validation
from labkit.core.speculative import draw
from labkit.runtime import crop, forward, module_of
from labkit.runtime.capture import layer_names
from labkit.runtime.forward import rollback_cache
from labkit.runtime.llama import decoder_of, early_exit


class Drafter:
    """What the speculative loop (:func:`labkit.runtime.speculative.speculative_generate`) asks of a drafter,
    declared once; a drafter subclasses it and overrides what differs.

    * ``name``: how a run reports it (``SpeculativeRun.drafter``; the class name when empty).
    * ``drafts_from_prompt``: True when it needs no model state, so it can propose before the prefill (which then
      verifies those drafts too, one target pass fewer).
    * :meth:`reset` before each generation, :meth:`propose` each round, :meth:`accepted` after each verdict.
    * :meth:`draft_probs`: the distributions its last proposal drew from, which the exact sampled step needs
      (by default a point proposal: all the draft's mass on each proposed token).
    * :meth:`catch_up`: bring its own state up to a context, so that
      :func:`labkit.runtime.speculative.draft_step_s` times one draft step and not a prefill (by default nothing: a
      drafter whose whole state is the context).

    :class:`PromptLookup` (no model), :class:`EarlyExit` (the target's own first blocks) and :class:`DraftModel`
    (a separate small model with the target's tokenizer) implement it.
    """

    name: str = ""
    drafts_from_prompt: bool = False

    def reset(self, lm: Any, token_ids: torch.Tensor) -> None:
        """Prepare a generation after the prompt ``token_ids`` (``[1, prompt_len]``) on ``lm``."""

    def propose(self, context: Sequence[int], gamma: int, temperature: float = 0.0,
                generator: torch.Generator | None = None) -> list[int]:
        """Up to ``gamma`` tokens to follow ``context`` (every accepted token so far); ``temperature`` 0 is greedy,
        above 0 a drafter that samples draws from ``generator``."""
        raise NotImplementedError(f"{type(self).__name__} must define propose(context, gamma, temperature, generator)")

    def accepted(self, context_length: int) -> None:
        """The verdict: the accepted text is now ``context_length`` tokens long (state beyond it is stale)."""

    def draft_probs(self, draft_ids: Sequence[int], vocab: int) -> torch.Tensor:
        """The distributions the last proposal ``draft_ids`` was drawn from, ``[k, vocab]`` float64 (sampling).

        >>> Drafter().draft_probs([1, 0], 3).tolist()  # a point proposal
        [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
        """
        probs = torch.zeros(len(draft_ids), vocab, dtype=torch.float64)
        probs[torch.arange(len(draft_ids)), torch.tensor(draft_ids, dtype=torch.long)] = 1.0
        return probs

    def catch_up(self, context: Sequence[int]) -> None:
        """Bring the drafter's own state up to ``context`` without timing it (nothing to do by default)."""


OCCURRENCES = ("latest", "first")


class PromptLookup(Drafter):
    """Propose what followed an earlier occurrence of the context's last n-gram (n from ``max_ngram`` down to
    ``min_ngram``); nothing when there is no match. Costs a scan of the context, no model call.

    ``occurrence`` picks among several earlier matches: ``"latest"`` (labkit's choice, the default: the most recent
    text is the likeliest to be copied next) or ``"first"`` (the earliest, as transformers'
    ``PromptLookupCandidateGenerator`` and the method's original write-up do). Both are verified against the same
    greedy choice, so the output is the same; only the tokens per target call can differ.

    >>> PromptLookup(max_ngram=2).propose([5, 6, 7, 8, 5, 6], 3)
    [7, 8, 5]
    >>> context = [5, 1, 5, 2, 5]  # the last 1-gram, 5, occurred twice before: followed by 1, then by 2
    >>> PromptLookup(max_ngram=1).propose(context, 1), PromptLookup(max_ngram=1, occurrence="first").propose(context, 1)
    ([2], [1])
    >>> PromptLookup().propose([1, 2, 3], 4)
    []
    """

    name = "prompt lookup"
    drafts_from_prompt = True  # needs no model state: it can propose before the prefill

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, occurrence: str = "latest"):
        self.max_ngram = validation.integer("max_ngram", max_ngram, min=1)
        self.min_ngram = validation.integer("min_ngram", min_ngram, min=1, max=self.max_ngram)
        self.occurrence = validation.choice("occurrence", occurrence, OCCURRENCES)
        if occurrence == "first":
            self.name = "prompt lookup (first occurrence)"

    def propose(self, context: Sequence[int], gamma: int, temperature: float = 0.0,
                generator: torch.Generator | None = None) -> list[int]:
        """A point proposal, the same at every temperature (nothing to reset or crop: the context is the state)."""
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            tail = list(context[-n:])
            # starts before the tail itself, so that the proposal continues real text; latest or first first
            starts = range(len(context) - n - 1, -1, -1) if self.occurrence == "latest" else range(len(context) - n)
            for start in starts:
                if list(context[start:start + n]) == tail:
                    return list(context[start + n:start + n + gamma])
        return []


def truncated_model(lm: Any, n_layers: int) -> torch.nn.Module:
    """The model with only its first ``n_layers`` blocks (then its final norm and head), sharing every weight.

    A shallow copy of the module tree: the blocks, norm, embedding and head are the same tensors as the target's,
    so it costs no memory and follows any change to the shared model. The copied config says ``n_layers`` so that
    a new cache has that many layers.
    """
    module = module_of(lm)
    # The blocks' list by architecture (model.layers, gpt_neox.layers): its parent is the body to copy.
    blocks = layer_names(module)[0].rsplit(".", 1)[0] if _has_config(module) else ""
    body_name, _, list_name = blocks.rpartition(".")
    body = getattr(module, body_name, None) if body_name and "." not in body_name else None
    if body is None or list_name != "layers":
        raise TypeError(f"lm must be a decoder whose blocks are <body>.layers (model.layers in Llama, "
                        f"gpt_neox.layers in GPT-NeoX), got {type(module).__name__}")
    total = len(body.layers)
    n_layers = validation.integer("n_layers", n_layers, min=1, max=total, note=f"the model has {total} blocks")
    config = copy.deepcopy(module.config)
    config.num_hidden_layers = n_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = list(config.layer_types)[:n_layers]
    draft_body = copy.copy(body)
    draft_body._modules = dict(body._modules)  # a new module table: the target's keeps all its blocks
    draft_body.layers = torch.nn.ModuleList(list(body.layers)[:n_layers])
    draft_body.config = config
    draft = copy.copy(module)
    draft._modules = dict(module._modules)
    setattr(draft, body_name, draft_body)
    draft.config = config
    return draft


def _has_config(module: torch.nn.Module) -> bool:
    return getattr(module, "config", None) is not None


class _ModelDrafter(Drafter):
    """A drafter that runs a model (``self.module``) with its own KV cache: greedy or sampled proposals, the cache
    cut back after each verdict. The cache always holds a prefix of the accepted text: what is missing is fed at
    the next proposal."""

    module: Any = None

    def __init__(self) -> None:
        self.cache: Any = None
        self.cached = 0  # tokens in the draft cache
        self.last_probs: list[torch.Tensor] = []  # the draft distribution of each proposal (sampling mode)

    def propose(self, context: Sequence[int], gamma: int, temperature: float = 0.0,
                generator: torch.Generator | None = None) -> list[int]:
        proposal: list[int] = []
        self.last_probs = []
        pending = list(context[self.cached:])  # accepted tokens the draft has not seen yet (at least the last)
        if self.cache is None and self.cached == 0:
            self.cache = rollback_cache(self.module)  # None except for a sliding window: the pass makes its own
        for _ in range(gamma):
            token_ids = torch.tensor([pending])  # [1, len(pending)]
            logits, self.cache = forward(self.module, token_ids, self.cache)
            self.cached += len(pending)
            row = logits[0].cpu()  # [vocab]
            if temperature == 0:
                token = int(row.argmax())
            else:
                probs = sampling.softmax_with_temperature(row.double(), temperature)
                self.last_probs.append(probs)
                token = draw(probs, generator)
            proposal.append(token)
            pending = [token]
        return proposal

    def accepted(self, context_length: int) -> None:
        """Cut the draft cache back to what the accepted text still shares with it."""
        if self.cache is not None and self.cached > context_length:
            crop(self.cache, context_length)
            self.cached = context_length

    def draft_probs(self, draft_ids: Sequence[int], vocab: int) -> torch.Tensor:
        """The draft's own distribution at each proposed position (kept by :meth:`propose` when sampling), as wide
        as the target's ``vocab`` (a draft with fewer embedding rows puts no mass on the ids it lacks)."""
        if not draft_ids:
            return torch.zeros(0, vocab, dtype=torch.float64)
        probs = torch.stack(self.last_probs)
        if probs.shape[-1] < vocab:
            probs = torch.nn.functional.pad(probs, (0, vocab - probs.shape[-1]))
        return probs

    def catch_up(self, context: Sequence[int]) -> None:
        """Feed ``context`` to the draft cache (one proposal's passes, the proposed token dropped)."""
        self.propose(context, 1)
        self.accepted(len(context))


class EarlyExit(_ModelDrafter):
    """Self-draft: the first ``n_layers`` blocks of the target with its final norm and head, and its own cache."""

    def __init__(self, n_layers: int = 4):
        super().__init__()
        self.n_layers = validation.integer("n_layers", n_layers, min=1)
        self.name = f"early exit after {n_layers} blocks"
        self.module: torch.nn.Module | None = None  # the truncated target (built at the first reset)

    def reset(self, lm: Any, token_ids: torch.Tensor) -> None:
        target_decoder = None if isinstance(lm, torch.nn.Module) else decoder_of(lm)
        if self.module is None or self._target is not module_of(lm) or self._decoder != target_decoder:
            # the target's decoder cut short (labkit's), else the transformers module cut short
            draft = early_exit(lm, self.n_layers)
            self.module = draft if draft is not None else truncated_model(lm, self.n_layers)
            self._target, self._decoder = module_of(lm), target_decoder
        self.cache, self.cached = None, 0


class DraftModel(_ModelDrafter):
    """A separate small model drafts for the target: greedy (or sampled) proposals from its own passes and cache.

    ``draft``: a LoadedModel (its tokenizer is compared with the target's) or a transformers causal LM (then only
    the vocabulary sizes can be compared). Any architecture: the passes go through ``runtime.forward``. The check
    runs at :meth:`reset`, where the loop first hands the drafter its target, before any pass.
    """

    def __init__(self, draft: Any, name: str = ""):
        super().__init__()
        module_of(draft)  # a LoadedModel or a module, refused here otherwise
        self.module = draft
        self.name = name or f"draft model {getattr(draft, 'name', None) or type(module_of(draft)).__name__}"

    def reset(self, lm: Any, token_ids: torch.Tensor) -> None:
        check_same_vocabulary(lm, self.module)
        self.cache, self.cached = None, 0


def check_same_vocabulary(target: Any, draft: Any) -> None:
    """Refuse a draft whose token ids do not mean the target's tokens; return None when they do.

    With both tokenizers (LoadedModels), their vocabularies (``tokenizer.get_vocab()``, token -> id) must be equal,
    and the first id that differs is named; a bare module carries no tokenizer, so then the vocabulary sizes
    (``config.vocab_size``) must be equal. The draft's output may be narrower than the target's (a model padded to
    a round number of rows), never wider: it could propose an id the target cannot score.

    >>> from types import SimpleNamespace
    >>> target, draft = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)  # two bare modules, no tokenizer
    >>> target.config, draft.config = SimpleNamespace(vocab_size=100), SimpleNamespace(vocab_size=90)
    >>> check_same_vocabulary(target, draft)
    Traceback (most recent call last):
    ...
    ValueError: draft must have the target's vocabulary size, config.vocab_size 100 (no tokenizer to compare), got 90
    """
    target_tokenizer, draft_tokenizer = getattr(target, "tokenizer", None), getattr(draft, "tokenizer", None)
    target_size = getattr(getattr(module_of(target), "config", None), "vocab_size", None)
    draft_size = getattr(getattr(module_of(draft), "config", None), "vocab_size", None)
    if target_tokenizer is not None and draft_tokenizer is not None:
        target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
        if target_vocab != draft_vocab:
            target_tokens = {index: token for token, index in target_vocab.items()}
            draft_tokens = {index: token for token, index in draft_vocab.items()}
            index = next(i for i in sorted(set(target_tokens) | set(draft_tokens))
                         if target_tokens.get(i) != draft_tokens.get(i))
            raise ValueError(
                f"draft must share the target's tokenizer (the same token for every id), got a draft whose token id "
                f"{index} is {draft_tokens.get(index)!r} where the target's is {target_tokens.get(index)!r} "
                f"({len(draft_vocab):,} tokens in the draft's vocabulary, {len(target_vocab):,} in the target's)")
        if target_size is not None and draft_size is not None and draft_size > target_size:
            raise ValueError(f"draft must score at most the target's {target_size:,} token ids (config.vocab_size), "
                             f"got a draft with {draft_size:,}: it could propose an id the target cannot score")
    elif target_size is not None and draft_size is not None and target_size != draft_size:
        raise ValueError(f"draft must have the target's vocabulary size, config.vocab_size {target_size:,} (no "
                         f"tokenizer to compare), got {draft_size:,}")
