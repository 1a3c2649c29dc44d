"""Lab 06's latency explorer (layer 3, explorers: widgets, ``compute`` over a fitted latency model, ``render``).

The explorer turns a :class:`labkit.core.latency_model.LatencyModel` calibrated from the learner's own
measurements into predicted TTFT, TPOT, E2E and throughput for any prompt length, output length and batch size,
with the measured points laid over the curves where they were measured. Given the fit itself (a
:class:`~labkit.core.latency_model.LatencyFit`) it also shows where it extrapolates: the batch sizes outside the
measured ones are shaded, and the text names every prompt length, batch size or context the prediction reads
beyond what was measured. The model is fitted once, before the widget exists; a slider move runs :func:`compute`
(a few dozen multiplications) and :func:`render` (lines moved in place). The lab's static pictures (roofline,
cached vs uncached steps, emissions, batched requests) are in :mod:`labkit.explorers.timing_figures`.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any, Sequence

from labkit.core import validation
from labkit.core.latency_model import LatencyFit, LatencyModel, LatencyPrediction
from labkit.explorers import base as layout
from labkit.explorers.base import Explorer
from labkit.explorers.canvas import FigureCanvas, plain, readable


@dataclass(frozen=True)
class MeasuredPoint:
    """One measured setting: medians of the requests of a batch (seconds)."""

    prompt_len: int
    output_len: int
    batch_size: int
    ttft_s: float
    tpot_s: float | None
    e2e_s: float
    tokens_per_s: float  # output tokens of the whole batch per second


def points_from_batches(batch_points: Sequence[Any], prompt_len: int, output_len: int) -> tuple[MeasuredPoint, ...]:
    """MeasuredPoints from ``labkit.runtime.sweeps.batching_sweep``'s results (read by attribute)."""
    return tuple(MeasuredPoint(prompt_len, output_len, p.batch_size, p.ttft_s, p.tpot_s, p.e2e_s, p.tokens_per_s)
                 for p in batch_points)


@dataclass(frozen=True)
class TimingView:
    """What the explorer shows for one setting."""

    prompt_len: int
    output_len: int
    batch_size: int
    prediction: LatencyPrediction  # at the chosen batch size
    batch_sizes: tuple[int, ...]  # the x axis of the curves
    ttft_curve_s: tuple[float, ...]
    e2e_curve_s: tuple[float, ...]
    throughput_curve: tuple[float, ...]  # tokens/s
    measured: tuple[MeasuredPoint, ...]  # the measured points at this prompt and output length
    measured_at: tuple[tuple[int, int], ...]  # (prompt_len, output_len) of every measured setting
    extrapolated: tuple[str, ...] = ()  # what the prediction reads beyond the measured range (a fit given)
    fitted_batches: tuple[int, int] | None = None  # (smallest, largest) batch measured, when a fit was given


def compute(latency: LatencyModel | LatencyFit, prompt_len: int, output_len: int, batch_size: int = 1,
            measured: Sequence[MeasuredPoint] = (), max_batch: int = 16) -> TimingView:
    """Predictions at one setting and along the batch axis, and the measurements that match the setting.

    ``latency`` is a LatencyModel, or a LatencyFit (its model, and the range it was measured over).

    >>> latency = LatencyModel(0.01, 0.001, 0.05, 0.005, 0.0)
    >>> view = compute(latency, prompt_len=10, output_len=3, batch_size=2, max_batch=4)
    >>> round(view.prediction.e2e_s, 6)  # TTFT 0.01 + 10 x 2 x 0.001, then 2 steps of 0.05 + 2 x 0.005
    0.15
    >>> [round(x, 1) for x in view.throughput_curve]  # 3b tokens / (0.11 + 0.02 b) s
    [23.1, 40.0, 52.9, 63.2]
    """
    validation.instance("latency", latency, (LatencyModel, LatencyFit),
                        "a labkit.core.latency_model.LatencyModel or LatencyFit")
    fit = latency if isinstance(latency, LatencyFit) else None
    latency = fit.latency if fit is not None else latency
    max_batch = validation.integer("max_batch", max_batch, min=1)
    batch_size = validation.integer("batch_size", batch_size, min=1, max=max_batch)
    predictions = [latency.predict(prompt_len, output_len, b) for b in range(1, max_batch + 1)]
    matching = tuple(p for p in measured if (p.prompt_len, p.output_len) == (prompt_len, output_len))
    return TimingView(
        prompt_len, output_len, batch_size, predictions[batch_size - 1], tuple(range(1, max_batch + 1)),
        tuple(p.ttft_s for p in predictions), tuple(p.e2e_s for p in predictions),
        tuple(p.tokens_per_s for p in predictions), matching,
        tuple(sorted({(p.prompt_len, p.output_len) for p in measured})),
        () if fit is None else fit.extrapolations(prompt_len, output_len, batch_size),
        None if fit is None else fit.batch_sizes)


_TERM_UNITS = {"per cached token": ("µs", 1e6)}  # every other coefficient in ms


def _coefficient(name: str, value: float, error: float, identifiable: bool) -> str:
    unit, scale = _TERM_UNITS.get(name, ("ms", 1e3))
    if not identifiable:
        spread = "± inf (not identifiable from these points)"
    elif math.isnan(error):
        spread = "± ? (no point left over to estimate it)"
    else:
        spread = f"± {error * scale:,.2f}"
    return f"  {name:<17}{value * scale:>9,.2f} {unit}  {spread}"


def fit_table(fit: LatencyFit) -> str:
    """A calibrated fit as text: every coefficient with its standard error, and the range it was measured over.

    >>> from labkit.core.latency_model import fit_latency
    >>> print(fit_table(fit_latency([(8, 1, 0.11), (64, 1, 0.18), (512, 1, 0.76)], [(1, 9, 0.07), (3, 9, 0.08)])))
    prefill (3 points, 8 to 512 prompt tokens):
      fixed                99.23 ms  ± 1.03
      per prompt token      1.28 ms  ± 0.01
    decode step (2 points, batches 1 to 3, 9 to 9 cached tokens):
      fixed                65.00 ms  ± ? (no point left over to estimate it)
      per sequence          5.00 ms  ± inf (not identifiable from these points)
      per cached token      0.00 µs  ± inf (not identifiable from these points)
    """
    validation.instance("fit", fit, LatencyFit, "a labkit.core.latency_model.LatencyFit")
    rows = []
    for label, part, where in [
        ("prefill", fit.prefill, f"{fit.prefill_tokens[0]:,} to {fit.prefill_tokens[1]:,} prompt tokens"),
        ("decode step", fit.decode, f"batches {fit.batch_sizes[0]} to {fit.batch_sizes[1]}, "
                                    f"{fit.context_lens[0]:,.0f} to {fit.context_lens[1]:,.0f} cached tokens"),
    ]:
        rows.append(f"{label} ({part.n_points} points, {where}):")
        rows += [_coefficient(*term) for term in zip(part.names, part.coefficients, part.standard_errors,
                                                     part.identifiable)]
    return "\n".join(rows)


def _ms(seconds: float | None) -> str:
    return "unavailable (one token)" if seconds is None else f"{seconds * 1e3:,.1f} ms"


def summary_html(view: TimingView) -> str:
    """The predicted numbers at the chosen setting, and the measured ones when this setting was measured."""
    p = view.prediction
    lines = [f"<b>predicted</b> (batch {view.batch_size}, prompt {view.prompt_len}, {view.output_len} new tokens):",
             f"TTFT {_ms(p.ttft_s)} &middot; TPOT {_ms(p.tpot_s)} &middot; E2E {_ms(p.e2e_s)} "
             f"&middot; {p.tokens_per_s:,.1f} tokens/s over the batch"]
    here = [m for m in view.measured if m.batch_size == view.batch_size]
    if here:
        m = here[0]
        lines.append(f"<b>measured</b>: TTFT {_ms(m.ttft_s)} &middot; TPOT {_ms(m.tpot_s)} &middot; E2E "
                     f"{_ms(m.e2e_s)} &middot; {m.tokens_per_s:,.1f} tokens/s (E2E predicted / measured = "
                     f"{p.e2e_s / m.e2e_s:.2f})")
    elif view.measured:
        lines.append(f"measured at this prompt and output length for batches "
                     f"{', '.join(str(m.batch_size) for m in sorted(view.measured, key=lambda m: m.batch_size))}")
    elif view.measured_at:
        settings = "; ".join(f"prompt {a}, {b} new tokens" for a, b in view.measured_at)
        lines.append(f"measured points exist at {html.escape(settings)}")
    if view.extrapolated:
        lines.append('<span style="color:#b35900"><b>extrapolated</b>: '
                     f"{html.escape('; '.join(view.extrapolated))}: trust this less</span>")
    elif view.fitted_batches is not None:
        lines.append("inside the measured range")
    return f'<div style="font-size:12px;line-height:1.5">{"<br>".join(lines)}</div>'


class TimingFigure:
    """Per-request latency and batch throughput against batch size, blitted.

    The axes, ticks and legends are drawn once per pair of y limits (snapped by :func:`layout.nice_limit`, so a
    handful of backgrounds serve every slider position) and cached; a move restores one and draws only the
    curves, the measured markers and the batch cursor.
    """

    def __init__(self, max_batch: int, width_in: float = 6.4, height_in: float = 3.3, dpi: int = 80,
                 fitted_batches: tuple[int, int] | None = None):
        self.canvas = FigureCanvas(width_in, height_in, dpi, layout=None)
        self.latency, self.throughput = self.canvas.figure.subplots(1, 2)
        # The batch sizes the fit never measured, shaded (static: part of the cached background).
        ends = [] if fitted_batches is None else [(0.5, fitted_batches[0] - 0.5),
                                                  (fitted_batches[1] + 0.5, max_batch + 0.5)]
        self.outside_batches = [(low, high) for low, high in ends if high > low]
        self.outside = [axes.axvspan(low, high, color="#e8e8e8", zorder=0,
                                     label="not measured" if axes is self.throughput and number == 0 else None)
                        for axes in (self.latency, self.throughput)
                        for number, (low, high) in enumerate(self.outside_batches)]
        kw = {"animated": True}
        self.e2e_line, = self.latency.plot([], [], color="#4c72b0", label="E2E (predicted)", **kw)
        self.ttft_line, = self.latency.plot([], [], color="#dd8452", label="TTFT (predicted)", **kw)
        self.e2e_dots, = self.latency.plot([], [], "o", color="#4c72b0", label="E2E (measured)", **kw)
        self.ttft_dots, = self.latency.plot([], [], "s", color="#dd8452", label="TTFT (measured)", **kw)
        self.tput_line, = self.throughput.plot([], [], color="#55a868", label="predicted", **kw)
        self.tput_dots, = self.throughput.plot([], [], "o", color="#55a868", label="measured", **kw)
        self.cursors = [axes.axvline(1, color="grey", linestyle=":", **kw) for axes in (self.latency, self.throughput)]
        self.latency.set(xlabel="batch size", ylabel="seconds per request", xlim=(0.5, max_batch + 0.5))
        self.throughput.set(xlabel="batch size", ylabel="output tokens/s (batch)", xlim=(0.5, max_batch + 0.5))
        # One key for both panels, under them (inside, it covered the curves); the cursor is the chosen batch.
        handles = [self.e2e_line, self.ttft_line, self.tput_line, self.e2e_dots, self.ttft_dots, self.tput_dots]
        labels = ["E2E, predicted", "TTFT, predicted", "tokens/s, predicted", "E2E, measured", "TTFT, measured",
                  "tokens/s, measured"]
        if self.outside:
            handles.append(self.outside[0])
            labels.append("batch sizes not measured")
        self.canvas.figure.legend(handles, labels, loc="lower center", ncols=3, frameon=False, handlelength=1.5,
                                  columnspacing=1.0, borderaxespad=0.2)
        readable(self.canvas.figure)
        bottom = 0.46 if self.outside else 0.4
        self.canvas.figure.subplots_adjust(left=0.1, right=0.98, bottom=bottom, top=0.97, wspace=0.34)

    def redraw(self, limits: tuple[float, float]) -> None:
        """Set these y limits and draw the moving artists over their background."""
        self.latency.set_ylim(0, limits[0])
        self.throughput.set_ylim(0, limits[1])
        self.canvas.blit(limits, [self.e2e_line, self.ttft_line, self.e2e_dots, self.ttft_dots, self.tput_line,
                                  self.tput_dots, *self.cursors])


def render(figure: TimingFigure, view: TimingView) -> None:
    """Move the curves, the measured markers and the batch cursor; snap the y limits; refresh the image."""
    xs = view.batch_sizes
    figure.e2e_line.set_data(xs, view.e2e_curve_s)
    figure.ttft_line.set_data(xs, view.ttft_curve_s)
    figure.tput_line.set_data(xs, view.throughput_curve)
    measured = sorted(view.measured, key=lambda m: m.batch_size)
    figure.e2e_dots.set_data([m.batch_size for m in measured], [m.e2e_s for m in measured])
    figure.ttft_dots.set_data([m.batch_size for m in measured], [m.ttft_s for m in measured])
    figure.tput_dots.set_data([m.batch_size for m in measured], [m.tokens_per_s for m in measured])
    for cursor in figure.cursors:
        cursor.set_xdata([view.batch_size, view.batch_size])
    top_latency = max([*view.e2e_curve_s, *(m.e2e_s for m in measured)])
    top_tput = max([*view.throughput_curve, *(m.tokens_per_s for m in measured)])
    figure.redraw((layout.nice_limit(top_latency * 1.1), layout.nice_limit(top_tput * 1.1)))


def alt_text(view: TimingView) -> str:
    """What the picture shows, in numbers: the setting, both panels' predictions at the cursor and along the batch
    axis, the measured points, the shaded range.

    >>> latency = LatencyModel(0.01, 0.001, 0.05, 0.005, 0.0)
    >>> alt_text(compute(latency, prompt_len=10, output_len=3, batch_size=2, max_batch=4)).split(". ")[0]
    '10 prompt tokens, 3 new tokens, batch 2 (dotted line)'
    """
    b, p, xs = view.batch_size, view.prediction, view.batch_sizes
    measured = sorted(view.measured, key=lambda m: m.batch_size)
    dots = ("; measured at this setting: " + ", ".join(
        f"batch {m.batch_size} E2E {plain(m.e2e_s)} s, TTFT {plain(m.ttft_s)} s, {plain(m.tokens_per_s)} tokens/s"
        for m in measured)) if measured else "; nothing measured at this setting"
    shaded = ""
    if view.fitted_batches is not None:
        shaded = f" Shaded: batch sizes outside the measured {view.fitted_batches[0]} to {view.fitted_batches[1]}."
    return (f"{view.prompt_len} prompt tokens, {view.output_len} new tokens, batch {b} (dotted line). Left: seconds "
            f"per request against batch size {xs[0]} to {xs[-1]}, predicted E2E {plain(p.e2e_s)} s and TTFT "
            f"{plain(p.ttft_s)} s at batch {b} (E2E {plain(view.e2e_curve_s[0])} s at batch {xs[0]}, "
            f"{plain(view.e2e_curve_s[-1])} s at {xs[-1]}). Right: output tokens per second of the batch, predicted "
            f"{plain(p.tokens_per_s)} at batch {b} ({plain(view.throughput_curve[0])} at {xs[0]}, "
            f"{plain(view.throughput_curve[-1])} at {xs[-1]}){dots}.{shaded}")


class TimingExplorer(Explorer):
    """Prompt length, output length and batch size sliders over a calibrated latency model."""

    title = "latency explorer"

    def __init__(self, latency: LatencyModel | LatencyFit, measured: Sequence[MeasuredPoint] = (), prompt_len: int = 32,
                 output_len: int = 16, max_batch: int = 16):
        import ipywidgets as widgets

        self.latency, self.measured, self.max_batch = latency, tuple(measured), max_batch
        style = layout.description_style(96)
        self.controls = {
            "prompt_len": widgets.IntSlider(value=prompt_len, min=1, max=1024, description="prompt tokens",
                                            style=style, layout=layout.full_width()),
            "output_len": widgets.IntSlider(value=output_len, min=1, max=256, description="new tokens",
                                            style=style, layout=layout.full_width()),
            "batch_size": widgets.IntSlider(value=1, min=1, max=max_batch, description="batch size", style=style,
                                            layout=layout.full_width()),
        }
        self.text = layout.html_block()
        self.figure = TimingFigure(max_batch, fitted_batches=latency.batch_sizes if isinstance(latency, LatencyFit)
                                   else None)
        self.canvas = self.figure.canvas
        for control in self.controls.values():
            control.observe(self.update, names="value")
        self.update()
        c = self.controls
        self.widget = widgets.VBox([
            layout.row([layout.column([c["prompt_len"], c["output_len"], c["batch_size"]]),
                        layout.figure_image(self.canvas)]),
            self.text,
        ], layout=widgets.Layout(width="100%"))

    def update(self, change: Any = None) -> None:
        values = {name: control.value for name, control in self.controls.items()}
        view = compute(self.latency, measured=self.measured, max_batch=self.max_batch, **values)
        render(self.figure, view)
        self.canvas.describe(alt_text(view))
        self.text.value = summary_html(view)


def timing_explorer(latency: LatencyModel | LatencyFit, measured: Sequence[MeasuredPoint] = (), prompt_len: int = 32,
                    output_len: int = 16, max_batch: int = 16) -> TimingExplorer:
    """The lab 06 explorer (leave it last in a cell to show it); a LatencyFit also marks where it extrapolates."""
    return TimingExplorer(latency, measured, prompt_len, output_len, max_batch)
