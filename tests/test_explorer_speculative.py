"""The speculative simulator: compute agrees with the core's closed forms, render updates artists in place."""

import html
import time

import pytest

from labkit.core import speedup as sp
from labkit.explorers.speculative import (MAX_GAMMA, STRIP_CALLS, SpeculativeExplorer, compute, position_alphas,
                                          summary_html)


def test_compute_is_the_core_closed_form():
    view = compute(0.7, 4, 0.1)
    assert view.tokens_per_call[4] == pytest.approx(sp.expected_tokens_per_call(0.7, 4))
    assert view.popular_tokens_per_call[4] == pytest.approx(3.8)
    assert view.improvement[4] == pytest.approx(sp.walltime_improvement(0.7, 4, 0.1))
    assert view.best_gamma == sp.optimal_gamma(0.7, 0.1, max_gamma=MAX_GAMMA)
    assert view.break_even_alpha == pytest.approx(sp.break_even_alpha(4, 0.1))
    assert abs(view.simulated_tokens_per_call - view.tokens_per_call[4]) < 4 * view.simulated_standard_error


def test_the_strip_shows_accepted_rejected_and_bonus_cells():
    view = compute(0.6, 3, 0.2, seed=1)
    assert len(view.strip) == STRIP_CALLS
    for row in view.strip:
        assert len(row) == 4  # gamma drafts plus the target's token
        assert row[-1] in ("bonus", "correction")
        if row[-1] == "bonus":
            assert set(row[:-1]) == {"accepted"}
        else:
            assert row.count("rejected") == 1
    assert compute(1.0, 3, 0.2).strip[0] == ("accepted",) * 3 + ("bonus",)


def test_alpha_decaying_by_position_uses_the_varying_formula():
    view = compute(0.8, 5, 0.0, varying=True)
    assert view.tokens_per_call[5] == pytest.approx(sp.expected_tokens_varying(position_alphas(0.8, 5, True)))
    assert view.tokens_per_call[5] < compute(0.8, 5, 0.0).tokens_per_call[5]


def test_bad_sliders_are_refused():
    with pytest.raises(ValueError, match="gamma must be an int"):
        compute(0.5, MAX_GAMMA + 1, 0.1)


def test_the_widget_updates_in_place_and_quickly():
    explorer = SpeculativeExplorer(measured=[(4, 2.3)])
    image = explorer.plot.canvas.image
    line = explorer.plot.speed_line
    before = image.value
    durations = []
    for value in (0.3, 0.5, 0.9):
        started = time.perf_counter()
        explorer.alpha.value = value
        durations.append(time.perf_counter() - started)
    assert explorer.plot.speed_line is line and explorer.plot.canvas.image is image  # same artists, same image
    assert image.value != before
    assert explorer.numbers.value == summary_html(explorer.view)
    assert explorer.view.alpha == 0.9
    # The picture's text follows it: the setting, the paper's value at γ, and the measured point.
    text = explorer.canvas.alt_text
    assert text.startswith("α 0.90, γ 4, c 0.10") and f"{explorer.view.tokens_per_call[4]:.2f} at γ = 4" in text
    assert "Measured runs (squares): γ 4 at 2.30×" in text and html.escape(text) in explorer.canvas.caption.value
