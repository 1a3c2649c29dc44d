"""Predict, then see: what a learner reads before answering a prediction never states its answer.

Each prediction's registration names its answer's giveaways (``Exercise.giveaways``: the words and numbers that
would state it, "n - 1" or "7 decode" for the forward calls after a prefill). A learner meets the learner notebook
top to bottom, so this test reads it that way, for every prediction:

- **above the check**: every markdown cell, every code cell's visible source and every saved output (text, HTML,
  an explorer's text), from the lab's first cell;
- **the check itself** and the exercise's own texts (its title, the question, the hint a malformed answer shows);
- **below the check, up to the next exercise** (its heading, its check, or the lab's closing sections): the same;
- **every check's saved output anywhere in the notebook**: another exercise's title is visible text too.

What is not read is the reveal: the explanation the check prints once the learner has answered
(``Exercise.reveal``, never in a committed learner copy, where no prediction is answered), and the cells tagged
``reveal``, which the build commits without outputs and with their source collapsed
(``labkit.instructor.authoring``). A ``<details>`` block counts as visible: one click opens it before answering.

``tests/test_reveals.py`` looks for the answer's value rendered the ways a notebook prints it; this test looks for
the words that explain it, which no rendering of a value finds.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import nbformat
import pytest

from labkit.exercises import exercises
from labkit.instructor.authoring import REVEAL_TAG, build, source_is_hidden
from test_reveals import _NEXT_EXERCISE, _cell_text

ROOT = Path(__file__).resolve().parent.parent
LEARNER_NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PREDICTIONS = [exercise for exercise in exercises() if exercise.kind == "prediction"]
_CHECK = re.compile(r"""\bcheck\(\s*["']([^"']+)["']""")


def _flat(text: str) -> str:
    """Text as read: markdown's line breaks and runs of spaces are one space."""
    return " ".join(text.split())


def giveaway_pattern(giveaway: str) -> re.Pattern:
    """``giveaway`` as a whole word or number, case-insensitive ("7 decode" is not inside "17 decode").

    >>> bool(giveaway_pattern("7 decode").search("then 7 decode calls")), bool(giveaway_pattern("7 decode").search("17 decode"))
    (True, False)
    """
    before = r"(?<![\w.,])" if giveaway[:1].isalnum() else ""
    after = r"(?![\w])" if giveaway[-1:].isalnum() else ""
    return re.compile(before + re.escape(_flat(giveaway)) + after, re.I)


def _visible(notebook: dict, cell: dict) -> str:
    """What a learner sees of a cell before running anything: markdown, a code cell's source unless collapsed, and
    its saved outputs (widgets' text included)."""
    if cell["cell_type"] == "markdown":
        return "".join(cell["source"])
    if cell["cell_type"] != "code":
        return ""
    source = "" if source_is_hidden(cell) else "".join(cell["source"])
    return source + "\n" + _cell_text(notebook, cell)


def _checked_id(cell: dict) -> str | None:
    match = _CHECK.search("".join(cell["source"])) if cell["cell_type"] == "code" else None
    return match.group(1) if match else None


def read_before_answering(notebook: dict, exercise_id: str) -> list[tuple[str, str]]:
    """(where, text) of everything a learner reads before answering ``exercise_id``: the lab up to its check,
    the check, what follows up to the next exercise, and every check's saved output in the notebook."""
    cells = notebook["cells"]
    check_at = next(i for i, cell in enumerate(cells) if _checked_id(cell) == exercise_id)
    read = [(f"cell {i}", _visible(notebook, cell)) for i, cell in enumerate(cells[:check_at + 1])]
    for index in range(check_at + 1, len(cells)):
        cell = cells[index]
        if cell["cell_type"] == "code" and _checked_id(cell):
            break
        text = _visible(notebook, cell)
        stop = _NEXT_EXERCISE.search(text) if cell["cell_type"] == "markdown" else None
        read.append((f"cell {index} (below the check)", text[:stop.start()] if stop else text))
        if stop:
            break
    read += [(f"cell {i} (another check's output)", _cell_text(notebook, cell)) for i, cell in enumerate(cells)
             if _checked_id(cell) not in (None, exercise_id)]
    return read


def giveaways_in(notebook: dict, exercise) -> list[str]:
    """Each place a learner reads one of ``exercise``'s giveaways before answering, as "where: …snippet…"."""
    texts = [*read_before_answering(notebook, exercise.id), ("its title", exercise.title),
             ("its question", exercise.hand_cases[0].label), ("its hint", " ".join(exercise.hints))]
    found = []
    for where, text in texts:
        text = _flat(text)
        for giveaway in exercise.giveaways:
            found += [f"{where}: {giveaway!r} in …{text[max(0, m.start() - 70):m.end() + 70]}…"
                      for m in giveaway_pattern(giveaway).finditer(text)]
    return found


def _home(exercise_id: str) -> Path:
    homes = [path for path in LEARNER_NOTEBOOKS
             if any(_checked_id(cell) == exercise_id for cell in json.loads(path.read_text())["cells"])]
    assert len(homes) == 1, f"{exercise_id} is checked in {len(homes)} learner notebooks, not one"
    return homes[0]


# ----- the tests -----

@pytest.mark.parametrize("exercise", PREDICTIONS, ids=[exercise.id for exercise in PREDICTIONS])
def test_a_prediction_names_its_giveaways_and_its_check_explains_it(exercise):
    assert exercise.giveaways, f"{exercise.id} names no giveaway words: nothing could hold its page to the rule"
    assert exercise.reveal.strip(), f"{exercise.id} has no reveal: its check explains nothing once answered"
    shown = _flat(exercise.reveal)
    assert any(giveaway_pattern(giveaway).search(shown) for giveaway in exercise.giveaways), (
        f"{exercise.id}: no giveaway is in its own reveal; they may not be the words that explain the answer")


@pytest.mark.parametrize("exercise", PREDICTIONS, ids=[exercise.id for exercise in PREDICTIONS])
def test_nothing_a_learner_reads_before_answering_gives_the_answer(exercise):
    path = _home(exercise.id)
    found = giveaways_in(json.loads(path.read_text(encoding="utf-8")), exercise)
    assert not found, f"{path.name}: {exercise.id}'s answer is on the page before the learner answers:\n" + "\n".join(found)


def test_the_check_shows_the_reveal_only_once_the_learner_has_answered():
    from labkit.exercises.checking import check_function

    exercise = next(e for e in PREDICTIONS if e.id == "06.predict_shorter_run_e2e")
    answered = check_function(exercise, lambda: 1200)
    assert answered.status == "passed" and "quarter" in str(answered) and "quarter" in answered._repr_html_()
    for not_yet in (check_function(exercise, None), check_function(exercise, lambda: "soon"),
                    check_function(exercise, lambda: (_ for _ in ()).throw(NotImplementedError()))):
        assert not_yet.status != "passed"
        assert "quarter" not in str(not_yet) and "quarter" not in not_yet._repr_html_()


# ----- the rule, on a notebook built the way `labkit build` builds one -----

def _built_with(tmp_path: Path, extra_cells: list) -> dict:
    """Lab 06's learner copy as ``labkit build`` makes it (not executed) from its solution with ``extra_cells``
    inserted just below exercise 6.4's check."""
    solutions = tmp_path / "notebooks" / "solutions"
    solutions.mkdir(parents=True)
    name = "06_prefill_decode.ipynb"
    solution = nbformat.read(ROOT / "notebooks" / "solutions" / name, as_version=4)
    at = next(i for i, cell in enumerate(solution.cells) if _checked_id(cell) == "06.predict_shorter_run_e2e")
    solution.cells[at + 1:at + 1] = copy.deepcopy(extra_cells)
    nbformat.write(solution, solutions / name)
    [written] = build(tmp_path, only=[name])
    return json.loads(written.read_text(encoding="utf-8"))


def test_an_answer_typed_just_below_its_check_fails_the_rule(tmp_path):
    from nbformat.v4 import new_markdown_cell

    exercise = next(e for e in PREDICTIONS if e.id == "06.predict_shorter_run_e2e")
    learner = _built_with(tmp_path, [new_markdown_cell("A quarter lower: 1,015 ms, with no token computed faster.")])
    found = giveaways_in(learner, exercise)
    assert found and all("below the check" in problem for problem in found), found
    assert {"'quarter'", "'1,015'"} <= {problem.split(": ")[1].split(" in ")[0] for problem in found}


def test_a_reveal_cells_source_is_hidden_by_the_build_and_an_untagged_one_is_read(tmp_path):
    from nbformat.v4 import new_code_cell

    exercise = next(e for e in PREDICTIONS if e.id == "06.predict_shorter_run_e2e")
    computing = "shorter = timing.e2e_estimate(700, 35, 10)  # a quarter lower"
    hidden = _built_with(tmp_path / "tagged", [new_code_cell(computing, metadata={"tags": [REVEAL_TAG]})])
    assert giveaways_in(hidden, exercise) == []
    shown = _built_with(tmp_path / "untagged", [new_code_cell(computing)])
    assert any("quarter" in problem for problem in giveaways_in(shown, exercise))


def test_another_checks_printed_title_counts_as_read():
    exercise = next(e for e in PREDICTIONS if e.id == "06.predict_forward_calls")
    notebook = {"cells": [
        {"cell_type": "code", "source": ['check("06.predict_forward_calls")'], "outputs": [], "metadata": {}},
        {"cell_type": "markdown", "source": ["### Exercise 6.2 — the loop"], "metadata": {}},
        {"cell_type": "markdown", "source": ["far below, after the next exercise"], "metadata": {}},
        {"cell_type": "code", "source": ['check("06.greedy_loop")'], "metadata": {}, "outputs": [
            {"output_type": "stream", "name": "stdout", "text": ["[NOT ATTEMPTED] one prefill, then n - 1 decode calls"]}]},
    ]}
    found = giveaways_in(notebook, exercise)
    assert found and found[0].startswith("cell 3 (another check's output)"), found
