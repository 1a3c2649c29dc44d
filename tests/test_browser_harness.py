"""The browser test's comparison of checked outputs is nbval's (tests/browser_harness.py), shown without a browser.

Under ``make test`` the learner notebooks' outputs are compared in the browser run, not by a second nbval run, so
this comparison must find what nbval finds: nbval's own list of what it skips, a saved output equal to itself, a
changed number and a missing output found, and an unchecked cell left alone.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import nbformat
from nbval import plugin

import browser_harness as browser

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "05_memory_kv_cache.ipynb"


def _shown(notebook: Path) -> list[dict]:
    """The saved outputs as the browser's :func:`browser_harness.outputs` gives them (lines joined, cell index)."""
    notebook_node = nbformat.read(notebook, as_version=4)  # multi-line strings joined, as the browser gives them
    return [{"cell": index, **copy.deepcopy(dict(output))} for index, cell in enumerate(notebook_node.cells)
            if cell.cell_type == "code" for output in cell.outputs]


def _checked(notebook: Path) -> list[int]:
    cells = json.loads(notebook.read_text())["cells"]
    return [i for i, c in enumerate(cells) if "nbval-check-output" in c.get("metadata", {}).get("tags", ())]


def test_what_is_skipped_is_nbvals_own_list(request):
    collector = plugin.IPyNbFile.from_parent(request.session, path=NOTEBOOK)
    assert set(browser._NbvalCell.SKIP_COMPARE) == set(collector.skip_compare)


def test_saved_outputs_equal_themselves_and_a_changed_number_or_a_lost_output_is_found():
    shown = _shown(NOTEBOOK)
    assert browser.checked_output_differences(NOTEBOOK, shown) == []
    checked = _checked(NOTEBOOK)
    stream = next(o for o in shown if o["cell"] in checked and o["output_type"] == "stream")
    digit = next(ch for ch in stream["text"] if ch.isdigit())
    changed = [dict(o, text=o["text"].replace(digit, str((int(digit) + 1) % 10), 1)) if o is stream else o
               for o in shown]
    differences = browser.checked_output_differences(NOTEBOOK, changed)
    assert len(differences) == 1 and differences[0].startswith(f"cell {stream['cell']}:")
    assert "mismatch 'stdout'" in differences[0]
    lost = [o for o in shown if o is not stream]
    assert browser.checked_output_differences(NOTEBOOK, lost)[0].startswith(f"cell {stream['cell']}:")


def test_an_unchecked_cell_may_differ_and_a_duration_is_sanitized(tmp_path):
    shown = _shown(NOTEBOOK)
    checked = _checked(NOTEBOOK)
    unchecked = next(o for o in shown if o["cell"] not in checked and o["output_type"] == "stream")
    stream = next(o for o in shown if o["cell"] in checked and o["output_type"] == "stream")
    # The saved notebook says "took 7 s" where the run printed "took 1.5 ms"; an unchecked cell printed anything.
    saved = nbformat.read(NOTEBOOK, as_version=4)
    saved.cells[stream["cell"]].outputs = [nbformat.from_dict(dict(o, text=o["text"] + "took 7 s\n")) for o in
                                           saved.cells[stream["cell"]].outputs if o["output_type"] == "stream"]
    rewritten = tmp_path / NOTEBOOK.name
    nbformat.write(saved, rewritten)
    run = [dict(o, text="anything else\n") if o is unchecked else
           dict(o, text=o["text"] + "took 1.5 ms\n") if o is stream else o for o in shown]
    assert browser.checked_output_differences(rewritten, run) == []
    assert browser.checked_output_differences(NOTEBOOK, run) != []  # against the real file the extra line is new
