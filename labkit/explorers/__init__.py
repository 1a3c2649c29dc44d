"""Explorers: one interactive widget per lab (layer 3). They import the core, never the reverse.

Every explorer has the same shape (docs/DESIGN.md, "Explorers"):

- ``compute(...)`` — a pure function of plain values (numbers, tensors, a model's *precomputed* outputs) that
  returns a plain dataclass; tests call it directly. Heavy work such as a model forward pass happens once,
  before the widget exists, never in a slider callback.
- ``render(canvas, result)`` — updates matplotlib artists that were created once (``set_data``,
  ``set_height``, ``set_text``), never re-plotting from scratch.
- ``build(...)`` / ``*_explorer(...)`` — wires core ipywidgets (sliders, dropdowns, toggles, ``Image``,
  ``HTML``) to ``compute`` + ``render`` and returns the widget. Callbacks hold no math.

Only core ipywidgets are used, so explorers work in JupyterLab (ipywidgets 8) and in Colab (7.7). Figures
reach the page as PNG bytes in a ``widgets.Image`` through :class:`FigureCanvas`, which needs no ipympl.
"""

from labkit.explorers.canvas import FigureCanvas, show_figures_as_png

show_figures_as_png()  # a figure an explorer module returns shows as a picture, not as "<Figure size ...>"


def yours(answer) -> str:
    """A learner's answer to an explorer task, as the reveal prints it beside labkit's: ``...`` (the placeholder
    of the answers cell) reads "not answered yet", and a placeholder inside a tuple reads "...".

    >>> yours(...), yours(7), yours((8, ...))
    ('not answered yet', '7', '(8, ...)')
    """
    if answer is Ellipsis:
        return "not answered yet"
    return str(answer).replace("Ellipsis", "...")


__all__ = ["FigureCanvas", "show_figures_as_png", "yours"]
