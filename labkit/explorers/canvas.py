"""A matplotlib figure drawn once and shown as PNG bytes in an ``ipywidgets.Image``.

Why not ipympl or ``%matplotlib widget``: Colab does not run it, and re-creating a figure on every slider move
is slow. The figure uses the Agg backend directly (no pyplot, so no global state and no figure leak), its
artists are updated in place by an explorer's ``render``, and :meth:`FigureCanvas.refresh` re-encodes it.
"""

from __future__ import annotations

import io
from typing import Iterable

import ipywidgets as widgets
from matplotlib.artist import Artist
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def figure_png(figure: Figure) -> bytes:
    """A figure drawn once as PNG bytes, at its own size (show with ``IPython.display.Image``)."""
    buffer = io.BytesIO()
    FigureCanvasAgg(figure).print_png(buffer)
    return buffer.getvalue()


def show_figures_as_png() -> bool:
    """Let a plain ``Figure`` left as a cell's last expression show as its PNG (returns whether it could).

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

    def refresh(self) -> None:
        """Re-encode the figure into the image widget (call after updating artists)."""
        self.image.value = self.png()
