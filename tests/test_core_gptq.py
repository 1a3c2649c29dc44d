"""labkit.core.gptq: GPTQ against round-to-nearest on the layer output, act-order, and its arguments."""

import pytest
import torch

from labkit.core.gptq import gptq, gptq_column_order, layer_output_error, round_to_nearest
from labkit.core.quantization import code_range


def _random(shape, seed, scale=1.0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator) * scale


# ----- GPTQ -----

def _correlated_inputs(n, d, seed):
    generator = torch.Generator().manual_seed(seed)
    mixing = torch.randn(d, d, generator=generator) / d**0.5
    scales = torch.logspace(-1, 1, d)
    return (torch.randn(n, d, generator=generator) * scales) @ mixing + torch.randn(n, d, generator=generator) * 0.1


@pytest.mark.parametrize("group_size,scheme", [(None, "symmetric"), (16, "symmetric"), (16, "affine")])
def test_gptq_beats_round_to_nearest_on_layer_output(group_size, scheme):
    w, x = _random((24, 64), 0), _correlated_inputs(256, 64, 1)
    ours = gptq(w, x, 4, group_size, scheme=scheme)
    rtn = round_to_nearest(w, 4, group_size, scheme)
    assert ours.codes.shape == w.shape and ours.scales.shape == rtn.scales.shape
    assert layer_output_error(w, ours.dequantize(), x) < 0.9 * layer_output_error(w, rtn.dequantize(), x)


def test_gptq_with_identity_hessian_is_round_to_nearest():
    # Inputs whose X^T X is a multiple of I: no correlations, so no error has anywhere useful to go.
    w = _random((8, 16), 2)
    x = torch.eye(16) * 3.0
    ours = gptq(w, x, 4, damp=1e-9)
    assert torch.equal(ours.codes, round_to_nearest(w, 4).codes)


def test_act_order_takes_the_largest_hessian_diagonal_first():
    x = torch.tensor([[1.0, 3.0, 0.0, 2.0], [1.0, 0.0, 2.0, 0.0]])  # diag(2 X^T X) = 4, 18, 8, 8
    assert gptq_column_order(x, act_order=True).tolist() == [1, 2, 3, 0]  # the tie 8, 8 keeps index order
    assert gptq_column_order(x).tolist() == [0, 1, 2, 3]  # Algorithm 1: left to right
    diagonal = torch.diagonal(2 * x.T.double() @ x.double())
    assert torch.equal(diagonal[gptq_column_order(x, act_order=True)], diagonal.sort(descending=True).values)


def test_act_order_per_row_is_plain_gptq_on_the_reordered_columns():
    # Per output row (no groups) the scales do not depend on the order, so act-order is GPTQ on W[:, order].
    w, x = _random((12, 32), 3), _correlated_inputs(128, 32, 4)
    order = gptq_column_order(x, act_order=True)
    ours = gptq(w, x, 4, act_order=True)
    reordered = gptq(w[:, order], x[:, order], 4)
    assert (ours.codes[:, order] != reordered.codes).float().mean() < 0.01  # the same up to a rare rounding tie
    assert torch.allclose(ours.scales, reordered.scales)


@pytest.mark.parametrize("group_size,scheme", [(None, "symmetric"), (16, "symmetric"), (16, "affine")])
def test_act_order_keeps_the_layout_and_beats_round_to_nearest(group_size, scheme):
    w, x = _random((24, 64), 0), _correlated_inputs(256, 64, 1)
    ours = gptq(w, x, 4, group_size, scheme=scheme, act_order=True)
    rtn = round_to_nearest(w, 4, group_size, scheme)
    assert ours.codes.shape == w.shape and ours.scales.shape == rtn.scales.shape
    q_min, q_max = code_range(4, scheme)
    assert int(ours.codes.min()) >= q_min and int(ours.codes.max()) <= q_max
    assert layer_output_error(w, ours.dequantize(), x) < 0.9 * layer_output_error(w, rtn.dequantize(), x)


def test_fewer_calibration_samples_than_inputs_overfit():
    # n_samples < in: H is singular before damping, and GPTQ fits those samples far better than fresh ones.
    # Inputs of 64 channels: 32 samples span half of them, and GPTQ spends the other half's weights on those.
    w, x = _random((24, 64), 5), _random((2048, 64), 6)
    few, fresh = x[:32], x[1024:]
    fitted, rtn = gptq(w, few, 4).dequantize(), round_to_nearest(w, 4).dequantize()
    assert layer_output_error(w, fitted, few) < 0.6 * layer_output_error(w, rtn, few)
    assert layer_output_error(w, fitted, fresh) > 1.2 * layer_output_error(w, rtn, fresh)  # worse than no GPTQ


def test_gptq_arguments():
    with pytest.raises(ValueError, match="inputs must be 2-D \\[n_samples, 16\\]"):
        gptq(torch.zeros(4, 16), torch.zeros(3, 8))
    with pytest.raises(ValueError, match="group_size must be a divisor of the row length 16"):
        gptq(torch.zeros(4, 16), torch.ones(3, 16), group_size=5)
    with pytest.raises(TypeError, match="act_order must be True or False"):
        gptq(torch.zeros(4, 16), torch.ones(3, 16), act_order="yes")
