"""labkit.runtime.weight_formats: each format's layer against the matrix it stands for, its codes against
core.quantization's grid, and the bytes it holds."""

import os
import platform
import subprocess
import sys

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


BF16_UNDER_AVX2 = """
import torch
from labkit.runtime.weight_formats import FloatLinear, bf16_fallback_reason, make_linear
weight = torch.randn(96, 64, generator=torch.Generator().manual_seed(0))
layer = make_linear(weight, "bf16")
x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1)).bfloat16()
error = (layer(x).float() - x.float() @ weight.T).abs().max().item()
print(type(layer).__name__, layer.weight.dtype, error <= 2 ** -7 * x.float().abs().sum(1).max().item() * 4.5)
print(bf16_fallback_reason())
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="ONEDNN_MAX_CPU_ISA=AVX2 names an x86 ISA")
def test_bf16_falls_back_to_the_plain_matmul_where_onednn_has_no_bfloat16_path():
    # What an AVX2-only laptop has: oneDNN refuses to pack bfloat16 ("bf16 path needs the cpu support avx_ne_convert
    # or avx512bw, avx512vl and avx512dq"). oneDNN reads the limit when it starts, so a fresh process sets it.
    run = subprocess.run([sys.executable, "-c", BF16_UNDER_AVX2], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert run.returncode == 0, run.stderr
    kind, reason = run.stdout.splitlines()
    assert kind == "FloatLinear torch.bfloat16 True"
    assert "AVX-512" in reason and "ONEDNN_MAX_CPU_ISA" in reason


def test_a_bf16_decoder_says_when_its_matmul_is_not_packed(embedded, monkeypatch, capsys):
    from labkit.runtime import llama
    from labkit.runtime import weight_formats

    reason = "oneDNN has no bfloat16 matmul on this processor"
    monkeypatch.setattr(weight_formats, "bf16_fallback_reason", lambda: reason)
    monkeypatch.setattr(llama, "bf16_fallback_reason", lambda: reason)
    plain = llama.decoder(embedded, "bf16")
    assert {type(layer) for layer in plain.model.modules() if "Linear" in type(layer).__name__} == {FloatLinear}
    assert plain.notes[-1].endswith(f"plain bfloat16 matmul, which repacks each matrix at every call: {reason}")
    assert capsys.readouterr().out == f"BF16: {plain.notes[-1]}.\n"
    monkeypatch.undo()
    packed = llama.decoder(embedded, "bf16")
    native = weight_formats.bf16_fallback_reason()
    assert (packed.notes[-1] == "labkit's Llama forward, bf16 weights") == (native is None)
    token_ids = torch.tensor([[1, 422, 1159, 314, 4053]])
    with torch.no_grad():
        plain_logits, packed_logits = (llama.run(lm.model, token_ids, None, "last", False)[0] for lm in (plain, packed))
    # two bfloat16 kernels (oneDNN's packed one, ATen's plain one) sum in other orders: logits within bfloat16's
    # relative step (2^-8) of the largest logit times the 30 layers it compounds over
    assert (plain_logits - packed_logits).abs().max() <= 30 * 2 ** -8 * packed_logits.abs().max()
