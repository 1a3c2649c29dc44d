"""labkit.runtime.weight_formats: each format's layer against the matrix it stands for, its codes against
core.quantization's grid, and the bytes it holds."""

import pytest
import torch

from labkit.core.quantization import fake_quantize, quantize_with
from labkit.runtime.weight_formats import (FORMATS, FloatLinear, Int4Linear, Int8Linear, compute_dtype, make_linear,
                                           weight_bytes)


@pytest.fixture(scope="module")
def weight():
    return torch.randn(96, 64, generator=torch.Generator().manual_seed(0))  # [out, in]


def test_int8_codes_are_core_quantizations_grid_at_the_stored_scale(weight):
    layer = Int8Linear(weight)
    assert layer.codes.dtype == torch.int8 and layer.scales.dtype == torch.bfloat16 and layer.scales.shape == (96,)
    scales = layer.scales.float()[:, None]
    assert torch.equal(layer.codes.long(), quantize_with(weight, scales, 0, -127, 127))
    # the stored scale is max|row| / 127 rounded to bfloat16 (relative spacing 2^-8)
    assert torch.allclose(scales[:, 0], weight.abs().amax(1) / 127, rtol=2 ** -8)


def test_int4_dequantizes_to_core_quantizations_affine_group_grid(weight):
    layer = Int4Linear(weight, group_size=32)
    assert layer.packed.dtype == torch.uint8 and layer.packed.numel() == weight.numel() // 2  # two codes a byte
    x = torch.eye(64, dtype=torch.bfloat16)  # multiplying the identity reads the matrix back: [in, out] = W^T
    read_back = layer(x).float().T
    expected = fake_quantize(weight, 4, "affine", "group", group_size=32)
    # the kernel holds scale and zero in bfloat16: within a few bfloat16 steps of the float32 grid
    assert (read_back - expected).abs().max() <= 4 * 2 ** -8 * weight.abs().max()


@pytest.mark.parametrize("weights", FORMATS)
def test_every_format_multiplies_like_the_matrix_it_stands_for(weight, weights):
    layer = make_linear(weight, weights)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1)).to(compute_dtype(weights))
    y = layer(x)
    assert y.shape == (3, 96) and y.dtype == compute_dtype(weights)
    exact = x.float() @ weight.T
    # FP32 to float32 rounding; the others to their grids: bf16 2^-8, INT8 half a step of 127, INT4 of 15
    step = {"fp32": 1e-6, "bf16": 2 ** -7, "int8": 2 ** -6, "int4": 2 ** -3}[weights]
    assert (y.float() - exact).abs().max() <= step * x.float().abs().sum(1).max() * weight.abs().max()


def test_bytes_held_per_format(weight):
    assert weight_bytes(FloatLinear(weight)) == 96 * 64 * 4
    assert weight_bytes(make_linear(weight, "bf16")) == 96 * 64 * 2
    assert weight_bytes(Int8Linear(weight)) == 96 * 64 + 96 * 2  # codes and one bfloat16 scale per row
    assert weight_bytes(Int4Linear(weight, 32)) == 96 * 64 // 2 + 96 * 2 * 2 * 2  # two scalars per group of 32
    shared = torch.nn.Module()
    shared.a, shared.b = FloatLinear(weight), FloatLinear(weight)
    assert weight_bytes(shared) == 96 * 64 * 4  # a tied matrix counts once
    with pytest.raises(ValueError, match="weights must be one of"):
        make_linear(weight, "fp8")
    with pytest.raises(ValueError, match="group_size must divide"):
        Int4Linear(weight, 48)
