"""Run All with every stub untouched prints no prediction's answer: a reveal cell's output waits for the answer.

A learner who opens a lab and presses Run All (labs 04 and 05 invite it) runs every reveal cell right under a
check that says NOT ATTEMPTED. Each reveal cell's body runs inside ``with reveal("NN.name"):``
(``labkit.exercises.reveals``), which prints "answer NN.name first" and discards the body's output until that
prediction has a well-formed answer on record. This test runs every learner notebook top to bottom in a fresh
kernel with a fresh progress file, as a learner's first Run All does, and reads every output (text, HTML, an
explorer's text) for each prediction checked in that notebook:

- its registered giveaways (``Prediction.giveaways``: "fewest H100s: 4", "n - 1") and, for a choice, the text
  of the right choice, anywhere;
- its answer's value rendered the ways a notebook prints it (``test_reveals.given_away``): a rendering of four
  characters or more ("4.375", "1,015") anywhere; any rendering, short ones in the forms that read as an answer
  ("decode: 7"), in the reveal cells' output.

It also asserts that Run All reaches the end (no cell raises: JupyterLab stops a Run All at the first error) and
that every guarded reveal cell printed its waiting line. A run of lab 03 with its prediction answered beforehand
shows the finder finding the answer the guard then lets through.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import nbformat
import pytest

from labkit.exercises import exercises, progress
from labkit.exercises.definitions import Prediction
from labkit.exercises.reveals import waiting_message
from labkit.instructor.authoring import is_reveal
from test_giveaways import _checked_id, _flat, giveaway_pattern
from test_reveals import _cell_text, given_away

ROOT = Path(__file__).resolve().parent.parent
LEARNER_NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PREDICTIONS = [exercise for exercise in exercises() if isinstance(exercise, Prediction)]
_GUARD = re.compile(r"""^with reveal\(\s*(?:["']([^"']+)["']|explorer_answers)\s*\):""")


def run_all(path: Path, progress_file: Path) -> dict:
    """The notebook at ``path`` run top to bottom in a fresh kernel (errors recorded, not raised), as a dict."""
    from nbclient import NotebookClient
    from traitlets.config import Config

    notebook = nbformat.read(path, as_version=4)
    config = Config({"KernelManager": {"transport": "ipc", "ip": str(progress_file.parent / "kernel")}})
    client = NotebookClient(notebook, timeout=600, kernel_name="python3", allow_errors=True, config=config,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute(env={**os.environ, "HF_HUB_OFFLINE": "1", "LABKIT_PROGRESS": str(progress_file)})
    return json.loads(nbformat.writes(notebook))


def answers_shown(notebook: dict, exercise) -> list[str]:
    """Where an output of ``notebook`` states ``exercise``'s answer, as "cell N: …snippet…"."""
    truth = exercise.reference()
    choice_text = [exercise.answer_text(truth)] if isinstance(truth, str) and exercise.answer_text(truth) else []
    found = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        text = _cell_text(notebook, cell)
        snippets = given_away(text, truth, exercise.choices, long_only=not is_reveal(cell))
        flat = _flat(text)
        snippets += [flat[max(0, m.start() - 60):m.end() + 60] for giveaway in (*exercise.giveaways, *choice_text)
                     for m in giveaway_pattern(giveaway).finditer(flat)]
        found += [f"cell {index}: …{snippet}…" for snippet in dict.fromkeys(snippets)]
    return found


def checked_here(notebook: dict) -> list:
    ids = {_checked_id(cell) for cell in notebook["cells"]}
    return [exercise for exercise in PREDICTIONS if exercise.id in ids]


def guarded_reveals(notebook: dict) -> list[tuple[int, str | None]]:
    """(cell index, the prediction it waits for, or None for the explorer tasks) of every guarded reveal cell."""
    found = []
    for index, cell in enumerate(notebook["cells"]):
        match = _GUARD.match("".join(cell["source"])) if cell["cell_type"] == "code" and is_reveal(cell) else None
        if match:
            found.append((index, match.group(1)))
    return found


def _errors(notebook: dict) -> list[str]:
    return [f"cell {index}: {output.get('ename')}: {output.get('evalue')}" for index, cell in
            enumerate(notebook["cells"]) for output in cell.get("outputs", []) if output.get("output_type") == "error"]


def test_every_prediction_has_a_guarded_reveal_in_its_notebook():
    guarded = {}
    for path in LEARNER_NOTEBOOKS:
        notebook = json.loads(path.read_text(encoding="utf-8"))
        for _, question in guarded_reveals(notebook):
            guarded.setdefault(question, path.name)
        for exercise in checked_here(notebook):
            assert exercise.id in guarded and guarded[exercise.id] == path.name, (
                f"{path.name}: no reveal cell runs under `with reveal({exercise.id!r}):`")


def run_all_problems(name: str, executed: dict, widget_text: dict[int, str] | None = None) -> list[str]:
    """What a first Run All of learner notebook ``name`` with every stub untouched must not show, as lines (empty:
    nothing): an error, a guarded reveal that printed anything but its waiting line, a prediction's answer in an
    output. ``executed`` is the notebook with its outputs; ``widget_text`` (cell index -> the text a page shows of
    the cell's widgets) is what the browser's Run All adds to the explorers' text saved in the file."""
    problems = [f"{name}: Run All stops at an error: {error}" for error in _errors(executed)]
    for index, question in guarded_reveals(executed):
        printed = _cell_text(executed, executed["cells"][index])
        expected = waiting_message(question if question is not None else {})
        if printed.strip() != expected:
            problems.append(f"{name} cell {index} printed {printed[:300]!r}, not the waiting line")
    if widget_text:
        executed = json.loads(json.dumps(executed))
        for index, text in widget_text.items():
            executed["cells"][index].setdefault("outputs", []).append(
                {"output_type": "stream", "name": "stdout", "text": text})
    found = {exercise.id: answers_shown(executed, exercise) for exercise in checked_here(executed)}
    if not found and guarded_reveals(executed):
        problems.append(f"{name}: it has guarded reveals but checks no prediction the finder knows")
    problems += [f"{name}: Run All shows the answer of {exercise_id}: {where}"
                 for exercise_id, places in found.items() for where in places]
    return problems


@pytest.mark.parametrize("path", LEARNER_NOTEBOOKS, ids=[path.stem for path in LEARNER_NOTEBOOKS])
def test_run_all_with_the_stubs_untouched_shows_no_prediction_answer(path, tmp_path):
    """Skipped where the browser test runs the same notebook in the same session (its Run All, with the stubs
    untouched and a fresh progress file, is checked by :func:`run_all_problems` too: tests/conftest.py)."""
    problems = run_all_problems(path.name, run_all(path, tmp_path / "progress.json"))
    assert not problems, "\n".join(problems)


def test_once_answered_the_reveal_shows_the_answer_and_the_finder_sees_it(tmp_path):
    """The negative control: lab 03's prediction answered well-formed before the Run All, so its reveals print."""
    exercise = next(e for e in PREDICTIONS if e.id == "03.predict_fp16_round_trip")
    progress_file = tmp_path / "progress.json"
    progress.record(exercise.id, "passed", 1, 1, path=progress_file, close=False)
    executed = run_all(ROOT / "notebooks" / "03_number_formats.ipynb", progress_file)
    shown = answers_shown(executed, exercise)
    assert any("400 of" in where for where in shown), shown
    reveal_cells = {index for index, question in guarded_reveals(executed) if question == exercise.id}
    assert {int(where.split(":")[0].split()[1]) for where in shown} <= reveal_cells, shown


def test_an_answer_in_an_explorers_text_on_the_page_is_found():
    """The browser's side of the check (tests/test_browser.py hands it the page's widget text): a prediction's
    giveaway shown by an explorer on the page is named, in the cell that shows it."""
    path = ROOT / "notebooks" / "05_memory_kv_cache.ipynb"
    notebook = json.loads(path.read_text(encoding="utf-8"))
    exercise = next(e for e in checked_here(notebook) if e.giveaways)
    first_code = next(i for i, cell in enumerate(notebook["cells"]) if cell["cell_type"] == "code")
    assert not [line for line in run_all_problems(path.name, notebook) if "shows the answer" in line]
    found = run_all_problems(path.name, notebook, {first_code: f"a readout: {exercise.giveaways[0]}"})
    assert [line for line in found if f"answer of {exercise.id}: cell {first_code}:" in line], found
