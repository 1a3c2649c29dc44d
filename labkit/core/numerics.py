"""Floating-point formats from their bits: range, spacing, and what rounding into a format does.

A binary float with ``e`` exponent bits and ``m`` mantissa bits stores ``(-1)^s x 1.f x 2^(E - bias)`` for
normal numbers (``bias = 2^(e-1) - 1``) and ``0.f x 2^(1 - bias)`` for subnormals. Everything below is derived
from ``(e, m)`` and one rule about the top exponent; nothing is typed from a table, and the tests compare every
number with ``torch.finfo``. The formats: FP32, FP16, BF16 (FP32's exponent, 7 mantissa bits), and the two FP8
formats of Micikevicius et al. 2022, "FP8 Formats for Deep Learning": E5M2 (IEEE-like, with inf and NaN) and
E4M3 (torch's ``float8_e4m3fn``: no inf, only the all-ones pattern is NaN, so the top binade is usable up to 448).

Used by lab 03 (the spacing table, what FP16 loses, summing in low precision, FP8 ranges). Left out: decimal
formats, FP4/MX block formats, stochastic rounding and the rounding modes other than round-to-nearest-even.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from labkit.core.validation import choice, fail, instance

__all__ = ["FloatFormat", "FORMATS", "float_format", "spacing", "round_to_format", "sequential_sum", "format_table",
           "round_trip_checkpoint"]


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format; the numbers are properties derived from the bit counts."""

    name: str  # "fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"
    dtype: torch.dtype  # torch's dtype for it
    exponent_bits: int
    mantissa_bits: int  # stored fraction bits (the leading 1 of a normal number is implicit)
    ieee_top: bool = True  # True: the top exponent is inf/NaN (IEEE); False: E4M3fn, only S.1111.111 is NaN

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def max_exponent(self) -> int:
        """Unbiased exponent of the largest finite binade."""
        top_field = 2**self.exponent_bits - 1  # all ones
        return (top_field - 1 if self.ieee_top else top_field) - self.bias

    @property
    def max(self) -> float:
        """Largest finite value: all-ones mantissa in the top binade (E4M3fn gives one pattern up to NaN)."""
        largest_fraction = 2 ** self.mantissa_bits - (1 if self.ieee_top else 2)
        return math.ldexp(1 + largest_fraction / 2**self.mantissa_bits, self.max_exponent)

    @property
    def smallest_normal(self) -> float:
        return math.ldexp(1.0, 1 - self.bias)

    @property
    def smallest_subnormal(self) -> float:
        return math.ldexp(1.0, 1 - self.bias - self.mantissa_bits)

    @property
    def eps(self) -> float:
        """Machine epsilon: the gap between 1 and the next larger value, 2^-mantissa_bits."""
        return math.ldexp(1.0, -self.mantissa_bits)

    @property
    def has_inf(self) -> bool:
        return self.ieee_top


FORMATS = {
    "fp32": FloatFormat("fp32", torch.float32, 8, 23),
    "fp16": FloatFormat("fp16", torch.float16, 5, 10),
    "bf16": FloatFormat("bf16", torch.bfloat16, 8, 7),
    "fp8_e4m3": FloatFormat("fp8_e4m3", torch.float8_e4m3fn, 4, 3, ieee_top=False),
    "fp8_e5m2": FloatFormat("fp8_e5m2", torch.float8_e5m2, 5, 2),
}


def float_format(fmt: Any) -> FloatFormat:
    """A format by name (case-insensitive) or a FloatFormat itself.

    >>> f = float_format("FP16")
    >>> f.bits, f.bias, f.max, f.eps
    (16, 15, 65504.0, 0.0009765625)
    >>> float_format("fp8_e4m3").max
    448.0
    """
    if isinstance(fmt, FloatFormat):
        return fmt
    if not isinstance(fmt, str) or fmt.lower() not in FORMATS:
        choice("fmt", fmt, list(FORMATS))
    return FORMATS[fmt.lower()]


def spacing(x: Any, fmt: Any) -> Any:
    """The gap between |x| and the next larger-magnitude value of the format (numpy.spacing's rule for x itself).

    In the binade [2^k, 2^(k+1)) the gap is 2^(k - mantissa_bits); below the smallest normal every gap is the
    smallest subnormal. x need not be representable: the gap of the binade it falls in. A float in, a float
    out; a tensor in, a float64 tensor out.

    >>> [spacing(1.0, f) for f in ("fp32", "fp16", "bf16")] == [2**-23, 2**-10, 2**-7]
    True
    >>> spacing(1000.0, "fp16"), spacing(0.0, "fp16") == 2**-24
    (0.5, True)
    """
    f = float_format(fmt)
    values = x.double() if isinstance(x, torch.Tensor) else torch.tensor(float(_real_or_tensor(x)), dtype=torch.float64)
    if not bool(torch.isfinite(values).all()):
        raise fail(ValueError, "x", "finite", x)
    exponent = torch.floor(torch.log2(values.abs().clamp_min(f.smallest_normal)))  # binade of |x|
    gaps = torch.pow(2.0, exponent - f.mantissa_bits)
    return gaps if isinstance(x, torch.Tensor) else float(gaps)


def _real_or_tensor(x: Any) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise fail(TypeError, "x", "a real number or a tensor", x)
    return x


def round_to_format(x: torch.Tensor, fmt: Any) -> torch.Tensor:
    """Round a tensor into a format (nearest, ties to even) and back to its own dtype: what storing it loses.

    A float64 tensor reaches the 16- and 8-bit formats through float32 (torch's cast rounds twice), so a value
    within float32's spacing of a halfway point between two codes can round the other way than a single rounding
    would: ``1 + 2**-11 + 2**-30`` becomes 1.0 in FP16, not its nearest code ``1 + 2**-10``. A float32 tensor is
    rounded once.

    Overflow: FP16/BF16/E5M2 give inf; E4M3fn has no inf, and torch's cast saturates to +-448 in the pinned torch
    (2.13, measured here); older releases that ``torch>=2.1`` allows return NaN from 480 up instead.

    >>> round_to_format(torch.tensor([1.0 + 2**-11, 1.0 + 3 * 2**-11, 70000.0]), "fp16").tolist()
    [1.0, 1.001953125, inf]
    """
    instance("x", x, torch.Tensor, "a torch.Tensor")
    return x.to(float_format(fmt).dtype).to(x.dtype)


def sequential_sum(values: torch.Tensor, fmt: Any) -> float:
    """Add values one by one, each partial sum rounded into fmt (a naive loop's accumulator in that format).

    Once the sum's spacing exceeds twice an addend, adding it changes nothing: FP16 stops at 2048 for +1s.

    >>> sequential_sum(torch.ones(3000), "fp16")
    2048.0
    """
    instance("values", values, torch.Tensor, "a torch.Tensor")
    dtype = float_format(fmt).dtype
    total = torch.zeros((), dtype=dtype)
    for value in values.reshape(-1).to(dtype):
        total = (total.float() + value.float()).to(dtype)  # exact in float32 for fp16/bf16/fp8 operands
    return float(total)


def format_table() -> list[dict[str, Any]]:
    """One row per format: bits, exponent/mantissa bits, bias, max, smallest normal/subnormal, eps, inf or not.

    >>> [row["name"] for row in format_table()]
    ['fp32', 'fp16', 'bf16', 'fp8_e4m3', 'fp8_e5m2']
    """
    return [dict(name=f.name, bits=f.bits, exponent_bits=f.exponent_bits, mantissa_bits=f.mantissa_bits,
                 bias=f.bias, max=f.max, smallest_normal=f.smallest_normal,
                 smallest_subnormal=f.smallest_subnormal, eps=f.eps, has_inf=f.has_inf) for f in FORMATS.values()]


# Lab 03's round-trip example: a fine-tuning run whose weights are saved in FP16 and loaded back into FP32.
N_FROM_FP16, N_TUNED, WEIGHT_STD, CHECKPOINT_SEED = 400, 600, 0.02, 3


def round_trip_checkpoint() -> tuple[torch.Tensor, torch.Tensor]:
    """Lab 03's FP32 checkpoint, from a fixed random seed: (400 weights copied from an FP16 release, 600
    fine-tuned in FP32).

    Both parts are drawn from N(0, 0.02^2), a typical weight scale; the copied ones are rounded to FP16 first.

    >>> copied, tuned = round_trip_checkpoint()
    >>> copied.dtype, tuned.dtype, copied.numel() + tuned.numel()
    (torch.float32, torch.float32, 1000)
    """
    generator = torch.Generator().manual_seed(CHECKPOINT_SEED)
    copied = round_to_format(torch.randn(N_FROM_FP16, generator=generator) * WEIGHT_STD, "fp16")
    tuned = torch.randn(N_TUNED, generator=generator) * WEIGHT_STD
    return copied, tuned
