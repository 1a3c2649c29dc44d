"""Every picture is visible: a cell that makes a figure shows it as an image in both committed notebooks.

A matplotlib ``Figure`` that reaches a cell's output without a PNG prints as ``<Figure size 512x240 with 1 Axes>``
(in JupyterLab and on a code host): the prose around it then describes a picture nobody sees. labkit's figures
never touch pyplot, so ``labkit.explorers`` registers the PNG formatter itself (``show_figures_as_png``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(ROOT / "notebooks")) for p in NOTEBOOKS])
def test_every_figure_is_committed_as_an_image(path):
    notebook = json.loads(path.read_text(encoding="utf-8"))
    blind = []
    for index, cell in enumerate(notebook["cells"]):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            text = "".join(data.get("text/plain", ""))
            if text.startswith("<Figure size") and "image/png" not in data:
                blind.append(f"cell {index}: {text.strip()}")
    assert not blind, f"figures shown as text, not as a picture: {blind}"


# ---------------------------------------------------------------------------------------------------------------
# Every figure a notebook shows: a text alternative in numbers, a legend where colours or styles carry meaning,
# and text a person can read at the figure's own size (labkit.explorers.canvas.MIN_TEXT_PX).


def _figures():
    """(name, figure, numbers its text must say) for every static figure function in labkit.explorers."""
    from types import SimpleNamespace as Run

    import torch

    from labkit.core import lossless
    from labkit.core.budget import MemoryBudget
    from labkit.core.memory import GIB
    from labkit.core.paging import request_stream, simulate_kv_allocation
    from labkit.core.presets import model_preset
    from labkit.core.timing import request_metrics
    from labkit.explorers import loss, memory_figures, numerics, outliers_figures, sampling, speculative, timing_figures

    spec = model_preset("Llama-3-8B")
    stream = request_stream(40, seed=0)
    paged = [simulate_kv_allocation(stream, spec, "paged", block_size=b, kv_budget_bytes=10 * 10**9) for b in (1, 16)]
    whole = simulate_kv_allocation(stream, spec, "contiguous", kv_budget_bytes=10 * 10**9)
    fits = MemoryBudget(weights_bytes=2 * 10**9, kv_cache_bytes=10**9, activations_bytes=0, workspace_bytes=0,
                        capacity_bytes=4 * 10**9)
    tables = lossless.random_markov_pair(3, torch.Generator().manual_seed(0))
    tests = {name: lossless.lossless_test(*tables, 2, 200, torch.Generator().manual_seed(1), step=step)
             for name, step in list(lossless.STEP_VARIANTS.items())[:2]}
    alone = Run(results=[Run(request=0, batch=0, latency_s=0.25), Run(request=1, batch=1, latency_s=0.5)])
    together = Run(results=[Run(request=0, batch=0, latency_s=0.375), Run(request=1, batch=0, latency_s=0.375)])
    return [
        ("spacing", numerics.spacing_figure(), ["65,504", "448"]),
        ("genre", loss.genre_figure({"code": 3.25, "poem": 120.0}, {"code": 4.5, "poem": 50.0}), ["3.25", "120"]),
        ("temperature", loss.temperature_figure([0.5, 1.0, 2.0], [60.68, 50.5, 67.37]), ["50.5 at T = 1"]),
        ("tail", sampling.tail_figure({"T = 1": ([3, 5, 7], [0, 2, 1]), "T = 1.5": ([3, 9, 11], [1, 1200, 4])}),
         ["beyond 1,000 at 1 of 3 steps", "at most 11"]),
        ("scheme cost", outliers_figures.scheme_cost_figure({"W4 group 32": 1.256, "W8A8 per token": 0.982}, 70.68,
                                                            128, intervals={"W8A8 per token": (0.953, 1.011)}),
         ["+25.6%", "-1.8% (-4.7% to +1.1%)", "70.68"]),
        ("kv context", memory_figures.kv_context_figure(spec, {"MHA": 32, "GQA": 8}, [256, 1024],
                                                        capacity_bytes=80 * GIB, weights_bytes=16 * GIB), ["64 GiB"]),
        ("paging", memory_figures.paging_figure([1, 16], paged, {"contiguous, longest": whole}),
         [f"{paged[1].requests_fit} fit", f"{whole.requests_fit} fit"]),
        ("fit grid", memory_figures.fit_grid_figure({"FP16": [fits]}, ["1 GPU"], "one card"), ["1 GPU 3.0 GB fits"]),
        ("roofline", timing_figures.roofline_figure(1e11, 1e10, {"decode": (0.5, 2e9)}), ["40 % of the roof"]),
        ("steps", timing_figures.steps_figure([4, 5], [0.2, 0.1], [0.2, 0.25]), ["250 ms at 5"]),
        ("emissions", timing_figures.emissions_figure([request_metrics([0.5, 0.6, 0.7])]), ["3 tokens by 700 ms"]),
        ("requests", timing_figures.requests_timeline_figure(alone, together), ["1 at 500 ms", "1 at 375 ms"]),
        ("lossless", speculative.lossless_figure(tests),
         [f"chi-square {next(iter(tests.values())).chi_square:.1f}"]),
    ]


FIGURES = _figures()


@pytest.mark.parametrize("name, figure, numbers", FIGURES, ids=[f[0] for f in FIGURES])
def test_every_figure_says_what_it_shows_has_a_legend_and_readable_text(name, figure, numbers):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    from labkit.explorers.canvas import MIN_TEXT_PX, alt_text, figure_html

    text = alt_text(figure)
    assert text and all(number in text for number in numbers), (text, numbers)
    html = figure_html(figure)
    assert html.startswith('<img src="data:image/png;base64,') and 'alt="' in html
    FigureCanvasAgg(figure).draw()  # ticks exist once drawn
    small = {t.get_text(): round(t.get_fontsize() * figure.dpi / 72, 1) for t in figure.findobj(Text)
             if t.get_visible() and t.get_text().strip() and t.get_fontsize() * figure.dpi / 72 < MIN_TEXT_PX - 0.01}
    assert not small, f"text under {MIN_TEXT_PX} px: {small}"
    series = [line for axes in figure.axes for line in axes.get_lines() if not line.get_label().startswith("_")]
    if len(series) > 1 or name in ("genre", "scheme cost", "lossless", "emissions", "requests"):
        assert figure.legends or any(axes.get_legend() for axes in figure.axes), "colours without a legend"


def test_a_figure_without_a_text_shows_as_png_only_and_an_empty_text_is_refused():
    from matplotlib.figure import Figure

    from labkit.explorers.canvas import describe, figure_html

    assert figure_html(Figure()) is None  # IPython then leaves the HTML form out
    with pytest.raises(ValueError, match="non-empty string"):
        describe(Figure(), " ")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(ROOT / "notebooks")) for p in NOTEBOOKS])
def test_every_committed_picture_has_a_text_alternative(path):
    """Each PNG output carries an ``<img alt="...">`` HTML form (what JupyterLab, Colab and nbviewer show)."""
    import re

    notebook = json.loads(path.read_text(encoding="utf-8"))
    silent = []
    for index, cell in enumerate(notebook["cells"]):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/png" in data:
                alt = re.search(r'<img [^>]*alt="([^"]+)"', "".join(data.get("text/html", "")))
                if not alt or not alt.group(1).strip():
                    silent.append(f"cell {index}")
    assert not silent, f"pictures without a text alternative (rebuild the notebook with this labkit): {silent}"
