"""Where KV-cache memory goes when many requests share a GPU: contiguous reservation versus paged blocks.

Used by the memory lab. A "contiguous" allocator reserves max_seq_len tokens for every request up front, as
serving systems did before vLLM; a "paged" one hands out blocks of block_size tokens on demand (Kwon et al.
2023, "Efficient Memory Management for Large Language Model Serving with PagedAttention", arXiv:2309.06180;
vLLM's default block is 16 tokens). The report is a snapshot with every request at its final length, the
peak of its life; it leaves out arrival and departure times, preemption, prefix sharing and the per-block
table, so it compares layouts, not schedulers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from labkit.core.memory import kv_bytes_per_token
from labkit.core.spec import ModelSpec
from labkit.core.validation import choice, fail, integer

POLICIES = ("contiguous", "paged")


@dataclass(frozen=True)
class Request:
    """One request's token counts."""

    prompt_len: int  # tokens in the prompt, cached at prefill
    output_len: int  # tokens generated, each cached as it is produced

    def __post_init__(self) -> None:
        integer("prompt_len", self.prompt_len, min=1)
        integer("output_len", self.output_len, min=0)

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.output_len


def request_stream(n_requests: int, seed: int = 0, prompt_len: tuple[int, int] = (32, 1024),
                   output_len: tuple[int, int] = (16, 512)) -> tuple[Request, ...]:
    """A reproducible stream of requests with lengths drawn uniformly from inclusive (low, high) ranges.

    >>> [r.total_len for r in request_stream(3, prompt_len=(10, 10), output_len=(5, 5))]
    [15, 15, 15]
    """
    n_requests, seed = integer("n_requests", n_requests, min=0), integer("seed", seed, min=0)
    for name, bounds in {"prompt_len": prompt_len, "output_len": output_len}.items():
        if not isinstance(bounds, (tuple, list)):
            raise fail(TypeError, name, "a (low, high) pair", bounds)
        if len(bounds) != 2:
            raise fail(ValueError, name, "a (low, high) pair", bounds)
        if integer(f"{name}[0]", bounds[0], min=1) > integer(f"{name}[1]", bounds[1], min=1):
            raise ValueError(f"{name} must be a (low, high) range with low <= high, got {bounds!r}")
    rng = np.random.default_rng(seed)
    prompts = rng.integers(prompt_len[0], prompt_len[1], size=n_requests, endpoint=True)
    outputs = rng.integers(output_len[0], output_len[1], size=n_requests, endpoint=True)
    return tuple(Request(int(p), int(o)) for p, o in zip(prompts, outputs))


@dataclass(frozen=True)
class AllocationReport:
    """KV-cache bytes of a request stream under one policy, part by part."""

    policy: str  # "contiguous" or "paged"
    n_requests: int  # requests in the snapshot
    used_bytes: int  # keys and values actually written
    over_reserved_bytes: int  # contiguous: reserved up to max_seq_len but never written
    last_block_bytes: int  # paged: unused slots in each request's last block (internal fragmentation)
    requests_fit: int | None = None  # requests admitted at once, in arrival order, within the KV budget

    @property
    def wasted_bytes(self) -> int:
        return self.over_reserved_bytes + self.last_block_bytes

    @property
    def reserved_bytes(self) -> int:
        return self.used_bytes + self.wasted_bytes

    @property
    def waste_fraction(self) -> float:
        """Share of the reservation never written (0 for an empty stream)."""
        return self.wasted_bytes / self.reserved_bytes if self.reserved_bytes else 0.0


def _reserved_tokens(total_len: int, policy: str, block_size: int, max_seq_len: int) -> int:
    if policy == "contiguous":
        return max_seq_len
    return -(-total_len // block_size) * block_size  # whole blocks: the last one is partly empty


def simulate_kv_allocation(requests: Sequence[Request], spec: ModelSpec, policy: str, *, kv_dtype: str = "bf16",
                           block_size: int = 16, max_seq_len: int | None = None,
                           kv_budget_bytes: int | None = None) -> AllocationReport:
    """Reserve KV cache for every request under a policy and report used, wasted and what fits a budget.

    max_seq_len is the per-request reservation of the contiguous policy; None means the longest request in
    the stream, the most favourable choice a contiguous allocator could make. requests_fit admits requests
    first come, first served, and stops at the first that does not fit (None when kv_budget_bytes is None).

    >>> spec = ModelSpec("toy", n_layers=1, d_model=2, n_heads=1, n_kv_heads=1, head_dim=1, vocab=2)  # 4 B/token
    >>> r = simulate_kv_allocation([Request(10, 7)], spec, "paged")  # 17 tokens -> 2 blocks of 16
    >>> r.used_bytes, r.last_block_bytes, r.reserved_bytes
    (68, 60, 128)
    """
    choice("policy", policy, POLICIES)
    requests = list(requests)
    if not all(isinstance(r, Request) for r in requests):
        raise fail(TypeError, "requests", "a sequence of labkit.core.paging.Request", requests)
    block_size = integer("block_size", block_size, min=1)
    longest = max((r.total_len for r in requests), default=0)
    if max_seq_len is None:
        max_seq_len = longest
    elif integer("max_seq_len", max_seq_len, min=1) < longest:
        raise ValueError(f"max_seq_len must be >= the longest request ({longest} tokens), got {max_seq_len}")
    token_bytes = kv_bytes_per_token(spec, kv_dtype)

    used = sum(r.total_len for r in requests)
    reserved = [_reserved_tokens(r.total_len, policy, block_size, max_seq_len) for r in requests]
    waste = sum(reserved) - used
    requests_fit = None
    if kv_budget_bytes is not None:
        kv_budget_bytes, requests_fit, held = integer("kv_budget_bytes", kv_budget_bytes, min=0), 0, 0
        for tokens in reserved:
            if held + tokens * token_bytes > kv_budget_bytes:
                break
            held, requests_fit = held + tokens * token_bytes, requests_fit + 1
    return AllocationReport(
        policy=policy,
        n_requests=len(requests),
        used_bytes=used * token_bytes,
        over_reserved_bytes=waste * token_bytes if policy == "contiguous" else 0,
        last_block_bytes=waste * token_bytes if policy == "paged" else 0,
        requests_fit=requests_fit,
    )
