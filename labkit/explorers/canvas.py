"""A matplotlib figure drawn once and shown as PNG bytes in an ``ipywidgets.Image``, and every picture's text.

Why not ipympl or ``%matplotlib widget``: Colab does not run it, and re-creating a figure on every slider move
is slow. The figure uses the Agg backend directly (no pyplot, so no global state and no figure leak), its
artists are updated in place by an explorer's ``render``, and :meth:`FigureCanvas.refresh` re-encodes it.

Text alternatives: every picture says what it shows in numbers, for a screen reader and for anyone who cannot
read the image. A static figure carries its text (:func:`describe`) and shows as ``<img alt=...>`` HTML beside
its PNG (JupyterLab, Colab and nbviewer pick the HTML; the PNG stays for the rest). A live explorer cannot put
an ``alt`` on the ``ipywidgets.Image`` element (core ipywidgets have no such trait in 7.7 or 8, and 8's
``tooltip`` raises in the page for a widget without a description, ipywidgets#3860), so its canvas keeps a
caption, an HTML widget under the image, rewritten with the numbers on every update (:meth:`FigureCanvas.describe`;
``aria-live`` so a screen reader hears the change).
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any, Iterable

import ipywidgets as widgets
from matplotlib.artist import Artist
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def figure_png(figure: Figure) -> bytes:
    """A figure drawn once as PNG bytes, at its own size (show with ``IPython.display.Image``)."""
    buffer = io.BytesIO()
    FigureCanvasAgg(figure).print_png(buffer)
    return buffer.getvalue()


MIN_TEXT_PX = 11.0  # the smallest text a figure draws, in pixels of its PNG (shown at its own size)
ALT_ATTRIBUTE = "labkit_alt_text"  # where a figure keeps its text alternative
CAPTION_CLASS = "labkit-alt"  # the class of an explorer's caption element (the browser test reads it)


def readable(figure: Figure, min_px: float = MIN_TEXT_PX) -> Figure:
    """Raise every text of the figure (tick labels, labels, titles, legends, annotations) to at least ``min_px``
    pixels at the figure's dpi; ticks drawn later keep the size. Returns the figure.

    >>> figure = Figure(dpi=80)
    >>> axes = figure.add_subplot()
    >>> label = axes.set_xlabel("x", fontsize=6)
    >>> round(readable(figure).axes[0].xaxis.label.get_fontsize() * 80 / 72, 1)
    11.0
    """
    from matplotlib.text import Text

    min_pt = min_px * 72 / figure.dpi
    for axes in figure.axes:
        for axis in (axes.xaxis, axes.yaxis):
            for which in ("major", "minor"):
                ticks = axis.get_major_ticks() if which == "major" else axis.get_minor_ticks()
                size = ticks[0].label1.get_fontsize() if ticks else min_pt
                if size < min_pt:
                    axis.set_tick_params(which=which, labelsize=min_pt)
    for text in figure.findobj(Text):
        if text.get_fontsize() < min_pt:
            text.set_fontsize(min_pt)
    return figure


def plain(value: float) -> str:
    """A number as a text alternative says it: thousands with commas, otherwise three significant digits.

    >>> plain(21743.2), plain(2.2), plain(0.000123), plain(70.68), plain(-0.018)
    ('21,743', '2.2', '0.000123', '70.7', '-0.018')
    """
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def describe(figure: Figure, text: str) -> Figure:
    """Attach ``text`` as the figure's text alternative and return the figure (what a figure function returns).

    >>> figure = describe(Figure(), "one line: 1 to 3")
    >>> alt_text(figure)
    'one line: 1 to 3'
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"text must be a non-empty string saying what the figure shows, got {text!r}")
    setattr(figure, ALT_ATTRIBUTE, text)
    return figure


def alt_text(figure: Figure) -> str | None:
    """The figure's text alternative, or None when it has none."""
    return getattr(figure, ALT_ATTRIBUTE, None)


def picture_html(png: bytes, alt: str, width: int | None = None) -> str:
    """An ``<img>`` of PNG bytes with its text alternative (``width`` in px: shown at most that wide)."""
    size = f' style="max-width:100%;width:{width}px;height:auto"' if width else ""
    return (f'<img src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}" '
            f'alt="{html.escape(alt, quote=True)}"{size}>')


def figure_html(figure: Figure) -> str | None:
    """A described figure as ``<img alt=...>`` HTML; None for a figure without a text (IPython then skips it)."""
    text = alt_text(figure)
    if text is None:
        return None
    width = round(figure.get_size_inches()[0] * figure.dpi)
    return picture_html(figure_png(figure), text, width)


def show_figures_as_png() -> bool:
    """Let a plain ``Figure`` left as a cell's last expression show as its PNG (returns whether it could), and a
    described one (:func:`describe`) also as ``<img alt=...>`` HTML, which JupyterLab and Colab show first.

    IPython draws a matplotlib figure only once pyplot's inline backend has registered a PNG formatter, and these
    figures never touch pyplot: without this, a cell ending in one prints ``<Figure size 512x240 with 1 Axes>``.
    Harmless outside IPython (nothing to register) and when pyplot registers its own formatter later.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    shell.display_formatter.formatters["image/png"].for_type(Figure, figure_png)
    shell.display_formatter.formatters["text/html"].for_type(Figure, figure_html)
    return True


class FigureCanvas:
    """A figure plus the ``widgets.Image`` that shows it.

    >>> canvas = FigureCanvas(width_in=3, height_in=2, dpi=50)
    >>> line, = canvas.figure.add_subplot().plot([0, 1], [0, 1])
    >>> canvas.refresh()
    >>> canvas.image.value[:4] == b"\\x89PNG"
    True
    """

    def __init__(self, width_in: float = 8.0, height_in: float = 4.0, dpi: int = 96,
                 layout: str | None = "constrained"):
        self.figure = Figure(figsize=(width_in, height_in), dpi=dpi, layout=layout)
        self._agg = FigureCanvasAgg(self.figure)
        self.image = widgets.Image(format="png")
        self.caption = widgets.HTML()  # the picture's text alternative, rewritten with it (describe)
        self.alt_text = ""
        self._backgrounds: dict = {}  # blit(): key -> the figure drawn without its animated artists

    @property
    def pixel_size(self) -> tuple[int, int]:
        """(width, height) of the PNG in pixels: the size the page shows it at (never stretched)."""
        width, height = self.figure.get_size_inches() * self.figure.dpi
        return round(width), round(height)

    def png(self) -> bytes:
        """The figure as PNG bytes, as drawn now."""
        buffer = io.BytesIO()
        self._agg.print_png(buffer)
        return buffer.getvalue()

    @property
    def agg(self) -> FigureCanvasAgg:
        """The Agg canvas, for explorers that blit (restore a background, draw a few artists)."""
        return self._agg

    def png_as_drawn(self) -> bytes:
        """The pixels as they stand, as PNG, without redrawing the figure (for blitting explorers)."""
        from PIL import Image

        buffer = io.BytesIO()
        # compress_level 1: a slider-sized image encodes several times faster, for a slightly larger file.
        Image.frombuffer("RGBA", self._agg.get_width_height(), self._agg.buffer_rgba(), "raw", "RGBA", 0, 1).save(
            buffer, format="png", compress_level=1)
        return buffer.getvalue()

    def blit(self, key: object, artists: Iterable[Artist]) -> None:
        """Show the figure with only ``artists`` redrawn, over a cached background, then encode it.

        The background is everything not animated, drawn once per ``key``: the key names what the static parts
        depend on (axis limits, a tensor's shape), so an explorer that snaps its limits to a few values keeps a
        few backgrounds and a move costs a restore, a few artists and a fast PNG encoding.
        """
        if key not in self._backgrounds:
            self._agg.draw()
            self._backgrounds[key] = self._agg.copy_from_bbox(self.figure.bbox)
        self._agg.restore_region(self._backgrounds[key])
        for artist in artists:
            artist.axes.draw_artist(artist)
        self.image.value = self.png_as_drawn()

    def forget_backgrounds(self) -> None:
        """Drop the cached backgrounds (after a change no key names, such as new tick labels)."""
        self._backgrounds.clear()

    def snapshot_png(self) -> bytes:
        """The image as it stands, re-encoded small (the picture a static view of the notebook shows)."""
        from PIL import Image

        buffer = io.BytesIO()
        Image.open(io.BytesIO(self.image.value)).save(buffer, format="png", optimize=True)
        return buffer.getvalue()

    def describe(self, text: str) -> None:
        """Set the picture's text alternative: what the figure shows now, in numbers (call from ``render``)."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"text must be a non-empty string saying what the figure shows, got {text!r}")
        if text != self.alt_text:
            self.alt_text = text
            self.caption.value = (f'<div class="{CAPTION_CLASS}" aria-live="polite" style="font-size:12px;'
                                  f'line-height:1.35;color:#444"><b>Picture:</b> {html.escape(text)}</div>')

    def refresh(self) -> None:
        """Re-encode the figure into the image widget (call after updating artists)."""
        self.image.value = self.png()
