"""The weight formats labkit's Llama forward decodes in: FP32, BF16, weight-only INT8 and INT4, and the bytes each
step reads.

A format decides how each weight matrix ``[out, in]`` is stored and which kernel multiplies by it; the rest of the
forward (norms, rotary embedding, attention) is the same. Every matrix of a decode step is read once, so the bytes
these layers hold are the bytes a step reads (:func:`weight_bytes`), and fewer bytes per weight is the whole point.

* ``"fp32"``: a float32 copy packed once for oneDNN's matmul (:class:`PackedLinear`), where torch has oneDNN;
  elsewhere the given weights themselves (no copy) through ``F.linear``.
* ``"bf16"``: a bfloat16 copy, packed once for oneDNN's matmul where the processor has one (:class:`PackedLinear`;
  elsewhere torch's plain bfloat16 matmul, and :func:`bf16_fallback_reason` says why); the
  forward then computes in bfloat16 (its norms in float32), as ``torch_dtype=torch.bfloat16`` does in transformers.
  Half the bytes. The INT formats compute in bfloat16 too.
* ``"int8"``: weight-only INT8, one scale per output channel (symmetric, codes -127..127, ``core.quantization``'s
  grid), multiplied by ``torch._weight_int8pack_mm`` (the kernel gpt-fast and torchao call on CPU: it reads the
  int8 codes and scales the output). A quarter of the bytes, plus one bfloat16 scale per row.
* ``"int4"``: weight-only INT4, an affine grid per group of ``INT4_GROUP_SIZE`` inputs (codes 0..15, a scale and a
  zero per group), packed two codes a byte by ``torch._convert_weight_to_int4pack_for_cpu`` and multiplied by
  ``torch._weight_int4pack_mm_for_cpu`` (torchao's CPU int4 path).

The output head is the tied embedding matrix in the step's format; the embedding lookup reads its row from the
loaded FP32 table (one row per token, 2,304 bytes: not what a step's time is made of), so no format needs rows of a
packed matrix. Left out: activation quantization (lab 04 simulates it),
GPTQ/AWQ-calibrated codes (round-to-nearest here), a quantized KV cache. Layer: runtime. Used by
:mod:`labkit.runtime.llama` and lab 06.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from labkit.core import validation
from labkit.core.quantization import minmax_qparams

FORMATS = ("fp32", "bf16", "int8", "int4")
INT4_GROUP_SIZE = 32  # inputs per INT4 scale and zero (576 and 1536 are multiples; torchao's default is 128)


class FloatLinear(torch.nn.Module):
    """``y = x W^T`` with ``W`` float32 or bfloat16 (``x`` in the same dtype)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.register_buffer("weight", weight, persistent=False)  # [out, in]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class PackedLinear(torch.nn.Module):
    """A float32 or bfloat16 matrix packed once into oneDNN's blocked layout (the layout its matmul reads).

    ``F.linear`` on a plain matrix either repacks it at every call (bfloat16) or hands a one-row product to a
    general matrix kernel (float32). Measured on a 2-core AMD EPYC, 2 threads, 300 matrices [1536, 576]
    multiplied by one row: float32 through ``F.linear`` 9.5 GB/s of weights, packed 17 to 19 GB/s; bfloat16
    packed takes 0.6 times as long as plain. The packed tensor has no plain storage (it is not a buffer); a copy
    unpacks and packs again."""

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype):
        super().__init__()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.to(dtype), 1)  # tuned for 1 row
        self.out_features, self.dtype = weight.shape[0], dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")

    def __deepcopy__(self, memo: dict) -> "PackedLinear":
        return PackedLinear(self.packed.to_dense(), self.dtype)


def _packs(weight: torch.Tensor, dtype: torch.dtype) -> bool:
    """oneDNN can pack this matrix in ``dtype``: a CPU tensor, a torch built with oneDNN (mkldnn) and its private
    ops, and for bfloat16 a processor oneDNN runs bfloat16 on (:func:`bf16_fallback_reason` is None)."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bf16_fallback_reason() is None
    return all(hasattr(torch.ops.mkldnn, name) for name in ("_reorder_linear_weight", "_linear_pointwise"))


@functools.cache  # oneDNN reads its ISA limit once, when it starts: one answer per process (make_linear asks 211 times)
def bf16_fallback_reason() -> str | None:
    """Why BF16 weights multiply through torch's plain bfloat16 matmul rather than a packed oneDNN one, or None.

    oneDNN's bfloat16 matmul needs AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT: an AVX2-only processor (Intel's 12th to
    14th generation consumer chips, AMD before Zen 4), or oneDNN limited to AVX2 by ``ONEDNN_MAX_CPU_ISA``, has none,
    and packing raises there ("bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq").
    """
    if not torch.backends.mkldnn.is_available():
        return "this torch is built without oneDNN"
    if not all(hasattr(torch.ops.mkldnn, name) for name in ("_reorder_linear_weight", "_is_mkldnn_bf16_supported")):
        return f"torch {torch.__version__} has no packed oneDNN linear"
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return ("oneDNN has no bfloat16 matmul on this processor (it needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT; "
                "ONEDNN_MAX_CPU_ISA can limit it too)")
    return None


class Int8Linear(torch.nn.Module):
    """Weight-only INT8: codes ``[out, in]`` int8 and one scale per output row; ``y = (x q^T) * scale``.

    The kernel's fast path takes bfloat16 activations and scales (float32 ones run a scalar loop, about ten times
    slower here), so the scales are rounded to bfloat16 first and the codes chosen for the rounded scale.
    """

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        # core.quantization's symmetric grid per output channel (codes -127..127, scale = max|row| / 127, codes
        # rounded half to even from x * (1 / s)), written out here on int8 codes: its quantize() keeps int64 codes,
        # 8 bytes per weight, which takes seconds on the 135M weights (a test holds the two equal).
        weight = weight.float()
        scales = (weight.abs().amax(dim=1, keepdim=True) / 127).clamp_min(torch.finfo(torch.float32).eps)  # as core's rule
        scales = scales.to(torch.bfloat16)  # [out, 1]
        codes = torch.round(weight * (1.0 / scales.float())).clamp_(-127, 127)
        self.register_buffer("codes", codes.to(torch.int8).contiguous(), persistent=False)  # [out, in]
        self.register_buffer("scales", scales.reshape(-1).contiguous(), persistent=False)  # [out] bfloat16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # the kernel takes a matrix [tokens, in]
        return torch._weight_int8pack_mm(flat, self.codes, self.scales).reshape(*x.shape[:-1], -1)

    def dequantized(self) -> torch.Tensor:
        """The matrix these codes and scales stand for, float32 ``[out, in]``."""
        return self.codes.float() * self.scales.float()[:, None]


class Int4Linear(torch.nn.Module):
    """Weight-only INT4 per group of inputs: codes 0..15 packed two a byte, a scale and a zero per group."""

    def __init__(self, weight: torch.Tensor, group_size: int = INT4_GROUP_SIZE):
        super().__init__()
        out_features, in_features = weight.shape
        if in_features % group_size:
            raise ValueError(f"group_size must divide the input width {in_features}, got {group_size}")
        self.group_size = group_size
        # core.quantization's affine grid (MinMaxObserver's rule, minmax_qparams) per group of inputs: codes 0..15,
        # w ~ scale * (q - zero_point); the codes are written out here as in Int8Linear (no int64 copy).
        groups = weight.float().reshape(out_features, in_features // group_size, group_size)
        scales, zero_points = minmax_qparams(groups.amin(dim=-1), groups.amax(dim=-1), 0, 15)  # [out, in / group_size]
        codes = torch.clamp(torch.round(groups * (1.0 / scales[..., None])) + zero_points[..., None], 0, 15)
        # The kernel's convention is w = (q - 8) * scale + zero, so its "zero" is scale * (8 - zero_point).
        kernel_zeros = scales * (8 - zero_points)
        self.register_buffer("packed", torch._convert_weight_to_int4pack_for_cpu(
            codes.reshape(out_features, in_features).to(torch.int32).contiguous(), 1), persistent=False)
        # [in / group_size, out, 2]: (scale, zero) of each group, the layout the kernel reads
        self.register_buffer("scales_and_zeros", torch.stack([scales, kernel_zeros], dim=-1).transpose(0, 1)
                             .to(torch.bfloat16).contiguous(), persistent=False)  # bfloat16: the fast path
        self.out_features = out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        y = torch._weight_int4pack_mm_for_cpu(flat, self.packed, self.group_size, self.scales_and_zeros)
        return y.reshape(*x.shape[:-1], self.out_features)


def make_linear(weight: torch.Tensor, weights: str) -> torch.nn.Module:
    """The layer that multiplies by ``weight`` (``[out, in]``, as loaded) in the format ``weights``."""
    validation.choice("weights", weights, FORMATS)
    if weights in ("fp32", "bf16"):
        dtype = compute_dtype(weights)
        if _packs(weight, dtype):
            return PackedLinear(weight.detach(), dtype)
        return FloatLinear(weight.detach().to(dtype))  # FP32: the tensor given itself, no copy
    if weights == "int8":
        return Int8Linear(weight.detach())
    return Int4Linear(weight.detach())


def compute_dtype(weights: str) -> torch.dtype:
    """The dtype activations flow in: float32 with FP32 weights, bfloat16 with the others (the INT8 and INT4
    kernels' fast paths take bfloat16 activations; float32 ones run a scalar loop, about ten times slower here)."""
    return torch.float32 if weights == "fp32" else torch.bfloat16


def weight_bytes(module: torch.nn.Module) -> int:
    """Bytes of every tensor a module holds, each counted once (a tied matrix once): what a decode step reads.

    >>> weight_bytes(FloatLinear(torch.zeros(3, 4)))  # 12 float32 values
    48
    """
    seen: dict[int, int] = {}
    for tensor in list(module.buffers()) + list(module.parameters()):
        seen[tensor.data_ptr()] = tensor.numel() * tensor.element_size()
    packed = sum(m.packed.numel() * m.packed.element_size() for m in module.modules() if isinstance(m, PackedLinear))
    return sum(seen.values()) + packed
