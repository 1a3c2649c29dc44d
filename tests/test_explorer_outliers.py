"""The outlier visualizer: real activations captured once, compute's numbers, in-place updates."""

import pytest
import torch

from labkit.core.quantization import fake_quantize, relative_error
from labkit.explorers.outliers import alt_text, compute, numbers_html, outlier_explorer
from labkit.runtime.activations import RESIDUAL, capture_activations

PROMPT = "The Eiffel Tower is in Paris."


@pytest.fixture(scope="module")
def data(embedded):
    return capture_activations(embedded, PROMPT)


def test_the_massive_activation_is_channel_507_on_the_first_token(data):
    view = compute(data, layer=15)
    channel, value, token = view.tensor.top_channels[0]
    assert (channel, token) == (507, 0) and value > 10_000


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
    explorer.controls["threshold"].value = 30.0  # the numbers and the outliers-kept SQNR line
    assert image.value != drawn and "&ge; 30" in explorer.numbers.value
    explorer.controls["source"].value = "down_proj input"
    explorer.controls["alpha"].value = 0.8
    assert explorer.view.smoothing.act_range[0].shape == (1536,)
    assert explorer.picture()[:4] == b"\x89PNG"


def test_per_tensor_int8_leaves_the_median_token_nothing_once_the_massive_activation_appears(data):
    layers = compute(data, layer=15).layers.sqnr
    per_tensor, per_token = layers["per-tensor INT8"], layers["per-token INT8"]
    assert data.massive_layer == 11
    # From layer 11 a 21,700 sets the scale (171 per code): the median token's ~2s round to 0 (SQNR 0 dB there,
    # a few dB later as the median grows), at least 20 dB below per-token scales at every layer it rides through.
    assert per_tensor[11] < 1.0 and (per_token - per_tensor)[11:28].min() > 20.0
    assert per_tensor[10] > 15.0  # the layer before: no massive activation yet


def test_the_toggle_shows_the_model_with_its_massive_activations_zeroed(embedded):
    explorer = outlier_explorer(embedded, PROMPT, layer=15)
    before, image = explorer.view.tensor, explorer.canvas.image.value
    explorer.controls["massive"].value = True
    after = explorer.view.tensor
    assert explorer.data.zeroed_at == 11 and "zeroed" in explorer.numbers.value
    assert "Layer 15, residual stream, massive activations zeroed at layer 11." in explorer.canvas.alt_text
    assert before.largest > 10_000 and after.largest < 5_000  # 507 gone (channel 247 grows to a few thousand)
    assert explorer.canvas.image.value != image
    explorer.controls["massive"].value = False
    assert explorer.view.tensor.largest == before.largest


def test_the_residual_stream_is_labelled_as_no_linears_input(data):
    assert "No Linear reads this tensor" in numbers_html(compute(data, 15, RESIDUAL))
    assert "No Linear reads" not in numbers_html(compute(data, 15, "down_proj input"))


def test_the_picture_text_says_where_the_peak_is_and_follows_the_view(data):
    view = compute(data, 15)
    channel, peak, token = view.tensor.top_channels[0]
    text = alt_text(view)
    assert f"peaks at channel 507 with {peak:,.1f} (token {token})" in text
    per_channel = sorted(view.tensor.magnitudes.max(axis=0).tolist())
    assert per_channel[0] < 10 < peak  # the median channel the text gives lies far below the peak
    middle = per_channel[len(per_channel) // 2]  # the median's neighbour (576 channels: it averages two)
    assert 0.9 * middle < float(text.split("the median channel ")[1].split(";")[0]) < 1.1 * middle
    sqnr = view.layers.sqnr["per-token INT8"][15]
    assert f"per-token INT8 {sqnr:.1f} dB" in text
    assert alt_text(compute(data, 15, threshold=30.0)) != text  # the threshold moves the outliers-kept line
