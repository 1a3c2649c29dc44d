"""Lab 06's static figures draw what they are given (labkit.explorers.timing_figures)."""

from labkit.explorers.timing_figures import roofline_figure, steps_figure


def test_static_figures_draw():
    figure = roofline_figure(1e11, 1e10, {"decode": (0.5, 2e9), "prefill 64": (30.0, 5e10)})
    assert len(figure.axes[0].collections) == 2 and "ridge at 10.0" in figure.axes[0].get_title()
    assert len(steps_figure([5, 6, 7], [0.3, 0.1, 0.1], [0.3, 0.3, 0.35]).axes[0].lines) == 2
