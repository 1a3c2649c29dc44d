"""Lab 04's model side: activations captured once, Sun et al.'s massive-activation experiment on the embedded model,
and the output-editing hooks under it."""

import pytest
import torch

from labkit import runtime
from labkit.core.texts import load_eval_text, tokenize_sections
from labkit.runtime import activations
from labkit.runtime.activations import (ROLES, RESIDUAL, SOURCES, OutlierData, capture_activations,
                                        input_maxima, massive_activations)

PROMPT = "The Eiffel Tower is in Paris."


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


@pytest.fixture(scope="module")
def text(embedded):
    return tokenize_sections(embedded.tokenizer, load_eval_text()).token_ids


def test_zeroing_the_massive_activations_breaks_the_model_and_their_mean_does_not(embedded, text):
    calibration = [text[start:start + 48][None] for start in (300, 900)]
    before = runtime.full_logits(embedded, text[None, :16])
    result = activations.ablate_massive(embedded, text[:96], calibration)
    # They appear at layer 11, on the first token: channel 507 (about 21,700) and 247.
    assert result.layer == 11
    assert {(token, channel) for token, channel, _ in result.entries} == {(0, 507), (0, 247)}
    assert result.zeroed > 1000 * result.perplexity  # Sun et al.: zeroed, the model falls apart
    assert abs(result.mean - result.perplexity) < 0.05 * result.perplexity  # their mean: it hardly notices
    assert abs(result.control - result.perplexity) < 0.01 * result.perplexity  # as many ordinary entries: nothing
    assert torch.equal(runtime.full_logits(embedded, text[None, :16]), before)  # hooks gone, weights untouched


@pytest.fixture(scope="module")
def data(embedded):
    return capture_activations(embedded, PROMPT)


def test_capture_holds_every_layer_and_source(data, embedded):
    assert data.n_layers == 30 and data.token_texts[0] == "The"
    n_tokens = embedded.text_ids(PROMPT).shape[1]
    assert data.activations[RESIDUAL][0].shape == (n_tokens, 576)
    assert data.activations["down_proj input"][5].shape == (n_tokens, 1536)
    assert set(data.activations) == set(SOURCES)


def test_input_maxima_per_linear_kind_and_the_culprit_at_layer_11(data):
    maxima = input_maxima(data, [3, 11])
    assert list(maxima) == [*ROLES, RESIDUAL]
    assert maxima["down_proj input"][1] == float(data.activations["down_proj input"][11].abs().max())
    # The MLP that writes the massive activation reads a massive input; RMSNorm keeps q/k/v's input small.
    assert maxima["down_proj input"][1] > 1000 > 10 > maxima["q/k/v_proj input"][1]
    assert maxima[RESIDUAL][1] > 10_000


def test_the_massive_activation_is_channel_507_on_the_first_token(data):
    found = massive_activations(data)
    assert {(f["channel"], f["token"]) for f in found if 11 <= f["layer"] <= 26} == {(507, 0)}


def test_massive_activations_lists_what_the_core_mask_flags():
    stream = torch.full((3, 4), 0.01)
    stream[0, 1], stream[2, 3] = 50.0, -500.0  # both >= 1000 x the median; only -500 clears the floor of 100
    data = OutlierData("p", ("a", "b", "c"), {RESIDUAL: [stream]}, {})
    found = massive_activations(data)
    assert [(f["layer"], f["token"], f["channel"], f["value"]) for f in found] == [(0, 2, 3, -500.0)]
