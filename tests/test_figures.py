"""Every picture is visible: a cell that makes a figure shows it as an image in both committed notebooks.

A matplotlib ``Figure`` that reaches a cell's output without a PNG prints as ``<Figure size 512x240 with 1 Axes>``
(in JupyterLab and on a code host): the prose around it then describes a picture nobody sees. labkit's figures
never touch pyplot, so ``labkit.explorers`` registers the PNG formatter itself (``show_figures_as_png``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(ROOT / "notebooks")) for p in NOTEBOOKS])
def test_every_figure_is_committed_as_an_image(path):
    notebook = json.loads(path.read_text(encoding="utf-8"))
    blind = []
    for index, cell in enumerate(notebook["cells"]):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            text = "".join(data.get("text/plain", ""))
            if text.startswith("<Figure size") and "image/png" not in data:
                blind.append(f"cell {index}: {text.strip()}")
    assert not blind, f"figures shown as text, not as a picture: {blind}"
