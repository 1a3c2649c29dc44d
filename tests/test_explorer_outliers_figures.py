"""Lab 04's static figure draws the ratios it is given, grouped by what each scheme quantizes
(labkit.explorers.outliers_figures)."""

import pytest

from labkit.explorers.canvas import alt_text
from labkit.explorers.outliers_figures import scheme_cost_figure, scheme_group


def test_bars_start_at_the_baseline_and_intervals_become_error_bars():
    ratios = {"W8 per channel": 1.012, "W8A8 per token": 0.982, "A8 per tensor, down_proj": 1.79}
    figure = scheme_cost_figure(ratios, 70.68, 128, intervals={"W8A8 per token": (0.95, 1.01)})
    axes = figure.axes[0]
    bars = axes.patches[:3]
    assert [round(bar.get_x() + bar.get_width(), 6) for bar in bars] == [1.012, 0.982, 1.79]
    assert [bar.get_facecolor() for bar in bars] == [figure.legends[0].legend_handles[i].get_facecolor()
                                                     for i in range(3)]
    assert "W8A8 per token -1.8% (-5.0% to +1.0%)" in alt_text(figure)
    assert scheme_group("fp16") == ("other", "tab:grey")
    with pytest.raises(ValueError, match="intervals name schemes that ratios does not"):
        scheme_cost_figure(ratios, 70.68, 128, intervals={"W3": (1.0, 2.0)})


def test_the_legend_covers_no_bar_or_label_and_names_what_each_group_quantizes():
    """Lab 04's chart had its legend over the last row's "+96.3%" (the A8 rows come last, with the largest bars)."""
    ratios = {"W8 per tensor": 1.079, "W3 group 32": 4.523, "W8A8 per tensor": 2.175, "W8A8 per token": 1.015,
              "A8 per tensor, down_proj": 1.963, "A8 per tensor, the rest": 1.133}
    figure = scheme_cost_figure(ratios, 31.01, 512, intervals={"A8 per tensor, down_proj": (1.739, 2.230)})
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    axes = figure.axes[0]
    legend = (figure.legends or [axes.get_legend()])[0].get_window_extent(renderer)
    labels = [text for text in axes.texts if text.get_text().endswith("%")]
    assert "+96.3%" in [text.get_text() for text in labels]
    covered = [text.get_text() for text in labels if text.get_window_extent(renderer).overlaps(legend)]
    covered += [f"bar {i}" for i, bar in enumerate(axes.patches) if bar.get_window_extent(renderer).overlaps(legend)]
    assert not covered, covered
    assert scheme_group("A8 per tensor, down_proj")[0] == "weights, and some Linears' activations"
