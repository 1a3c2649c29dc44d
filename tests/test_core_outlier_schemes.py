"""labkit.core.outlier_schemes: outlier channels, LLM.int8()'s decomposition, per-token scales, SmoothQuant."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from labkit.core.outlier_schemes import (
    fake_quantize_outliers_kept, int8_decomposed_matmul, outlier_channels, per_token_fake_quantize, smooth,
    smoothquant_scales,
)
from labkit.core.quantization import fake_quantize, relative_error


def _random(shape, seed, scale=1.0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator) * scale


# ----- SmoothQuant -----

@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(0, 1))
def test_smoothing_leaves_the_product_unchanged(seed, alpha):
    x, w = _random((5, 16), seed, 4.0), _random((7, 16), seed + 1)
    xs, ws, s = smooth(x.double(), w.double(), alpha)
    assert torch.allclose(xs @ ws.T, x.double() @ w.double().T, rtol=1e-9, atol=1e-9)
    assert bool((s > 0).all())


def test_smoothing_hand_case_and_alpha_one_flattens_activations():
    assert smoothquant_scales(torch.tensor([16.0, 1.0]), torch.tensor([1.0, 4.0]), 0.5).tolist() == [4.0, 0.5]
    x, w = _random((8, 6), 0) * torch.tensor([1, 1, 50, 1, 1, 1.0]), _random((4, 6), 1)
    xs, _, _ = smooth(x, w, 1.0)
    assert torch.allclose(xs.abs().amax(dim=0), torch.ones(6))  # every channel's max becomes 1
    with pytest.raises(ValueError, match="alpha must be a real number in \\[0, 1\\]"):
        smoothquant_scales(torch.ones(2), torch.ones(2), 1.5)


# ----- outliers -----

def test_outlier_channels_at_the_threshold():
    x = torch.tensor([[0.5, -6.0, 5.999], [1.0, 0.0, 2.0]])
    assert outlier_channels(x).tolist() == [False, True, False]
    assert outlier_channels(x, 0.5).tolist() == [True, True, True]


def test_outliers_kept_beats_per_token_which_beats_per_tensor_on_a_massive_channel():
    x = _random((16, 64), 0)
    x[0, 7] = 2000.0  # a massive activation on the first token
    x[:, 3] += 20.0  # a systematic outlier channel
    per_tensor = relative_error(x, fake_quantize(x, 8))
    per_token = relative_error(x, per_token_fake_quantize(x))
    kept = relative_error(x, fake_quantize_outliers_kept(x, 6.0))
    assert kept < per_token < per_tensor
    assert torch.equal(fake_quantize_outliers_kept(x, 6.0)[:, 3], x[:, 3])  # outlier columns stay exact


def test_int8_decomposition_is_close_and_exact_when_everything_is_an_outlier():
    x, w = _random((12, 32), 0), _random((10, 32), 1)
    x[:, 5] *= 40
    exact = x @ w.T
    assert relative_error(exact, int8_decomposed_matmul(x, w)) < 0.02
    assert torch.allclose(int8_decomposed_matmul(x, w, threshold=1e-9), exact, atol=1e-5)
