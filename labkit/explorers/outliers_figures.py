"""Lab 04's static picture: what each quantization scheme costs in perplexity (layer 3, explorers).

A plain matplotlib figure of ratios the runtime measured (``labkit.runtime.scoring``); the notebook shows it as an
image with its text alternative. The outlier visualizer itself is in :mod:`labkit.explorers.outliers`.
"""

from __future__ import annotations

import re
from typing import Any

from labkit.explorers.canvas import describe, readable

# A scheme's group, read from the start of its label: what it quantizes. An "A8 ..." scheme keeps lab 04's INT8
# weights (per channel) and adds INT8 activations at some Linears only, so its weights are quantized too.
GROUPS = (("weights and activations", re.compile(r"W\d+A\d+"), "tab:orange"),
          ("weights, and some Linears' activations", re.compile(r"A\d+"), "tab:green"),
          ("weights only", re.compile(r"W\d+"), "tab:blue"))
OTHER = ("other", "tab:grey")


def scheme_group(label: str) -> tuple[str, str]:
    """(group, colour) of a scheme from its label: ``W8A8 ...``, ``A8 ...``, ``W4 ...``, else other.

    >>> [scheme_group(label)[0] for label in ("W8A8 per token", "A8 per tensor, down_proj", "W4 group 32", "fp16")]
    ['weights and activations', "weights, and some Linears' activations", 'weights only', 'other']
    """
    for name, pattern, colour in GROUPS:
        if pattern.match(label):
            return name, colour
    return OTHER


def scheme_cost_figure(ratios: dict[str, float], baseline: float, n_tokens: int,
                       intervals: dict[str, tuple[float, float]] | None = None) -> Any:
    """Horizontal bars of perplexity / baseline per scheme (log scale, from 1), coloured by what the scheme
    quantizes, each labelled with its change; ``intervals`` (``{label: (low, high)}`` ratios) draws error bars.
    The legend sits below the axes, where it covers no bar and no label.

    >>> figure = scheme_cost_figure({"W8 per channel": 1.01, "W8A8 per token": 0.98}, 70.68, 128)
    >>> [text.get_text() for text in figure.legends[0].get_texts()]
    ['weights only', 'weights and activations']
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    if not ratios:
        raise ValueError("ratios must name at least one scheme: {label: perplexity / baseline}")
    intervals = intervals or {}
    unknown = set(intervals) - set(ratios)
    if unknown:
        raise ValueError(f"intervals name schemes that ratios does not: {sorted(unknown)}")
    labels = list(ratios)
    groups = [scheme_group(label) for label in labels]
    figure = Figure(figsize=(7.5, 0.8 + 0.3 * len(labels) + 0.9), dpi=80, layout="constrained")
    axes = figure.add_subplot()
    errors = None
    if intervals:
        errors = [[ratios[label] - intervals.get(label, (ratios[label],) * 2)[0] for label in labels],
                  [intervals.get(label, (ratios[label],) * 2)[1] - ratios[label] for label in labels]]
    axes.barh(labels, [ratios[label] - 1 for label in labels], left=1, color=[colour for _, colour in groups])
    if errors is not None:
        axes.errorbar([ratios[label] for label in labels], range(len(labels)), xerr=errors, fmt="none",
                      ecolor="black", elinewidth=1, capsize=3)
    for row, label in enumerate(labels):
        high = intervals.get(label, (ratios[label],) * 2)[1]
        axes.annotate(f"{ratios[label] - 1:+.1%}", (max(ratios[label], high, 1), row), xytext=(4, 0),
                      textcoords="offset points", va="center")
    axes.axvline(1, color="grey", linewidth=0.8)
    axes.invert_yaxis()
    axes.set_xscale("log")
    top = max(5.0, max([*ratios.values(), *(high for _, high in intervals.values())]) * 1.25)
    ticks = [tick for tick in (1, 1.5, 2, 3, 4, 6, 8, 10, 20, 50, 100) if tick <= top]
    axes.set_xticks(ticks, labels=[f"{tick:g}" for tick in ticks])
    axes.set_xticks([], minor=True)
    axes.set(xlim=(min(0.9, min(ratios.values()) * 0.95), top),
             xlabel=f"perplexity / baseline ({baseline:.2f}), log scale",
             title=f"What each scheme costs, {n_tokens} tokens of the evaluation text")
    seen = list(dict.fromkeys(groups))
    figure.legend(handles=[Patch(color=colour, label=name) for name, colour in seen], loc="outside lower center",
                  ncol=len(seen), frameon=False)

    def said(label: str) -> str:
        words = f"{label} {ratios[label] - 1:+.1%}"
        if label in intervals:
            low, high = intervals[label]
            words += f" ({low - 1:+.1%} to {high - 1:+.1%})"
        return words

    by_group = "; ".join(f"{name}: " + ", ".join(said(label) for label, group in zip(labels, groups)
                                                 if group[0] == name) for name, _ in seen)
    interval_words = ", with paired intervals in brackets" if intervals else ""
    return describe(readable(figure), f"Perplexity change of each quantization scheme against the baseline "
                    f"{baseline:.2f}, {n_tokens} tokens scored, bars on a log scale{interval_words}. {by_group}.")
