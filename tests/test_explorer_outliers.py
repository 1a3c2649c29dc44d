"""The outlier visualizer: real activations captured once, compute's numbers, in-place updates."""

import pytest
import torch

from labkit.core.quantization import fake_quantize, relative_error
from labkit.explorers.outliers import RESIDUAL, SOURCES, capture_activations, compute, massive_activations, outlier_explorer

PROMPT = "The Eiffel Tower is in Paris."


@pytest.fixture(scope="module")
def data(embedded):
    return capture_activations(embedded, PROMPT)


def test_capture_holds_every_layer_and_source(data, embedded):
    assert data.n_layers == 30 and data.token_texts[0] == "The"
    n_tokens = embedded.text_ids(PROMPT).shape[1]
    assert data.activations[RESIDUAL][0].shape == (n_tokens, 576)
    assert data.activations["down_proj input"][5].shape == (n_tokens, 1536)
    assert set(data.activations) == set(SOURCES)


def test_the_massive_activation_is_channel_507_on_the_first_token(data):
    view = compute(data, layer=15)
    channel, value, token = view.tensor.top_channels[0]
    assert (channel, token) == (507, 0) and value > 10_000
    found = massive_activations(data)
    assert {(f["channel"], f["token"]) for f in found if 11 <= f["layer"] <= 26} == {(507, 0)}


def test_errors_agree_with_the_core_and_keeping_outliers_helps(data):
    view = compute(data, layer=15, threshold=6.0)
    x = data.activations[RESIDUAL][15]
    assert view.tensor.errors["per-tensor INT8"][0] == relative_error(x, fake_quantize(x, 8))
    kept, per_token, per_tensor = view.threshold.error[0], *(view.tensor.errors[k][0] for k in
                                                             ("per-token INT8", "per-tensor INT8"))
    assert kept < per_token < per_tensor
    assert 507 in view.threshold.outlier_channels
    assert len(compute(data, 15, threshold=1e9).threshold.outlier_channels) == 0


def test_smoothing_moves_range_from_activations_to_weights(data):
    before, after = compute(data, 15, "q/k/v_proj input", alpha=0.0).smoothing, compute(data, 15, alpha=1.0).smoothing
    assert after.act_range[1].max() <= 1.0 + 1e-5  # alpha 1: every activation channel scaled to max 1
    assert torch.allclose(torch.from_numpy(before.weight_range[1]).max(), torch.tensor(1.0))  # alpha 0: weights


def test_widget_updates_in_place(embedded):
    explorer = outlier_explorer(embedded, PROMPT, layer=3)
    image = explorer.canvas.image
    first = image.value
    explorer.controls["layer"].value = 20
    assert image.value != first and "layer 20" in explorer.numbers.value
    drawn = image.value
    explorer.controls["threshold"].value = 30.0  # numbers only: the picture is not redrawn
    assert image.value is drawn and "&ge; 30" in explorer.numbers.value
    explorer.controls["source"].value = "down_proj input"
    explorer.controls["alpha"].value = 0.8
    assert explorer.view.smoothing.act_range[0].shape == (1536,)
    assert explorer.picture()[:4] == b"\x89PNG"
