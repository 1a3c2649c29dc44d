"""Integer quantization: codes, scales and zero points, fake quantization, and the error it leaves.

The two mappings (eq. 8.4 and 8.5 of the course's chapter on inference):
``q = clip(round(x / s) + z, q_min, q_max)`` and
``x_hat = s (q - z)``. Rounding is half to even (``torch.round``), and ``x / s`` is computed as
``x * (1 / s)``, as torch's quantize kernels do, so codes agree with ``torch.fake_quantize_per_*_affine`` bit for bit.

* ``symmetric``: z = 0, s = max|x| / (2^(bits-1) - 1), codes in [-(2^(bits-1) - 1), 2^(bits-1) - 1]. The code
  -2^(bits-1) (-128 for INT8) is left out on purpose: with this scale no in-range value rounds to it, and using it
  would make the grid lopsided (the "restricted range" of LLM.int8() and TensorRT).
* ``affine``: PyTorch's MinMaxObserver rule on codes [0, 2^bits - 1]: the range is widened to include 0, then
  s = (x_max - x_min) / (q_max - q_min) and z = q_min - round(x_min / s), clamped into the code range.

Granularity: ``"tensor"`` (one scale), ``"channel"`` (one scale per index along ``axis``; axis 0 of a weight
``[out, in]`` is per output channel, axis 0 of activations ``[tokens, channels]`` is per token) and ``"group"``
(consecutive runs of ``group_size`` values along the last dimension, the row a matmul reads).

Error measures: relative error, SQNR (whole tensor and per token). Layer 1 (core), pure math, no model. The schemes
that cope with activation outliers (per token, LLM.int8(), SmoothQuant) are ``labkit.core.outlier_schemes``; GPTQ
and its round-to-nearest baseline ``labkit.core.gptq``. Used by labs 03 and 04. Left out: packing codes into bytes
(counted, not packed), AWQ's scale search, FP8 scaling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from labkit.core.validation import choice, fail, instance, integer

SCHEMES = ("symmetric", "affine")
GRANULARITIES = ("tensor", "channel", "group")


def code_range(bits: int, scheme: str) -> tuple[int, int]:
    """(q_min, q_max) of a scheme.

    >>> code_range(8, "symmetric"), code_range(8, "affine"), code_range(4, "symmetric")
    ((-127, 127), (0, 255), (-7, 7))
    """
    bits = integer("bits", bits, min=2, max=16)
    if scheme not in SCHEMES:
        choice("scheme", scheme, SCHEMES)
    if scheme == "symmetric":
        return -(2 ** (bits - 1) - 1), 2 ** (bits - 1) - 1
    return 0, 2**bits - 1


def minmax_qparams(x_min: torch.Tensor, x_max: torch.Tensor, q_min: int, q_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    """MinMaxObserver's affine rule: (scale, zero_point) from observed minima and maxima (any matching shapes).

    The calibration example of the course's chapter on inference (its Table 8.7): values in [-2, 5] on codes
    0..7 give s = 1, z = 2.

    >>> minmax_qparams(torch.tensor(-2.0), torch.tensor(5.0), 0, 7)
    (tensor(1.), tensor(2))
    """
    low, high = torch.clamp(x_min, max=0), torch.clamp(x_max, min=0)  # the range always contains 0
    eps = torch.finfo(low.dtype).eps
    scale = torch.clamp((high - low) / (q_max - q_min), min=eps)
    zero_point = torch.clamp(q_min - torch.round(low / scale), q_min, q_max).to(torch.int64)
    return scale, zero_point


def _symmetric_scale(absmax: torch.Tensor, q_max: int) -> torch.Tensor:
    return torch.clamp(absmax / q_max, min=torch.finfo(absmax.dtype).eps)


@dataclass(frozen=True)
class QuantizedTensor:
    """Integer codes with the scales and zero points that map them back, as stored.

    ``codes`` has the input's shape. ``scales`` and ``zero_points`` broadcast against the codes' *grouped*
    view: ``[]`` per tensor; the input's shape with 1 except along ``axis`` per channel; and
    ``[*shape[:-1], n_groups, 1]`` against codes viewed as ``[*shape[:-1], n_groups, group_size]`` per group.
    """

    codes: torch.Tensor  # int64, the input's shape
    scales: torch.Tensor  # floating, the input's dtype
    zero_points: torch.Tensor  # int64, the scales' shape (all 0 when symmetric)
    bits: int
    scheme: str
    granularity: str
    group_size: int | None = None
    axis: int | None = None

    def _grouped(self, values: torch.Tensor) -> torch.Tensor:
        if self.granularity != "group":
            return values
        return values.reshape(*values.shape[:-1], -1, self.group_size)

    def dequantize(self) -> torch.Tensor:
        """x_hat = s (q - z), in the scales' dtype, with the input's shape (eq. 8.5)."""
        grouped = self._grouped(self.codes)
        values = (grouped - self.zero_points).to(self.scales.dtype) * self.scales
        return values.reshape(self.codes.shape)

    @property
    def n_scales(self) -> int:
        return self.scales.numel()

    def stored_bytes(self, scale_bytes: int = 2, zero_point_bytes: int = 2) -> int:
        """Bytes of the packed codes (bits each, rounded up once) plus one scale per group, plus zero points
        when the scheme is affine (memory.stored_bytes' count with scale_bytes + zero_point_bytes per group).

        >>> quantize(torch.ones(4, 64), 4, granularity="group", group_size=32).stored_bytes()  # 128 B + 8 x 2 B
        144
        """
        scale_bytes = integer("scale_bytes", scale_bytes, min=0)
        zero_point_bytes = integer("zero_point_bytes", zero_point_bytes, min=0)
        per_scale = scale_bytes + (zero_point_bytes if self.scheme == "affine" else 0)
        return -(-self.codes.numel() * self.bits // 8) + self.n_scales * per_scale


def _check_input(x: Any) -> torch.Tensor:
    instance("x", x, torch.Tensor, "a floating torch.Tensor")
    if not x.is_floating_point():
        raise fail(TypeError, "x", "a floating torch.Tensor", x)
    if x.numel() == 0:
        raise fail(ValueError, "x", "a non-empty tensor", x)
    return x


def _check_finite(x: torch.Tensor, *reductions: torch.Tensor) -> None:
    # max and min propagate NaN and inf, so checking the (small) reductions checks every element of x.
    if not all(bool(torch.isfinite(r).all()) for r in reductions):
        raise fail(ValueError, "x", "finite everywhere (no inf or NaN)", x)


def _check_group_size(x: torch.Tensor, group_size: Any) -> int:
    if group_size is None:
        raise fail(ValueError, "group_size", "an int >= 1 when granularity is 'group'", group_size)
    group_size = integer("group_size", group_size, min=1)
    row = x.shape[-1] if x.ndim else 1
    if x.ndim == 0 or row % group_size:
        raise fail(ValueError, "group_size", f"a divisor of the row length {row} (the last dimension)", group_size)
    return group_size


def quantize(x: torch.Tensor, bits: int = 8, scheme: str = "symmetric", granularity: str = "tensor",
             group_size: int | None = None, axis: int = 0) -> QuantizedTensor:
    """Quantize a float tensor: codes, scales and zero points (eq. 8.4), returned as a QuantizedTensor.

    ``axis`` is used by ``granularity="channel"`` only: the dimension whose every index gets its own scale.

    >>> q = quantize(torch.tensor([-1.5, 0.5, 3.0]), bits=3)  # symmetric: s = 3 / 3, codes in [-3, 3]
    >>> q.scales.item(), q.codes.tolist()  # halves round to even: -1.5 -> -2, 0.5 -> 0
    (1.0, [-2, 0, 3])
    >>> quantize(torch.zeros(2, 576), 4, granularity="group", group_size=128)
    Traceback (most recent call last):
    ...
    ValueError: group_size must be a divisor of the row length 576 (the last dimension), got 128
    """
    x = _check_input(x)
    view, scales, zero_points, q_min, q_max, group_size, axis = _qparams(x, bits, scheme, granularity, group_size, axis)
    codes = _codes(view, scales, zero_points, q_min, q_max).reshape(x.shape)
    return QuantizedTensor(codes, scales, zero_points, bits, scheme, granularity,
                           group_size if granularity == "group" else None, axis if granularity == "channel" else None)


def _qparams(x: torch.Tensor, bits: int, scheme: str, granularity: str, group_size: Any, axis: Any):
    """(grouped view of x, scales, zero points, q_min, q_max, group_size, axis), arguments validated."""
    q_min, q_max = code_range(bits, scheme)
    if granularity not in GRANULARITIES:
        choice("granularity", granularity, GRANULARITIES)
    if granularity != "group" and group_size is not None:
        raise fail(ValueError, "group_size", f"None unless granularity is 'group' (it is {granularity!r})", group_size)
    if granularity == "tensor":
        view, reduce = x, None
    elif granularity == "channel":
        axis = integer("axis", axis, min=-max(x.ndim, 1), max=max(x.ndim, 1) - 1)
        axis = axis % x.ndim if x.ndim else 0
        view, reduce = x, tuple(d for d in range(x.ndim) if d != axis)
    else:
        group_size = _check_group_size(x, group_size)
        view, reduce = x.reshape(*x.shape[:-1], -1, group_size), (-1,)

    def amax(t: torch.Tensor) -> torch.Tensor:
        return t.amax() if reduce is None else t.amax(dim=reduce, keepdim=True)

    def amin(t: torch.Tensor) -> torch.Tensor:
        return t.amin() if reduce is None else t.amin(dim=reduce, keepdim=True)

    if scheme == "symmetric":
        absmax = amax(view.abs())
        _check_finite(x, absmax)
        scales = _symmetric_scale(absmax, q_max)
        zero_points = torch.zeros(scales.shape, dtype=torch.int64)
    else:
        low, high = amin(view), amax(view)
        _check_finite(x, low, high)
        scales, zero_points = minmax_qparams(low, high, q_min, q_max)
    return view, scales, zero_points, q_min, q_max, group_size, axis


def _codes(x: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor, q_min: int, q_max: int) -> torch.Tensor:
    # Multiply by the reciprocal like torch's kernels (x / s can differ from x * (1/s) in the last bit).
    return torch.clamp(torch.round(x * (1.0 / scales)) + zero_points, q_min, q_max).to(torch.int64)


def fake_quantize(x: torch.Tensor, bits: int = 8, scheme: str = "symmetric", granularity: str = "tensor",
                  group_size: int | None = None, axis: int = 0) -> torch.Tensor:
    """Quantize then dequantize: the values a quantized model computes with, in x's dtype and shape.

    >>> fake_quantize(torch.tensor([-2.0, -0.6, 0.0, 1.4, 5.0]), bits=3, scheme="affine").tolist()
    [-2.0, -1.0, 0.0, 1.0, 5.0]
    """
    x = _check_input(x)
    view, scales, zero_points, q_min, q_max, _, _ = _qparams(x, bits, scheme, granularity, group_size, axis)
    # The same arithmetic as quantize(...).dequantize() without int64 codes: integers below 2^24 are exact in
    # float32, so the result is identical (a test says so) and about twice as fast on a model's weights.
    zeros = zero_points.to(view.dtype)
    values = torch.round(view * (1.0 / scales))
    values.add_(zeros).clamp_(q_min, q_max).sub_(zeros).mul_(scales)
    return values.reshape(x.shape)


def quantize_with(x: torch.Tensor, scale: Any, zero_point: Any, q_min: int, q_max: int) -> torch.Tensor:
    """Codes of x with a scale and zero point held fixed (calibrated earlier): values outside the range clip.

    That example's last row (the chapter's Table 8.7): 12 with s = 1, z = 2 on codes 0..7 rounds to 14 and clips to 7.

    >>> quantize_with(torch.tensor([-0.6, 1.4, 12.0]), 1.0, 2, 0, 7).tolist()
    [1, 3, 7]
    """
    x = _check_input(x)
    scale = torch.as_tensor(scale, dtype=x.dtype)
    return _codes(x, scale, torch.as_tensor(zero_point, dtype=torch.int64), q_min, q_max)


def ste_fake_quantize(x: torch.Tensor, scale: float, zero_point: int, q_min: int, q_max: int) -> torch.Tensor:
    """Fake quantization whose gradient is the clipped straight-through estimator (the chapter's eq. 8.6).

    Forward: s (clip(round(x/s) + z) - z). Backward: 1 where x lies in [s (q_min - z), s (q_max - z)], else 0
    (the clamp's own derivative; rounding is skipped by ``detach``).

    >>> x = torch.tensor([-3.0, 0.4, 9.0], requires_grad=True)
    >>> ste_fake_quantize(x, 1.0, 2, 0, 7).sum().backward()
    >>> x.grad.tolist()
    [0.0, 1.0, 0.0]
    """
    low, high = scale * (q_min - zero_point), scale * (q_max - zero_point)
    inside = torch.clamp(x, low, high)  # derivative 1 inside the representable interval, 0 outside
    rounded = (torch.clamp(torch.round(x.detach() / scale) + zero_point, q_min, q_max) - zero_point) * scale
    return inside + (rounded - inside).detach()


# ----------------------------------------------------------------------------------------------------------------
# Error measures


def relative_error(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """||x - x_hat|| / ||x|| (Frobenius), in float64.

    >>> relative_error(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 3.0]))
    0.2
    """
    x64 = x.double()
    return float(torch.linalg.norm(x64 - x_hat.double()) / torch.linalg.norm(x64))


def sqnr_db(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB: 10 log10(sum x^2 / sum (x - x_hat)^2); inf when exact.

    >>> sqnr_db(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 3.0]))  # 25 / 1
    13.979400086720377
    """
    noise = float(((x.double() - x_hat.double()) ** 2).sum())
    return math.inf if noise == 0 else 10 * math.log10(float((x.double() ** 2).sum()) / noise)


def token_sqnr_db(x: torch.Tensor, x_hat: torch.Tensor) -> torch.Tensor:
    """SQNR in dB of each token (row) of activations ``[tokens, channels]``: float64 ``[tokens]``, inf where exact.

    One number for a whole tensor hides what a massive activation does: its own energy dominates the sum, so a
    per-tensor scale that rounds every other token to zero still scores well. Per token, those tokens score 0 dB.

    >>> token_sqnr_db(torch.tensor([[3.0, 4.0], [1.0, 0.0]]), torch.tensor([[3.0, 3.0], [1.0, 0.0]])).tolist()
    [13.979400086720377, inf]
    """
    x64, noise = x.double(), (x.double() - x_hat.double()) ** 2
    return 10 * torch.log10((x64 ** 2).sum(dim=-1) / noise.sum(dim=-1))
