"""Requests of different lengths served the way a server batches them (layer 2, runtime): greedy generation in
left-padded batches, each request's tokens and latency.

:func:`generate_requests` sorts the prompts by length, cuts them into batches and runs each batch with an attention
mask and positions counted from each prompt's first real token (:func:`left_pad`), so every request's greedy output
is the one it gets alone (:func:`labkit.runtime.generation.generate` runs one batch of prompts of one length). The
results come back in request order with each request's latency. Left out: continuous batching (a finished
request's slot is not refilled). Used by lab 06.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from labkit.core import validation
from labkit.runtime import forward, model_device, synchronize


@dataclass(frozen=True)
class RequestResult:
    """One request served in a batch: its new tokens (up to and including an end token) and when it was done."""

    request: int  # its index in the list of prompts given
    prompt_len: int
    new_token_ids: tuple[int, ...]
    batch: int  # which batch served it (batches run one after another)
    batch_size: int
    padding: int  # pad tokens put before its prompt
    latency_s: float  # from the start of the whole run to its last token


@dataclass(frozen=True)
class RequestsRun:
    """Every request's result, in request order, and the whole run's wall time."""

    results: tuple[RequestResult, ...]
    wall_s: float

    @property
    def new_tokens(self) -> int:
        return sum(len(r.new_token_ids) for r in self.results)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s


def left_pad(prompts: Sequence[torch.Tensor], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of different lengths as one ``[batch, longest]`` tensor padded on the left, and its attention mask.

    Left, so that every sequence's last real token is in the last column: the next token is read there for all.

    >>> ids, mask = left_pad([torch.tensor([5, 6, 7]), torch.tensor([8])], pad_token_id=0)
    >>> ids.tolist(), mask.tolist()
    ([[5, 6, 7], [0, 0, 8]], [[1, 1, 1], [0, 0, 1]])
    """
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), longest), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, longest - len(prompt):] = prompt
        mask[row, longest - len(prompt):] = 1
    return ids, mask


def _serve_batch(lm: Any, prompts: Sequence[torch.Tensor], max_new_tokens: int, eos_token_id: int | None,
                 pad_token_id: int, started: float, device: Any) -> tuple[list[list[int]], list[float]]:
    """Greedy generation for one left-padded batch: each sequence's new tokens and the time it finished."""
    ids, mask = left_pad(prompts, pad_token_id)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)  # each prompt's first real token is position 0
    batch = len(prompts)
    new: list[list[int]] = [[] for _ in range(batch)]
    done_at = [0.0] * batch
    finished = torch.zeros(batch, dtype=torch.bool)
    cache = None
    with torch.inference_mode():
        for step in range(max_new_tokens):
            if step == 0:
                logits, cache = forward(lm, ids, attention_mask=mask, position_ids=positions, device=device)
            else:
                positions = positions[:, -1:] + 1  # the new token follows each sequence's last real one
                logits, cache = forward(lm, chosen.unsqueeze(1), cache, attention_mask=mask,
                                        position_ids=positions, device=device)
            chosen = logits.cpu().argmax(dim=-1)  # greedy, as generate() at T = 0
            mask = torch.cat([mask, torch.ones((batch, 1), dtype=torch.long)], dim=1)
            synchronize(device if device is not None else model_device(lm))
            now = time.perf_counter() - started
            for row in range(batch):
                if not finished[row]:
                    new[row].append(int(chosen[row]))
                    done_at[row] = now
                    finished[row] = eos_token_id is not None and int(chosen[row]) == eos_token_id
            if bool(finished.all()):
                break
    return new, done_at


def generate_requests(lm: Any, prompts: Sequence[torch.Tensor], max_new_tokens: int, *, batch_size: int = 8,
                      eos_token_id: int | None = None, pad_token_id: int = 0, sort_by_length: bool = True,
                      device: Any = None) -> RequestsRun:
    """Greedy generation for requests of different lengths (``prompts``: 1-D token-id tensors), in batches.

    The requests are sorted by prompt length (longest first; ``sort_by_length=False`` keeps arrival order), cut
    into batches of at most ``batch_size``, each left-padded (:func:`left_pad`) with an attention mask and
    positions counted from each prompt's first real token. A request stops at ``eos_token_id``; its batch runs
    until all its requests have. Results come back in request order, each with the batch that served it and its
    latency from the start of the run (batches run one after another, so a later batch waits for earlier ones).
    """
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise validation.fail(ValueError, "prompts", "a non-empty list of 1-D token-id tensors", prompts)
    for index, prompt in enumerate(prompts):
        validation.tensor(f"prompts[{index}]", prompt, kind="int", ndim=1, shape="[prompt_len]", nonempty=True)
    validation.integer("max_new_tokens", max_new_tokens, min=1)
    batch_size = validation.integer("batch_size", batch_size, min=1)
    validation.integer("eos_token_id", eos_token_id, optional=True, min=0)
    validation.integer("pad_token_id", pad_token_id, min=0)
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i])) if sort_by_length else list(range(len(prompts)))
    results: dict[int, RequestResult] = {}
    started = time.perf_counter()
    for number, first in enumerate(range(0, len(order), batch_size)):
        members = order[first:first + batch_size]
        chosen = [prompts[i] for i in members]
        new, done_at = _serve_batch(lm, chosen, max_new_tokens, eos_token_id, pad_token_id, started, device)
        longest = max(len(p) for p in chosen)
        for row, request in enumerate(members):
            results[request] = RequestResult(request, len(prompts[request]), tuple(new[row]), number, len(members),
                                             longest - len(prompts[request]), done_at[row])
    wall = time.perf_counter() - started
    return RequestsRun(tuple(results[i] for i in range(len(prompts))), wall)
