"""Lab 02's pictures: per-token surprisal as coloured text, and the perplexity charts.

``surprisal_html`` returns an HTML string (no widget): each token is a span whose background grows redder with
its surprisal, with the exact value on hover. The charts are matplotlib Figures drawn without pyplot (no global
state) and shown as PNG images. The numbers come from ``labkit.core.loss``; nothing here computes a loss.
"""

from __future__ import annotations

import html
import math
from typing import Any, Sequence

from matplotlib.figure import Figure

from labkit.explorers.canvas import describe, figure_png, plain, readable


def token_strings(tokenizer: Any, token_ids: Sequence[int]) -> list[str]:
    """Each token decoded on its own (a character split across tokens shows as a replacement mark)."""
    return [tokenizer.decode([int(token)]) for token in token_ids]


def _background(surprisal_bits: float, max_bits: float) -> str:
    """White at 0 bits to saturated red at ``max_bits`` and above; grey when the value is unknown."""
    if math.isnan(surprisal_bits):
        return "#e8e8e8"
    strength = min(max(surprisal_bits / max_bits, 0.0), 1.0)
    fade = round(255 * (1 - 0.85 * strength))
    return f"rgb(255,{fade},{fade})"


def surprisal_html(tokens: Sequence[str], surprisal_bits: Sequence[float], max_bits: float = 12.0,
                   cut: Sequence[bool] | None = None) -> str:
    """Coloured text: one span per token, redder for more surprising tokens; ``cut`` tokens are outlined.

    >>> surprisal_html(["Hi", " there"], [0.0, 12.0]).count("<span")
    2
    """
    if len(tokens) != len(surprisal_bits):
        raise ValueError(f"tokens and surprisal_bits must have the same length, got {len(tokens)} and "
                         f"{len(surprisal_bits)}")
    if not max_bits > 0:
        raise ValueError(f"max_bits must be > 0, got {max_bits!r}")
    spans = []
    for number, (token, bits) in enumerate(zip(tokens, surprisal_bits)):
        bits = float(bits)
        tip = "not scored (nothing predicts the first token)" if math.isnan(bits) else f"{bits:.2f} bits"
        outline = ";outline:2px solid #000" if cut is not None and cut[number] else ""
        if cut is not None and cut[number]:
            tip += " - cut by truncation: probability 0"
        text = html.escape(token).replace("\n", "&#8629;<br>")
        spans.append(f'<span title="{tip}" style="background:{_background(bits, max_bits)}{outline}">{text}</span>')
    legend = (f'<div style="margin-top:6px;font-size:85%">white = 0 bits (certain) &rarr; red = {max_bits:g}+ bits'
              f'{"; outlined = cut by truncation (probability 0)" if cut is not None else ""}; hover for values</div>')
    return ('<div style="font-family:monospace;white-space:pre-wrap;line-height:1.6">' + "".join(spans) + "</div>"
            + legend)


def png(figure: Figure) -> bytes:
    """The figure as PNG bytes, without its text alternative: show the figure itself (``display(figure)``)."""
    return figure_png(figure)


def genre_figure(perplexities: dict[str, float], branching: dict[str, float]) -> Figure:
    """Bars of perplexity per genre, next to exp(mean entropy), the branching factor of the model's own guesses."""
    figure = Figure(figsize=(8, 3.4), dpi=96, layout="constrained")
    axes = figure.add_subplot()
    names = list(perplexities)
    positions = range(len(names))
    axes.bar([p - 0.2 for p in positions], [perplexities[n] for n in names], width=0.4, label="perplexity of the text")
    axes.bar([p + 0.2 for p in positions], [branching[n] for n in names], width=0.4,
             label="exp(mean entropy) of the model's predictions")
    axes.set_xticks(list(positions), names)
    axes.set_yscale("log")
    axes.set_ylabel("effective number of choices")
    axes.legend(fontsize=8)
    pairs = "; ".join(f"{name} {plain(perplexities[name])} against {plain(branching[name])}" for name in names)
    return describe(readable(figure), "Bars per genre, log scale: the perplexity of the text against exp(mean "
                    f"entropy) of the model's predictions: {pairs}.")


def temperature_figure(temperatures: Sequence[float], perplexities: Sequence[float]) -> Figure:
    """Perplexity of the reference text against the temperature applied to the model's logits."""
    figure = Figure(figsize=(6, 3.2), dpi=96, layout="constrained")
    axes = figure.add_subplot()
    axes.plot(list(temperatures), list(perplexities), marker="o")
    axes.axvline(1.0, color="grey", linestyle=":", linewidth=1)
    axes.set_xlabel("temperature T")
    axes.set_ylabel("perplexity of the text")
    axes.set_yscale("log")
    points = list(zip(temperatures, perplexities))
    best_t, best = min(points, key=lambda point: point[1])
    listed = ", ".join(f"T = {plain(t)}: {plain(p)}" for t, p in points)
    return describe(readable(figure), "Perplexity of the text (log scale) against the temperature T, a dotted line "
                    f"at T = 1: lowest {plain(best)} at T = {plain(best_t)}; {listed}.")
