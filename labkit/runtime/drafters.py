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

The loop that verifies their drafts is :func:`labkit.runtime.speculative.speculative_generate`. Left out: a separate
small draft model (the :class:`Drafter` interface admits one). Layer: runtime (runs the model). Used by lab 07.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch

from labkit.core import sampling, validation
from labkit.core.speculative import draw
from labkit.runtime import crop, forward, module_of
from labkit.runtime.llama import current_forward, early_exit


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

    :class:`PromptLookup` (no model) and :class:`EarlyExit` (the target's own first blocks) implement it. A separate
    small draft model with the target's tokenizer fits the same interface: ``reset`` drops its cache, ``propose``
    runs its passes (sampling at ``temperature`` from ``generator``) and keeps the distributions for
    ``draft_probs``, ``accepted`` crops its cache, ``catch_up`` feeds it the context. None ships (left out above).
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
    body = getattr(module, "model", None)
    if body is None or not hasattr(body, "layers"):
        raise TypeError(f"lm must be a decoder with .model.layers (Llama-like), got {type(module).__name__}")
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
    draft.model = draft_body
    draft.config = config
    return draft


class EarlyExit(Drafter):
    """Self-draft: the first ``n_layers`` blocks of the target with its final norm and head, and its own cache.

    The draft's cache always holds a prefix of the accepted text: what is missing is fed at the next proposal.
    """

    def __init__(self, n_layers: int = 4):
        self.n_layers = validation.integer("n_layers", n_layers, min=1)
        self.name = f"early exit after {n_layers} blocks"
        self.module: torch.nn.Module | None = None  # the truncated target (built at the first reset)
        self.cache: Any = None
        self.cached = 0  # tokens in the draft cache
        self.last_probs: list[torch.Tensor] = []  # the draft distribution of each proposal (sampling mode)

    def reset(self, lm: Any, token_ids: torch.Tensor) -> None:
        if self.module is None or self._target is not module_of(lm) or self._forward != current_forward():
            # labkit's decoder cut short when the target decodes through it, else the transformers module cut short
            draft = early_exit(lm, self.n_layers)
            self.module = draft if draft is not None else truncated_model(lm, self.n_layers)
            self._target, self._forward = module_of(lm), current_forward()
        self.cache, self.cached = None, 0

    def propose(self, context: Sequence[int], gamma: int, temperature: float = 0.0,
                generator: torch.Generator | None = None) -> list[int]:
        proposal: list[int] = []
        self.last_probs = []
        pending = list(context[self.cached:])  # accepted tokens the draft has not seen yet (at least the last)
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
        """The draft's own distribution at each proposed position (kept by :meth:`propose` when sampling)."""
        return torch.stack(self.last_probs) if draft_ids else torch.zeros(0, vocab, dtype=torch.float64)

    def catch_up(self, context: Sequence[int]) -> None:
        """Feed ``context`` to the draft cache (one proposal's passes, the proposed token dropped)."""
        self.propose(context, 1)
        self.accepted(len(context))
