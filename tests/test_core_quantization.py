"""labkit.core.quantization: hand cases (the seed chapter's Table 8.7), properties, and torch's own kernels."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from labkit.core.memory import stored_bytes
from labkit.core.quantization import (
    code_range, fake_quantize, minmax_qparams, quantize, quantize_with, relative_error, sqnr_db, ste_fake_quantize,
)

TABLE_8_7 = torch.tensor([-2.0, -0.6, 0.0, 1.4, 5.0])


def _random(shape, seed, scale=1.0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator) * scale


# ----- hand cases -----

def test_table_8_7_row_by_row():
    scale, zero = minmax_qparams(TABLE_8_7.min(), TABLE_8_7.max(), 0, 7)
    assert (scale.item(), zero.item()) == (1.0, 2)
    codes = quantize_with(torch.cat([TABLE_8_7, torch.tensor([12.0])]), scale, zero, 0, 7)
    assert codes.tolist() == [0, 1, 2, 3, 7, 7]
    assert ((codes - zero) * scale).tolist() == [-2.0, -1.0, 0.0, 1.0, 5.0, 5.0]  # 12 clips to 5: error -7
    # Recalibrated with 12 inside: s = 2, z = 1; -0.6 -> 0, 1.4 -> 2, 5 -> 2.5 -> 2 (half to even) -> code 3 -> 4.
    wider = quantize(torch.cat([TABLE_8_7, torch.tensor([12.0])]), 3, "affine")
    assert (wider.scales.item(), wider.zero_points.item()) == (2.0, 1)
    assert wider.dequantize().tolist() == [-2.0, 0.0, 0.0, 2.0, 4.0, 12.0]


def test_symmetric_int8_hand_case_and_the_unreachable_minus_128():
    x = torch.tensor([-1.27, 0.005, 0.015, 1.27])
    q = quantize(x, 8)
    assert q.scales.item() == pytest.approx(0.01)
    assert q.codes.tolist() == [-127, 0, 2, 127]  # 0.5 -> 0 and 1.5 -> 2: half to even
    assert code_range(8, "symmetric") == (-127, 127)
    big = _random((4000,), 0, 3.0)
    assert quantize(big, 8).codes.min() >= -127  # with s = max|x| / 127 no value reaches -128


def test_group_size_must_divide_the_row():
    with pytest.raises(ValueError, match="group_size must be a divisor of the row length 576"):
        quantize(torch.zeros(3, 576), 4, granularity="group", group_size=128)
    with pytest.raises(ValueError, match="group_size must be an int >= 1 when granularity is 'group'"):
        quantize(torch.zeros(3, 576), 4, granularity="group")
    with pytest.raises(ValueError, match="group_size must be None unless granularity is 'group'"):
        quantize(torch.zeros(3, 576), 4, granularity="channel", group_size=64)
    assert quantize(torch.zeros(3, 576), 4, granularity="group", group_size=64).n_scales == 27


def test_bad_arguments():
    with pytest.raises(ValueError, match="bits must be an int in \\[2, 16\\]"):
        quantize(torch.ones(3), 1)
    with pytest.raises(ValueError, match="scheme must be one of"):
        quantize(torch.ones(3), 8, "asymmetric")
    with pytest.raises(ValueError, match="granularity must be one of"):
        quantize(torch.ones(3), 8, granularity="row")
    with pytest.raises(TypeError, match="x must be a floating torch.Tensor"):
        quantize(torch.ones(3, dtype=torch.int64), 8)
    with pytest.raises(ValueError, match="x must be finite everywhere"):
        quantize(torch.tensor([1.0, float("nan")]), 8)


def test_all_zero_tensor_round_trips():
    for scheme in ("symmetric", "affine"):
        assert torch.equal(fake_quantize(torch.zeros(5), 8, scheme), torch.zeros(5))


# ----- agreement with torch -----

@pytest.mark.parametrize("seed", range(4))
def test_per_tensor_affine_agrees_with_torch_observer_and_kernel(seed):
    x = _random((64, 96), seed, 2.0) + 0.5 * seed
    observer = torch.ao.quantization.MinMaxObserver(dtype=torch.quint8, qscheme=torch.per_tensor_affine)
    observer(x)
    scale, zero = observer.calculate_qparams()
    q = quantize(x, 8, "affine")
    assert q.scales.item() == scale.item() and q.zero_points.item() == zero.item()
    expected = torch.fake_quantize_per_tensor_affine(x, scale.item(), int(zero), 0, 255)
    assert torch.equal(q.dequantize(), expected)


@pytest.mark.parametrize("seed", range(4))
def test_per_tensor_symmetric_agrees_with_torch_kernel(seed):
    x = _random((50, 70), seed, 3.0)
    q = quantize(x, 8)
    expected = torch.fake_quantize_per_tensor_affine(x, q.scales.item(), 0, -127, 127)
    assert torch.equal(q.dequantize(), expected)


@pytest.mark.parametrize("axis", [0, 1])
def test_per_channel_affine_agrees_with_torch_observer_and_kernel(axis):
    x = _random((48, 80), 7 + axis, 1.5)
    observer = torch.ao.quantization.PerChannelMinMaxObserver(ch_axis=axis, dtype=torch.quint8,
                                                              qscheme=torch.per_channel_affine)
    observer(x)
    scales, zeros = observer.calculate_qparams()
    q = quantize(x, 8, "affine", "channel", axis=axis)
    assert torch.equal(q.scales.reshape(-1), scales) and torch.equal(q.zero_points.reshape(-1), zeros)
    expected = torch.fake_quantize_per_channel_affine(x, scales, zeros.int(), axis, 0, 255)
    assert torch.equal(q.dequantize(), expected)


def test_per_channel_symmetric_agrees_with_torch_kernel():
    x = _random((32, 64), 3)
    q = quantize(x, 4, granularity="channel", axis=0)
    expected = torch.fake_quantize_per_channel_affine(x, q.scales.reshape(-1), torch.zeros(32, dtype=torch.int32),
                                                      0, -7, 7)
    assert torch.equal(q.dequantize(), expected)


def test_group_is_per_channel_on_the_regrouped_rows():
    x = _random((6, 96), 4)
    grouped = fake_quantize(x, 4, granularity="group", group_size=32)
    rows = fake_quantize(x.reshape(-1, 32), 4, granularity="channel", axis=0).reshape(6, 96)
    assert torch.equal(grouped, rows)


def test_ste_gradient_agrees_with_torch_fake_quantize_backward():
    x = torch.linspace(-4.3, 9.7, 57)
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = ste_fake_quantize(ours, 1.0, 2, 0, 7)
    ref = torch.fake_quantize_per_tensor_affine(theirs, 1.0, 2, 0, 7)
    assert torch.equal(out.detach(), ref.detach())
    out.sum().backward()
    ref.sum().backward()
    # Eq. 8.6 passes the gradient on [s(q_min - z), s(q_max - z)] = [-2, 5]; torch's kernel tests the rounded
    # code instead, which widens the interval by half a step on each side: [-2.5, 5.5). They differ only there.
    edges = ((x >= -2.5) & (x < -2)) | ((x > 5) & (x < 5.5))
    assert torch.equal(ours.grad[~edges], theirs.grad[~edges])
    assert bool((ours.grad[edges] == 0).all() and (theirs.grad[edges] == 1).all()) and bool(edges.any())


# ----- bytes -----

@pytest.mark.parametrize("bits,fmt", [(8, "int8"), (4, "int4")])
@pytest.mark.parametrize("group_size", [32, 64, 192])
def test_stored_bytes_agree_with_the_memory_module(bits, fmt, group_size):
    x = _random((10, 576), 0)
    sym = quantize(x, bits, granularity="group", group_size=group_size)
    assert sym.stored_bytes() == stored_bytes(x.numel(), fmt, group_size=group_size, scale_bytes=2)
    aff = quantize(x, bits, "affine", "group", group_size)
    assert aff.stored_bytes() == stored_bytes(x.numel(), fmt, group_size=group_size, scale_bytes=4)
    assert quantize(x, bits).stored_bytes(scale_bytes=0) == stored_bytes(x.numel(), fmt)


# ----- properties -----

shapes = st.tuples(st.integers(1, 6), st.sampled_from([8, 16, 24]))


@settings(max_examples=60, deadline=None)
@given(shapes, st.integers(0, 2**31 - 1), st.integers(2, 8), st.sampled_from(["symmetric", "affine"]),
       st.sampled_from(["tensor", "channel", "group"]), st.floats(1e-3, 1e3))
def test_codes_in_range_and_error_at_most_half_a_step(shape, seed, bits, scheme, granularity, magnitude):
    x = _random(shape, seed, magnitude)
    q = quantize(x, bits, scheme, granularity, 8 if granularity == "group" else None)
    q_min, q_max = code_range(bits, scheme)
    assert int(q.codes.min()) >= q_min and int(q.codes.max()) <= q_max
    error = (q.dequantize() - x).abs()
    steps = q._grouped(torch.ones_like(x)) * q.scales  # each value's own step size
    assert bool((error <= steps.reshape(x.shape) * 0.5001 + 1e-6 * magnitude).all())


@settings(max_examples=40, deadline=None)
@given(shapes, st.integers(0, 2**31 - 1), st.integers(2, 8), st.sampled_from(["symmetric", "affine"]))
def test_fake_quantize_is_idempotent_and_finer_granularity_never_worse_on_max_error(shape, seed, bits, scheme):
    x = _random(shape, seed)
    once = fake_quantize(x, bits, scheme, "channel", axis=0)
    assert torch.allclose(fake_quantize(once, bits, scheme, "channel", axis=0), once, atol=1e-6)
    per_tensor = quantize(x, bits, scheme)
    per_row = quantize(x, bits, scheme, "channel", axis=0)
    assert bool((per_row.scales <= per_tensor.scales * (1 + 1e-6)).all())


def test_sqnr_hand_case():
    assert sqnr_db(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 3.0])) == pytest.approx(13.9794, abs=1e-4)
    assert sqnr_db(torch.ones(3), torch.ones(3)) == float("inf")


@settings(max_examples=40, deadline=None)
@given(shapes, st.integers(0, 2**31 - 1), st.integers(2, 16), st.sampled_from(["symmetric", "affine"]),
       st.sampled_from(["tensor", "channel", "group"]))
def test_fake_quantize_is_exactly_quantize_then_dequantize(shape, seed, bits, scheme, granularity):
    x = _random(shape, seed, 5.0)
    size = 8 if granularity == "group" else None
    assert torch.equal(fake_quantize(x, bits, scheme, granularity, size),
                       quantize(x, bits, scheme, granularity, size).dequantize())
