"""The latency explorer: compute() agrees with the core's model, render() moves artists in place, the widget
answers every control."""

import pytest

from labkit.core.latency_model import LatencyModel, fit_latency
from labkit.explorers.timing import (
    MeasuredPoint, TimingFigure, compute, fit_table, points_from_batches, render, summary_html, timing_explorer,
)

LATENCY = LatencyModel(0.02, 0.001, 0.06, 0.004, 1e-6)
MEASURED = (MeasuredPoint(32, 16, 1, 0.05, 0.07, 1.1, 14.5), MeasuredPoint(32, 16, 4, 0.15, 0.08, 1.4, 45.7),
            MeasuredPoint(64, 8, 2, 0.1, 0.07, 0.6, 26.7))


def test_compute_is_the_core_prediction_along_the_batch_axis():
    view = compute(LATENCY, 32, 16, batch_size=4, measured=MEASURED, max_batch=8)
    assert view.prediction == LATENCY.predict(32, 16, 4)
    assert view.batch_sizes == tuple(range(1, 9))
    assert view.e2e_curve_s == tuple(LATENCY.predict(32, 16, b).e2e_s for b in range(1, 9))
    assert list(view.throughput_curve) == sorted(view.throughput_curve)  # batching buys throughput...
    assert list(view.e2e_curve_s) == sorted(view.e2e_curve_s)  # ...and costs every request latency
    assert [m.batch_size for m in view.measured] == [1, 4]  # only the points measured at this setting
    assert view.measured_at == ((32, 16), (64, 8))


def test_one_token_has_no_tpot_in_the_view_and_text():
    view = compute(LATENCY, 32, 1)
    assert view.prediction.tpot_s is None and "TPOT unavailable (one token)" in summary_html(view)
    with pytest.raises(ValueError, match=r"batch_size must be an int in \[1, 4\]"):
        compute(LATENCY, 32, 8, batch_size=5, max_batch=4)
    with pytest.raises(TypeError, match="latency must be a labkit.core.latency_model.LatencyModel"):
        compute("model", 32, 8)


def test_summary_shows_measured_against_predicted_where_measured():
    text = summary_html(compute(LATENCY, 32, 16, batch_size=4, measured=MEASURED))
    assert "<b>measured</b>" in text and f"{LATENCY.predict(32, 16, 4).e2e_s / 1.4:.2f}" in text
    elsewhere = summary_html(compute(LATENCY, 100, 16, measured=MEASURED))
    assert "measured points exist at prompt 32, 16 new tokens; prompt 64, 8 new tokens" in elsewhere
    other_batch = summary_html(compute(LATENCY, 32, 16, batch_size=2, measured=MEASURED))
    assert "measured at this prompt and output length for batches 1, 4" in other_batch


def test_render_moves_the_same_artists():
    figure = TimingFigure(max_batch=16)
    lines = list(figure.latency.lines) + list(figure.throughput.lines)
    render(figure, compute(LATENCY, 32, 16, measured=MEASURED))
    first = figure.canvas.image.value
    render(figure, compute(LATENCY, 512, 128, batch_size=12, measured=MEASURED))
    assert list(figure.latency.lines) + list(figure.throughput.lines) == lines
    assert list(figure.e2e_dots.get_xdata()) == []  # no measurement at prompt 512
    assert figure.cursors[0].get_xdata()[0] == 12
    assert figure.canvas.image.value != first and figure.canvas.image.value[:4] == b"\x89PNG"


def test_widget_answers_every_control_in_place():
    explorer = timing_explorer(LATENCY, MEASURED)
    image, text = explorer.canvas.image, explorer.text
    for name, value in [("prompt_len", 64), ("output_len", 8), ("batch_size", 2)]:
        before = (image.value, text.value)
        explorer.controls[name].value = value
        assert (image.value, text.value) != before, name
    assert "<b>measured</b>" in text.value  # prompt 64, 8 tokens, batch 2 was measured
    assert explorer.picture()[:4] == b"\x89PNG"


def test_points_from_batches_reads_attributes():
    class Point:
        batch_size, ttft_s, tpot_s, e2e_s, tokens_per_s = 2, 0.1, 0.05, 0.5, 20.0

    assert points_from_batches([Point()], 32, 5) == (MeasuredPoint(32, 5, 2, 0.1, 0.05, 0.5, 20.0),)


FIT = fit_latency([(8, 1, 0.03), (64, 1, 0.08), (512, 1, 0.55)],
                  [(b, c, LATENCY.decode_step_s(b, c)) for b in (1, 3) for c in (16, 256, 1024)])


def test_a_fit_marks_where_the_explorer_extrapolates():
    inside = compute(FIT, 32, 16, batch_size=2)
    assert inside.prediction == FIT.latency.predict(32, 16, 2) and inside.extrapolated == ()
    assert inside.fitted_batches == (1, 3) and "inside the measured range" in summary_html(inside)
    outside = compute(FIT, 1000, 100, batch_size=6, max_batch=8)
    assert outside.extrapolated == ("prefill of 6,000 tokens (6 x 1,000) > 512 measured", "batch 6 > 3 measured",
                                    "context up to 1,098 tokens > 1,024 measured")
    assert "<b>extrapolated</b>: prefill of 6,000 tokens" in summary_html(outside)
    assert compute(LATENCY, 1000, 100).extrapolated == ()  # a bare model knows no range


def test_the_batches_never_measured_are_shaded():
    explorer = timing_explorer(FIT, max_batch=8)
    spans = explorer.figure.outside
    assert explorer.figure.outside_batches == [(3.5, 8.5)]  # batch 4 and up: the fit measured 1 to 3
    assert len(spans) == 2 and {span.axes for span in spans} == {explorer.figure.latency, explorer.figure.throughput}
    assert "batch sizes not measured" in [t.get_text() for t in explorer.canvas.figure.legends[0].get_texts()]
    assert "Shaded: batch sizes outside the measured 1 to 3." in explorer.canvas.alt_text
    assert timing_explorer(LATENCY).figure.outside == []


def test_the_fit_table_shows_each_coefficient_with_its_error():
    text = fit_table(FIT).splitlines()
    assert text[0] == "prefill (3 points, 8 to 512 prompt tokens):"
    assert text[3] == "decode step (6 points, batches 1 to 3, 16 to 1,024 cached tokens):"
    assert text[6].split()[:5] == ["per", "cached", "token", "1.00", "µs"]  # LATENCY's 1e-6 s, recovered exactly
    assert all("±" in line for line in text if line.startswith("  "))
