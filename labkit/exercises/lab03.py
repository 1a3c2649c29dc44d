"""Lab 03's exercises: what an FP16 checkpoint loaded into FP32 gives back (a prediction), symmetric
per-channel fake quantization, and affine quantization by MinMaxObserver's rule.

Both quantizers meet an all-zero row or tensor: its scale would be 0 and 0 / 0 is NaN, where labkit's reference
(a scale clamped to float32's eps) returns 0. A hand case covers it, and a mistake names the division.

Each exercise's task text in ``notebooks/solutions/03_number_formats.ipynb`` states the rules used here.
"""

from __future__ import annotations

import torch

from labkit.core.numerics import N_FROM_FP16, N_TUNED, round_to_format, round_trip_checkpoint
from labkit.core.quantization import fake_quantize
from labkit.exercises import register
from labkit.exercises.definitions import Case, CodeExercise, Mistake, prediction


def _random_matrix(generator: torch.Generator) -> torch.Tensor:
    rows = int(torch.randint(1, 6, (1,), generator=generator))
    cols = int(torch.randint(2, 40, (1,), generator=generator))
    x = torch.randn(rows, cols, generator=generator) * float(torch.rand(1, generator=generator) * 10 + 0.01)
    if torch.rand(1, generator=generator) < 0.5:  # one row much larger than the others: per-tensor scales fail
        x[0] *= 50
    if torch.rand(1, generator=generator) < 0.3:  # a non-negative row (ReLU-like), which an affine grid must handle
        x[-1] = x[-1].abs()
    return x


def _zero_row_case(generator: torch.Generator) -> torch.Tensor:
    """A random matrix; one time in five, one of its rows (a pruned output channel) is all zeros."""
    x = _random_matrix(generator)
    if x.shape[0] > 1 and torch.rand(1, generator=generator) < 0.2:
        x[int(torch.randint(0, x.shape[0], (1,), generator=generator))] = 0.0
    return x


# --------------------------------------------------------------------------------------------------------------
# 03.predict_fp16_round_trip: does loading an FP16 checkpoint into FP32 give back what was lost? Answered before
# the notebook shows it

def weights_back_exactly() -> float:
    """How many of the checkpoint's 1,000 weights equal their FP32 value after saving in FP16 and loading into FP32."""
    weights = torch.cat(round_trip_checkpoint())
    return float((round_to_format(weights, "fp16") == weights).sum())


PREDICT_ROUND_TRIP = register(prediction(
    "03.predict_fp16_round_trip", "Predict: the weights an FP16 checkpoint gives back exactly in FP32",
    "predicted_exact_weights", weights_back_exactly, atol=5,
    asked=f"{N_FROM_FP16 + N_TUNED:,} FP32 weights, {N_TUNED / (N_FROM_FP16 + N_TUNED):.0%} of them fine-tuned in FP32 "
          "and the rest copied from an FP16 release, saved in FP16, loaded into FP32 (within 5)",
    hint="return a number of weights (of 1,000), such as 250",
    reveal="""FP32 gives back only what FP16 kept. The 400 copied weights were on FP16's grid already, so saving
    lost nothing and they return bit for bit. Each fine-tuned weight was rounded to its nearest FP16 value when
    saved (a relative change of at most half FP16's spacing, 2^-11, in FP16's normal range), and FP32 then holds
    that rounded value exactly: it has 13 more mantissa bits and nothing to put in them. A fine-tuned weight
    survives only if those 13 bits happen to be all zero, a chance of about 2^-13 each.

    The other direction is exact: every finite FP16 value widens to FP32 and narrows back unchanged. The next cells
    count the weights, try every FP16 value, and show what rounding to FP16 does to a few familiar numbers.""",
    giveaways=("already on FP16's grid", "on FP16's grid already", "only what FP16 kept", "nothing to put in them",
               "return bit for bit", "400 copied", "400 of", "happen to be all zero")))


# --------------------------------------------------------------------------------------------------------------
# 03.fake_quantize_per_channel: symmetric, one scale per output row


def fake_quantize_per_channel(weight: torch.Tensor, bits: int) -> torch.Tensor:
    """The reference: symmetric, s_row = max|row| / (2^(bits-1) - 1), round half to even, clip, dequantize."""
    return fake_quantize(weight, bits, "symmetric", "channel", axis=0)


def _per_channel_case(generator: torch.Generator) -> Case:
    bits = int(torch.randint(2, 9, (1,), generator=generator))
    return Case((_zero_row_case(generator), bits), label=f"a random [rows, cols] weight, bits = {bits}")


def _scale(weight, bits, q_max):
    return weight.abs().amax(dim=1, keepdim=True) / q_max


def _per_tensor(weight, bits):
    q_max = 2 ** (bits - 1) - 1
    s = weight.abs().max() / q_max
    return torch.clamp(torch.round(weight / s), -q_max, q_max) * s


def _uses_128(weight, bits):
    q_max = 2 ** (bits - 1)
    s = _scale(weight, bits, q_max)
    return torch.clamp(torch.round(weight / s), -q_max, q_max - 1) * s


def _floor(weight, bits):
    q_max = 2 ** (bits - 1) - 1
    s = _scale(weight, bits, q_max)
    return torch.clamp(torch.floor(weight / s), -q_max, q_max) * s


def _codes_not_dequantized(weight, bits):
    q_max = 2 ** (bits - 1) - 1
    return torch.clamp(torch.round(weight / _scale(weight, bits, q_max)), -q_max, q_max)


def _per_column(weight, bits):
    return fake_quantize(weight, bits, "symmetric", "channel", axis=1)


def _zero_scale_rows(weight, bits):
    q_max = 2 ** (bits - 1) - 1
    s = _scale(weight, bits, q_max)  # 0 for an all-zero row: 0 / 0 is NaN
    return torch.clamp(torch.round(weight / s), -q_max, q_max) * s


ZERO_SCALE_HINT = ("an all-zero row has max|row| = 0, so its scale is 0 and 0 / 0 gives NaN: a row of zeros must "
                   "come back as zeros; give such a row any positive scale (e.g. torch.where(scale == 0, 1, scale), "
                   "or clamp the scale to a tiny minimum) so that its codes are 0")


PER_CHANNEL = register(
    CodeExercise(
        id="03.fake_quantize_per_channel",
        title="Symmetric per-channel quantize, then dequantize",
        function="fake_quantize_per_channel",
        reference=fake_quantize_per_channel,
        points=2,
        rtol=1e-5,
        atol=1e-6,
        hand_cases=(
            Case((torch.tensor([[-1.5, 0.5, 3.0]]), 3), label="s = 3/3 = 1: -1.5 -> -2 and 0.5 -> 0 (half to even)"),
            Case((torch.tensor([[1.27, -0.64], [0.03, 0.02]]), 8),
                 label="two rows, two scales: 1.27/127 and 0.03/127"),
            Case((torch.tensor([[100.0, 1.0, -2.0], [0.3, -0.2, 0.1]]), 4),
                 label="a large row must not flatten a small one"),
            Case((torch.tensor([[0.0, 0.0, 0.0], [2.0, -0.5, 1.0]]), 8),
                 label="an all-zero row (a pruned channel) comes back as zeros, not NaN; s = 2/127 for the other"),
        ),
        random_case=_per_channel_case,
        hints=("one scale per row: s = max|row| / (2^(bits-1) - 1); q = clamp(round(w / s), -q_max, q_max); "
               "return q * s",),
        mistakes=(  # the zero-scale mistake first: it is right everywhere else, so it matches only NaN rows
            Mistake(ZERO_SCALE_HINT, _zero_scale_rows),
            Mistake("one scale per ROW (output channel): take the max over dim=1 with keepdim=True, not over the "
                    "whole tensor", _per_tensor),
            Mistake("the largest code is 2^(bits-1) - 1 (127 for INT8), not 2^(bits-1) (128): with 128 the row's "
                    "maximum maps to a code that does not exist", _uses_128),
            Mistake("round to the nearest code (torch.round), not down (floor): flooring biases every value "
                    "towards -inf", _floor),
            Mistake("return the dequantized values q * s, not the integer codes", _codes_not_dequantized),
            Mistake("the channels are the rows of weight [out, in]: reduce over dim=1", _per_column),
        ),
        forbidden=(torch.fake_quantize_per_channel_affine, torch.fake_quantize_per_tensor_affine),
    )
)


# --------------------------------------------------------------------------------------------------------------
# 03.affine_fake_quantize: MinMaxObserver's rule, per tensor, codes 0 .. 2^bits - 1


def affine_fake_quantize(x: torch.Tensor, bits: int) -> torch.Tensor:
    """The reference: s = (max - min) / (2^bits - 1) over a range widened to include 0,
    z = clamp(0 - round(min / s)), q = clamp(round(x / s) + z, 0, 2^bits - 1), x_hat = s (q - z)."""
    return fake_quantize(x, bits, "affine", "tensor")


TIE_MARGIN = 1e-3  # in codes: how near a rounding boundary a random case's x / s may come


def _near_a_tie(x: torch.Tensor, bits: int) -> bool:
    """Whether some x / s (or the range's low end / s, which sets z) lies within TIE_MARGIN of a half code.

    There the code depends on how x / s is computed (``x / s`` or ``x * (1 / s)``, as torch's own kernels do, round
    the last bit differently), so two right answers could differ by one whole step. Random cases avoid such
    inputs (about 1 in 100,000 values drawn; one check in about 4,600 met one): a verdict must not hang on a bit.
    """
    wide = x.double()
    low, high = wide.min().clamp(max=0), wide.max().clamp(min=0)
    if high == low:
        return False
    scaled = torch.cat([wide.flatten(), low.reshape(1)]) / ((high - low) / (2**bits - 1))
    return bool(((scaled - scaled.floor() - 0.5).abs() < TIE_MARGIN).any())


def _affine_case(generator: torch.Generator) -> Case:
    for _ in range(1000):
        bits = int(torch.randint(2, 9, (1,), generator=generator))
        x = _random_matrix(generator) + float(torch.randn(1, generator=generator) * 3)
        if not _near_a_tie(x, bits):
            break
    return Case((x, bits), label=f"a random tensor, bits = {bits}")


def _affine_parts(x, bits, include_zero=True):
    q_max = 2**bits - 1
    low, high = (x.min().clamp(max=0), x.max().clamp(min=0)) if include_zero else (x.min(), x.max())
    s = (high - low) / q_max
    z = torch.clamp(-torch.round(low / s), 0, q_max)
    return s, z, q_max


def _forgets_zero_point(x, bits):
    s, z, q_max = _affine_parts(x, bits)
    return torch.clamp(torch.round(x / s) + z, 0, q_max) * s


def _range_without_zero(x, bits):
    s, z, q_max = _affine_parts(x, bits, include_zero=False)
    return (torch.clamp(torch.round(x / s) + z, 0, q_max) - z) * s


def _unrounded_zero_point(x, bits):
    s, _, q_max = _affine_parts(x, bits)
    z = -x.min().clamp(max=0) / s
    return (torch.clamp(torch.round(x / s + z), 0, q_max) - z) * s


def _codes_to_2_pow_bits(x, bits):
    q_max = 2**bits
    low, high = x.min().clamp(max=0), x.max().clamp(min=0)
    s = (high - low) / q_max
    z = torch.clamp(-torch.round(low / s), 0, q_max)
    return (torch.clamp(torch.round(x / s) + z, 0, q_max) - z) * s


def _centred_grid(x, bits):
    q_max = 2**bits - 1
    s = 2 * x.abs().max() / q_max  # [-max|x|, max|x|] on codes 0 .. q_max, zero point in the middle
    z = torch.tensor(float(2 ** (bits - 1)))
    return (torch.clamp(torch.round(x / s) + z, 0, q_max) - z) * s


def _zero_scale_tensor(x, bits):
    s, z, q_max = _affine_parts(x, bits)  # s = 0 for an all-zero tensor: 0 / 0 is NaN
    return (torch.clamp(torch.round(x / s) + z, 0, q_max) - z) * s


AFFINE = register(
    CodeExercise(
        id="03.affine_fake_quantize",
        title="Affine quantization with MinMaxObserver's rule",
        function="affine_fake_quantize",
        reference=affine_fake_quantize,
        points=2,
        rtol=1e-5,
        atol=1e-5,
        hand_cases=(
            Case((torch.tensor([-2.0, -0.6, 0.0, 1.4, 5.0]), 3),
                 label="the worked example: s = 1, z = 2 -> -2, -1, 0, 1, 5"),
            Case((torch.tensor([-2.0, -0.6, 0.0, 1.4, 5.0, 12.0]), 3),
                 label="the worked example recalibrated with 12: s = 2, z = 1 -> -2, 0, 0, 2, 4, 12"),
            Case((torch.tensor([1.0, 2.0, 3.0]), 8), label="all positive: the range still starts at 0 (z = 0)"),
            Case((torch.tensor([-3.0, -1.0]), 2), label="all negative: the range ends at 0 (z = 3)"),
            Case((torch.tensor([-0.4, 0.0, 1.0]), 2),
                 label="0 comes back as exactly 0: s = 1.4/3, z = round(0.4/s) = 1 -> -s, 0, 2s"),
            Case((torch.zeros(2, 3), 4), label="an all-zero tensor comes back as zeros, not NaN"),
        ),
        random_case=_affine_case,
        hints=("widen [min, max] to include 0; s = (max - min) / (2^bits - 1); z = -round(min / s) clamped to "
               "[0, 2^bits - 1]; q = clamp(round(x / s) + z, 0, 2^bits - 1); return s * (q - z)",),
        mistakes=(  # the zero-scale mistake first: it is right everywhere else, so it matches only NaN outputs
            Mistake("an all-zero tensor has the range [0, 0], so s = 0 and 0 / 0 gives NaN: it must come back as "
                    "zeros; give it any positive scale (e.g. clamp s to a tiny minimum) so that every code is z",
                    _zero_scale_tensor),
            Mistake("dequantize with the zero point: x_hat = s * (q - z), not s * q", _forgets_zero_point),
            Mistake("MinMaxObserver widens the range to include 0 (min(x_min, 0), max(x_max, 0)), so that 0 is "
                    "exactly representable", _range_without_zero),
            Mistake("the zero point is an integer code, z = -round(x_min / s), so that 0 is exactly on the grid; "
                    "offsetting by x_min itself (round((x - x_min) / s), then s * q + x_min) puts 0 between two "
                    "codes", _unrounded_zero_point),
            Mistake("bits give 2^bits codes, 0 .. 2^bits - 1: divide the range by 2^bits - 1", _codes_to_2_pow_bits),
            Mistake("the grid spans [min(x_min, 0), max(x_max, 0)], not [-max|x|, max|x|]: a grid centred on 0 "
                    "wastes the codes on the side that holds no values", _centred_grid),
        ),
        forbidden=(torch.fake_quantize_per_tensor_affine, torch.quantize_per_tensor),
    )
)


__all__ = ["AFFINE", "PER_CHANNEL", "PREDICT_ROUND_TRIP", "affine_fake_quantize", "fake_quantize_per_channel",
           "round_trip_checkpoint", "weights_back_exactly"]
