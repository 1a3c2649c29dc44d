"""Token-by-token generation from labkit's sampling functions and the model's KV cache.

The loop, in reading order: ``runtime.prefill`` runs the prompt once and returns the last position's logits and
the cache; ``runtime.decode_one_token`` feeds one new token per sequence against that cache; :func:`next_tokens`
turns logits into token ids with ``labkit.core.sampling`` (temperature 0 is greedy: the first argmax). With the
cache, each step costs one token's forward pass instead of the whole prefix's.

Greedy output equals transformers' ``generate(do_sample=False)`` token for token (a test checks it). A seed
fixes the random stream of sampling, so the same seed gives the same ids on the same machine and library
versions; :func:`first_divergence` finds where two generations part. Two paths (cached and uncached, batched and
alone, speculative and plain) give the same greedy tokens only where no step is a near-tie: :func:`greedy_margins`
measures each step's margin so a lab can show it is far above float32 noise.

:func:`generate` runs one batch of prompts of one length; :mod:`labkit.runtime.batching` serves prompts of
different lengths the way a server batches requests; :class:`labkit.runtime.step_counter.StepCounter` hands
out this loop's two passes one by one, counted, for a loop written by hand.

:func:`draw_continuations` turns a seeded batch of samples into text (lab 01's explorer, ``LoadedModel.sample``).

Left out: beam search, repetition penalties, stop strings. Used by lab 02 (and by labs 06 and 07 for timing and
speculation).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from labkit.core import distribution, sampling, validation
# The model is only ever run through the runtime; these names are re-exported for the labs that call them.
from labkit.runtime import (StepInfo, cache_length, decode_one_token, full_logits, model_device, prefill,
                            synchronize)


@dataclass(frozen=True)
class Generation:
    """The prompt and what was generated after it."""

    token_ids: torch.Tensor  # [batch, prompt_len + n_new]
    prompt_len: int
    finished: torch.Tensor  # [batch] bool: the sequence produced eos_token_id
    step_logits: torch.Tensor | None = None  # [batch, n_new, vocab] when asked for (keep_logits=True)

    @property
    def new_token_ids(self) -> torch.Tensor:
        """The generated tokens only: ``[batch, n_new]``."""
        return self.token_ids[:, self.prompt_len :]


def next_tokens(logits: torch.Tensor, settings: dict, generator: torch.Generator | None) -> torch.Tensor:
    """Token ids ``[batch]`` from logits ``[batch, vocab]``: the first argmax at T = 0, else a sample."""
    if settings["temperature"] == 0:
        return logits.argmax(dim=-1)  # greedy needs no filter and no random draw
    return sampling.sample(sampling.sampling_probs(logits, **settings), generator=generator)


def _check_arguments(token_ids: Any, max_new_tokens: Any, seed: Any) -> None:
    validation.tensor("token_ids", token_ids, kind="int", ndim=2, shape="[batch, prompt_len]", nonempty=True)
    validation.integer("max_new_tokens", max_new_tokens, min=0)
    validation.integer("seed", seed, optional=True)


def generate(lm: Any, token_ids: torch.Tensor, max_new_tokens: int, *, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, order: str = "temperature_first",
             seed: int | None = None, eos_token_id: int | None = None, use_cache: bool = True,
             keep_logits: bool = False, on_step: Callable[[StepInfo], Any] | None = None,
             device: Any = None) -> Generation:
    """Generate up to ``max_new_tokens`` tokens after ``token_ids`` (``[batch, prompt_len]``).

    ``temperature=0`` (the default) is greedy. Sampling draws from ``labkit.core.sampling.sampling_probs`` with the
    given filters; ``seed`` makes the draws reproducible (``None`` uses torch's global generator). Once a
    sequence produces ``eos_token_id`` it is padded with it; generation stops when every sequence has.
    ``use_cache=False`` recomputes the whole prefix at every step (slow; the reference the cache must match).
    ``keep_logits`` keeps each step's logits (``[batch, n_new, vocab]`` floats: mind the memory).
    ``on_step`` is called after every step with a :class:`labkit.runtime.StepInfo` (the chosen tokens, the step's
    wall time with the device synchronized, the cache length): timing is measured here, in the one loop.
    ``device`` is where the model runs (default: where it is); sampling happens on the CPU, so a seed gives the
    same tokens whatever the device.
    """
    _check_arguments(token_ids, max_new_tokens, seed)
    settings = sampling.check_settings(temperature, top_k, top_p, min_p, order)  # the same errors as sampling's
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    batch_size, prompt_len = token_ids.shape
    finished = torch.zeros(batch_size, dtype=torch.bool)
    kept: list[torch.Tensor] = []
    cache = None
    if on_step is not None and not callable(on_step):
        raise TypeError(f"on_step must be a function taking a StepInfo, or None, got {validation.shown(on_step)}")
    with torch.inference_mode():
        for step in range(max_new_tokens):
            started = time.perf_counter()
            if not use_cache:
                logits = full_logits(lm, token_ids, device=device)[:, -1, :]
            elif step == 0:
                logits, cache = prefill(lm, token_ids, device=device)
            else:
                logits, cache = decode_one_token(lm, token_ids[:, -1:], cache, device=device)
            logits = logits.cpu()  # [batch, vocab]; a no-op on the CPU
            if keep_logits:
                kept.append(logits)
            chosen = next_tokens(logits, settings, generator)  # [batch]
            if eos_token_id is not None:
                chosen = torch.where(finished, torch.full_like(chosen, eos_token_id), chosen)
                finished = finished | (chosen == eos_token_id)
            token_ids = torch.cat([token_ids, chosen.unsqueeze(1)], dim=1)
            if on_step is not None:
                synchronize(device if device is not None else model_device(lm))
                on_step(StepInfo(step, chosen, time.perf_counter() - started,
                                 cache_length(cache) if cache is not None else 0))
            if bool(finished.all()):
                break
    step_logits = torch.stack(kept, dim=1) if keep_logits and kept else None
    return Generation(token_ids, prompt_len, finished, step_logits)



def draw_continuations(lm: Any, token_ids: torch.Tensor, n: int = 4, max_new_tokens: int = 20, seed: int = 0,
                       temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                       order: str = "temperature_first") -> list[str]:
    """``n`` continuations of ``token_ids`` (``[1, seq_len]``) as text, drawn as one batch with a seeded generator.

    A thin text wrapper over :func:`generate` (KV cache, ``sampling_probs`` then ``sample`` at every step; rows
    stop at the end-of-sequence token). Repeatable for a seed on this machine and these library versions. Used by
    the sampling explorer's button and ``LoadedModel.sample``.
    """
    n = validation.integer("n", n, min=1)
    validation.tensor("token_ids", token_ids, kind="int", ndim=2, shape="[1, seq_len]")
    if token_ids.shape[0] != 1:
        raise validation.fail(ValueError, "token_ids", "a tensor of shape [1, seq_len]", token_ids)
    result = generate(lm, token_ids.repeat(n, 1), max_new_tokens, temperature=temperature, top_k=top_k,
                      top_p=top_p, min_p=min_p, order=order, seed=seed, eos_token_id=lm.tokenizer.eos_token_id)
    return [lm.tokenizer.decode(row, skip_special_tokens=True) for row in result.new_token_ids]


def _as_list(tokens: Any, name: str) -> list[int]:
    if isinstance(tokens, torch.Tensor):
        if tokens.ndim != 1:
            raise ValueError(f"{name} must be one sequence of token ids (1-D), got shape {tuple(tokens.shape)}")
        return tokens.tolist()
    return list(tokens)


def first_divergence(a: Sequence[int] | torch.Tensor, b: Sequence[int] | torch.Tensor) -> int | None:
    """The first position where two token sequences differ, or None when they are identical.

    When one is a prefix of the other, they diverge where the shorter one ends.

    >>> first_divergence([5, 6, 7, 8], [5, 6, 9, 8])
    2
    >>> first_divergence([5, 6], [5, 6, 7]), first_divergence([5, 6], [5, 6])
    (2, None)
    """
    left, right = _as_list(a, "a"), _as_list(b, "b")
    for position, (x, y) in enumerate(zip(left, right)):
        if x != y:
            return position
    return None if len(left) == len(right) else min(len(left), len(right))


def greedy_margins(lm: Any, prompt_ids: torch.Tensor, new_token_ids: torch.Tensor, *,
                   device: Any = None) -> torch.Tensor:
    """Each generated token's logit margin over the best other token, ``[batch, n_new]``, from one uncached pass.

    ``prompt_ids`` ``[batch, prompt_len]`` and ``new_token_ids`` ``[batch, n_new]`` (no padding). A greedy choice
    made with a margin above ``distribution.CLEAR_MARGIN`` is the same on any path that computes these logits in
    another float order (a cache, a batch, a copy of the weights, another CPU); a small or negative margin marks a
    step where two correct implementations may part.
    """
    validation.tensor("prompt_ids", prompt_ids, kind="int", ndim=2, shape="[batch, prompt_len]", nonempty=True)
    validation.tensor("new_token_ids", new_token_ids, kind="int", ndim=2, shape="[batch, n_new]", nonempty=True)
    if new_token_ids.shape[0] != prompt_ids.shape[0]:
        raise validation.fail(ValueError, "new_token_ids", f"one row per prompt ({prompt_ids.shape[0]})",
                              tuple(new_token_ids.shape))
    prompt_len, n_new = prompt_ids.shape[1], new_token_ids.shape[1]
    everything = torch.cat([prompt_ids, new_token_ids.to(prompt_ids.device)], dim=1)
    logits = full_logits(lm, everything, device=device)  # [batch, prompt_len + n_new, vocab]
    deciding = logits[:, prompt_len - 1 : prompt_len - 1 + n_new]  # the positions that chose each new token
    return distribution.choice_margin(deciding, new_token_ids.to(deciding.device))
