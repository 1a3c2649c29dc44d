"""Any causal LM in a weight format: every linear layer of a private copy stored as BF16, INT8 or INT4, run by
transformers' own forward.

Lab 06 compares weight formats on the decoder that runs the model (:func:`labkit.runtime.llama.decoder` asks the
model's :class:`~labkit.runtime.decoder.Decoder`): labkit's Llama forward for a plain Llama, and for every other
architecture transformers' forward (:class:`~labkit.runtime.decoder.TransformersDecoder`) over this: a deep copy of
the model in which each linear layer (every ``torch.nn.Linear`` and transformers ``Conv1D``, the output head
included, found by :func:`labkit.runtime.structure.is_linear`) becomes the same format layer labkit's Llama uses
(:func:`labkit.runtime.weight_formats.make_linear`: torch's own ``_weight_int8pack_mm`` and
``_weight_int4pack_mm_for_cpu``, the CPU kernels torchao's weight-only configs call), its bias kept in float. The
rest of the model (norms, embeddings, attention) is cast to bfloat16 with the BF16 and INT formats, as
``torch_dtype=torch.bfloat16`` does in transformers; FP32 is the model as loaded.

Why not torchao itself: its ``quantize_`` with ``Int8WeightOnlyConfig`` / ``Int4WeightOnlyConfig`` does this to
``nn.Linear`` only (GPT-2's ``Conv1D`` stays float), its CPU INT4 layout has changed between releases and each
release pins a torch version, and the codes here must be labkit's own grid (``core.quantization``), the one lab 04
teaches and the tests hold equal. Left out: an INT4 layer whose input width is not a multiple of the group size
(it stays INT8, and the note says how many), activation quantization, a quantized KV cache.
Layer 2 (runtime).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from labkit.core import validation
from labkit.runtime.structure import is_linear, linear_weight
from labkit.runtime.weight_formats import (FORMATS, INT4_GROUP_SIZE, FloatLinear, Int4Linear, Int8Linear,
                                           PackedLinear, compute_dtype, make_linear)

FORMAT_LAYERS = (FloatLinear, PackedLinear, Int8Linear, Int4Linear)


class FormatLinear(torch.nn.Module):
    """A linear layer in a weight format (``inner``, one of :data:`FORMAT_LAYERS`) plus its float bias, if any."""

    def __init__(self, inner: torch.nn.Module, bias: torch.Tensor | None):
        super().__init__()
        self.inner = inner
        self.register_buffer("bias", None if bias is None else bias.detach().clone(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        return y if self.bias is None else y + self.bias.to(y.dtype)


def step_read_bytes(module: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads: every parameter and format layer's codes, each tensor once, but no
    embedding table (a step reads one row of each; a head tied to the token embedding is counted as the head)."""
    tables = {id(child.weight) for child in module.modules() if isinstance(child, torch.nn.Embedding)}
    heads = {id(p) for child in module.modules() if is_linear(child) for p in child.parameters()}
    seen: dict[int, int] = {}
    for tensor in module.parameters():
        if id(tensor) not in tables or id(tensor) in heads:
            seen[tensor.data_ptr()] = tensor.numel() * tensor.element_size()
    for child in module.modules():
        if isinstance(child, FormatLinear):
            for tensor in child.buffers():
                seen[tensor.data_ptr()] = tensor.numel() * tensor.element_size()
        if isinstance(child, PackedLinear):
            seen[id(child)] = child.packed.numel() * child.packed.element_size()
    return sum(seen.values())


def _format_layer(linear: torch.nn.Module, weights: str) -> tuple[torch.nn.Module, bool]:
    """(the layer in ``weights``, whether INT4 fell back to INT8 for an input width the group size does not divide)."""
    weight = linear_weight(linear).detach()  # [out, in]
    fallback = weights == "int4" and weight.shape[1] % INT4_GROUP_SIZE != 0
    inner = make_linear(weight.contiguous(), "int8" if fallback else weights)
    bias = None if linear.bias is None else linear.bias.to(compute_dtype(weights))
    return FormatLinear(inner, bias), fallback


def in_format(lm: Any, weights: str) -> Any:
    """A LoadedModel whose ``model`` is a private copy of ``lm``'s with every linear layer in ``weights``
    (``"bf16"``, ``"int8"``, ``"int4"``; ``"fp32"`` is ``lm``'s module itself), run by transformers' forward.

    The copy's ``weight_bytes`` is the bytes one decode step reads (:func:`step_read_bytes`).
    """
    validation.choice("weights", weights, FORMATS)
    module = lm.model
    if any(isinstance(child, FormatLinear) for child in module.modules()):
        raise TypeError(f"lm must be a LoadedModel as load_model() returns it, got one already holding "
                        f"{type(module).__name__} in a weight format")
    if weights == "fp32":
        module.weight_bytes = step_read_bytes(module)
        return dataclasses.replace(lm, notes=[*lm.notes, "transformers' forward, fp32 weights as loaded"])
    copied = copy.deepcopy(module).eval().to(compute_dtype(weights))
    names = [name for name, child in copied.named_modules() if name and is_linear(child)]
    fallbacks = 0
    for name in names:
        parent_name, _, leaf = name.rpartition(".")
        parent = copied.get_submodule(parent_name) if parent_name else copied
        # quantized from the loaded float32 matrix (the copy's is already cast to bfloat16)
        layer, fell_back = _format_layer(module.get_submodule(name), weights)
        setattr(parent, leaf, layer)
        fallbacks += fell_back
    copied.weight_bytes = step_read_bytes(copied)
    note = f"transformers' forward, {len(names)} linear layers in {weights}"
    if fallbacks:
        note += f" ({fallbacks} in INT8: their input width is not a multiple of {INT4_GROUP_SIZE})"
    return dataclasses.replace(lm, model=copied, notes=[*lm.notes, note])
