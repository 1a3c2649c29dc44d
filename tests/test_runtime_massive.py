"""Sun et al.'s massive-activation experiment on the embedded model, and the output-editing hooks under it."""

import pytest
import torch

from labkit import runtime
from labkit.core.texts import load_eval_text, tokenize_sections
from labkit.runtime import massive


def test_edit_outputs_replaces_an_output_then_leaves_the_model_as_it_was():
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    x = torch.ones(2, 3)
    plain = net(x)
    with runtime.edit_outputs(net, ["1"], lambda name, out: out * 0):
        assert torch.equal(net(x), net[2].bias.expand(2, 1))  # nothing but the bias gets through
    assert torch.equal(net(x), plain) and not net[1]._forward_hooks


def test_edit_outputs_refuses_a_new_shape_and_removes_its_hooks_on_error():
    net = torch.nn.Sequential(torch.nn.Linear(3, 3))
    with pytest.raises(ValueError, match=r"edit must return a tensor of the output's shape \(2, 3\)"):
        with runtime.edit_outputs(net, ["0"], lambda name, out: out[:, :1]):
            net(torch.ones(2, 3))
    assert not net[0]._forward_hooks
    with pytest.raises(TypeError, match="edit must be a function"):
        with runtime.edit_outputs(net, ["0"], 3):
            pass


def test_the_mask_is_relative_to_each_sequence_median():
    x = torch.ones(2, 4, 8)
    x[0, 0, 3] = 2000.0  # 2000 x the median, above the floor of 100
    x[1] = 0.01
    x[1, 2, 5] = 50.0  # 5000 x its median but under the floor
    assert massive.massive_mask(x).nonzero().tolist() == [[0, 0, 3]]
    with pytest.raises(ValueError, match="ratio must be"):
        massive.massive_mask(x, ratio=0.5)


@pytest.fixture(scope="module")
def text(embedded):
    return tokenize_sections(embedded.tokenizer, load_eval_text()).token_ids


def test_zeroing_the_massive_activations_breaks_the_model_and_their_mean_does_not(embedded, text):
    calibration = [text[start:start + 48][None] for start in (300, 900)]
    before = runtime.full_logits(embedded, text[None, :16])
    result = massive.ablate_massive(embedded, text[:96], calibration)
    # They appear at layer 11, on the first token: channel 507 (about 21,700) and 247.
    assert result.layer == 11
    assert {(token, channel) for token, channel, _ in result.entries} == {(0, 507), (0, 247)}
    assert result.zeroed > 1000 * result.perplexity  # Sun et al.: zeroed, the model falls apart
    assert abs(result.mean - result.perplexity) < 0.05 * result.perplexity  # their mean: it hardly notices
    assert abs(result.control - result.perplexity) < 0.01 * result.perplexity  # as many ordinary entries: nothing
    assert torch.equal(runtime.full_logits(embedded, text[None, :16]), before)  # hooks gone, weights untouched
