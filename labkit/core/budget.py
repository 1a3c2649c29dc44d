"""One GPU's memory budget for serving a model: every part, the total, the headroom, and what fits.

Used by the memory lab (lab 05) and its explorer. The exact parts (weights, KV cache) come from
``labkit.core.memory``; this module adds the two that can only be estimated, live activations and workspace (each
docstring states what it assumes), and answers the reverse questions: the largest batch for a context and the
longest context for a batch, per GPU under tp-way tensor parallelism. Sizes are int bytes; the ``*_gib``
properties are binary GiB (2**30), the ``*_gb`` ones decimal GB (10**9), never mixed.

Prefill is either one forward pass over every prompt (``prefill_chunk_tokens=None``, the default: the largest
activation peak) or chunked, a capped number of tokens per forward step as serving engines run it.

Left out: pipeline parallelism, CUDA graphs, the allocator's own rounding, and a model's context limit
(max_seq_len answers for memory only; ``ModelSpec.max_position_embeddings`` holds the limit where a preset
knows it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from labkit.core.spec import GPUSpec  # re-exported: budgets are taken against a GPU
from labkit.core.memory import (
    GB, GIB, LLAMA, BlockLayout, check_shardable, format_bits, kv_cache_bytes, to_gb, to_gib, weights_bytes,
)
from labkit.core.spec import ModelSpec
from labkit.core.validation import instance, integer, real


def activations_bytes(spec: ModelSpec, batch_size: int, seq_len: int, act_fmt: str = "bf16", tp: int = 1,
                      layout: BlockLayout = LLAMA, prefill_chunk_tokens: int | None = None) -> int:
    """First-order estimate of live activation bytes at the prefill peak on one of tp ranks.

    Tokens in flight: the whole batch (batch_size x seq_len) when prefill_chunk_tokens is None, i.e. one
    forward pass over every prompt; with chunked prefill (vLLM's max_num_batched_tokens, SGLang's
    chunked_prefill_size) a forward step holds at most prefill_chunk_tokens tokens, so the peak is
    min(prefill_chunk_tokens, batch_size x seq_len) tokens. Assumes layers run one after another (one layer's
    tensors alive at a time) and a fused attention kernel (FlashAttention) that never stores the
    [seq_len, seq_len] scores. Per token in flight: the residual stream and its normed copy (2 d_model), the
    q/k/v projections, and the MLP hidden state (gate and up: 2 d_ff / tp), in act_fmt; plus FP32 logits of
    each sequence's last position [batch, vocab / tp] (either way: a step can finish every sequence's prompt).
    Autograd-free inference.

    >>> spec = ModelSpec("toy", n_layers=1, d_model=4, n_heads=2, n_kv_heads=1, head_dim=2, vocab=10, d_ff=8)
    >>> activations_bytes(spec, 1, 3)  # 3 tokens x (8 + 8 + 16) values x 2 B + 10 logits x 4 B
    232
    >>> activations_bytes(spec, 2, 3, prefill_chunk_tokens=4)  # 4 of the 6 tokens x 64 B + 2 x 40 B of logits
    336
    """
    kv_heads = check_shardable(spec, layout, tp)
    batch_size, seq_len = integer("batch_size", batch_size, min=0), integer("seq_len", seq_len, min=0)
    in_flight = batch_size * seq_len
    if prefill_chunk_tokens is not None:
        in_flight = min(in_flight, integer("prefill_chunk_tokens", prefill_chunk_tokens, min=1))
    qkv = (spec.n_heads // tp + 2 * kv_heads) * spec.head_dim
    mlp_hidden = (2 if layout.gated_mlp else 1) * (spec.d_ff // tp)
    per_token = 2 * spec.d_model + qkv + mlp_hidden
    logits = batch_size * -(-spec.vocab // tp) * 4  # FP32: engines upcast logits before sampling
    return -(-in_flight * per_token * format_bits(act_fmt, "act_fmt") // 8) + logits


def workspace_bytes(capacity_bytes: int, fraction: float = 0.1) -> int:
    """First-order allowance for everything not modelled: a fraction of the device memory.

    The default 10% is what vLLM leaves outside its budget (gpu_memory_utilization=0.9) for the CUDA
    context, cuBLAS/NCCL workspaces and allocator fragmentation; measure a real deployment instead.

    >>> workspace_bytes(80 * GB)
    8000000000
    """
    capacity_bytes = integer("capacity_bytes", capacity_bytes, min=1)
    fraction = real("fraction", fraction, min=0, max=1, max_open=True)
    return int(capacity_bytes * fraction)


@dataclass(frozen=True)
class MemoryBudget:
    """One GPU's memory, part by part, in bytes; *_gib properties for display.

    >>> b = MemoryBudget(4 * GIB, 3 * GIB // 2, 3 * GIB // 4, GIB // 2, 8 * GIB, other_bytes=GIB // 2)
    >>> b.total_gib, b.headroom_gib, b.fits  # the course reading's invented 8-GiB device
    (7.25, 0.75, True)
    """

    weights_bytes: int  # this rank's weights, with quantization scales
    kv_cache_bytes: int  # this rank's KV heads for every cached token (eq. 8.3)
    activations_bytes: int  # first-order prefill peak, see activations_bytes()
    workspace_bytes: int  # allowance for CUDA context, library workspaces, fragmentation
    capacity_bytes: int  # the GPU's memory
    other_bytes: int = 0  # anything else the caller reserves
    tp: int = 1  # tensor-parallel ranks; every field above is per GPU

    def __post_init__(self) -> None:
        for name in ("weights_bytes", "kv_cache_bytes", "activations_bytes", "workspace_bytes", "other_bytes"):
            integer(name, getattr(self, name), min=0)
        integer("capacity_bytes", self.capacity_bytes, min=1)
        integer("tp", self.tp, min=1)

    @property
    def parts(self) -> dict[str, int]:
        """The stacked-bar parts, in bytes."""
        return {"weights": self.weights_bytes, "kv_cache": self.kv_cache_bytes,
                "activations": self.activations_bytes, "workspace": self.workspace_bytes,
                "other": self.other_bytes}

    @property
    def total_bytes(self) -> int:
        return sum(self.parts.values())

    @property
    def headroom_bytes(self) -> int:
        """Capacity minus total; negative when it does not fit."""
        return self.capacity_bytes - self.total_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    weights_gib = property(lambda self: to_gib(self.weights_bytes))
    kv_cache_gib = property(lambda self: to_gib(self.kv_cache_bytes))
    activations_gib = property(lambda self: to_gib(self.activations_bytes))
    workspace_gib = property(lambda self: to_gib(self.workspace_bytes))
    total_gib = property(lambda self: to_gib(self.total_bytes))
    capacity_gib = property(lambda self: to_gib(self.capacity_bytes))
    headroom_gib = property(lambda self: to_gib(self.headroom_bytes))
    total_gb = property(lambda self: to_gb(self.total_bytes))  # decimal, to compare with a datasheet
    capacity_gb = property(lambda self: to_gb(self.capacity_bytes))
    headroom_gb = property(lambda self: to_gb(self.headroom_bytes))


def budget(spec: ModelSpec, gpu: GPUSpec, batch_size: int, seq_len: int, weight_fmt: str = "bf16",
           kv_dtype: str = "bf16", tp: int = 1, *, layout: BlockLayout = LLAMA, group_size: int | None = None,
           scale_bytes: int = 2, act_fmt: str = "bf16", workspace_fraction: float = 0.1,
           other_bytes: int = 0, prefill_chunk_tokens: int | None = None) -> MemoryBudget:
    """Per-GPU memory for serving batch_size sequences of seq_len tokens with tp-way tensor parallelism.

    prefill_chunk_tokens=None prefills every prompt in one forward pass (the largest activation peak); a
    number caps the tokens of one forward step, as chunked prefill does (see activations_bytes).

    >>> spec = ModelSpec("toy", n_layers=1, d_model=4, n_heads=2, n_kv_heads=1, head_dim=2, vocab=10, d_ff=8)
    >>> b = budget(spec, GPUSpec("1 KB", 1000), batch_size=1, seq_len=3, workspace_fraction=0)
    >>> b.weights_bytes, b.kv_cache_bytes, b.activations_bytes, b.fits  # 236 params x 2 B; 3 x 2*2 x 2 B
    (472, 24, 232, True)
    """
    instance("gpu", gpu, GPUSpec, "a GPUSpec (labkit.core.presets.gpu_preset(name))")
    format_bits(weight_fmt, "weight_fmt")  # checked here so the message names budget's own argument
    return MemoryBudget(
        weights_bytes=weights_bytes(spec, weight_fmt, group_size, scale_bytes, tp=tp, layout=layout),
        kv_cache_bytes=kv_cache_bytes(spec, batch_size, seq_len, kv_dtype, tp),
        activations_bytes=activations_bytes(spec, batch_size, seq_len, act_fmt, tp, layout, prefill_chunk_tokens),
        workspace_bytes=workspace_bytes(gpu.memory_bytes, workspace_fraction),
        capacity_bytes=gpu.memory_bytes,
        other_bytes=integer("other_bytes", other_bytes, min=0),
        tp=tp,
    )


def _largest_fitting(fits: Callable[[int], bool]) -> int:
    """Largest n >= 1 with fits(n), for fits true up to some n and false beyond; 0 if fits(1) is false."""
    if not fits(1):
        return 0
    low = 1
    while fits(2 * low):  # total memory grows at least linearly, so this ends
        low *= 2
    high = 2 * low  # invariant: fits(low) and not fits(high)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def max_batch_size(spec: ModelSpec, gpu: GPUSpec, seq_len: int, **options: Any) -> int:
    """Most sequences of seq_len tokens that fit on each GPU (0 if one does not); options go to budget().

    >>> spec = ModelSpec("toy", n_layers=1, d_model=4, n_heads=2, n_kv_heads=1, head_dim=2, vocab=10, d_ff=8)
    >>> max_batch_size(spec, GPUSpec("1 KB", 1000), seq_len=3, workspace_fraction=0)  # 472 + 256 n <= 1000
    2
    """
    seq_len = integer("seq_len", seq_len, min=1)
    return _largest_fitting(lambda n: budget(spec, gpu, n, seq_len, **options).fits)


def max_seq_len(spec: ModelSpec, gpu: GPUSpec, batch_size: int, **options: Any) -> int:
    """Longest context that fits for batch_size sequences on each GPU (0 if none); options go to budget().

    Memory only: the model's own context limit is not in ModelSpec, so check it separately.

    >>> spec = ModelSpec("toy", n_layers=1, d_model=4, n_heads=2, n_kv_heads=1, head_dim=2, vocab=10, d_ff=8)
    >>> max_seq_len(spec, GPUSpec("1 KB", 1000), batch_size=1, workspace_fraction=0)  # 512 + 72 T <= 1000
    6
    """
    batch_size = integer("batch_size", batch_size, min=1)
    return _largest_fitting(lambda n: budget(spec, gpu, batch_size, n, **options).fits)




def kv_batch_capacity(spec: ModelSpec, kv_budget_bytes: int, seq_len: int, kv_dtype: str = "bf16",
                      tp: int = 1) -> int:
    """Most sequences of seq_len cached tokens whose KV cache fits in kv_budget_bytes (per GPU), rounded down.

    The KV-only question (what is left after the weights, nothing else counted); budget() and max_batch_size()
    add activations and workspace.

    >>> spec = ModelSpec("8B-like", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, head_dim=128, vocab=1)
    >>> kv_batch_capacity(spec, 8 * GIB, seq_len=4096, kv_dtype="fp16")  # 512 MiB per sequence
    16
    """
    kv_budget_bytes, seq_len = integer("kv_budget_bytes", kv_budget_bytes, min=0), integer("seq_len", seq_len, min=1)
    return kv_budget_bytes // kv_cache_bytes(spec, 1, seq_len, kv_dtype, tp)
