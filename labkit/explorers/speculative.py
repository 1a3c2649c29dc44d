"""Lab 07's simulator: acceptance rate, draft length and draft cost as sliders over Leviathan et al.'s closed forms.

Left panel: expected tokens per target call against gamma (the paper's curve and a popular formula's alpha * gamma + 1).
Right panel: expected walltime improvement against gamma, the optimum marked, the break-even line at 1, and measured
(gamma, speedup) points from real runs when given. Below: a strip of seeded simulated calls, each a row of accepted
(green), rejected (red), never examined (grey) and bonus (blue) tokens. Everything shown comes from
``labkit.core.speedup`` (the lossless test's bars from ``labkit.core.lossless``); :func:`compute` is pure,
:func:`render` updates artists created once.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from labkit.core import lossless, speedup, validation
from labkit.explorers import base as layout
from labkit.explorers.base import Explorer

MAX_GAMMA = 12
STRIP_CALLS = 12
COLOURS = {"accepted": "#2da44e", "rejected": "#cf222e", "unexamined": "#d0d7de", "bonus": "#0969da",
           "correction": "#8250df"}


@dataclass(frozen=True)
class SpeculativeView:
    """What the simulator shows for one setting."""

    alpha: float
    gamma: int
    cost_ratio: float
    varying: bool  # alpha decays by position (alpha, alpha * 0.9, ...)
    gammas: tuple[int, ...]  # 0..MAX_GAMMA
    tokens_per_call: tuple[float, ...]  # the paper's, per gamma
    popular_tokens_per_call: tuple[float, ...]  # the popular formula alpha * gamma + 1, per gamma
    improvement: tuple[float, ...]  # walltime improvement per gamma
    best_gamma: int
    break_even_alpha: float  # at this gamma and c
    strip: tuple[tuple[str, ...], ...]  # STRIP_CALLS rows of gamma + 1 cells
    simulated_tokens_per_call: float  # over the strip's seeded calls plus more (2,000 calls)
    simulated_standard_error: float


def position_alphas(alpha: float, gamma: int, varying: bool) -> list[float]:
    """Per-position acceptance: constant, or decaying by 10 % per position (drafts drift further from the target).

    >>> position_alphas(0.5, 3, False), [round(a, 3) for a in position_alphas(0.5, 3, True)]
    ([0.5, 0.5, 0.5], [0.5, 0.45, 0.405])
    """
    return [alpha * (0.9 ** i if varying else 1.0) for i in range(gamma)]


def compute(alpha: float, gamma: int, cost_ratio: float, varying: bool = False, seed: int = 0) -> SpeculativeView:
    """The curves, the optimum and a seeded strip of simulated calls for one setting of the sliders."""
    alpha = validation.real("alpha", alpha, min=0, max=1)
    gamma = validation.integer("gamma", gamma, min=0, max=MAX_GAMMA)
    cost_ratio = validation.real("cost_ratio", cost_ratio, min=0)
    gammas = tuple(range(MAX_GAMMA + 1))
    tokens = tuple(speedup.expected_tokens_varying(position_alphas(alpha, g, varying)) for g in gammas)
    improvement = tuple(t / (g * cost_ratio + 1) for t, g in zip(tokens, gammas))
    best = max(gammas, key=lambda g: (improvement[g], -g))
    simulation = speedup.simulate(position_alphas(alpha, gamma, varying), gamma, 2000,
                                  torch.Generator().manual_seed(seed))
    strip = []
    for accepted in simulation.accepted[:STRIP_CALLS].tolist():
        cells = ["accepted"] * accepted
        if accepted < gamma:
            cells += ["rejected"] + ["unexamined"] * (gamma - accepted - 1) + ["correction"]
        else:
            cells += ["bonus"]
        strip.append(tuple(cells))
    return SpeculativeView(alpha, gamma, cost_ratio, varying, gammas, tokens,
                           tuple(speedup.popular_expected_tokens(alpha, g) for g in gammas), improvement, best,
                           speedup.break_even_alpha(gamma, cost_ratio), tuple(strip), simulation.mean_tokens,
                           simulation.standard_error)


STRIP_WORDS = {"accepted": "accepted", "rejected": "rejected", "unexamined": "not examined",
               "correction": "correction", "bonus": "bonus"}


def alt_text(view: SpeculativeView, measured: Sequence[tuple[int, float]] = ()) -> str:
    """What the picture shows, in numbers: the setting, both panels at γ, the optimum, the strip's cell counts.

    >>> alt_text(compute(0.7, 4, 0.1)).split(". ")[0]
    'α 0.70, γ 4, c 0.10, same α everywhere'
    """
    g = view.gamma
    counts = {kind: sum(row.count(kind) for row in view.strip) for kind in STRIP_WORDS}
    strip = ", ".join(f"{counts[kind]} {words}" for kind, words in STRIP_WORDS.items() if counts[kind])
    points = ""
    if measured:
        points = " Measured runs (squares): " + ", ".join(f"γ {m[0]} at {m[1]:.2f}×" for m in measured) + "."
    return (f"α {view.alpha:.2f}, γ {g}, c {view.cost_ratio:.2f}, "
            f"{'α decaying by position' if view.varying else 'same α everywhere'}. Left: tokens per target call "
            f"against γ, the paper's {view.tokens_per_call[g]:.2f} at γ = {g} (circled) against the popular "
            f"formula's "
            f"{view.popular_tokens_per_call[g]:.2f} (dashed). Right: walltime improvement {view.improvement[g]:.2f}× "
            f"at γ = {g}, the optimum (star) {view.improvement[view.best_gamma]:.2f}× at γ = {view.best_gamma}, "
            f"break-even at 1×.{points} Below: {len(view.strip)} simulated calls, {strip} tokens.")


def summary_html(view: SpeculativeView) -> str:
    g = view.gamma
    rows = [
        ("tokens per call at γ = %d" % g,
         f"{view.tokens_per_call[g]:.4f} (popular formula αγ + 1: {view.popular_tokens_per_call[g]:.4f})"),
        ("simulated (2,000 calls)", f"{view.simulated_tokens_per_call:.4f} ± {view.simulated_standard_error:.4f}"),
        ("walltime improvement", f"{view.improvement[g]:.4f}×"),
        ("best γ here", f"{view.best_gamma} ({view.improvement[view.best_gamma]:.4f}×)"),
        ("break-even α at this γ, c", f"{view.break_even_alpha:.4f}"),
    ]
    body = "".join(f"<tr><td><b>{html.escape(k)}</b></td><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table style='font-family:monospace;font-size:12px'>{body}</table>"


TOKENS_LIMITS = (2.0, 4.0, 7.0, 14.0)  # y limits of the tokens panel (snapped up to the first that holds the curves)
SPEED_LIMITS = (1.5, 2.0, 3.0, 4.0, 6.0, 9.0, 14.0)  # y limits of the improvement panel


class SpeculativePlot:
    """Two line panels and a strip of simulated calls, blitted.

    The axes, ticks and legends are drawn once per pair of y limits into a cached background (limits snap to
    :data:`TOKENS_LIMITS` and :data:`SPEED_LIMITS`, so a handful of backgrounds serve every slider position); a
    move restores it and draws only the lines, the markers and the strip (one image, not 156 patches).
    """

    def __init__(self, width_in: float = 9.0, height_in: float = 4.6, dpi: int = 72):
        import numpy as np
        from matplotlib.colors import ListedColormap

        from matplotlib.patches import Patch

        from labkit.explorers.canvas import FigureCanvas, readable

        self.canvas = FigureCanvas(width_in, height_in, dpi)
        grid = self.canvas.figure.add_gridspec(2, 2, height_ratios=(3, 2))
        self.tokens_axes = self.canvas.figure.add_subplot(grid[0, 0])
        self.speed_axes = self.canvas.figure.add_subplot(grid[0, 1])
        self.strip_axes = self.canvas.figure.add_subplot(grid[1, :])
        xs = list(range(MAX_GAMMA + 1))
        # Animated artists are left out of the background and drawn by hand on every move.
        (self.paper_line,) = self.tokens_axes.plot(xs, xs, "o-", ms=3, color="#0969da", label="paper",
                                                   animated=True)
        (self.popular_line,) = self.tokens_axes.plot(xs, xs, "--", color="#cf222e", label="popular formula: αγ + 1",
                                                     animated=True)
        (self.tokens_marker,) = self.tokens_axes.plot([0], [0], "o", ms=8, mfc="none", color="black", animated=True)
        self.tokens_axes.set(xlabel="γ (drafts per call)", ylabel="tokens per target call")
        self.tokens_axes.legend(fontsize=8, loc="upper left")
        (self.speed_line,) = self.speed_axes.plot(xs, xs, "o-", ms=3, color="#0969da", label="improvement",
                                                  animated=True)
        (self.best_marker,) = self.speed_axes.plot([0], [0], "*", ms=14, color="#bf8700", label="optimum",
                                                   animated=True)
        (self.speed_marker,) = self.speed_axes.plot([0], [0], "o", ms=8, mfc="none", color="black", animated=True)
        (self.measured,) = self.speed_axes.plot([], [], "s", color="#8250df", label="measured runs", animated=True)
        self.speed_axes.axhline(1.0, color="#888888", lw=0.8)
        self.speed_axes.set(xlabel="γ", ylabel="walltime improvement (×)")
        self.speed_axes.legend(fontsize=8, loc="lower right")
        self.kinds = ("empty", *COLOURS)  # the strip's cell kinds, as indices into one colour map
        self.strip = self.strip_axes.imshow(np.zeros((STRIP_CALLS, MAX_GAMMA + 1)), vmin=0,
                                            vmax=len(self.kinds) - 1, cmap=ListedColormap(["white", *COLOURS.values()]),
                                            interpolation="nearest", aspect="auto", animated=True,
                                            extent=(0, MAX_GAMMA + 1, STRIP_CALLS, 0))
        self.strip_axes.set(xlim=(0, MAX_GAMMA + 1), ylim=(STRIP_CALLS, 0), xticks=[], yticks=[],
                            ylabel="simulated\ncalls")
        keys = [Patch(color=colour, label=STRIP_WORDS[kind]) for kind, colour in COLOURS.items()]
        self.strip_axes.legend(handles=keys,
                               ncols=len(COLOURS), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False,
                               handlelength=1.2, columnspacing=1.2)
        readable(self.canvas.figure)
        self.canvas.agg.draw()  # solve the constrained layout once; redraws keep it
        self.canvas.figure.set_layout_engine("none")

    def redraw(self, limits: tuple[float, float]) -> None:
        """Set these y limits and draw the animated artists over their background."""
        self.tokens_axes.set_ylim(0, limits[0])
        self.speed_axes.set_ylim(0, limits[1])
        self.canvas.blit(limits, [self.paper_line, self.popular_line, self.tokens_marker, self.speed_line,
                                  self.best_marker, self.speed_marker, self.measured, self.strip])


def render(plot: SpeculativePlot, view: SpeculativeView,
           measured: Sequence[tuple[int, float]] = ()) -> None:
    """Update every artist from ``view`` (and measured (gamma, speedup) points), then re-encode the image."""
    import numpy as np

    g = view.gamma
    plot.paper_line.set_ydata(view.tokens_per_call)
    plot.popular_line.set_ydata(view.popular_tokens_per_call)
    plot.tokens_marker.set_data([g], [view.tokens_per_call[g]])
    plot.speed_line.set_ydata(view.improvement)
    plot.best_marker.set_data([view.best_gamma], [view.improvement[view.best_gamma]])
    plot.speed_marker.set_data([g], [view.improvement[g]])
    plot.measured.set_data([m[0] for m in measured], [m[1] for m in measured])
    cells = np.zeros((STRIP_CALLS, MAX_GAMMA + 1))
    for row, kinds in enumerate(view.strip):
        cells[row, :len(kinds)] = [plot.kinds.index(kind) for kind in kinds]
    # Each cell as a 5 x 5 block whose last row and column stay white: a gap between cells, as in a table.
    blocks = np.repeat(np.repeat(cells, 5, axis=0), 5, axis=1)
    blocks[4::5, :] = 0
    blocks[:, 4::5] = 0
    plot.strip.set_data(blocks)
    tokens_top = max(view.popular_tokens_per_call[-1], view.tokens_per_call[-1]) * 1.05
    speed_top = max([*view.improvement, *(m[1] for m in measured)]) * 1.1
    plot.redraw((layout.nice_limit(tokens_top, TOKENS_LIMITS), layout.nice_limit(speed_top, SPEED_LIMITS)))
    plot.canvas.describe(alt_text(view, measured))


class SpeculativeExplorer(Explorer):
    """The simulator widget: α, γ and c sliders, a toggle for α that decays by position, the plot and numbers.

    ``measured`` is a list of ``(gamma, measured speedup)`` from real runs, drawn as points. ``controls`` holds
    ``alpha``, ``gamma``, ``cost`` and ``mode`` (also attributes of the same names).
    """

    title = "speculative-decoding simulator"

    def __init__(self, alpha: float = 0.7, gamma: int = 4, cost_ratio: float = 0.1,
                 measured: Sequence[tuple[int, float]] = ()):
        import ipywidgets as widgets

        style, width = layout.description_style(), layout.full_width
        self.alpha = widgets.FloatSlider(value=alpha, min=0.0, max=1.0, step=0.01, description="α (accept)",
                                         style=style, layout=width())
        self.gamma = widgets.IntSlider(value=gamma, min=0, max=MAX_GAMMA, description="γ (drafts)", style=style,
                                       layout=width())
        self.cost = widgets.FloatSlider(value=cost_ratio, min=0.0, max=1.0, step=0.01, description="c (cost)",
                                        style=style, layout=width())
        # Two buttons of 170 px fill the 360 px column (ToggleButtons add a few px of margin each).
        self.mode = widgets.ToggleButtons(options=[("same α everywhere", False), ("α decays by position", True)],
                                          value=False, style={"button_width": "170px"}, layout=width())
        self.controls = {"alpha": self.alpha, "gamma": self.gamma, "cost": self.cost, "mode": self.mode}
        self.numbers = layout.html_block()
        self.measured_points = list(measured)
        self.plot = SpeculativePlot()
        self.canvas = self.plot.canvas
        for control in self.controls.values():
            control.observe(self.update, names="value")
        self.update()
        self.widget = widgets.VBox([
            layout.row([layout.column([self.alpha, self.gamma, self.cost, self.mode]),
                        layout.figure_image(self.canvas)]),
            self.numbers,
        ], layout=widgets.Layout(width="100%"))

    def update(self, change: object = None) -> None:
        self.view = compute(self.alpha.value, self.gamma.value, self.cost.value, self.mode.value)
        render(self.plot, self.view, self.measured_points)
        self.numbers.value = summary_html(self.view)


def speculative_explorer(alpha: float = 0.7, gamma: int = 4, cost_ratio: float = 0.1,
                         measured: Sequence[tuple[int, float]] = ()) -> SpeculativeExplorer:
    """The lab 07 simulator."""
    return SpeculativeExplorer(alpha, gamma, cost_ratio, measured)


# ---------------------------------------------------------------------------------------------------------------
# A still picture (no widget): the counting test's verdict on each acceptance rule

CRITICAL_P, CRITICAL_Z = 1e-4, 4.0  # a rule fails when p < 1e-4 (chi-square) or |z| > 4 (tokens per call)


def lossless_figure(results: dict) -> object:
    """Each rule's chi-square (log scale, the critical value at p = 1e-4 dashed) and its tokens-per-call z-score
    (the band |z| <= 4 shaded), from ``{name: lossless.LosslessTest}``; a bar is green where it passes that test.

    >>> tables = lossless.random_markov_pair(3, torch.Generator().manual_seed(0))
    >>> result = lossless.lossless_test(*tables, 2, 50, torch.Generator().manual_seed(1), n_tokens=1)
    >>> len(lossless_figure({"exact": result}).axes)
    2
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import NullFormatter

    from labkit.explorers.canvas import describe, readable

    names = list(results)

    def colours(passed: list[bool]) -> list[str]:
        return [COLOURS["accepted"] if ok else COLOURS["rejected"] for ok in passed]

    rows = list(range(len(names)))[::-1]  # the first rule on top
    figure = Figure(figsize=(9.0, 0.45 * len(names) + 1.2), dpi=80, layout="constrained")
    chi_axes, z_axes = figure.subplots(1, 2, sharey=True)
    chi_axes.barh(rows, [max(results[name].chi_square, 0.1) for name in names],
                  color=colours([results[name].p_value > CRITICAL_P for name in names]))
    dof = results[names[0]].degrees_of_freedom
    critical = _critical_chi_square(dof)
    chi_axes.axvline(critical, color="black", linestyle="--", linewidth=1)
    chi_axes.xaxis.set_minor_formatter(NullFormatter())  # labels at the decades only (minor ones overlap)
    chi_axes.set(xscale="log", yticks=rows, yticklabels=names, xlabel=f"chi-square, {dof} degrees of freedom (log)",
                 title=f"distribution: fails right of {critical:.1f}")
    z_axes.barh(rows, [results[name].tokens_per_call_z for name in names],
                color=colours([abs(results[name].tokens_per_call_z) < CRITICAL_Z for name in names]))
    z_axes.axvspan(-CRITICAL_Z, CRITICAL_Z, color="#d0d7de", alpha=0.6, linewidth=0, zorder=0)
    z_axes.axvline(0, color="black", linewidth=0.8)
    z_axes.set(xlabel="tokens per call: z-score against exact", title="speed: fails outside |z| <= 4")
    figure.legend(handles=[Patch(color=COLOURS["accepted"], label="passes that test"),
                           Patch(color=COLOURS["rejected"], label="fails it")], loc="outside lower center", ncols=2)

    def verdicts(result: Any) -> str:
        chi = "passes" if result.p_value > CRITICAL_P else "fails"
        z = "passes" if abs(result.tokens_per_call_z) < CRITICAL_Z else "fails"
        return f"chi-square {result.chi_square:.1f} ({chi}), z {result.tokens_per_call_z:+.1f} ({z})"

    said = "; ".join(f"{name}: {verdicts(results[name])}" for name in names)
    return describe(readable(figure), "Each acceptance rule's counting test, two panels of bars, green where it "
                    f"passes and red where it fails: chi-square with {dof} degrees of freedom (log scale, fails right "
                    f"of {critical:.1f}, dashed) and the tokens-per-call z-score (fails outside |z| <= 4, shaded). "
                    f"{said}.")


def _critical_chi_square(dof: int) -> float:
    """The chi-square whose upper-tail p value is :data:`CRITICAL_P` (bisection on the core's p value)."""
    low, high = 0.0, 10.0 * dof + 100.0
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if lossless.chi_square_p_value(middle, dof) > CRITICAL_P else (low, middle)
    return high
