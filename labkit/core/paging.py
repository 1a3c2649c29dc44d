"""Where KV-cache memory goes when many requests share a GPU: contiguous reservation versus paged blocks.

Used by the memory lab. A "contiguous" allocator reserves max_seq_len tokens for every request up front, as
serving systems did before vLLM; a "paged" one hands out blocks of block_size tokens on demand (Kwon et al.
2023, "Efficient Memory Management for Large Language Model Serving with PagedAttention", arXiv:2309.06180;
vLLM's default block is 16 tokens). The report is a snapshot with every request at its final length, the
peak of its life; it leaves out arrival and departure times, preemption, prefix sharing and the per-block
table, so it compares layouts, not schedulers. The block table itself, event by event over a fixed pool, is
:class:`BlockAllocator` (:func:`replay_block_events`; the reference of lab 05's allocator exercise).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import NamedTuple, Sequence

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


# ---------------------------------------------------------------------------------------------------------------
# The block table itself: a fixed pool of blocks, handed out and taken back event by event

EVENT_KINDS = ("allocate", "append", "free")


class BlockReplay(NamedTuple):
    """What a pool of KV blocks looks like after a list of events (see :func:`replay_block_events`)."""

    block_tables: dict[int, list[int]]  # every live request's blocks, in the order they were handed out
    free_blocks: int  # blocks in the pool that no request holds
    wasted_slots: int  # token slots held by live requests but not written (internal fragmentation)
    refused: list[int]  # indices of the allocate and append events the pool could not serve


class BlockAllocator:
    """A pool of ``n_blocks`` KV blocks of ``block_size`` tokens and one block table per request.

    A request of n tokens holds ceil(n / block_size) blocks; a new block is taken only when its last one is full.
    Blocks are handed out lowest-numbered first, and a freed request's blocks go back to the pool at once. An
    allocate or append that needs more blocks than are free is refused whole (nothing changes). This is the
    bookkeeping of vLLM's PagedAttention without prefix sharing, copy-on-write or preemption.

    >>> pool = BlockAllocator(n_blocks=4, block_size=4)
    >>> pool.allocate(0, 5), pool.append(0, 3), pool.block_tables, pool.free_blocks, pool.wasted_slots
    (True, True, {0: [0, 1]}, 2, 0)
    """

    def __init__(self, n_blocks: int, block_size: int) -> None:
        self.n_blocks = integer("n_blocks", n_blocks, min=0)
        self.block_size = integer("block_size", block_size, min=1)
        self._free = list(range(self.n_blocks))  # a heap: the lowest-numbered free block first
        self._tables: dict[int, list[int]] = {}
        self._tokens: dict[int, int] = {}

    def blocks_for(self, n_tokens: int) -> int:
        """Blocks that hold n_tokens tokens: ceil(n_tokens / block_size)."""
        return -(-n_tokens // self.block_size)

    def _grow(self, request_id: int, n_tokens: int) -> bool:
        total = self._tokens.get(request_id, 0) + n_tokens
        needed = self.blocks_for(total) - len(self._tables.get(request_id, ()))
        if needed > len(self._free):
            return False
        self._tables.setdefault(request_id, []).extend(heapq.heappop(self._free) for _ in range(needed))
        self._tokens[request_id] = total
        return True

    def allocate(self, request_id: int, n_tokens: int) -> bool:
        """A new request with an n_tokens prompt; False (and nothing held) when the pool is short of blocks."""
        if request_id in self._tables:
            raise ValueError(f"request {request_id!r} is already allocated")
        return self._grow(request_id, integer("n_tokens", n_tokens, min=1))

    def append(self, request_id: int, n_tokens: int = 1) -> bool:
        """n_tokens more tokens for a live request (a request that is not live is left alone: True)."""
        n_tokens = integer("n_tokens", n_tokens, min=1)
        return self._grow(request_id, n_tokens) if request_id in self._tables else True

    def free(self, request_id: int) -> None:
        """A request ends: its blocks go back to the pool (a request that is not live: nothing happens)."""
        for block in self._tables.pop(request_id, ()):
            heapq.heappush(self._free, block)
        self._tokens.pop(request_id, None)

    @property
    def block_tables(self) -> dict[int, list[int]]:
        return {request_id: list(blocks) for request_id, blocks in self._tables.items()}

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def wasted_slots(self) -> int:
        return sum(len(self._tables[request_id]) * self.block_size - tokens
                   for request_id, tokens in self._tokens.items())


def replay_block_events(events: Sequence[tuple[str, int, int]], n_blocks: int, block_size: int) -> BlockReplay:
    """Run ("allocate", request, tokens), ("append", request, tokens) and ("free", request, 0) events on a
    :class:`BlockAllocator` and report the block tables, the free blocks, the wasted slots and the refusals.

    >>> events = [("allocate", 0, 5), ("allocate", 1, 6), ("free", 0, 0), ("append", 1, 3), ("allocate", 2, 9)]
    >>> replay_block_events(events, n_blocks=4, block_size=4)
    BlockReplay(block_tables={1: [2, 3, 0]}, free_blocks=1, wasted_slots=3, refused=[4])
    """
    pool = BlockAllocator(n_blocks, block_size)
    refused = []
    for index, event in enumerate(events):
        if not isinstance(event, (tuple, list)) or len(event) != 3:
            raise fail(TypeError, f"events[{index}]", "a (kind, request_id, n_tokens) triple", event)
        kind, request_id, n_tokens = event
        choice(f"events[{index}] kind", kind, EVENT_KINDS)
        if kind == "free":
            pool.free(request_id)
        elif not (pool.allocate if kind == "allocate" else pool.append)(request_id, n_tokens):
            refused.append(index)
    return BlockReplay(pool.block_tables, pool.free_blocks, pool.wasted_slots, refused)


def request_events(requests: Sequence[Request], append_tokens: int | None = 1) -> list[tuple[str, int, int]]:
    """Every request's prompt allocated, then its output appended append_tokens at a time (None: all at once, the
    same final state in far fewer events), nothing freed.

    >>> request_events([Request(3, 2)]), request_events([Request(3, 5)], append_tokens=None)
    ([('allocate', 0, 3), ('append', 0, 1), ('append', 0, 1)], [('allocate', 0, 3), ('append', 0, 5)])
    """
    if append_tokens is not None:
        append_tokens = integer("append_tokens", append_tokens, min=1)
    events = [("allocate", index, request.prompt_len) for index, request in enumerate(requests)]
    for index, request in enumerate(requests):
        left = request.output_len
        while left:
            step = left if append_tokens is None else min(append_tokens, left)
            events.append(("append", index, step))
            left -= step
    return events
