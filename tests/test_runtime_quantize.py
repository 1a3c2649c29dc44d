"""labkit.runtime.quantize: a private quantized copy; the shared model is never touched."""

import pytest
import torch

from alignment import logits_atol, misaligned_model
from labkit import runtime
from labkit.core.quantization import fake_quantize
from labkit.core.distribution import choice_margin
from labkit.runtime.quantize import (ActivationScheme, QuantizedLinear, WeightScheme, decoder_linear_names,
                                     quantize_linear, quantized_model)

PROMPT = "Quantization rounds every weight to a grid."


def _fingerprint(lm):
    return {name: tensor.detach().clone() for name, tensor in runtime.module_of(lm).state_dict().items()}


def test_the_shared_model_is_never_touched(embedded):
    before = _fingerprint(embedded)
    ids = embedded.text_ids(PROMPT)
    reference = runtime.forward(embedded, ids, positions="all").logits
    name = "model.layers.3.self_attn.q_proj"
    with quantized_model(embedded, WeightScheme(4, granularity="group", group_size=32)) as private:
        changed = runtime.forward(private, ids, positions="all").logits
        names = decoder_linear_names(embedded)
        module = runtime.module_of(private)
        assert len(names) == 30 * 7
        assert all(isinstance(module.get_submodule(n), QuantizedLinear) for n in names)
        assert not any(isinstance(m, QuantizedLinear) for m in runtime.module_of(embedded).modules())
        expected = fake_quantize(before[name + ".weight"], 4, granularity="group", group_size=32)
        # Exact although the buffers differ: fake quantization is elementwise arithmetic and maxima, which give
        # the same bits in any order and at any alignment.
        assert torch.equal(module.get_submodule(name).weight, expected)
        assert isinstance(module.get_submodule("lm_head"), torch.nn.Linear)  # the tied head stays as loaded
    after = _fingerprint(embedded)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(runtime.forward(embedded, ids, positions="all").logits, reference)  # same op, same buffers
    assert float((changed - reference).abs().max()) > 100 * logits_atol(embedded, reference)  # far beyond noise


def test_per_tensor_activations_fail_where_outliers_kept_and_smoothing_help(embedded):
    ids = embedded.text_ids(PROMPT)
    reference = runtime.forward(embedded, ids, positions="all").logits
    calibration = embedded.text_ids("A short calibration sentence for SmoothQuant.")
    errors = {}
    for label, acts in [("tensor", ActivationScheme(8, "tensor")), ("outliers", ActivationScheme(8, "outliers")),
                        ("smooth", ActivationScheme(8, "token", smooth_alpha=0.5))]:
        with quantized_model(embedded, None, acts, calibration_ids=calibration) as private:
            logits = runtime.forward(private, ids, positions="all").logits
        errors[label] = float((logits - reference).norm() / reference.norm())
    # Measured here: 0.06 kept, 0.03 smoothed per token, 0.23 per tensor (one scale for 22,000 and for 1).
    assert errors["outliers"] < 0.1 and errors["smooth"] < 0.1, errors
    assert errors["tensor"] > 2 * max(errors["outliers"], errors["smooth"]), errors


@pytest.mark.parametrize("source", ["loaded", "misaligned"])
def test_a_copy_with_no_scheme_computes_the_same_function(embedded, source):
    """Wrapping a Linear with no scheme changes nothing but the buffers: the copy computes the loaded model's
    function, within float32 reordering noise (a bound from epsilon and depth, tests/alignment.py), and picks the
    same greedy token at every position. Not bitwise: the copy's weights are new buffers, and MKL may choose another
    kernel at another alignment (the "misaligned" copy makes sure of that on every machine)."""
    original = embedded if source == "loaded" else misaligned_model(embedded)
    ids = embedded.text_ids(PROMPT)
    every_ref, last_ref = (runtime.forward(embedded, ids, positions=p).logits for p in ("all", "last"))
    with quantized_model(original, names=["model.layers.0.mlp.up_proj"]) as private:
        every, last = (runtime.forward(private, ids, positions=p).logits for p in ("all", "last"))
    atol = logits_atol(embedded, every_ref)
    assert float((every - every_ref).abs().max()) <= atol and float((last - last_ref).abs().max()) <= atol
    greedy = every_ref.argmax(dim=-1)
    # The greedy tokens can only be compared where no position is a near-tie: every margin is far above atol here.
    assert float(choice_margin(every_ref, greedy).min()) > 10 * atol
    assert torch.equal(every.argmax(dim=-1), greedy)


def test_quantized_linear_with_no_scheme_is_the_identity_wrapper(embedded):
    linear = runtime.module_of(embedded).model.layers[0].mlp.up_proj
    wrapper = quantize_linear(linear, None, None)
    assert wrapper.weight.data_ptr() != linear.weight.data_ptr()  # its own buffer: the shared model is untouched
    assert torch.equal(wrapper.weight, linear.weight) and wrapper.bias is None and linear.bias is None  # same values
    x = torch.randn(2, 5, linear.in_features, generator=torch.Generator().manual_seed(0))
    # Exact: the same operation (a bias-free linear) on the same buffers.
    assert torch.equal(wrapper(x), torch.nn.functional.linear(x, wrapper.weight))


def test_bad_arguments(embedded):
    with pytest.raises(ValueError, match="calibration_ids must be token ids"):
        with quantized_model(embedded, activations=ActivationScheme(smooth_alpha=0.5)):
            pass
    with pytest.raises(ValueError, match="weights must be None with activations 'outliers'"):
        with quantized_model(embedded, WeightScheme(8), ActivationScheme(granularity="outliers")):
            pass
    with pytest.raises(ValueError, match="granularity must be one of"):
        WeightScheme(4, granularity="row")
    with pytest.raises(TypeError, match="weights must be a WeightScheme or None"):
        with quantized_model(embedded, "int8"):
            pass
