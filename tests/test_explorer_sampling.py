"""The sampling explorer: compute is pure and right, render updates artists in place, sliders never run the model."""

import math
from types import SimpleNamespace

import pytest
import torch

from labkit.core.course import lesson_logits
from labkit.explorers.sampling import SamplingExplorer, SamplingPlot, compute, render, summary_html
from labkit.runtime.scoring import NextTokenScores

LESSON = lesson_logits()


def lesson_scores(n_show=4):
    ids = tuple(range(n_show))
    probs = tuple(torch.softmax(LESSON, -1)[:n_show].tolist())
    return NextTokenScores("lesson", torch.zeros(1, 1, dtype=torch.long), LESSON, ids, tuple("ABCD"[:n_show]), probs)


class FakeModel(torch.nn.Module):
    """Returns fixed logits and counts its forward passes."""

    def __init__(self, logits):
        super().__init__()
        self.logits, self.calls = logits, 0

    def forward(self, input_ids, **kwargs):
        self.calls += 1
        return SimpleNamespace(logits=self.logits.expand(input_ids.shape[0], input_ids.shape[1], -1))


class FakeLM:
    def __init__(self, logits):
        self.model = FakeModel(logits)
        self.tokenizer = SimpleNamespace(decode=lambda ids, **kw: "".join("ABCDEFGH"[i] for i in ids),
                                         eos_token_id=0)

    def chat_ids(self, prompt):
        return torch.tensor([[1, 2, 3]])


def test_compute_on_the_lesson_example():
    view = compute(lesson_scores(), temperature=1.0, top_p=0.75)
    assert view.n_kept == 2 and view.mass_kept == pytest.approx(0.8)
    assert view.sampling_probs == pytest.approx((2 / 3, 1 / 3, 0, 0))
    assert view.model_probs == pytest.approx((8 / 15, 4 / 15, 2 / 15, 1 / 15))
    assert view.entropy_bits == pytest.approx(-(2 / 3 * math.log2(2 / 3) + 1 / 3 * math.log2(1 / 3)), abs=1e-6)


def test_compute_shows_that_the_order_matters():
    first = compute(lesson_scores(), temperature=0.5, top_p=0.75)
    reverse = compute(lesson_scores(), temperature=0.5, top_p=0.75, order="filters_first")
    assert (first.n_kept, first.mass_kept) == (1, pytest.approx(64 / 85))  # measured on the tempered distribution
    assert (reverse.n_kept, reverse.mass_kept) == (2, pytest.approx(12 / 15))  # measured at T = 1
    assert reverse.sampling_probs == pytest.approx((0.8, 0.2, 0, 0))


def test_compute_at_temperature_zero_is_greedy():
    view = compute(lesson_scores(), temperature=0.0, top_k=3, top_p=0.9, min_p=0.1)
    assert view.sampling_probs == (1.0, 0.0, 0.0, 0.0) and view.n_kept == 1 and view.entropy_bits == 0.0


def test_compute_rejects_bad_settings_with_the_core_errors():
    with pytest.raises(ValueError, match="top_p"):
        compute(lesson_scores(), top_p=0.0)
    with pytest.raises(ValueError, match="order"):
        compute(lesson_scores(), order="sideways")


def test_summary_lists_numbers_and_candidates():
    text = summary_html(compute(lesson_scores(), top_k=2))
    assert "2 of 4" in text and "removed" in text and "&#x27;A&#x27;" in text


def test_render_updates_the_same_artists_and_encodes_png():
    plot = SamplingPlot(4)
    plot.set_tokens(tuple("ABCD"))
    bars = list(plot.sampling_bars)
    render(plot, compute(lesson_scores(), top_k=2))
    first_png = plot.canvas.image.value
    assert first_png[:4] == b"\x89PNG" and plot.x_limit == 0.7
    render(plot, compute(lesson_scores(), temperature=0.0))
    assert list(plot.sampling_bars) == bars and bars[0].get_width() == 1.0 and plot.x_limit == 1.0
    assert plot.canvas.image.value != first_png


def test_the_model_runs_once_per_prompt_never_per_slider_move():
    lm = FakeLM(torch.tensor([0.0, 3.0, 2.0, 1.0, -1.0, 2.5]))
    explorer = SamplingExplorer(lm, prompt="hello", n_show=4)
    assert lm.model.calls == 1 and explorer.scores.top_texts == ("B", "F", "C", "D")
    before = explorer.numbers.value
    explorer.temperature.value = 0.3
    explorer.top_k.value = 2
    explorer.top_p.value = 0.5
    explorer.min_p.value = 0.2
    explorer.order.value = "filters_first"
    explorer.temperature.value = 0.0
    assert lm.model.calls == 1 and explorer.numbers.value != before
    assert "1 of 6" in explorer.numbers.value
    explorer.prompt.value = "another"
    explorer.run.click()
    assert lm.model.calls == 2


def test_layout_keeps_the_figure_at_its_size_and_display_carries_a_picture():
    import base64

    explorer = SamplingExplorer(FakeLM(torch.tensor([0.0, 3.0, 2.0, 1.0, -1.0, 2.5])), prompt="hello", n_show=4)
    image = explorer.canvas.image
    assert image.layout.width == f"{explorer.canvas.pixel_size[0]}px" and image.layout.height == "auto"
    bundle = explorer._repr_mimebundle_()
    assert base64.b64decode(bundle["image/png"])[:4] == b"\x89PNG" and "VBox" not in bundle["text/plain"]
    assert set(explorer.controls) >= {"temperature", "top_k", "top_p", "min_p", "order", "mode", "run", "draw"}
