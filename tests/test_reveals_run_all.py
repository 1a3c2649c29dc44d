"""Run All with every stub untouched prints no prediction's answer: a reveal cell's output waits for the answer.

A learner who opens a lab and presses Run All (labs 04 and 05 invite it) runs every reveal cell right under a
check that says NOT ATTEMPTED. Each reveal cell is one statement, ``if reveal("NN.name"):``
(``labkit.exercises.reveals``), whose body runs only once that prediction has a well-formed answer on record;
until then the cell prints "answer NN.name first" and computes nothing. This test runs every learner notebook top
to bottom in a fresh kernel with a fresh progress file, as a learner's first Run All does, and reads every output
(text, HTML, an explorer's text) for each prediction checked in that notebook:

- its registered giveaways (``Prediction.giveaways``: "fewest H100s: 4", "n - 1") and, for a choice, the text
  of the right choice, anywhere;
- its answer's value rendered the ways a notebook prints it (``test_reveals.given_away``): a rendering of four
  characters or more ("4.375", "1,015") anywhere; any rendering, short ones in the forms that read as an answer
  ("decode: 7"), in the reveal cells' output.

It also asserts that Run All reaches the end (no cell raises: JupyterLab stops a Run All at the first error, and a
later cell reading a name only a reveal's body defines would), that every guarded reveal cell printed its waiting
line and nothing else, and that afterwards none of the names only the reveals' bodies bind exists in the kernel:
the bodies did not run. A run of lab 03 with its prediction answered beforehand shows the finder finding the
answer the guard then lets through, and those names existing.
"""

from __future__ import annotations

import ast
import json
import os
import re
import symtable
from pathlib import Path

import nbformat
import pytest

from labkit.exercises import exercises, progress
from labkit.exercises.definitions import Prediction
from labkit.exercises.reveals import waiting_message
from labkit.instructor.authoring import is_reveal
from labkit.instructor.grader.course_cells import cell_names
from test_giveaways import _checked_id, _flat, giveaway_pattern
from test_reveals import _cell_text, given_away

ROOT = Path(__file__).resolve().parent.parent
LEARNER_NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PREDICTIONS = [exercise for exercise in exercises() if isinstance(exercise, Prediction)]
_GUARD = re.compile(r"""^if reveal\(\s*(?:["']([^"']+)["']|explorer_answers)\s*\):""")
_PROBE = "# which of these names exist after the Run All\nprint(json.dumps(sorted(set({names!r}) & set(globals()))))"


def run_all(path: Path, progress_file: Path, probe: set[str] | None = None) -> dict:
    """The notebook at ``path`` run top to bottom in a fresh kernel (errors recorded, not raised), as a dict.

    With ``probe``, a last cell reports which of those names exist in the kernel afterwards: the notebook comes
    back without that cell, and the names under its ``"probed"`` key."""
    from nbclient import NotebookClient
    from traitlets.config import Config

    notebook = nbformat.read(path, as_version=4)
    if probe is not None:
        notebook.cells.append(nbformat.v4.new_code_cell("import json\n" + _PROBE.format(names=sorted(probe))))
    config = Config({"KernelManager": {"transport": "ipc", "ip": str(progress_file.parent / "kernel")}})
    client = NotebookClient(notebook, timeout=600, kernel_name="python3", allow_errors=True, config=config,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute(env={**os.environ, "HF_HUB_OFFLINE": "1", "LABKIT_PROGRESS": str(progress_file)})
    executed = json.loads(nbformat.writes(notebook))
    if probe is not None:
        probe_cell = executed["cells"].pop()
        printed = "".join("".join(output.get("text", "")) for output in probe_cell.get("outputs", []))
        executed["probed"] = json.loads(printed)
    return executed


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


def guard_problem(source: str) -> str | None:
    """Why a guarded reveal cell could run code before its answer is on record (None: it cannot): it must be
    exactly one ``if reveal(...):`` statement, without ``else``, nothing before or after it."""
    tree = ast.parse(source)
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.If):
        return "code outside its `if reveal(...):` runs unanswered"
    if tree.body[0].orelse:
        return "its `else:` runs unanswered"
    return None


def _bound_at_top(statements: list[ast.stmt]) -> set[str]:
    """The names ``statements`` bind in the namespace they run in (a comprehension's or function's own excluded)."""
    bound: set[str] = set()
    nested = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
    todo: list[ast.AST] = list(statements)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            continue
        if isinstance(node, nested):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        todo.extend(ast.iter_child_nodes(node))
    return bound


def reveal_body_names(notebook: dict) -> set[str]:
    """The names only the guarded reveals' bodies bind: bound under an ``if reveal(...):`` and by no other code
    cell (a name another cell binds may exist for that cell's sake). ``_`` and its kin, IPython's own, left out."""
    guarded = {index for index, _ in guarded_reveals(notebook)}
    in_bodies: set[str] = set()
    elsewhere: set[str] = set()
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        if index in guarded:
            in_bodies |= _bound_at_top(ast.parse(source).body[0].body)
        else:
            elsewhere |= cell_names(source)[0]
    return {name for name in in_bodies - elsewhere if not name.startswith("_")}


def free_reads(source: str) -> set[str]:
    """The names a cell reads from the notebook's namespace: read before the cell itself binds them, statement by
    statement in the order they run, or read in a function or comprehension and bound nowhere at the cell's top
    (generous to the cell: a function it defines is taken to run after the cell's own bindings)."""
    tree = ast.parse(source)
    top_level_bound = _bound_at_top(tree.body)
    reads: set[str] = set()

    def nested(table: symtable.SymbolTable) -> None:
        for child in table.get_children():
            reads.update(symbol.get_name() for symbol in child.get_symbols()
                         if symbol.is_referenced() and symbol.is_global() and not symbol.is_assigned()
                         and symbol.get_name() not in top_level_bound)
            nested(child)

    nested(symtable.symtable(source, "<cell>", "exec"))
    bound: set[str] = set()

    def loads(*nodes: ast.AST | None) -> None:
        for node in nodes:
            if node is not None:
                reads.update(found.id for found in _walk_top(node)
                             if isinstance(found, ast.Name) and isinstance(found.ctx, ast.Load) and found.id not in bound)

    def run(statements: list[ast.stmt]) -> None:
        for statement in statements:
            if isinstance(statement, (ast.If, ast.While)):
                loads(statement.test)
                run(statement.body)
                run(statement.orelse)
            elif isinstance(statement, ast.For):
                loads(statement.iter)
                bound.update(_bound_at_top([statement.target]))
                run(statement.body)
                run(statement.orelse)
            elif isinstance(statement, ast.With):
                loads(*(item.context_expr for item in statement.items))
                bound.update(_bound_at_top([item.optional_vars for item in statement.items if item.optional_vars]))
                run(statement.body)
            elif isinstance(statement, ast.Try):
                run(statement.body)
                for handler in statement.handlers:
                    loads(handler.type)
                    run(handler.body)
                run(statement.orelse)
                run(statement.finalbody)
            elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                loads(*statement.decorator_list)
                bound.add(statement.name)
            elif isinstance(statement, ast.AugAssign):
                loads(statement.value, statement.target)
                bound.update(_bound_at_top([statement.target]))
            elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
                loads(statement.value)
                targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                loads(*(node for target in targets for node in ast.walk(target)
                        if isinstance(node, (ast.Subscript, ast.Attribute))))
                bound.update(_bound_at_top(targets))
            else:
                loads(statement)
                bound.update(_bound_at_top([statement]))

    run(tree.body)
    return reads


def _walk_top(node: ast.AST):
    """Every node of ``node`` outside the functions, lambdas and comprehensions in it (their scope is their own;
    a comprehension's first iterable is evaluated outside it)."""
    todo = [node]
    while todo:
        current = todo.pop()
        if isinstance(current, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            todo.append(current.generators[0].iter)
            continue
        if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield current
        todo.extend(ast.iter_child_nodes(current))


def reads_of_reveal_names(notebook: dict) -> list[str]:
    """Where a cell reads a name as a guarded reveal's body left it, unless the cell waits for the same answer:
    unanswered, that body did not run, so the cell would fail or read another value. A cell that binds the name
    again in between (not itself a reveal) ends the dependence."""
    guarded = dict(guarded_reveals(notebook))
    last_binder: dict[str, int] = {}  # name -> index of the cell that bound it last
    problems = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        for name in sorted(free_reads(source)):
            binder = last_binder.get(name)
            if binder in guarded and not (index in guarded and guarded[index] == guarded[binder]):
                problems.append(f"cell {index} reads {name!r}, which the reveal in cell {binder} "
                                f"({guarded[binder] or 'explorer_answers'}) binds")
        bound = _bound_at_top(ast.parse(source).body[0].body) if index in guarded else _bound_at_top(
            ast.parse(source).body)
        last_binder.update(dict.fromkeys(bound, index))
    return problems


def _errors(notebook: dict) -> list[str]:
    return [f"cell {index}: {output.get('ename')}: {output.get('evalue')}" for index, cell in
            enumerate(notebook["cells"]) for output in cell.get("outputs", []) if output.get("output_type") == "error"]


def test_every_prediction_has_a_guarded_reveal_in_its_notebook():
    guarded = {}
    for path in LEARNER_NOTEBOOKS:
        notebook = json.loads(path.read_text(encoding="utf-8"))
        for index, question in guarded_reveals(notebook):
            guarded.setdefault(question, path.name)
            problem = guard_problem("".join(notebook["cells"][index]["source"]))
            assert problem is None, f"{path.name} cell {index}: {problem}"
        for exercise in checked_here(notebook):
            assert exercise.id in guarded and guarded[exercise.id] == path.name, (
                f"{path.name}: no reveal cell runs under `if reveal({exercise.id!r}):`")
        old_form = [index for index, cell in enumerate(notebook["cells"])
                    if cell["cell_type"] == "code" and "with reveal(" in "".join(cell["source"])]
        assert not old_form, f"{path.name} cells {old_form}: `with reveal(...)` is gone; reveal() returns a bool"


NOTEBOOKS = [*LEARNER_NOTEBOOKS, *sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(path.relative_to(ROOT / "notebooks")) for path in NOTEBOOKS])
def test_no_cell_needs_what_a_reveal_of_another_answer_computes(path):
    """Statically: what a later cell reads (an import, a preset, a text) is computed before the reveal, not in it;
    only a reveal of the same prediction may read what a reveal defined (both wait for the same answer)."""
    problems = reads_of_reveal_names(json.loads(path.read_text(encoding="utf-8")))
    assert not problems, "\n".join(problems)


def test_the_reveal_dependence_rule_finds_a_later_cell_reading_a_reveals_name():
    def code(source, tags=()):
        return {"cell_type": "code", "source": [source], "metadata": {"tags": list(tags)}}

    reveal_a = code('if reveal("06.a"):\n    from math import pi\n    rows = [pi]\n', ["reveal"])
    notebook = {"cells": [code("rows = []"), reveal_a,
                          code('if reveal("06.a"):\n    print(rows)\n', ["reveal"]),  # same answer: fine
                          code('if reveal("06.b"):\n    print(pi)\n', ["reveal"]),  # another answer's import
                          code("def show():\n    return rows\n"),  # a later cell's function
                          code("rows = [1]\nprint(rows)\n"), code("print(rows)")]}  # bound again: fine
    assert reads_of_reveal_names(notebook) == [
        "cell 3 reads 'pi', which the reveal in cell 1 (06.a) binds",
        "cell 4 reads 'rows', which the reveal in cell 1 (06.a) binds"]
    assert free_reads("import math\nx = [math.pi for _ in y]\ndef f():\n    return math, z\n") == {"y", "z"}
    assert free_reads("x = [a + b for b in y]") == {"a", "y"}


def test_the_guard_rule_finds_code_that_runs_unanswered():
    assert guard_problem('if reveal("06.x"):\n    print(7)\n') is None
    assert "outside" in guard_problem('decode = 7\nif reveal("06.x"):\n    print(decode)\n')
    assert "outside" in guard_problem('if reveal("06.x"):\n    pass\nprint(7)\n')
    assert "else" in guard_problem('if reveal("06.x"):\n    pass\nelse:\n    decode = 7\n')


def test_reveal_body_names_are_those_no_other_cell_binds():
    def code(source, tags=()):
        return {"cell_type": "code", "source": [source], "metadata": {"tags": list(tags)}}

    notebook = {"cells": [code("first = 1"),
                          code('if reveal("06.x"):\n    import math\n    steps = [first for _ in range(3)]\n'
                               '    first = len(steps)\n    for k in steps:\n        pass\n', ["reveal"]),
                          code("print(first)")]}
    assert reveal_body_names(notebook) == {"math", "steps", "k"}


def run_all_problems(name: str, executed: dict, widget_text: dict[int, str] | None = None) -> list[str]:
    """What a first Run All of learner notebook ``name`` with every stub untouched must not show, as lines (empty:
    nothing): an error, a guarded reveal that printed anything but its waiting line, a prediction's answer in an
    output. ``executed`` is the notebook with its outputs; ``widget_text`` (cell index -> the text a page shows of
    the cell's widgets) is what the browser's Run All adds to the explorers' text saved in the file."""
    problems = [f"{name}: Run All stops at an error: {error}" for error in _errors(executed)]
    for index, question in guarded_reveals(executed):
        problem = guard_problem("".join(executed["cells"][index]["source"]))
        if problem:
            problems.append(f"{name} cell {index}: {problem}")
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
    untouched and a fresh progress file, is checked by :func:`run_all_problems` too: tests/conftest.py). The
    names only the reveals' bodies bind must not exist afterwards: not one body ran."""
    body_names = reveal_body_names(json.loads(path.read_text(encoding="utf-8")))
    executed = run_all(path, tmp_path / "progress.json", probe=body_names)
    problems = run_all_problems(path.name, executed)
    if executed["probed"]:
        problems.append(f"{path.name}: after Run All these names of reveal bodies exist: {executed['probed']}")
    assert not problems, "\n".join(problems)


def test_once_answered_the_reveal_shows_the_answer_and_the_finder_sees_it(tmp_path):
    """The negative control: lab 03's prediction answered well-formed before the Run All, so its reveals print."""
    exercise = next(e for e in PREDICTIONS if e.id == "03.predict_fp16_round_trip")
    progress_file = tmp_path / "progress.json"
    progress.record(exercise.id, "passed", 1, 1, path=progress_file, close=False)
    path = ROOT / "notebooks" / "03_number_formats.ipynb"
    body_names = reveal_body_names(json.loads(path.read_text(encoding="utf-8")))
    executed = run_all(path, progress_file, probe=body_names | {"no_cell_binds_this"})
    shown = answers_shown(executed, exercise)
    assert any("400 of" in where for where in shown), shown
    reveal_cells = {index for index, question in guarded_reveals(executed) if question == exercise.id}
    assert {int(where.split(":")[0].split()[1]) for where in shown} <= reveal_cells, shown
    assert {"loaded", "every_fp16", "familiar"} <= body_names and set(executed["probed"]) == body_names


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
