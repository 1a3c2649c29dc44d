"""Lab 01's sampling explorer: sliders over the embedded model's real next-token distribution (layer 3,
explorers: widgets, ``compute`` over precomputed scores, ``render``).

The model runs once per prompt, in the runtime (:func:`labkit.runtime.scoring.next_token_scores`); a slider move
only re-runs :func:`compute` (the core's temperature and filters on one ``[vocab]`` row) and :func:`render` (bar
lengths updated in place and drawn over a cached background), well under 50 ms (``python -m benchmarks.sampling``
prints p50 and p95; the browser adds the round trip, ``python -m benchmarks browser``). The bars show the prompt's
top candidates by the model's own ranking: every filter keeps a prefix of that ranking, so the same bars stay
meaningful at every setting. The continuations button calls :func:`labkit.runtime.generation.draw_continuations`.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import torch

from labkit.core.distribution import entropy_bits, kept_count, kept_mass
from labkit.core.sampling import apply_temperature, sampling_logits
from labkit.explorers import base as layout
from labkit.explorers.base import Explorer
from labkit.runtime.generation import draw_continuations
from labkit.runtime.scoring import NextTokenScores, next_token_scores

DEFAULT_PROMPT = "Give me a name for a cat."


# ---------------------------------------------------------------------------------------------------------------
# compute: plain values in, plain values out


@dataclass(frozen=True)
class SamplingView:
    """What the explorer shows for one setting of the sliders."""

    tokens: tuple[str, ...]  # the top candidates' texts
    model_probs: tuple[float, ...]  # their probabilities at T = 1, no filter
    sampling_probs: tuple[float, ...]  # the same tokens after temperature, filters and renormalizing
    n_kept: int  # tokens left possible (of the whole vocabulary)
    mass_kept: float  # mass of the kept tokens in the distribution the filters saw (>= top_p)
    entropy_bits: float  # of the sampling distribution
    vocab: int


def compute(scores: NextTokenScores, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
            min_p: float = 0.0, order: str = "temperature_first") -> SamplingView:
    """The sampling distribution for one setting, summarized for the bars and the numbers beside them."""
    logits = scores.next_token_logits  # [vocab]
    final_logits = sampling_logits(logits, temperature, top_k, top_p, min_p, order)
    final_probs = torch.softmax(final_logits, dim=-1)  # [vocab]
    # The filters saw the tempered distribution (temperature first) or the model's own (filters first).
    seen_logits = apply_temperature(logits, temperature) if order == "temperature_first" else logits
    return SamplingView(
        tokens=scores.top_texts,
        model_probs=scores.top_model_probs,
        sampling_probs=tuple(final_probs[list(scores.top_ids)].tolist()),
        n_kept=int(kept_count(final_logits)),
        mass_kept=float(kept_mass(seen_logits, final_logits)),
        entropy_bits=float(entropy_bits(final_probs)),
        vocab=logits.shape[-1],
    )


def summary_html(view: SamplingView) -> str:
    """The numbers beside the plot: kept tokens, kept mass, entropy, then each candidate's two probabilities."""
    numbers = [("tokens kept", f"{view.n_kept:,} of {view.vocab:,}"),
               ("mass kept", f"{view.mass_kept:.4f} of what the filters saw"),
               ("entropy", f"{view.entropy_bits:.3f} bits")]
    head = "".join(f"<tr><td><b>{name}</b></td><td colspan=2>{value}</td></tr>" for name, value in numbers)
    rows = "".join(
        f"<tr><td>{html.escape(repr(token))}</td><td>{model:.4f}</td><td>{'removed' if final == 0 else f'{final:.4f}'}"
        f"</td></tr>" for token, model, final in zip(view.tokens, view.model_probs, view.sampling_probs))
    style = "font-family:monospace;font-size:12px;line-height:1.25;width:100%;word-break:break-all"
    return (f"<table style='{style}'>{head}"
            f"<tr><th>token</th><th>model</th><th>sampling</th></tr>{rows}</table>")


def alt_text(view: SamplingView, settings: dict[str, Any], n_listed: int = 5) -> str:
    """What the picture shows, in numbers: the setting, then the first candidates' two probabilities.

    >>> view = SamplingView(("a", "b"), (0.75, 0.25), (1.0, 0.0), 1, 0.75, 0.0, 4)
    >>> text = alt_text(view, {"temperature": 1.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0,
    ...                        "order": "temperature_first"})
    >>> text.split(": bars")[0]
    'Temperature 1.00, top-k 1, top-p off, min-p off, temperature first'
    >>> text.split("(blue): ")[1]
    "'a' 0.750 -> 1.000, 'b' 0.250 -> removed; 1 of 4 tokens kept."
    """
    k, p, m = settings["top_k"], settings["top_p"], settings["min_p"]
    setting = (f"Temperature {settings['temperature']:.2f}, top-k {k or 'off'}, "
               f"top-p {f'{p:.2f}' if p < 1 else 'off'}, min-p {f'{m:.2f}' if m > 0 else 'off'}, "
               f"{settings['order'].replace('_', ' ')}")
    bars = ", ".join(f"{token!r} {model:.3f} -> {'removed' if final == 0 else f'{final:.3f}'}" for token, model, final
                     in list(zip(view.tokens, view.model_probs, view.sampling_probs))[:n_listed])
    return (f"{setting}: bars of the {len(view.tokens)} most likely next tokens, the model's probability (grey) "
            f"against the sampling distribution (blue): {bars}; {view.n_kept:,} of {view.vocab:,} tokens kept.")


# ---------------------------------------------------------------------------------------------------------------
# render: artists made once, updated in place


class SamplingPlot:
    """Horizontal bars, model (grey) versus sampling distribution (blue), for the top candidates.

    Blitting keeps a slider move cheap: the axes, token labels and legend are drawn once into a background
    (again only when the prompt or the x range changes); an update restores it, draws the bars on top and encodes
    the pixels. The x range snaps to a few fixed limits, so it rarely changes.
    """

    X_LIMITS = (0.05, 0.1, 0.2, 0.4, 0.7, 1.0)

    def __init__(self, n_show: int, width_in: float = 5.8, height_in: float = 3.6, dpi: int = 80):
        from labkit.explorers.canvas import FigureCanvas, readable

        self.canvas = FigureCanvas(width_in, height_in, dpi)
        self.axes = self.canvas.figure.add_subplot()
        rows = range(n_show)
        self.model_bars = self.axes.barh(rows, [0.0] * n_show, height=0.8, color="#c8c8c8", label="model, T = 1")
        self.sampling_bars = self.axes.barh(rows, [0.0] * n_show, height=0.45, color="#1f6feb",
                                            label="sampling distribution")
        self.axes.invert_yaxis()  # the most likely token at the top
        self.axes.set_xlabel("probability")
        self.axes.grid(axis="x", color="#eeeeee")
        self.axes.set_axisbelow(True)
        self.axes.legend(loc="lower right")
        self.bars = [*self.model_bars, *self.sampling_bars]
        for bar in self.bars:
            bar.set_animated(True)  # left out of the background, drawn by hand on every update
        self.x_limit = self.X_LIMITS[-1]
        readable(self.canvas.figure)

    def set_tokens(self, texts: tuple[str, ...]) -> None:
        """Token texts on the y axis (they change only with the prompt)."""
        self.axes.set_yticks(range(len(texts)), [repr(text) for text in texts])
        self.canvas.forget_backgrounds()

    def set_x_limit(self, largest: float) -> None:
        self.x_limit = layout.nice_limit(largest, self.X_LIMITS)

    def redraw(self) -> None:
        """Draw the bars over the background for the current x range into the image."""
        self.axes.set_xlim(0, self.x_limit)
        self.canvas.blit(self.x_limit, self.bars)


def render(plot: SamplingPlot, view: SamplingView) -> None:
    """Update the bar lengths (and the x range when needed), then re-encode the image."""
    for bar, value in zip(plot.model_bars, view.model_probs):
        bar.set_width(value)
    for bar, value in zip(plot.sampling_bars, view.sampling_probs):
        bar.set_width(value)
    plot.set_x_limit(max(max(view.model_probs), max(view.sampling_probs)))
    plot.redraw()


# ---------------------------------------------------------------------------------------------------------------
# The widget


class SamplingExplorer(Explorer):
    """The explorer: a prompt box, sliders, the bar plot, the numbers and a continuations button.

    Display it by leaving it as the last expression of a cell. ``update()`` is what a slider move runs.
    """

    title = "sampling explorer"

    def __init__(self, lm: Any, prompt: str = DEFAULT_PROMPT, n_show: int = 12, chat: bool | None = None):
        import ipywidgets as widgets

        if chat is None:  # the model's own: a chat turn for a chat model, raw text for a base model
            chat = getattr(getattr(lm, "source", None), "chat", True)
        self.lm, self.n_show = lm, n_show
        style = layout.description_style(92)
        self.prompt = widgets.Text(value=prompt, description="prompt", style=layout.description_style(56),
                                   layout=widgets.Layout(flex="1 1 320px", min_width="240px", max_width="560px",
                                                         margin=layout.GAP))
        self.mode = widgets.ToggleButtons(options=["chat", "raw text"], value="chat" if chat else "raw text",
                                          style={"button_width": "76px"}, layout=widgets.Layout(margin=layout.GAP))
        self.run = widgets.Button(description="run the model", button_style="primary",
                                  layout=widgets.Layout(width="130px", margin=layout.GAP))
        self.temperature = widgets.FloatSlider(value=1.0, min=0.0, max=2.0, step=0.05, description="temperature",
                                               style=style, layout=layout.full_width(), readout_format=".2f")
        self.top_k = widgets.IntSlider(value=0, min=0, max=100, description="top-k (0 off)", style=style,
                                       layout=layout.full_width())
        self.top_p = widgets.FloatSlider(value=1.0, min=0.01, max=1.0, step=0.01, description="top-p (1 off)",
                                         style=style, layout=layout.full_width(), readout_format=".2f")
        self.min_p = widgets.FloatSlider(value=0.0, min=0.0, max=0.5, step=0.01, description="min-p (0 off)",
                                         style=style, layout=layout.full_width(), readout_format=".2f")
        self.order = widgets.ToggleButtons(options=[("temperature first", "temperature_first"),
                                                    ("filters first", "filters_first")],
                                           value="temperature_first", style={"button_width": "156px"},
                                           tooltips=["temperature, then the filters",
                                                     "the filters, then temperature"])
        self.numbers = layout.html_block()
        self.seed = widgets.BoundedIntText(value=0, min=0, max=2**31 - 1, description="seed",
                                           style=layout.description_style(40),
                                           layout=widgets.Layout(width="150px", margin=layout.GAP))
        self.draw = widgets.Button(description="draw 4 continuations", layout=widgets.Layout(width="190px",
                                                                                             margin=layout.GAP))
        self.continuations = layout.html_block()
        self.plot = SamplingPlot(n_show)
        self.canvas = self.plot.canvas
        self.controls = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
                         "min_p": self.min_p, "order": self.order, "mode": self.mode, "prompt": self.prompt,
                         "run": self.run, "seed": self.seed, "draw": self.draw}

        for slider in (self.temperature, self.top_k, self.top_p, self.min_p, self.order):
            slider.observe(self.update, names="value")
        self.run.on_click(lambda button: self.set_prompt())
        self.mode.observe(lambda change: self.set_prompt(), names="value")  # chat or raw text: another input
        self.draw.on_click(lambda button: self.show_continuations())
        self.widget = widgets.VBox([
            layout.row([self.prompt, self.mode, self.run]),
            layout.row([layout.column([self.temperature, self.top_k, self.top_p, self.min_p, self.order,
                                       self.numbers], 340),
                        layout.figure_image(self.canvas)]),
            layout.row([self.draw, self.seed]),
            self.continuations,
        ])
        self.set_prompt()

    def settings(self) -> dict[str, Any]:
        return {"temperature": self.temperature.value, "top_k": self.top_k.value, "top_p": self.top_p.value,
                "min_p": self.min_p.value, "order": self.order.value}

    def set_prompt(self) -> None:
        """Run the model on the prompt box's text (the only forward pass outside the button) and redraw."""
        self.scores = next_token_scores(self.lm, self.prompt.value, chat=self.mode.value == "chat",
                                        n_show=self.n_show)
        self.plot.set_tokens(self.scores.top_texts)
        self.continuations.value = ""
        self.update()

    def update(self, change: Any = None) -> None:
        settings = self.settings()
        view = compute(self.scores, **settings)
        render(self.plot, view)
        self.canvas.describe(alt_text(view, settings))
        self.numbers.value = summary_html(view)

    def show_continuations(self) -> None:
        self.continuations.value = "<i>drawing...</i>"
        texts = draw_continuations(self.lm, self.scores.input_ids, n=4, max_new_tokens=24, seed=self.seed.value,
                                   **self.settings())
        items = "".join(f"<li><code>{html.escape(text)}</code></li>" for text in texts)
        self.continuations.value = f"<ol style='margin:0'>{items}</ol>"


# ---------------------------------------------------------------------------------------------------------------
# A still picture (no widget): every generated step of a few settings


TAIL_STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"))  # line and marker per setting, told apart in grey too


def tail_figure(tails: dict[str, tuple[Any, Any]], rank_line: int = 1000) -> Any:
    """Two panels over every generated step, one series per setting: how many tokens the sampler kept (log), and
    the model's rank of the token drawn (1 = its favourite; a dotted line at ``rank_line``).

    ``tails``: ``{label: (kept, drawn_rank)}``, per step the kept count and the drawn token's 0-based rank (lists
    or tensors). Each setting gets its own line style and marker, so a curve under another still shows.

    >>> figure = tail_figure({"T = 1": ([3, 5], [0, 2]), "T = 1.5": ([3, 9], [1, 1200])})
    >>> [line.get_label() for line in figure.axes[1].get_lines()][:2]
    ['T = 1', 'T = 1.5']
    """
    from matplotlib.figure import Figure

    from labkit.explorers.canvas import describe, plain, readable

    if not isinstance(tails, dict) or not tails:
        raise ValueError(f"tails must be a non-empty dict {{label: (kept, drawn_rank)}}, got {tails!r}")
    figure = Figure(figsize=(9, 3.6), dpi=80, layout="constrained")
    kept_axes, rank_axes = figure.subplots(1, 2, sharex=True)
    said = []
    for (label, (kept, drawn_rank)), (line, marker) in zip(tails.items(), TAIL_STYLES * len(tails)):
        kept, ranks = [int(k) for k in torch.as_tensor(kept).tolist()], [int(r) + 1 for r in
                                                                          torch.as_tensor(drawn_rank).tolist()]
        kept_axes.plot(kept, linestyle=line, marker=marker, markersize=3, linewidth=1.2, label=label)
        rank_axes.plot(ranks, linestyle="none", marker=marker, markersize=4, label=label)
        beyond = sum(rank > rank_line for rank in ranks)
        said.append(f"{label}: kept {plain(float(torch.tensor(kept).median()))} tokens at the median step "
                    f"(at most {max(kept):,}); drawn token ranked {max(ranks):,} at worst, beyond {rank_line:,} at "
                    f"{beyond} of {len(ranks)} steps")
    kept_axes.set(yscale="log", title="tokens the sampler kept", xlabel="step (3 continuations in a row)")
    rank_axes.set(yscale="log", title="model's rank of the drawn token (1 = favourite)", xlabel="step")
    rank_axes.axhline(rank_line, color="grey", linestyle=":", label=f"rank {rank_line:,}")
    handles, labels = kept_axes.get_legend_handles_labels()
    handles.append(rank_axes.get_lines()[-1])
    labels.append(f"rank {rank_line:,} (right)")
    figure.legend(handles, labels, loc="outside lower center", ncols=len(labels))  # below both, over no data
    return describe(readable(figure), "Every generated step, two panels on log scales: tokens the sampler kept, "
                    "and the model's rank of the drawn token. " + "; ".join(said) + ".")


def sampling_explorer(lm: Any = None, prompt: str = DEFAULT_PROMPT, n_show: int = 12,
                      chat: bool | None = None) -> SamplingExplorer:
    """The lab 01 explorer over ``lm`` (default: the embedded model); ``chat`` None opens it as the model reads
    text (a chat turn for a chat model, raw text for a base model)."""
    if lm is None:
        from labkit.runtime.models import load_model

        lm = load_model()
    return SamplingExplorer(lm, prompt, n_show, chat)
