"""Misaligned copies of tensors, models and caches: make a test that leans on memory alignment fail everywhere.

Why this exists: MKL (torch's CPU BLAS on x86) without conditional numerical reproducibility may pick another GEMM
kernel for operands at another memory alignment, so the same matrix product on the same values can differ in the
last bits between two buffers. A model loaded from the memory-mapped cache has its weights at whatever offsets the
file gives them; a deep copy gets fresh, 64-byte-aligned buffers. A test that claims bitwise equality between the
two passes on a machine where the kernels happen to agree and fails on the next one (it did, on an AVX-512 EPYC).

The rule (tests/conftest.py states it too): bitwise equality only for the same operation on the same buffers.
Two paths — a copy, another layout, batch shape, cache, thread count — agree within a stated tolerance, or on
discrete results (argmax, tokens, counts) at margins far above float noise. To keep that honest, a test that
compares two model paths runs one of them on a copy whose every tensor starts one element past a fresh
allocation (never 64-byte aligned): a test that only passes by alignment luck then fails on every machine.
"""

from __future__ import annotations

import torch

from labkit import runtime
from labkit.runtime.cache import _layer_tensors
from labkit.runtime.generation import full_logits, greedy_margins
from labkit.runtime.kv_cache import KVCache


def misaligned(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` (same shape, dtype, values) whose data starts one element into a fresh buffer."""
    buffer = torch.empty(tensor.numel() + 1, dtype=tensor.dtype, device=tensor.device)
    moved = buffer[1:].view(tensor.shape)  # data_ptr is one element past a 64-byte-aligned allocation
    moved.copy_(tensor)
    return moved


def is_misaligned(tensor: torch.Tensor, alignment: int = 64) -> bool:
    return tensor.data_ptr() % alignment != 0


def misaligned_model(lm):
    """A private copy of a model (LoadedModel or module) with every parameter and buffer in a misaligned buffer.

    Tied parameters stay tied: a Parameter shared by two modules is one object, moved once.
    """
    private = runtime.model_copy(lm)
    module = runtime.module_of(private)
    with torch.no_grad():
        for parameter in {id(p): p for p in module.parameters()}.values():
            parameter.data = misaligned(parameter.data)
        for owner in module.modules():
            for name, buffer in list(owner._buffers.items()):
                if buffer is not None:
                    owner._buffers[name] = misaligned(buffer)
    return private


def misaligned_cache(cache):
    """A copy of a KV cache whose key and value tensors all sit in misaligned buffers."""
    copied = runtime.copy_cache(cache)
    if isinstance(copied, KVCache):  # labkit's static cache: its whole reserved tensors, not the views it shows
        copied.keys = [misaligned(t) for t in copied.keys]
        copied.values = [misaligned(t) for t in copied.values]
        return copied
    with torch.no_grad():
        for tensor in _layer_tensors(copied):
            moved = misaligned(tensor)
            tensor.set_(moved.untyped_storage(), moved.storage_offset(), moved.shape, moved.stride())
    return copied


def logits_atol(lm, logits: torch.Tensor) -> float:
    """How far two float32 paths of this model may differ in a logit: ``8 * eps * n_layers * max|logit|``.

    Reordering a float32 sum changes it by about epsilon (1.2e-7) relative to its size; every block adds such a
    rounding to the residual stream, and the output head carries it to the logits. Eight roundings per block
    (two norms, attention, the MLP, each with a product and a sum) over n_layers blocks, relative to the largest
    logit: for the embedded model (30 layers, logits up to ~31) that is 9e-4. Measured here between the loaded
    model and a misaligned copy: 1.5e-5 at the last position, so the bound has a factor of 60 to spare.
    """
    n_layers = runtime.module_of(lm).config.num_hidden_layers
    eps = torch.finfo(torch.float32).eps
    return float(8 * eps * n_layers * logits.abs().max().clamp_min(1.0))


def assert_clear_greedy_choices(lm, prompt_ids, new_token_ids):
    """Every greedy step is decided by a margin far above the float32 difference two paths may show."""
    margins = greedy_margins(lm, prompt_ids, new_token_ids)
    bound = logits_atol(lm, full_logits(lm, torch.cat([prompt_ids, new_token_ids], dim=1)))
    assert float(margins.min()) > 10 * bound, (margins, bound)
