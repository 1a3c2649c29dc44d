"""Lab 03's picture of the floating-point formats: how far apart neighbouring values sit, at every magnitude.

Drawn from :mod:`labkit.core.numerics` (each format's gaps derived from its exponent and mantissa bits); no model
and no widget. Left out: the integer grids, whose gap is one scale everywhere.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from labkit.core import numerics
from labkit.explorers.canvas import describe, plain, readable

FORMATS = ("fp32", "bf16", "fp16", "fp8_e5m2", "fp8_e4m3")


def spacing_figure(formats: Sequence[str] = FORMATS, mark: float | None = 1000.0, lowest_log2: int = -30,
                   highest_log2: int = 20, title: str = "how far apart neighbouring values sit") -> Any:
    """Log-log, per format: the gap from |x| to the next value, relative to |x|, for |x| in [2^lowest, 2^highest].

    Within a binade the relative gap falls from 2^-m to about 2^-(m+1) (a sawtooth: m mantissa bits); below the
    smallest normal it climbs (subnormals keep a fixed absolute gap). A dot marks a format's largest value when
    it lies in the window (FP32's and BF16's, about 3.4e38, lie far to the right); ``mark`` draws a dotted line.

    >>> figure = spacing_figure(("fp16", "bf16"), mark=None)
    >>> [line.get_label() for line in figure.axes[0].get_lines()]  # bf16's largest value is off the window
    ['fp16', '_largest', 'bf16']
    """
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 3.6), dpi=80, layout="constrained")
    axes = figure.add_subplot()
    said = []  # per format, what the text alternative says about its line
    for name in formats:
        fmt = numerics.float_format(name)
        lowest = max(math.log2(fmt.smallest_subnormal), lowest_log2)
        highest = min(math.log2(fmt.max), highest_log2)
        magnitudes = torch.logspace(lowest, highest, 6000, base=2.0, dtype=torch.float64)
        relative = numerics.spacing(magnitudes, name) / magnitudes
        (line,) = axes.plot(magnitudes.tolist(), relative.tolist(), label=name, linewidth=1.2)
        if math.log2(fmt.max) <= highest_log2:
            axes.plot([fmt.max], [float(relative[-1])], marker="o", color=line.get_color(), label="_largest")
        normal = relative[magnitudes >= fmt.smallest_normal]
        words = f"{name} between {plain(float(normal.min()))} and {plain(float(normal.max()))}"
        if fmt.smallest_normal > 2.0**lowest_log2:
            words += f", climbing below {plain(fmt.smallest_normal)}"
        if math.log2(fmt.max) <= highest_log2:
            words += f", largest value {plain(fmt.max)} (dot)"
        said.append(words)
    if mark is not None:
        axes.axvline(mark, linestyle=":", color="grey")
        axes.annotate(f"|x| = {mark:g}", (mark, 0.3), xytext=(4, 0), textcoords="offset points", fontsize=8,
                      color="grey", xycoords=("data", "axes fraction"))
    axes.set(xscale="log", yscale="log", xlim=(2.0**lowest_log2, 2.0**highest_log2), xlabel="|x|",
             ylabel="gap to the next value / |x|", title=title)
    axes.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 0.2), ncols=3)  # between FP32 and BF16
    marked = f"; a dotted line at |x| = {mark:g}" if mark is not None else ""
    return describe(readable(figure), f"{title}: the gap from |x| to the next value, relative to |x|, for |x| from "
                    f"2^{lowest_log2} to 2^{highest_log2} (log-log), one line per format: " + "; ".join(said)
                    + marked + ".")


__all__ = ["FORMATS", "spacing_figure"]
