"""What every explorer shares: the object shape, a layout that fits a laptop's notebook, a picture for static views.

An explorer is an :class:`Explorer`: ``.widget`` (the box to show), ``.controls`` (name -> control widget, what a
test or a benchmark moves), ``.canvas`` (its :class:`~labkit.explorers.canvas.FigureCanvas`) and ``update()``
(what a control change runs: compute, then render). Displaying it (leave it last in a cell) sends one output with
three forms: the live widget, and a PNG of the figure as it stands then, alone and as ``<img alt=...>`` HTML
carrying the picture's text alternative. JupyterLab and Colab show the widget; a code host, nbviewer, or
JupyterLab on a notebook it does not trust yet shows the picture, never the widget's ``VBox(children=...`` text.
Under the live figure, a caption says what the picture shows in numbers, rewritten on every update
(:meth:`~labkit.explorers.canvas.FigureCanvas.describe`).

Layout rules, measured in Chromium with JupyterLab at 1024-1280 px wide (``tests/test_browser.py`` asserts them):

- controls sit in a column of fixed width (:data:`CONTROL_WIDTH`) that never shrinks, every control 100 % of it,
  so no readout or handle slides under the figure and no label is cut;
- the figure is shown at its own pixel size, never stretched (it may only shrink to the width it has, keeping its
  aspect), top-aligned beside the controls; the row wraps, putting the figure under the controls when narrow;
- descriptions get a fixed width wide enough for their text, toggle buttons a width that fits their labels.

Only core ipywidgets and Layout properties that exist in ipywidgets 7.7 (Colab) and 8.
"""

from __future__ import annotations

import base64
import math
from typing import Any, Sequence

CONTROL_WIDTH = 360  # px: the controls column
DESCRIPTION_WIDTH = 96  # px: a control's description ("temperature", "log2 context")
GAP = "0 12px 8px 0"  # margin right and below each block of a row


def description_style(width: int = DESCRIPTION_WIDTH) -> dict[str, str]:
    return {"description_width": f"{width}px"}


def full_width() -> Any:
    """Layout for a control filling the controls column."""
    import ipywidgets as widgets

    return widgets.Layout(width="100%", max_width="100%")


def column(children: list[Any], width: int = CONTROL_WIDTH) -> Any:
    """A fixed-width column of controls that neither shrinks nor grows in its row."""
    import ipywidgets as widgets

    return widgets.VBox(children, layout=widgets.Layout(width=f"{width}px", min_width=f"{width}px",
                                                         flex="0 0 auto", margin=GAP))


def row(children: list[Any], wrap: bool = True) -> Any:
    """Blocks side by side, top-aligned (nothing stretched to the tallest), wrapping when narrow."""
    import ipywidgets as widgets

    # No width: a box stretches to its parent, less its own margin (width 100% plus the margin overflows).
    return widgets.HBox(children, layout=widgets.Layout(flex_flow="row wrap" if wrap else "row nowrap",
                                                        align_items="flex-start"))


def figure_image(canvas: Any) -> Any:
    """The canvas's image widget, laid out at the figure's own pixel size (shrinks to fit, keeps its aspect),
    with its caption (the picture's text alternative) under it, as wide as the image."""
    import ipywidgets as widgets

    width, height = canvas.pixel_size
    canvas.image.layout = widgets.Layout(width=f"{width}px", max_width="100%", height="auto",
                                         object_fit="contain", align_self="flex-start", flex="0 0 auto")
    canvas.caption.layout = widgets.Layout(width=f"{width}px", max_width="100%", margin="2px 0 0 0")
    return widgets.VBox([canvas.image, canvas.caption],
                        layout=widgets.Layout(max_width="100%", align_self="flex-start", flex="0 1 auto",
                                              margin=GAP))


NICE_STEPS = (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)


def nice_limit(value: float, levels: Sequence[float] | None = None) -> float:
    """An axis limit at or above ``value`` that changes in a few steps only, so a blitting explorer keeps one
    background per limit: the first of ``levels`` (ascending) at or above ``value``, the last when none is; without
    ``levels``, the smallest of 1, 1.5, 2, 3, 4, 5, 6, 8 times a power of ten at or above ``value`` (> 0).

    >>> nice_limit(0.37), nice_limit(2.2), nice_limit(1234.0)
    (0.4, 3.0, 1500.0)
    >>> nice_limit(2.5, (2.0, 4.0)), nice_limit(9.0, (2.0, 4.0))
    (4.0, 4.0)
    """
    if levels is not None:
        return next((level for level in levels if level >= value), levels[-1])
    power = 10.0 ** math.floor(math.log10(value))
    return next(round(step * power, 12) for step in NICE_STEPS if step * power >= value * (1 - 1e-12))


def html_block(width: int | None = None) -> Any:
    """An HTML widget for numbers or text: a fixed width, or the whole row."""
    import ipywidgets as widgets

    return widgets.HTML(layout=widgets.Layout(width=f"{width}px" if width else None, max_width="100%"))


class Explorer:
    """The shape every explorer shares; subclasses build ``widget``, ``controls`` and ``canvas`` in ``__init__``."""

    title = "explorer"
    widget: Any
    controls: dict[str, Any]
    canvas: Any

    def update(self, change: Any = None) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def picture(self) -> bytes:
        """The figure as it stands, as a small PNG (the static form of the display)."""
        return self.canvas.snapshot_png()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        """The live widget view and a picture of it, in one output; frontends pick what they can show."""
        from labkit.explorers.canvas import picture_html

        png = self.picture()
        bundle = {
            "text/plain": f"<labkit {self.title}: run the notebook to use its controls>",
            "image/png": base64.b64encode(png).decode("ascii"),
            "text/html": picture_html(png, self.canvas.alt_text or self.title, self.canvas.pixel_size[0]),
        }
        model_id = getattr(self.widget, "model_id", None)
        if model_id:  # no kernel comm (a plain Python shell): the picture alone
            bundle["application/vnd.jupyter.widget-view+json"] = {"version_major": 2, "version_minor": 0,
                                                                  "model_id": model_id}
            handle = getattr(self.widget, "_handle_displayed", None)
            if handle is not None:
                handle()
        return bundle
