"""Lab 04's outlier visualizer: the embedded model's real activations, token x channel, at any layer (layer 3,
explorers: widgets, ``compute`` over the captured values, ``render``).

The model runs once per prompt, in the runtime (:func:`labkit.runtime.activations.capture_activations`: the
residual stream after every block and the input of every kind of Linear). A slider move only re-runs
:func:`compute` (labkit.core.quantization on one ``[tokens, channels]`` tensor) and :func:`render` (the heatmap's
data and the range lines updated in place). The threshold slider changes only numbers, so it redraws nothing;
``python -m benchmarks outliers`` prints p50/p95 of a move.

What it shows: |activation| on a log colour scale; how many channels reach the LLM.int8() threshold; the
reconstruction error of that tensor under per-tensor INT8, per-token INT8 and "outlier channels kept in float";
SmoothQuant's migration at strength alpha (per-channel max |X_j| and max |W_j| before and after); and the SQNR
of the three INT8 schemes at every layer. LLM.int8(), SmoothQuant and W8A8 act on the inputs of the Linear layers
(after RMSNorm); the residual stream, which no Linear reads, is shown because the massive activations live there,
and its numbers say so. For it, SmoothQuant is shown on the tensor it would act on: the normalized residual
entering q/k/v_proj. A toggle runs the prompt again with the massive activations zeroed where they appear
(:func:`labkit.runtime.activations.replace_massive`, Sun et al. 2024): what every later layer then computes.
The views it combines (one tensor, the threshold, SmoothQuant, SQNR per layer) are in
:mod:`labkit.explorers.outliers_views`.
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np

from labkit.core.outlier_schemes import LLM_INT8_THRESHOLD
from labkit.explorers import base as layout
from labkit.explorers.base import Explorer
from labkit.explorers.outliers_views import (SCHEMES, LayersView, OutlierView, layers_view, outliers_kept_sqnr,
                                             smoothing_view, tensor_view, threshold_free_sqnr, threshold_view)
from labkit.runtime import layer_names
from labkit.runtime.activations import RESIDUAL, OutlierData, capture_activations

DEFAULT_PROMPT = "The Eiffel Tower is in Paris. It was finished in 1889 and is 330 metres tall."


def compute(data: OutlierData, layer: int = 15, source: str = RESIDUAL, threshold: float = LLM_INT8_THRESHOLD,
            alpha: float = 0.5) -> OutlierView:
    """Everything for one setting, from the captured tensors and labkit.core.quantization."""
    return OutlierView(tensor_view(data, layer, source), threshold_view(data, layer, source, threshold),
                       smoothing_view(data, layer, source, alpha), layers_view(data, source, threshold))


class OutlierFigure:
    """Heatmap (top), per-channel ranges before/after SmoothQuant (middle), SQNR per layer (bottom), blitted.

    The colour scale and the range axis are fixed for every layer (1e-2 .. 3e4 covers the model's massive
    activations), so layers compare at a glance and the axes, ticks and colour bar are drawn once into a
    background; a move restores it and draws only the image and the four lines. The background is redrawn when
    the tensor's shape changes (another prompt, or a source of another width).
    """

    FLOOR, CEILING = 1e-2, 3e4  # colour scale of |x|
    RANGE = (1e-3, 1e5)  # y range of the middle panel
    SQNR_RANGE = (-5.0, 65.0)  # dB, the lower panel (an exact scheme is drawn at the top)

    # 460 x 480 px: beside the 360 px controls at 1024 px wide (an 860 px output area), every text at 11 px.
    def __init__(self, width_in: float = 5.75, height_in: float = 6.0, dpi: int = 80):
        from matplotlib.colors import Normalize

        from labkit.explorers.canvas import FigureCanvas, readable

        self.canvas = FigureCanvas(width_in, height_in, dpi)
        figure = self.canvas.figure
        self.heat_axes, self.range_axes, self.sqnr_axes = figure.subplots(3, 1, height_ratios=(3, 2, 1.6))
        # The log colour scale as log10 |x| on a linear map: the same colours, without LogNorm's masked arrays.
        self.image = self.heat_axes.imshow(np.zeros((2, 2)), norm=Normalize(np.log10(self.FLOOR),
                                                                             np.log10(self.CEILING)),
                                           aspect="auto", cmap="magma", interpolation="nearest", animated=True)
        colorbar = figure.colorbar(self.image, ax=self.heat_axes, label="|activation|, all layers")
        ticks = np.arange(-2, 5)
        colorbar.set_ticks(ticks, labels=[f"1e{t}" for t in ticks])
        self.heat_axes.set_xlabel("channel")
        self.heat_axes.set_ylabel("token")
        styles = [("activation before", "#4c72b0", "-"), ("activation after", "#4c72b0", ":"),
                  ("weight before", "#dd8452", "-"), ("weight after", "#dd8452", ":")]
        self.lines = [self.range_axes.plot([0, 1], [1, 1], color=c, linestyle=s, linewidth=0.9, label=label,
                                           animated=True)[0] for label, c, s in styles]
        self.range_axes.set_yscale("log")
        self.range_axes.set_ylim(*self.RANGE)
        self.range_axes.minorticks_off()
        self.range_axes.set_xlabel("input channel of the Linear (SmoothQuant)")
        self.range_axes.set_ylabel("max |value|")
        # Above the panel, outside it: inside, the lines run at every height.
        self.range_axes.legend(ncol=2, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False,
                               borderaxespad=0.1, handlelength=1.6, columnspacing=1.0)
        self.sqnr_lines = [self.sqnr_axes.plot([0, 1], [0, 0], color=c, linewidth=1.2, marker=".", markersize=3,
                                               label=label, animated=True)[0]
                           for label, c in zip(("per tensor", "per token", "outliers kept"),
                                               ("#c44e52", "#4c72b0", "#55a868"))]
        self.layer_marker = self.sqnr_axes.axvline(0, color="black", linewidth=0.8, linestyle="--", animated=True)
        self.sqnr_axes.set_ylim(*self.SQNR_RANGE)
        self.sqnr_axes.set_xlabel("layer (INT8, median token; higher is better)")
        self.sqnr_axes.set_ylabel("SQNR dB")
        self.sqnr_axes.legend(ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False,
                              borderaxespad=0.1, handlelength=1.6, columnspacing=1.0)
        readable(figure)
        self.canvas.agg.draw()  # solve the constrained layout once; redraws keep it
        self.canvas.figure.set_layout_engine("none")
        self._shape: tuple[int, int, int, int] | None = None

    def set_shape(self, n_tokens: int, n_channels: int, n_inputs: int, n_layers: int) -> None:
        """Axis limits for a tensor's shape (and the Linear input's width); a new shape redraws the background."""
        shape = (n_tokens, n_channels, n_inputs, n_layers)
        if shape != self._shape:
            self._shape = shape
            self.image.set_extent((-0.5, n_channels - 0.5, n_tokens - 0.5, -0.5))
            self.heat_axes.set_xlim(-0.5, n_channels - 0.5)
            self.heat_axes.set_ylim(n_tokens - 0.5, -0.5)
            self.range_axes.set_xlim(-0.5, n_inputs - 0.5)
            self.sqnr_axes.set_xlim(-0.5, n_layers - 0.5)

    def redraw(self) -> None:
        """Draw the image and lines over the background for this shape, encode the pixels."""
        self.canvas.blit(self._shape, [self.image, *self.lines, *self.sqnr_lines, self.layer_marker])


def render(figure: OutlierFigure, view: OutlierView) -> None:
    """Move the heatmap's data and the four range lines, then re-encode the image."""
    magnitudes, smoothing = view.tensor.magnitudes, view.smoothing
    figure.set_shape(magnitudes.shape[0], magnitudes.shape[1], len(smoothing.act_range[0]),
                     len(next(iter(view.layers.sqnr.values()))))
    figure.image.set_data(np.log10(np.clip(magnitudes, figure.FLOOR, figure.CEILING)))
    channels = np.arange(len(smoothing.act_range[0]))
    for line, y in zip(figure.lines, (*smoothing.act_range, *smoothing.weight_range)):
        line.set_data(channels, np.clip(y, *figure.RANGE))
    for line, values in zip(figure.sqnr_lines, view.layers.sqnr.values()):
        line.set_data(np.arange(len(values)), np.clip(values, *figure.SQNR_RANGE))
    figure.layer_marker.set_xdata([view.tensor.layer, view.tensor.layer])
    figure.redraw()


def alt_text(view: OutlierView, zeroed_at: int | None = None) -> str:
    """What the picture shows, in numbers: the heatmap's peak and median channel, the SmoothQuant ranges, the SQNR
    lines at the layer shown (computed from the view; nothing recomputed).
    """
    t, th, sm, layers = view.tensor, view.threshold, view.smoothing, view.layers
    channel, peak, token = t.top_channels[0]
    median_channel = float(np.median(t.magnitudes.max(axis=0)))
    (act_before, act_after), (w_before, w_after) = sm.act_range, sm.weight_range
    sqnr = ", ".join(f"{name} {values[t.layer]:.1f} dB" for name, values in layers.sqnr.items())
    state = f", massive activations zeroed at layer {zeroed_at}" if zeroed_at is not None else ""
    return (f"Layer {t.layer}, {t.source}{state}. Top: |activation| per token and channel, log colour 0.01 to "
            f"30,000: per-channel maximum |x| peaks at channel {channel} with {peak:,.1f} (token {token}), the median "
            f"channel {median_channel:.3g}; {len(th.outlier_channels)} channel(s) reach the threshold "
            f"{th.threshold:g}. "
            f"Middle: SmoothQuant α {sm.alpha:.2f}, activation max {act_before.max():,.1f} before, "
            f"{act_after.max():,.1f} after (blue); weight max {w_before.max():.3f} before, {w_after.max():.3f} after "
            f"(orange). Bottom: INT8 SQNR of the median token at every layer, at layer {t.layer}: {sqnr}.")


def intervention_html(data: OutlierData) -> str:
    """One line on what the activations shown are: as the model computes them, or with the massive ones zeroed."""
    if data.zeroed_at is not None:
        return (f"<b>massive activations zeroed</b> at the output of layer {data.zeroed_at} (where they appear): "
                "every later layer computes without them. Section 4's experiment measures what this costs in "
                "perplexity.<br>")
    if data.massive_layer is None:
        return "no massive activation in this prompt (|x| &ge; 1000 &times; the median), so nothing to zero.<br>"
    return (f"massive activations appear at layer {data.massive_layer} (|x| &ge; 1000 &times; the layer's median); "
            "the toggle zeroes them there.<br>")


def numbers_html(view: OutlierView, data: OutlierData | None = None) -> str:
    """The lists and the live errors, as HTML (with a line on the intervention when ``data`` is given)."""
    t, th, sm = view.tensor, view.threshold, view.smoothing
    channels = ", ".join(f"{c} ({v:,.1f} at token {i})" for c, v, i in t.top_channels)
    tokens = ", ".join(f"{i} {html.escape(repr(text))} ({v:,.1f})" for i, text, v in t.top_tokens)
    shown = ", ".join(map(str, th.outlier_channels[:12])) + (" ..." if len(th.outlier_channels) > 12 else "")
    errors = {**t.errors, "outliers kept + per-token INT8": th.error}
    rows = "".join(f"<tr><td>{html.escape(name)}</td><td>{err:.4f}</td><td>{snr:.1f}</td></tr>"
                   for name, (err, snr) in errors.items())
    (act_before, act_after), (w_before, w_after) = sm.act_range, sm.weight_range
    residual = t.source == RESIDUAL
    note = ("<br><i>No Linear reads this tensor (each reads it after RMSNorm): the threshold and INT8 rows show "
            "what they would do to it. W8A8 and LLM.int8() quantize the Linear inputs (menu <b>tensor</b>).</i>"
            if residual else "")
    reader = "q/k/v_proj's input" if data is None or data.residual_reader == "q/k/v_proj input" else \
        html.escape(data.residual_reader)
    linear = f"{reader} (the normalized residual)" if residual else "the Linear's input"
    return (f'<div style="font-size:12px">{intervention_html(data) if data else ""}'
            f"<b>layer {t.layer}, {html.escape(t.source)}</b>: "
            f"largest |x| {t.largest:,.1f}; median |x| {t.median:.3f}; ratio {t.largest / max(t.median, 1e-12):,.0f}x"
            f"{note}<br><b>largest channels</b>: {channels}<br><b>largest tokens</b>: {tokens}<br>"
            f"<b>{len(th.outlier_channels)}</b> channel(s) reach |x| &ge; {th.threshold:g}: {shown}<br>"
            f'<table style="font-size:12px"><tr><th>scheme</th><th>||x - x&#770;|| / ||x||</th><th>SQNR dB</th></tr>'
            f"{rows}</table>SmoothQuant (alpha {sm.alpha:.2f}) on {linear}: activation max "
            f"{act_before.max():,.1f} &rarr; {act_after.max():,.1f}, weight max {w_before.max():.3f} &rarr; "
            f"{w_after.max():.3f}</div>")


class OutlierExplorer(Explorer):
    """Prompt box, layer and source, threshold and alpha sliders, the figure and the numbers."""

    title = "outlier visualizer"

    def __init__(self, lm: Any, prompt: str = DEFAULT_PROMPT, layer: int = 15):
        import ipywidgets as widgets

        self.lm = lm
        style = layout.description_style(92)
        self.prompt = widgets.Text(value=prompt, description="prompt", style=layout.description_style(56),
                                   layout=widgets.Layout(flex="1 1 320px", min_width="240px", max_width="560px"))
        self.run = widgets.Button(description="run the model", button_style="primary",
                                  layout=widgets.Layout(width="130px", margin=layout.GAP))
        n_layers = len(layer_names(lm))
        self.layer = widgets.IntSlider(value=layer, min=0, max=n_layers - 1, description="layer", style=style,
                                       layout=layout.full_width())
        self.source = widgets.Dropdown(options=[RESIDUAL], value=RESIDUAL, description="tensor", style=style,
                                       layout=layout.full_width())
        self.threshold = widgets.FloatSlider(value=LLM_INT8_THRESHOLD, min=0.5, max=60.0, step=0.5,
                                             description="threshold", style=style, layout=layout.full_width())
        self.alpha = widgets.FloatSlider(value=0.5, min=0.0, max=1.0, step=0.05, description="SmoothQuant α",
                                         style=layout.description_style(120),  # the longest label here
                                         layout=layout.full_width())
        # Two buttons of 170 px fill the 360 px column (ToggleButtons add a few px of margin each).
        self.massive = widgets.ToggleButtons(options=[("massive as they are", False), ("massive zeroed", True)],
                                             value=False, style={"button_width": "170px"},
                                             tooltips=["the activations as the model computes them",
                                                       "the prompt run again with the massive activations zeroed "
                                                       "where they appear (Sun et al. 2024)"],
                                             layout=layout.full_width())
        self.numbers = layout.html_block()
        self.figure = OutlierFigure()
        self.canvas = self.figure.canvas
        self.controls = {"layer": self.layer, "source": self.source, "threshold": self.threshold,
                         "alpha": self.alpha, "massive": self.massive, "prompt": self.prompt, "run": self.run}
        for control in (self.layer, self.source, self.threshold, self.alpha):
            control.observe(self.update, names="value")
        self.massive.observe(self.switch, names="value")
        self.run.on_click(lambda button: self.set_prompt())
        self.widget = widgets.VBox([
            layout.row([self.prompt, self.run]),
            layout.row([layout.column([self.layer, self.source, self.threshold, self.alpha, self.massive]),
                        layout.figure_image(self.canvas)]),
            self.numbers,
        ], layout=widgets.Layout(width="100%"))
        self._parts: dict[tuple[Any, ...], Any] = {}
        self.set_prompt()

    def set_prompt(self) -> None:
        """The forward passes: this prompt's activations as they are and, when it has massive activations, with
        them zeroed where they appear (both captured now, so the toggle is instant); then redraw."""
        as_is = capture_activations(self.lm, self.prompt.value)
        self.datasets, self._parts = {False: as_is}, {}
        if as_is.massive_layer is not None:
            self.datasets[True] = capture_activations(self.lm, self.prompt.value, zero_massive_at=as_is.massive_layer)
        self.massive.disabled = as_is.massive_layer is None
        if tuple(self.source.options) != tuple(as_is.activations):  # the sources this model's blocks have
            self.source.unobserve(self.update, names="value")
            self.source.options = list(as_is.activations)
            self.source.value = RESIDUAL
            self.source.observe(self.update, names="value")
        if self.massive.disabled and self.massive.value:
            self.massive.value = False  # runs switch()
        else:
            self.switch()

    def switch(self, change: Any = None) -> None:
        """Show the activations as they are or with the massive ones zeroed (both already captured)."""
        self.data = self.datasets[bool(self.massive.value) and True in self.datasets]
        self.update()

    def _part(self, function: Any, *args: Any) -> Any:
        """A part of the view for the data shown, computed once per prompt for each set of its own arguments
        (so going back to a source, a layer or the other toggle position costs nothing)."""
        key = (self.data.zeroed_at, function.__name__, *args)
        if key not in self._parts:
            self._parts[key] = function(self.data, *args)
        return self._parts[key]

    def update(self, change: Any = None) -> None:
        where = (self.layer.value, self.source.value)
        tensor = self._part(tensor_view, *where)
        threshold = self._part(threshold_view, *where, self.threshold.value)
        smoothing = self._part(smoothing_view, *where, self.alpha.value)
        fixed = self._part(threshold_free_sqnr, self.source.value)
        kept = self._part(outliers_kept_sqnr, self.source.value, self.threshold.value)
        self.view = OutlierView(tensor, threshold, smoothing,
                                LayersView(self.source.value, self.threshold.value, {**fixed, SCHEMES[2]: kept}))
        render(self.figure, self.view)  # blitted: a few ms, even when only the SQNR lines moved
        self.canvas.describe(alt_text(self.view, self.data.zeroed_at))
        self.numbers.value = numbers_html(self.view, self.data)


def outlier_explorer(lm: Any = None, prompt: str = DEFAULT_PROMPT, layer: int = 15) -> OutlierExplorer:
    """The lab 04 visualizer over ``lm`` (default: the embedded model)."""
    if lm is None:
        from labkit.runtime.models import load_model

        lm = load_model()
    return OutlierExplorer(lm, prompt, layer)

