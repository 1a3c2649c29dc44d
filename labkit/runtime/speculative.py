"""Speculative decoding on the real model: the loop, and the measurements lab 07 sets beside it.

The loop: ``runtime.prefill`` runs the prompt; every round a drafter proposes up to ``gamma`` tokens,
``runtime.verify`` scores them in one target pass, :func:`labkit.core.speculative.greedy_accept` (or
:func:`~labkit.core.speculative.speculative_step` when sampling) keeps a prefix and adds one target token, and
``runtime.crop`` cuts the rejected drafts out of the cache (one function, :func:`_verify_round`). A drafter that
needs no model (prompt lookup) proposes before the prefill too, and the prefill verifies those drafts in the same
pass (transformers' assisted generation does the same): one target pass fewer. No forward pass is written here:
every pass goes through ``runtime.forward``.

Drafters (prompt lookup, early exit, a separate draft model with the target's tokenizer; what the loop asks of one is
declared by :class:`labkit.runtime.drafters.Drafter`) live in :mod:`labkit.runtime.drafters`. Any causal LM runs as
the target (labkit's own forward for a plain Llama, transformers' for the others); a model whose attention slides
over a window gets a cache that can be cut back past it (:func:`labkit.runtime.forward.rollback_cache`).

Greedy output equals plain greedy decoding token for token whatever the drafter (the draft only decides how many
tokens one pass yields), with one caveat, measured rather than assumed: the target scores a block of k + 1 tokens in
one pass, and a block's float reductions round differently from k + 1 single-token passes, so a step whose best two
logits are nearly tied could flip. The tests and lab 07 compare with plain greedy only on outputs whose every step
is far from a tie (``runtime.generation.greedy_margins`` above ``core.distribution.CLEAR_MARGIN``).

Left out: batches (rows would accept different numbers of drafts), tree drafts, a draft with another tokenizer
(refused: :func:`labkit.runtime.drafters.check_same_vocabulary`). The sampling step's first tokens on fixed rows
are core arithmetic (:func:`labkit.core.lossless.sample_first_tokens`). Layer: runtime (runs the model). Used by lab 07.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from labkit.core import sampling, validation
from labkit.core.speculative import draw, greedy_accept, speculative_step
from labkit.runtime import crop, forward, model_device, module_of, synchronize, verify
from labkit.runtime.drafters import Drafter, truncated_model
from labkit.runtime.forward import rollback_cache

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


def speculative_generate(lm: Any, token_ids: torch.Tensor, max_new_tokens: int, drafter: Drafter, gamma: int = 4, *,
                         temperature: float = 0.0, seed: int | None = None,
                         eos_token_id: int | None = None) -> SpeculativeRun:
    """Generate up to ``max_new_tokens`` after ``token_ids`` (``[1, prompt_len]``) with speculative decoding.

    ``temperature=0`` is greedy (equal to plain greedy decoding). ``temperature > 0`` samples with the exact
    speculative step, which needs the draft's probabilities (``Drafter.draft_probs``): ``EarlyExit`` keeps
    its own; prompt lookup is a point proposal, a draft distribution with all its mass on the proposed token.
    """
    validation.tensor("token_ids", token_ids, kind="int", ndim=2, shape="[1, prompt_len]", nonempty=True)
    if token_ids.shape[0] != 1:
        raise validation.fail(ValueError, "token_ids", "a tensor of shape [1, prompt_len] (one sequence)", token_ids)
    max_new_tokens = validation.integer("max_new_tokens", max_new_tokens, min=1)
    gamma = validation.integer("gamma", gamma, min=0)
    temperature = validation.real("temperature", temperature, min=0, note="0 means greedy")
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    if temperature > 0 and generator is None:
        generator = torch.Generator().manual_seed(torch.seed() % 2**63)
    run = SpeculativeRun(drafter.name or type(drafter).__name__, gamma, [])
    judging = _Judging(run, drafter, temperature, generator, eos_token_id, model_device(lm))
    started = time.perf_counter()
    with torch.inference_mode():
        drafter.reset(lm, token_ids)
        prompt = token_ids[0].tolist()
        # A drafter that needs no model (prompt lookup) can already propose what follows the prompt: the prefill
        # then verifies those drafts too, as transformers' assisted generation does, and saves one target call.
        drafts = (drafter.propose(prompt, min(gamma, max_new_tokens - 1), temperature, generator)
                  if drafter.drafts_from_prompt else [])
        if drafts:
            new, context, cache = _verify_round(lm, judging, None, [], prompt, drafts)
            run.prefill_verified = True
        else:
            logits, cache = forward(lm, token_ids, rollback_cache(lm))  # the prefill (rollback: a sliding window)
            context, new = prompt, [_choose(logits[0].cpu(), temperature, generator)]  # the target's own first token
        token = new[-1]
        while len(new) < max_new_tokens and (eos_token_id is None or token != eos_token_id):
            tick = time.perf_counter()
            drafts = drafter.propose(context + [token], min(gamma, max_new_tokens - len(new)), temperature, generator)
            run.draft_s += time.perf_counter() - tick
            produced, context, cache = _verify_round(lm, judging, cache, context, [token], drafts)
            new += produced
            token = new[-1]
    run.new_token_ids = new[:max_new_tokens]
    run.total_s = time.perf_counter() - started
    return run


@dataclass(frozen=True)
class _Judging:
    """What every verify round of one generation shares: the run it counts in and how it judges."""

    run: SpeculativeRun
    drafter: Drafter
    temperature: float
    generator: torch.Generator | None
    eos_token_id: int | None
    device: Any


def _verify_round(lm: Any, judging: _Judging, cache: Any, context: list[int], fed: list[int], drafts: list[int]
                  ) -> tuple[list[int], list[int], Any]:
    """One target pass over ``fed`` (the tokens after ``context``, which the cache holds: the prompt at the
    prefill, else the last chosen token) and ``drafts``, judged and counted; the cache and the drafter cut back to
    the accepted text. Returns (the tokens produced, the accepted text the cache now holds, the cache)."""
    tick = time.perf_counter()
    if cache is None:  # the prefill verifies too: the prompt's last position's logits, then each draft's
        rows, cache = forward(lm, torch.tensor([fed + drafts]), rollback_cache(lm), positions=len(drafts) + 1)
    else:
        rows, cache = verify(lm, cache, torch.tensor([fed]), torch.tensor([drafts], dtype=torch.long))
    rows = rows[0].cpu()  # [k + 1, vocab]
    synchronize(judging.device)
    judging.run.verify_s += time.perf_counter() - tick
    produced = _judge(judging, rows, drafts)
    context = context + fed + drafts[:len(produced) - 1]  # the last produced token is chosen, not fed yet
    crop(cache, len(context))
    judging.drafter.accepted(len(context))
    return produced, context, cache


def _judge(judging: _Judging, rows: torch.Tensor, drafts: list[int]) -> list[int]:
    """One target call's verdict on ``drafts`` (``rows``: its ``[k + 1, vocab]`` logits), counted in the run: the
    tokens it produces, the accepted drafts then the target's own token, cut after an end token."""
    run, eos_token_id = judging.run, judging.eos_token_id
    if judging.temperature == 0:
        n_accepted, following = greedy_accept(rows, drafts)
    else:
        n_accepted, following = _sampled_accept(rows, drafts, judging)
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


def _sampled_accept(rows: torch.Tensor, drafts: list[int], judging: _Judging) -> tuple[int, int]:
    """The exact speculative step on the target's rows at this temperature and the draft's distributions."""
    target_probs = sampling.softmax_with_temperature(rows.double(), judging.temperature)  # [k + 1, vocab]
    draft_probs = judging.drafter.draft_probs(drafts, rows.shape[-1])  # [k, vocab]
    return speculative_step(target_probs, draft_probs, drafts, judging.generator)


# ---------------------------------------------------------------------------------------------------------------
# Plain greedy, timed the same way, and transformers' own prompt lookup (a deliberate cross-check)


def plain_greedy(lm: Any, token_ids: torch.Tensor, max_new_tokens: int,
                 eos_token_id: int | None = None) -> tuple[list[int], float]:
    """labkit's greedy loop (one decode pass per token): (new token ids, wall seconds)."""
    from labkit.runtime.generation import generate

    synchronize(model_device(lm))
    started = time.perf_counter()
    result = generate(lm, token_ids, max_new_tokens, eos_token_id=eos_token_id)
    synchronize(model_device(lm))
    tokens = result.new_token_ids[0].tolist()
    if eos_token_id is not None and eos_token_id in tokens:
        tokens = tokens[:tokens.index(eos_token_id) + 1]
    return tokens, time.perf_counter() - started


def transformers_prompt_lookup(lm: Any, token_ids: torch.Tensor, max_new_tokens: int, gamma: int = 4,
                               eos_token_id: int | None = None) -> tuple[list[int], float]:
    """transformers' own assisted generation with ``prompt_lookup_num_tokens=gamma``: (new token ids, seconds)."""
    module = module_of(lm)
    kwargs = dict(do_sample=False, max_new_tokens=max_new_tokens, prompt_lookup_num_tokens=gamma,
                  attention_mask=torch.ones_like(token_ids), eos_token_id=eos_token_id,
                  pad_token_id=eos_token_id if eos_token_id is not None else 0)
    synchronize(model_device(lm))
    started = time.perf_counter()
    with torch.inference_mode():
        output = module.generate(token_ids.to(model_device(lm)), **kwargs)
    synchronize(model_device(lm))
    return output[0, token_ids.shape[1]:].tolist(), time.perf_counter() - started


def decode_step_s(lm: Any, token_ids: torch.Tensor, n_tokens: int = 1, repeats: int = 5) -> float:
    """Median wall time of one target pass over ``n_tokens`` new tokens after ``token_ids`` (a verify of
    ``n_tokens - 1`` drafts), the cache cropped back after each: the unit the cost ratio c is measured in."""
    import statistics

    with torch.inference_mode():
        _, cache = forward(lm, token_ids, rollback_cache(lm))  # the prefill, its cache croppable past a window
        length = token_ids.shape[1]
        block = token_ids[:, -1:].repeat(1, n_tokens)
        times = []
        for _ in range(repeats + 1):
            started = time.perf_counter()
            forward(lm, block, cache, positions="all")
            synchronize(model_device(lm))
            times.append(time.perf_counter() - started)
            crop(cache, length)
    return statistics.median(times[1:])


def draft_step_s(lm: Any, token_ids: torch.Tensor, drafter: Drafter, repeats: int = 5) -> float:
    """Median wall time of one draft proposal of one token (a model pass for EarlyExit, a scan for lookup),
    after ``Drafter.catch_up`` on the prompt."""
    import statistics

    context = token_ids[0].tolist()
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            drafter.reset(lm, token_ids)
            drafter.catch_up(context[:-1])  # time one step after the prompt, not a drafter's own prefill
            started = time.perf_counter()
            drafter.propose(context, 1)
            times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


# ---------------------------------------------------------------------------------------------------------------
# Lossless on the real model: the first speculative token's distribution


def first_token_distributions(lm: Any, token_ids: torch.Tensor, n_layers: int, temperature: float
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's and the early-exit draft's next-token distributions after ``token_ids``, float64 ``[vocab]``."""
    validation.real("temperature", temperature, min=0, min_open=True)
    with torch.inference_mode():
        target_row = forward(lm, token_ids, use_cache=False).logits[0].cpu()
        draft_row = forward(truncated_model(lm, n_layers), token_ids, use_cache=False).logits[0].cpu()
    return (sampling.softmax_with_temperature(target_row.double(), temperature),
            sampling.softmax_with_temperature(draft_row.double(), temperature))

