"""The KV-cache explorer (lab 05): does this model, at this batch and context, fit on this GPU?

The model is a preset, or any model sized from its config alone (``labkit.explorers.memory_models.read_model``):
a Hugging Face Hub id (``"Qwen/Qwen3-32B"``: config.json is downloaded, a few kilobytes, never the weights) or
the path of a config.json (offline). Sliding-window layers and multi-latent attention are counted as
transformers' cache holds them (``labkit.core.memory.kv_cache_bytes``); what labkit cannot count is refused with
the reason.

``compute`` is pure: a model and a preset GPU, the weight and KV formats, batch and context, an attention
what-if (MHA / GQA / MQA), a tensor-parallel degree and the prefill (one pass, or chunks as vLLM and SGLang run
it) in; a :class:`MemoryView` out, with the per-GPU budget,
the largest batch and the longest context that would fit, and the arithmetic with every number substituted.
``render`` moves the bars of a figure drawn once; ``memory_explorer`` wires core ipywidgets to both. The lab's
static pictures are in :mod:`labkit.explorers.memory_figures`.

Integer formats store one 2-byte scale per group of 128 weights (as GPTQ/AWQ checkpoints commonly do); the
activation and workspace parts are labkit.core.budget's first-order estimates, and the text says so.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from typing import Any

from labkit.core.budget import GPUSpec, MemoryBudget, budget, max_batch_size, max_seq_len
from labkit.core.memory import (
    GB, GIB, MIB, BlockLayout, bytes_per_value, cached_tokens, kv_heads_per_rank, kv_values_per_token, param_count,
    weights_count,
)
from labkit.explorers import base as layout
from labkit.explorers.base import Explorer
from labkit.explorers.canvas import FigureCanvas
from labkit.core.presets import gpu_preset, gpu_presets, model_presets
from labkit.core.spec import ATTENTION, ModelSpec, with_attention
from labkit.explorers.memory_models import read_model

WEIGHT_FORMATS = ("fp32", "bf16", "fp8", "int8", "int4")
KV_FORMATS = ("fp32", "bf16", "fp8", "int4")
TP_DEGREES = (1, 2, 4, 8)
PREFILL = (("one pass", 0), ("chunks of 8,192", 8192))  # tokens per prefill step (0: every prompt at once)
GROUP_SIZE = 128  # integer weight formats: one scale per 128 weights
SCALE_BYTES = 2  # each such scale is one FP16 number
WORKSPACE_FRACTION = 0.1  # of the GPU's memory, kept for everything not modelled (labkit.core.budget)
PARTS = ("weights", "KV cache", "activations (est.)", "workspace (est.)", "free")
COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#8c8c8c", "#e8e8e8")


@dataclass(frozen=True)
class MemoryView:
    """Everything the explorer shows for one setting; budget is None when the setting is impossible."""

    spec: ModelSpec  # the model after the attention what-if
    gpu: GPUSpec
    batch_size: int
    seq_len: int
    tp: int
    budget: MemoryBudget | None
    max_batch: int  # largest batch at seq_len on each GPU (0: not even one sequence)
    max_seq: int  # longest context at batch_size (0: not even one token)
    steps: tuple[str, ...]  # the arithmetic, one line per part, numbers substituted
    error: str | None = None  # why the setting is impossible (e.g. 71 heads over 2 GPUs)


def _size(n_bytes: int) -> str:
    return f"{n_bytes:,} B = {n_bytes / GB:,.2f} GB = {n_bytes / GIB:,.2f} GiB"


def _steps(spec: ModelSpec, layout: BlockLayout, b: MemoryBudget, batch_size: int, seq_len: int, weight_fmt: str,
           kv_dtype: str, tp: int, prefill_chunk: int = 0, gpu: GPUSpec | None = None) -> tuple[str, ...]:
    """The budget's arithmetic as text: every number is one the core returns or one of this module's settings."""
    n_weights = weights_count(spec, tp, layout)
    weights = f"weights: {n_weights:,} params x {bytes_per_value(weight_fmt):g} B"
    if weight_fmt.startswith("int"):
        weights += f" + ceil({n_weights:,} / {GROUP_SIZE}) scales x {SCALE_BYTES} B"
    if tp > 1:
        weights = weights.replace("params", f"params on this GPU (1/{tp} of each matrix, norms copied)")
    datasheet = ""  # a preset's capacity is nvidia-smi's reading; the datasheet prints a rounder figure
    if gpu is not None and gpu.vendor_memory:
        datasheet = f" (nvidia-smi: {b.capacity_bytes / MIB:,.0f} MiB; datasheet: {gpu.vendor_memory})"
    kv = f"KV cache: {_kv_formula(spec, batch_size, seq_len, tp)} x {bytes_per_value(kv_dtype):g} B"
    return (
        f"{weights} = {_size(b.weights_bytes)}",
        f"{kv} = {_size(b.kv_cache_bytes)}",
        f"activations (estimate: one layer's prefill tensors for "
        f"{f'a chunk of {min(prefill_chunk, batch_size * seq_len):,} tokens' if prefill_chunk else 'every prompt at once'}"
        f" + FP32 logits) = {_size(b.activations_bytes)}",
        f"workspace (estimate: {WORKSPACE_FRACTION:.0%} of the GPU) = {_size(b.workspace_bytes)}",
        f"total = {_size(b.total_bytes)}",
        f"capacity{datasheet} = {_size(b.capacity_bytes)}; headroom = {b.headroom_bytes / GB:,.2f} GB "
        f"= {b.headroom_bytes / GIB:,.2f} GiB",
    )


def _kv_formula(spec: ModelSpec, batch_size: int, seq_len: int, tp: int) -> str:
    """The KV cache's product with the numbers substituted: tokens held per layer, values per token and layer."""
    if spec.latent_attention:  # one latent and one rotary key per token, every GPU holds all of it
        kv_and = ""
        per_token = (f"(latent {spec.kv_lora_rank} + rotary key {spec.qk_rope_head_dim}, multi-latent attention"
                     f"{', on every GPU' if tp > 1 else ''}) = {kv_values_per_token(spec, tp):,}")
    else:
        kv_and = "2 x "  # K and V; written first, as eq. 8.3 does, when no layer slides
        per_token = (f"H_kv {kv_heads_per_rank(spec, tp)}{f' (of {spec.n_kv_heads}, over {tp} GPUs)' if tp > 1 else ''}"
                     f" x d_h {spec.head_dim}")
    if spec.n_sliding_layers == 0:
        return f"{kv_and}B {batch_size:,} x T {seq_len:,} x L {spec.n_layers} x {per_token}"
    full_tokens, sliding_tokens = cached_tokens(spec, seq_len)
    n_full = spec.n_layers - spec.n_sliding_layers
    tokens = (f"(L_full {n_full} x T {full_tokens:,} + L_sliding {spec.n_sliding_layers} x "
              f"min(T, window {spec.sliding_window:,} - 1) {sliding_tokens:,})")
    return f"B {batch_size:,} x {tokens} x {kv_and}{per_token}"


def compute(preset: str, gpu_name: str, weight_fmt: str = "bf16", kv_dtype: str = "bf16", batch_size: int = 1,
            seq_len: int = 4096, attention: str = "as built", tp: int = 1, prefill_chunk: int = 0) -> MemoryView:
    """The per-GPU budget and the reverse answers for one setting of the explorer: ``preset`` names the model (a
    preset, a hub id or a config.json path, read once by ``memory_models.read_model``), ``gpu_name`` the GPU preset
    (``gpu`` is the README's GPUSpec, the view's ``gpu``).

    ``prefill_chunk``: tokens per prefill step (0: every prompt in one pass, the largest activation peak).

    >>> view = compute("Llama-3-8B", "H100-SXM", batch_size=16, seq_len=4096, kv_dtype="fp16")
    >>> view.budget.kv_cache_bytes == 8 * GIB, view.budget.fits, view.max_batch >= 16
    (True, True, True)
    """
    sized, gpu = read_model(preset), gpu_preset(gpu_name)
    as_built, layout = sized.spec, sized.layout
    spec = as_built
    options = dict(weight_fmt=weight_fmt, kv_dtype=kv_dtype, tp=tp, layout=layout,
                   group_size=GROUP_SIZE if weight_fmt.startswith("int") else None, scale_bytes=SCALE_BYTES,
                   workspace_fraction=WORKSPACE_FRACTION, prefill_chunk_tokens=prefill_chunk or None)
    try:
        if (tp > 1 or attention != "as built") and not _dense(as_built, layout):
            raise ValueError(f"{as_built.name}'s weights (experts or latent attention) are counted as built on one "
                             "GPU only: labkit neither splits them over GPUs nor reshapes their attention")
        spec = with_attention(as_built, attention)
        b = budget(spec, gpu, batch_size, seq_len, **options)
    except ValueError as error:  # an impossible setting is shown, not raised into the widget
        return MemoryView(spec, gpu, batch_size, seq_len, tp, None, 0, 0, (), str(error))
    steps = _steps(spec, layout, b, batch_size, seq_len, weight_fmt, kv_dtype, tp, prefill_chunk, gpu)
    return MemoryView(
        spec=spec, gpu=gpu, batch_size=batch_size, seq_len=seq_len, tp=tp, budget=b,
        max_batch=max_batch_size(spec, gpu, seq_len, **options),
        max_seq=_longest_context(spec, gpu, batch_size, options),
        steps=steps + ((f"note: {sized.note}",) if sized.note else ()),
    )


def _longest_context(spec: ModelSpec, gpu: GPUSpec, batch_size: int, options: dict[str, Any]) -> int:
    """max_seq_len, or the model's context limit when memory stops growing: with every layer sliding its window
    and the prefill in chunks, nothing grows past the window (the search would double forever)."""
    if spec.n_sliding_layers == spec.n_layers and options["prefill_chunk_tokens"]:
        limit = spec.max_position_embeddings or 2**31
        if budget(spec, gpu, batch_size, limit, **options).fits:
            return limit
    return max_seq_len(spec, gpu, batch_size, **options)


def _dense(spec: ModelSpec, layout: BlockLayout) -> bool:
    """True unless the spec's parameters are more than its block layout counts (experts, latent attention)."""
    return spec.n_params is None or spec.d_ff is None or param_count(spec, layout) == spec.n_params


def bar_parts_gb(view: MemoryView) -> tuple[float, ...]:
    """The five stacked-bar widths in decimal GB: weights, KV, activations, workspace (+ other), free."""
    if view.budget is None:
        return (0.0,) * len(PARTS)
    b = view.budget
    return (b.weights_bytes / GB, b.kv_cache_bytes / GB, b.activations_bytes / GB,
            (b.workspace_bytes + b.other_bytes) / GB, max(b.headroom_bytes, 0) / GB)


def verdict_text(view: MemoryView) -> str:
    """One line: fits or not, and the largest batch and context that would."""
    if view.budget is None:
        return f"impossible setting: {view.error}"
    b, per = view.budget, f" per GPU (x{view.tp})" if view.tp > 1 else ""
    head = (f"FITS{per}: {b.total_gb:,.1f} of {b.capacity_gb:,.1f} GB" if b.fits else
            f"DOES NOT FIT{per}: needs {b.total_gb:,.1f} GB, has {b.capacity_gb:,.1f} GB")
    return (f"{head}. Largest batch at {view.seq_len:,} tokens: {view.max_batch:,}; "
            f"longest context at batch {view.batch_size:,}: {view.max_seq:,} tokens")


class MemoryFigure:
    """A horizontal stacked bar against the GPU's capacity, its key in the picture, drawn once and moved by
    ``render``."""

    def __init__(self, width_in: float = 5.5, height_in: float = 2.0, dpi: int = 80):
        from labkit.explorers.canvas import readable

        self.canvas = FigureCanvas(width_in, height_in, dpi, layout=None)
        self.axes = self.canvas.figure.add_subplot()
        self.bars = [self.axes.barh(0, 1.0, left=0.0, height=0.6, color=c, edgecolor="white", label=p)[0]
                     for p, c in zip(PARTS, COLOURS)]
        self.bars[-1].set_edgecolor("#8c8c8c")  # free memory: light grey, outlined so it shows on white
        self.capacity = self.axes.axvline(1.0, color="#c0392b", linewidth=2, label="the GPU's memory")
        self.axes.set_yticks([])
        self.axes.set_xlabel("GB (10^9 bytes) per GPU; red line: the GPU's memory (nvidia-smi)")
        # The key under the axis, in the picture (a static view shows it too); margins fixed: room on the right
        # for half of a tick label at the axis end, which the x range moves on every update.
        self.canvas.figure.legend(loc="lower center", ncols=3, frameon=False, handlelength=1.2, columnspacing=1.2,
                                  borderaxespad=0.2)
        readable(self.canvas.figure)
        self.canvas.figure.subplots_adjust(left=0.02, right=0.95, bottom=0.56, top=0.97)
        self.canvas.refresh()


def render(figure: MemoryFigure, view: MemoryView) -> None:
    """Update the bar segments, the capacity line and the axis range in place, then refresh the image."""
    left = 0.0
    for bar, width in zip(figure.bars, bar_parts_gb(view)):
        bar.set_x(left)
        bar.set_width(width)
        left += width
    capacity_gb = view.gpu.memory_bytes / GB
    figure.capacity.set_xdata([capacity_gb, capacity_gb])
    figure.axes.set_xlim(0, max(left, capacity_gb) * 1.04)
    figure.canvas.refresh()


def alt_text(view: MemoryView, weight_fmt: str, kv_dtype: str, attention: str, prefill_chunk: int) -> str:
    """What the picture shows, in numbers: the setting, each part of the bar in GB, the GPU's line, the verdict.

    >>> view = compute("Llama-3-8B", "H100-SXM", batch_size=16, seq_len=4096, kv_dtype="fp16")
    >>> alt_text(view, "bf16", "fp16", "as built", 0).split("; ")[1]
    'KV cache 8.59'
    """
    prefill = next(name for name, chunk in PREFILL if chunk == prefill_chunk)
    setting = (f"{view.spec.name} on {view.tp} x {view.gpu.name}, batch {view.batch_size:,} x {view.seq_len:,} tokens, "
               f"{weight_fmt.upper()} weights, {kv_dtype.upper()} KV cache, attention {attention}, prefill {prefill}")
    if view.budget is None:
        return f"{setting}: no bar, the setting is impossible ({view.error})."
    parts = "; ".join(f"{part} {gb:,.2f}" for part, gb in zip(PARTS, bar_parts_gb(view)))
    verdict = "fits" if view.budget.fits else "does not fit"
    return (f"{setting}. Stacked bar, GB per GPU: {parts}; red line at the GPU's {view.gpu.memory_bytes / GB:,.1f} GB: "
            f"{verdict}, {view.budget.total_gb:,.1f} GB in all.")


def verdict_html(view: MemoryView) -> str:
    """The verdict line, green when it fits, red when not."""
    colour = "#1a7f37" if view.budget is not None and view.budget.fits else "#cf222e"
    return (f'<div style="font-size:13px;line-height:1.4;color:{colour}"><b>{html.escape(verdict_text(view))}</b>'
            "</div>")


def steps_html(view: MemoryView) -> str:
    """The arithmetic, one line per part, wrapping inside the output's width."""
    lines = "".join(f'<div style="padding-left:2em;text-indent:-2em">{html.escape(step)}</div>'
                    for step in view.steps)
    return (f'<div style="font-family:monospace;font-size:12px;line-height:1.5;overflow-wrap:anywhere">{lines}'
            "</div>")


class MemoryExplorer(Explorer):
    """The KV-cache explorer: dropdowns, toggles and log-scaled sliders over ``compute`` + ``render``."""

    title = "KV-cache explorer"

    def __init__(self, preset: str = "Llama-3-8B", gpu_name: str = "A100-80GB"):
        import ipywidgets as widgets

        read_model(preset)  # a hub id's config.json is fetched (or refused) here, once, before any widget
        models = list(model_presets())
        if preset not in models:
            models.append(preset)
        style = layout.description_style(84)
        self.column_width = 384
        self.toggle_titles: dict[str, Any] = {}  # a toggle group's name -> the line above it

        def toggles(options, value, description, button_width):
            # The group's name is a line of its own above the buttons, not the widget's description: an inline
            # description shares the column with the buttons, and at 1024 px the row overflowed the output area
            # and lost its first letters ("eights" for "weights"). Buttons at their own width, nothing at 100 %.
            group = widgets.ToggleButtons(options=options, value=value, tooltips=[description] * len(options),
                                          style={"button_width": f"{button_width}px"},
                                          layout=widgets.Layout(width="auto", max_width="100%"))
            self.toggle_titles[description] = widgets.HTML(
                f'<div style="font-size:var(--jp-widgets-font-size, 13px)">{description}</div>',
                layout=widgets.Layout(margin="4px 0 0 4px"))
            return group

        self.controls = {
            "preset": widgets.Dropdown(options=models, value=preset, description="model", style=style,
                                       layout=layout.full_width()),
            "gpu_name": widgets.Dropdown(options=list(gpu_presets()), value=gpu_name, description="GPU",
                                         style=style, layout=layout.full_width()),
            "weight_fmt": toggles(WEIGHT_FORMATS, "bf16", "weights", 52),
            "kv_dtype": toggles(KV_FORMATS, "bf16", "KV cache", 52),
            "attention": toggles(ATTENTION, "as built", "attention", 68),
            "tp": toggles(TP_DEGREES, 1, "GPUs (TP)", 52),
            "prefill_chunk": toggles(PREFILL, 0, "prefill", 130),
            "log2_batch": widgets.IntSlider(value=4, min=0, max=10, description="log2 batch", style=style,
                                            layout=layout.full_width()),
            "log2_seq": widgets.IntSlider(value=12, min=7, max=17, description="log2 context", style=style,
                                          layout=layout.full_width()),
        }
        self.sizes = layout.html_block()
        self.verdict = layout.html_block()
        self.text = layout.html_block()
        self.figure = MemoryFigure()
        self.canvas = self.figure.canvas
        for control in self.controls.values():
            control.observe(self.update, names="value")
        self.update()
        c = self.controls
        figure_column = widgets.VBox([layout.figure_image(self.canvas), self.verdict],
                                     layout=widgets.Layout(width=f"{self.canvas.pixel_size[0] + 12}px",
                                                           max_width="100%", flex="0 1 auto"))
        self.widget = widgets.VBox([
            layout.row([layout.column([c["preset"], c["gpu_name"], *self._titled("weight_fmt", "weights"),
                                       *self._titled("kv_dtype", "KV cache"), *self._titled("attention", "attention"),
                                       *self._titled("tp", "GPUs (TP)"), *self._titled("prefill_chunk", "prefill"),
                                       c["log2_batch"], c["log2_seq"], self.sizes],
                                      self.column_width),
                        figure_column]),
            self.text,
        ])

    def _titled(self, name: str, title: str) -> list[Any]:
        """A toggle group under its name."""
        return [self.toggle_titles[title], self.controls[name]]

    def values(self) -> dict[str, Any]:
        """The controls' settings as compute's arguments (the sliders hold powers of two)."""
        values = {name: control.value for name, control in self.controls.items()}
        return dict(batch_size=2 ** values.pop("log2_batch"), seq_len=2 ** values.pop("log2_seq"), **values)

    def update(self, change: Any = None) -> None:
        view = compute(**self.values())
        self.sizes.value = (f'<div style="font-size:12px">batch {view.batch_size:,} sequences &times; context '
                            f"{view.seq_len:,} tokens</div>")
        render(self.figure, view)
        settings = self.values()
        self.canvas.describe(alt_text(view, settings["weight_fmt"], settings["kv_dtype"], settings["attention"],
                                      settings["prefill_chunk"]))
        self.verdict.value = verdict_html(view)
        self.text.value = steps_html(view)


def memory_explorer(preset: str = "Llama-3-8B", gpu_name: str = "A100-80GB") -> MemoryExplorer:
    """The lab 05 explorer (leave it last in a cell to show it); ``preset`` names the model: a preset, a Hugging
    Face Hub id (``"Qwen/Qwen3-32B"``: its config.json alone is downloaded) or the path of a config.json;
    ``gpu_name`` names a GPU preset (``gpu`` is a GPUSpec everywhere in labkit)."""
    return MemoryExplorer(preset, gpu_name)
