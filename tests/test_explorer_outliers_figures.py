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
    assert [bar.get_facecolor() for bar in bars] == [axes.get_legend().legend_handles[i].get_facecolor()
                                                     for i in range(3)]
    assert "W8A8 per token -1.8% (-5.0% to +1.0%)" in alt_text(figure)
    assert scheme_group("fp16") == ("other", "tab:grey")
    with pytest.raises(ValueError, match="intervals name schemes that ratios does not"):
        scheme_cost_figure(ratios, 70.68, 128, intervals={"W3": (1.0, 2.0)})
