"""Speculative decoding on the real model, with drafters that need no second model.

The loop: ``runtime.prefill`` runs the prompt; every round a drafter proposes up to ``gamma`` tokens,
``runtime.verify`` scores them in one target pass, :func:`labkit.core.speculative.greedy_accept` (or
:func:`~labkit.core.speculative.speculative_step` when sampling) keeps a prefix and adds one target token, and
``runtime.crop`` cuts the rejected drafts out of the cache. A drafter that needs no model (prompt lookup) proposes
before the prefill too, and the prefill verifies those drafts in the same pass (transformers' assisted generation
does the same): one target pass fewer. No forward pass is written here: every pass goes through ``runtime.forward``.

Drafters:

* :class:`PromptLookup` (Saxena 2023, "prompt lookup decoding"; transformers' ``prompt_lookup_num_tokens``): find
  the latest earlier occurrence of the context's last n-gram (n from 3 down to 1) and propose what followed it.
  transformers' ``PromptLookupCandidateGenerator`` takes the earliest occurrence and n-grams of at most 2 (4.57 to
  5.24), so the two may propose different drafts; both verify them against the same greedy choice. Free to run, and right
  whenever the output copies the input (editing, quoting, code).
* :class:`EarlyExit`: the target's own first ``n_layers`` blocks, then its final norm and head (a self-draft that
  shares every weight, with its own KV cache). The model was not trained to exit early, so its acceptance is low.

Greedy output equals plain greedy decoding token for token whatever the drafter (the draft only decides how many
tokens one pass yields), with one caveat, measured rather than assumed: the target scores a block of k + 1 tokens in
one pass, and a block's float reductions round differently from k + 1 single-token passes, so a step whose best two
logits are nearly tied could flip. The tests and lab 07 compare with plain greedy only on outputs whose every step
is far from a tie (``runtime.generation.greedy_margins`` above ``core.sampling.CLEAR_MARGIN``).

Left out: batches (rows would accept different numbers of drafts), tree drafts, a separate draft model.
Used by lab 07.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from labkit.core import sampling, validation
from labkit.core.speculative import draw, greedy_accept, speculative_step
from labkit.runtime import crop, forward, model_device, module_of, prefill, synchronize, verify

# ---------------------------------------------------------------------------------------------------------------
# Drafters


class PromptLookup:
    """Propose the continuation of the latest earlier match of the context's last n-gram (n from ``max_ngram``
    down to ``min_ngram``); nothing when there is no match. Costs a scan of the context, no model call.

    >>> PromptLookup(max_ngram=2).propose([5, 6, 7, 8, 5, 6], 3)
    [7, 8, 5]
    >>> PromptLookup().propose([1, 2, 3], 4)
    []
    """

    name = "prompt lookup"
    drafts_from_prompt = True  # needs no model state: it can propose before the prefill

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram = validation.integer("max_ngram", max_ngram, min=1)
        self.min_ngram = validation.integer("min_ngram", min_ngram, min=1, max=self.max_ngram)

    def reset(self, lm: Any, prompt_ids: torch.Tensor) -> None:
        """Nothing to prepare: the context is the whole state."""

    def propose(self, context: Sequence[int], gamma: int) -> list[int]:
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            tail = list(context[-n:])
            # the latest start before the tail itself, so that the proposal continues real text
            for start in range(len(context) - n - 1, -1, -1):
                if list(context[start:start + n]) == tail:
                    return list(context[start + n:start + n + gamma])
        return []

    def accepted(self, context_length: int) -> None:
        """Nothing to crop."""


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


class EarlyExit:
    """Self-draft: the first ``n_layers`` blocks of the target with its final norm and head, and its own cache.

    The draft's cache always holds a prefix of the accepted text: what is missing is fed at the next proposal.
    """

    def __init__(self, n_layers: int = 4):
        self.n_layers = validation.integer("n_layers", n_layers, min=1)
        self.name = f"early exit after {n_layers} blocks"
        self.model: torch.nn.Module | None = None
        self.cache: Any = None
        self.cached = 0  # tokens in the draft cache
        self.last_probs: list[torch.Tensor] = []  # the draft distribution of each proposal (sampling mode)

    def reset(self, lm: Any, prompt_ids: torch.Tensor) -> None:
        if self.model is None or self._target is not module_of(lm):
            self.model, self._target = truncated_model(lm, self.n_layers), module_of(lm)
        self.cache, self.cached = None, 0

    def propose(self, context: Sequence[int], gamma: int, temperature: float = 0.0,
                generator: torch.Generator | None = None) -> list[int]:
        proposal: list[int] = []
        self.last_probs = []
        pending = list(context[self.cached:])  # accepted tokens the draft has not seen yet (at least the last)
        for _ in range(gamma):
            ids = torch.tensor([pending])
            logits, self.cache = forward(self.model, ids, self.cache)
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


# ---------------------------------------------------------------------------------------------------------------
# The loop


@dataclass
class SpeculativeRun:
    """One speculative generation and what it measured."""

    drafter: str
    gamma: int
    new_token_ids: list[int]
    target_calls: int = 0  # verify passes (the prefill too when it verified drafts proposed from the prompt)
    proposed: int = 0  # draft tokens proposed
    examined: int = 0  # drafts the target judged: accepted ones plus the first rejection of each round
    accepted: int = 0
    rounds_with_drafts: int = 0
    draft_s: float = 0.0  # wall time inside the drafter
    verify_s: float = 0.0  # wall time of the target's verification passes (device synchronized)
    total_s: float = 0.0
    accepted_per_round: list[int] = field(default_factory=list)
    prefill_verified: bool = False  # the prefill also verified drafts (prompt lookup): one call saved

    @property
    def alpha(self) -> float:
        """Per-draft acceptance estimated as accepted / examined (drafts after a rejection are never judged)."""
        return self.accepted / self.examined if self.examined else 0.0

    @property
    def tokens_per_call(self) -> float:
        """Tokens produced per target verification pass (a plain prefill's first token left out)."""
        produced = len(self.new_token_ids) - (0 if self.prefill_verified else 1)
        return produced / self.target_calls if self.target_calls else 0.0

    @property
    def mean_draft_length(self) -> float:
        return self.proposed / self.target_calls if self.target_calls else 0.0


def speculative_generate(lm: Any, input_ids: torch.Tensor, max_new_tokens: int, drafter: Any, gamma: int = 4, *,
                         temperature: float = 0.0, seed: int | None = None,
                         eos_token_id: int | None = None) -> SpeculativeRun:
    """Generate up to ``max_new_tokens`` after ``input_ids`` (``[1, prompt_len]``) with speculative decoding.

    ``temperature=0`` is greedy (equal to plain greedy decoding). ``temperature > 0`` samples with the exact
    speculative step, which needs the draft's probabilities: only :class:`EarlyExit` gives them (prompt lookup is a
    point proposal, a draft distribution with all its mass on the proposed token, which the step also handles).
    """
    validation.tensor("input_ids", input_ids, kind="int", ndim=2, shape="[1, prompt_len]", nonempty=True)
    if input_ids.shape[0] != 1:
        raise validation.fail(ValueError, "input_ids", "a tensor of shape [1, prompt_len] (one sequence)", input_ids)
    max_new_tokens = validation.integer("max_new_tokens", max_new_tokens, min=1)
    gamma = validation.integer("gamma", gamma, min=0)
    temperature = validation.real("temperature", temperature, min=0, note="0 means greedy")
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    if temperature > 0 and generator is None:
        generator = torch.Generator().manual_seed(torch.seed() % 2**63)
    device = model_device(lm)
    run = SpeculativeRun(getattr(drafter, "name", type(drafter).__name__), gamma, [])
    started = time.perf_counter()
    with torch.inference_mode():
        drafter.reset(lm, input_ids)
        context = input_ids[0].tolist()
        # A drafter that needs no model (prompt lookup) can already propose what follows the prompt: the prefill
        # then verifies those drafts too, as transformers' assisted generation does, and saves one target call.
        drafts = (drafter.propose(context, min(gamma, max_new_tokens - 1))
                  if getattr(drafter, "drafts_from_prompt", False) else [])
        if drafts:
            tick = time.perf_counter()
            rows, cache = forward(lm, torch.tensor([context + drafts]), positions=len(drafts) + 1)
            rows = rows[0].cpu()  # [k + 1, vocab]: the prompt's last position, then each draft's
            synchronize(device)
            run.verify_s += time.perf_counter() - tick
            new = _judge(run, rows, drafts, drafter, temperature, generator, eos_token_id)
            context += drafts[:len(new) - 1]
            crop(cache, len(context))
            drafter.accepted(len(context))
            run.prefill_verified = True
        else:
            logits, cache = prefill(lm, input_ids)
            new = [_choose(logits[0].cpu(), temperature, generator)]  # the first token: the target's own
        token = new[-1]
        while len(new) < max_new_tokens and (eos_token_id is None or token != eos_token_id):
            tick = time.perf_counter()
            room = min(gamma, max_new_tokens - len(new))
            if temperature > 0 and isinstance(drafter, EarlyExit):
                drafts = drafter.propose(context + [token], room, temperature, generator)
            else:
                drafts = drafter.propose(context + [token], room)
            run.draft_s += time.perf_counter() - tick
            tick = time.perf_counter()
            rows, cache = verify(lm, cache, torch.tensor([[token]]), torch.tensor([drafts], dtype=torch.long))
            rows = rows[0].cpu()  # [k + 1, vocab]
            synchronize(device)
            run.verify_s += time.perf_counter() - tick
            produced = _judge(run, rows, drafts, drafter, temperature, generator, eos_token_id)
            context += [token] + drafts[:len(produced) - 1]  # the cache holds context; `token` is not fed yet
            crop(cache, len(context))
            drafter.accepted(len(context))
            new += produced
            token = new[-1]
    run.new_token_ids = new[:max_new_tokens]
    run.total_s = time.perf_counter() - started
    return run


def _judge(run: SpeculativeRun, rows: torch.Tensor, drafts: list[int], drafter: Any, temperature: float,
           generator: torch.Generator | None, eos_token_id: int | None) -> list[int]:
    """One target call's verdict on ``drafts`` (``rows``: its ``[k + 1, vocab]`` logits), counted in ``run``: the
    tokens it produces, the accepted drafts then the target's own token, cut after an end token."""
    if temperature == 0:
        n_accepted, following = greedy_accept(rows, drafts)
    else:
        n_accepted, following = _sampled_accept(rows, drafts, drafter, temperature, generator)
    run.target_calls += 1
    run.proposed += len(drafts)
    run.accepted += n_accepted
    run.examined += n_accepted + (1 if n_accepted < len(drafts) else 0)
    run.rounds_with_drafts += bool(drafts)
    run.accepted_per_round.append(n_accepted)
    produced = drafts[:n_accepted] + [following]
    if eos_token_id is not None and eos_token_id in produced:
        produced = produced[:produced.index(eos_token_id) + 1]
    return produced


def _choose(row: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    if temperature == 0:
        return int(row.argmax())
    return draw(sampling.softmax_with_temperature(row.double(), temperature), generator)


def _sampled_accept(rows: torch.Tensor, drafts: list[int], drafter: Any, temperature: float,
                    generator: torch.Generator) -> tuple[int, int]:
    """The exact speculative step on the target's rows at this temperature and the draft's distributions."""
    target_probs = sampling.softmax_with_temperature(rows.double(), temperature)  # [k + 1, vocab]
    if isinstance(drafter, EarlyExit):
        draft_probs = torch.stack(drafter.last_probs) if drafts else target_probs[:0]
    else:  # a point proposal: all of the draft's mass on the proposed token
        draft_probs = torch.zeros(len(drafts), rows.shape[-1], dtype=torch.float64)
        draft_probs[torch.arange(len(drafts)), torch.tensor(drafts, dtype=torch.long)] = 1.0
    return speculative_step(target_probs, draft_probs, drafts, generator)


# ---------------------------------------------------------------------------------------------------------------
# Plain greedy, timed the same way, and transformers' own prompt lookup (a deliberate cross-check)


def plain_greedy(lm: Any, input_ids: torch.Tensor, max_new_tokens: int,
                 eos_token_id: int | None = None) -> tuple[list[int], float]:
    """labkit's greedy loop (one decode pass per token): (new token ids, wall seconds)."""
    from labkit.runtime.generation import generate

    synchronize(model_device(lm))
    started = time.perf_counter()
    result = generate(lm, input_ids, max_new_tokens, eos_token_id=eos_token_id)
    synchronize(model_device(lm))
    tokens = result.new_token_ids[0].tolist()
    if eos_token_id is not None and eos_token_id in tokens:
        tokens = tokens[:tokens.index(eos_token_id) + 1]
    return tokens, time.perf_counter() - started


def transformers_prompt_lookup(lm: Any, input_ids: torch.Tensor, max_new_tokens: int, gamma: int = 4,
                               eos_token_id: int | None = None) -> tuple[list[int], float]:
    """transformers' own assisted generation with ``prompt_lookup_num_tokens=gamma``: (new token ids, seconds)."""
    module = module_of(lm)
    kwargs = dict(do_sample=False, max_new_tokens=max_new_tokens, prompt_lookup_num_tokens=gamma,
                  attention_mask=torch.ones_like(input_ids), eos_token_id=eos_token_id,
                  pad_token_id=eos_token_id if eos_token_id is not None else 0)
    synchronize(model_device(lm))
    started = time.perf_counter()
    with torch.inference_mode():
        output = module.generate(input_ids.to(model_device(lm)), **kwargs)
    synchronize(model_device(lm))
    return output[0, input_ids.shape[1]:].tolist(), time.perf_counter() - started


def decode_step_s(lm: Any, input_ids: torch.Tensor, n_tokens: int = 1, repeats: int = 5) -> float:
    """Median wall time of one target pass over ``n_tokens`` new tokens after ``input_ids`` (a verify of
    ``n_tokens - 1`` drafts), the cache cropped back after each: the unit the cost ratio c is measured in."""
    import statistics

    with torch.inference_mode():
        _, cache = prefill(lm, input_ids)
        length = input_ids.shape[1]
        block = input_ids[:, -1:].repeat(1, n_tokens)
        times = []
        for _ in range(repeats + 1):
            started = time.perf_counter()
            forward(lm, block, cache, positions="all")
            synchronize(model_device(lm))
            times.append(time.perf_counter() - started)
            crop(cache, length)
    return statistics.median(times[1:])


def draft_step_s(lm: Any, input_ids: torch.Tensor, drafter: Any, repeats: int = 5) -> float:
    """Median wall time of one draft proposal of one token (a model pass for EarlyExit, a scan for lookup)."""
    import statistics

    context = input_ids[0].tolist()
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            drafter.reset(lm, input_ids)
            if isinstance(drafter, EarlyExit):  # time one cached step, not the prompt's prefill
                drafter.propose(context[:-1], 1)
                drafter.accepted(len(context) - 1)
            started = time.perf_counter()
            drafter.propose(context, 1)
            times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


# ---------------------------------------------------------------------------------------------------------------
# Lossless on the real model: the first speculative token's distribution


def first_token_distributions(lm: Any, input_ids: torch.Tensor, n_layers: int, temperature: float
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's and the early-exit draft's next-token distributions after ``input_ids``, float64 ``[vocab]``."""
    validation.real("temperature", temperature, min=0, min_open=True)
    with torch.inference_mode():
        target_row = forward(lm, input_ids, use_cache=False).logits[0].cpu()
        draft_row = forward(truncated_model(lm, n_layers), input_ids, use_cache=False).logits[0].cpu()
    return (sampling.softmax_with_temperature(target_row.double(), temperature),
            sampling.softmax_with_temperature(draft_row.double(), temperature))


def sample_first_tokens(target_probs: torch.Tensor, draft_probs: torch.Tensor, n_samples: int, seed: int,
                        step: Any = speculative_step) -> torch.Tensor:
    """``n_samples`` first tokens from one-draft speculative rounds on fixed rows, ``[n_samples]`` (seeded).

    The first token a round emits is the accepted draft or the residual draw, so it depends only on these two
    rows; the bonus row is never reached with one draft unless it is accepted, and then the draft is the token.
    """
    generator = torch.Generator().manual_seed(seed)
    out = torch.empty(n_samples, dtype=torch.long)
    target_rows = torch.stack([target_probs, target_probs])  # the bonus row is not used for the first token
    draft_rows = draft_probs.unsqueeze(0)
    for i in range(n_samples):
        draft = draw(draft_probs, generator)
        n_accepted, token = step(target_rows, draft_rows, [draft], generator)
        out[i] = draft if n_accepted == 1 else token
    return out
