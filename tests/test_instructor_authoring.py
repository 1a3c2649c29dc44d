"""labkit.instructor.authoring: learner notebooks are exactly the solutions with answers stubbed."""

from pathlib import Path

import nbformat
import pytest

from labkit.instructor.authoring import (
    CHECK_TAG, KERNELSPEC, REVEAL_TAG, STUB, hide_reveals, is_reveal, learner_tags, learner_version, source_is_hidden,
    strip_solutions,
)

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))


def test_stub_keeps_indentation_and_everything_outside_the_markers():
    source = ("import torch\n\nclass A:\n    def f(self, x):\n        y = 1\n        ### BEGIN SOLUTION\n"
              "        return x + y\n        ### END SOLUTION\n\n### BEGIN SOLUTION\nz = 3\n### END SOLUTION\nprint(z)")
    assert strip_solutions(source) == (
        "import torch\n\nclass A:\n    def f(self, x):\n        y = 1\n        " + STUB + "\n\n" + STUB + "\nprint(z)")


@pytest.mark.parametrize("source,message", [
    ("### BEGIN SOLUTION\nx = 1\n", "BEGIN SOLUTION at line 1 is never closed"),
    ("x = 1\n### END SOLUTION\n", "END SOLUTION at line 2 has no ### BEGIN SOLUTION"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n", "nested ### BEGIN SOLUTION at line 2"),
])
def test_unbalanced_markers_are_errors_with_line_numbers(source, message):
    with pytest.raises(ValueError, match=message):
        strip_solutions(source)


def test_markers_inside_strings_or_comments_with_text_are_left_alone():
    source = 'print("### BEGIN SOLUTION")\nx = 1  # ### END SOLUTION\n'
    assert strip_solutions(source) == source


@pytest.mark.parametrize("solution_path", SOLUTIONS, ids=lambda p: p.name)
def test_committed_learner_notebook_is_what_the_build_produces(solution_path):
    solution = nbformat.read(solution_path, as_version=4)
    built = learner_version(solution)
    committed = nbformat.read(ROOT / "notebooks" / solution_path.name, as_version=4)
    assert [c.cell_type for c in committed.cells] == [c.cell_type for c in built.cells]
    for number, (ours, theirs) in enumerate(zip(built.cells, committed.cells)):
        assert ours.source == theirs.source, f"cell {number} differs: run `make notebooks` and commit the result"
    assert committed.metadata.get("labkit") == solution.metadata.get("labkit")


@pytest.mark.parametrize("solution_path", SOLUTIONS, ids=lambda p: p.name)
def test_solutions_have_answers_and_learner_copies_do_not(solution_path):
    solution = nbformat.read(solution_path, as_version=4)
    learner = nbformat.read(ROOT / "notebooks" / solution_path.name, as_version=4)
    assert any("### BEGIN SOLUTION" in c.source for c in solution.cells)
    assert not any("SOLUTION" in c.source for c in learner.cells)
    # Both are committed executed, with outputs, so they render on a code host (a learner's reveal is emptied).
    for notebook in (solution, learner):
        code = [c for c in notebook.cells if c.cell_type == "code" and not (notebook is learner and is_reveal(c))]
        assert all(c.execution_count is not None for c in code)
        assert sum(bool(c.outputs) for c in code) >= len(code) // 2


@pytest.mark.parametrize("solution_path", SOLUTIONS, ids=lambda p: p.name)
def test_check_markers_are_cell_tags_that_the_learner_copy_keeps(solution_path):
    solution = nbformat.read(solution_path, as_version=4)
    committed = nbformat.read(ROOT / "notebooks" / solution_path.name, as_version=4)
    assert not any("NBVAL" in c.source for c in solution.cells), "use the nbval-check-output cell tag, not a comment"
    tags = [c.metadata.get("tags", []) for c in solution.cells]
    assert any("nbval-check-output" in t for t in tags)
    expected = [learner_tags(c) for c in solution.cells]  # a reveal's output is not compared in the learner copy
    assert expected == [c.metadata.get("tags", []) for c in learner_version(solution).cells]
    assert expected == [c.metadata.get("tags", []) for c in committed.cells]


def _toy_notebook():
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    printed = [new_output("stream", name="stdout", text="24\n")]
    return new_notebook(cells=[
        new_markdown_cell("How many tokens survive? Predict first."),
        new_code_cell("def predicted():\n    ### BEGIN SOLUTION\n    return 24\n    ### END SOLUTION",
                      execution_count=1),
        new_code_cell('check("01.x")', execution_count=2, outputs=printed, metadata={"tags": [CHECK_TAG]}),
        new_code_cell("print(24)", execution_count=3, outputs=printed, metadata={"tags": [REVEAL_TAG, CHECK_TAG]}),
        new_code_cell("print(24)", execution_count=4, outputs=printed, metadata={"tags": [REVEAL_TAG]}),
    ])


def test_a_reveal_is_emptied_and_unchecked_in_the_learner_copy_only():
    solution = _toy_notebook()
    learner = learner_version(solution)
    assert [learner_tags(c) for c in solution.cells] == [[], [], [CHECK_TAG], [REVEAL_TAG], [REVEAL_TAG]]
    assert [c.metadata.get("tags", []) for c in learner.cells[2:]] == [[CHECK_TAG], [REVEAL_TAG], [REVEAL_TAG]]
    assert solution.cells[3].metadata["tags"] == [REVEAL_TAG, CHECK_TAG]  # the solution keeps its check
    for cell in learner.cells[1:]:  # as if executed: every code cell prints, then the reveals are emptied
        cell.outputs, cell.execution_count = list(solution.cells[2].outputs), 9
    hide_reveals(learner)
    assert [bool(c.outputs) for c in learner.cells[1:]] == [True, True, False, False]
    assert [c.execution_count for c in learner.cells[3:]] == [None, None]


def test_a_reveal_opens_with_its_source_collapsed_in_the_learner_copy_only():
    solution = _toy_notebook()
    learner = learner_version(solution)
    assert [source_is_hidden(c) for c in learner.cells] == [False, False, False, True, True]
    assert learner.cells[3].metadata["jupyter"] == {"source_hidden": True}  # JupyterLab collapses the input
    assert learner.cells[3].metadata["cellView"] == "form"  # Colab shows the form view, code behind "Show code"
    assert not any(source_is_hidden(c) for c in solution.cells)  # the instructor reads every line


@pytest.mark.parametrize("solution_path", SOLUTIONS, ids=lambda p: p.name)
def test_every_committed_reveal_hides_its_source_and_nothing_else_does(solution_path):
    learner = nbformat.read(ROOT / "notebooks" / solution_path.name, as_version=4)
    assert [number for number, cell in enumerate(learner.cells) if is_reveal(cell)] == [
        number for number, cell in enumerate(learner.cells) if source_is_hidden(cell)]


def test_only_a_code_cell_can_be_a_reveal():
    from nbformat.v4 import new_markdown_cell

    solution = _toy_notebook()
    solution.cells.append(new_markdown_cell("The answer is 24.", metadata={"tags": [REVEAL_TAG]}))
    with pytest.raises(ValueError, match="only a code cell can be a 'reveal'"):
        learner_version(solution)


@pytest.mark.parametrize("solution_path", SOLUTIONS, ids=lambda p: p.name)
def test_no_tagged_reveal_carries_outputs_in_a_committed_learner_notebook(solution_path):
    learner = nbformat.read(ROOT / "notebooks" / solution_path.name, as_version=4)
    for number, cell in enumerate(learner.cells):
        if is_reveal(cell):
            assert cell.outputs == [] and cell.execution_count is None, f"cell {number} reveals an answer early"
            assert CHECK_TAG not in cell.metadata["tags"], f"cell {number}: nbval would compare it with nothing"


@pytest.mark.parametrize("solution_path", SOLUTIONS, ids=lambda p: p.name)
def test_every_reveal_comes_after_the_check_it_answers(solution_path):
    cells = nbformat.read(solution_path, as_version=4).cells
    checks = [n for n, c in enumerate(cells) if c.cell_type == "code" and "check(" in c.source]
    for number, cell in enumerate(cells):
        if is_reveal(cell):
            assert checks and checks[0] < number, f"cell {number} is a reveal with no question checked above it"


def test_learner_and_solution_carry_the_kernelspec_jupyterlab_writes():
    for path in [*SOLUTIONS, *(ROOT / "notebooks" / p.name for p in SOLUTIONS)]:
        assert nbformat.read(path, as_version=4).metadata["kernelspec"] == KERNELSPEC, path.name


def test_every_notebook_names_its_own_lab_for_the_grader():
    """labkit grade grades a notebook as the lab its metadata names: lab 06 handed in must not be graded as 05."""
    for path in [*SOLUTIONS, *(ROOT / "notebooks" / p.name for p in SOLUTIONS)]:
        assert nbformat.read(path, as_version=4).metadata["labkit"]["lab"] == path.name[:2], path.name


def test_every_notebook_starts_with_the_one_colab_cell():
    from labkit.instructor.authoring import colab_cell_source

    for path in [*SOLUTIONS, *(ROOT / "notebooks" / p.name for p in SOLUTIONS)]:
        first = next(c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
        assert first.source == colab_cell_source(), f"{path.name}: run `make notebooks`"


def test_each_task_text_says_what_the_learner_may_call():
    import re

    from labkit.exercises import get

    for path in SOLUTIONS:
        cells = nbformat.read(path, as_version=4).cells
        for index, cell in enumerate(cells):
            for exercise_id in re.findall(r'check\("([^"]+)"\)', cell.source if cell.cell_type == "code" else ""):
                task = next(c for c in reversed(cells[:index]) if c.cell_type == "markdown")
                # Compared as rendered text: a markdown line break inside the sentence changes nothing on the page.
                assert " ".join(get(exercise_id).allowed_text.split()) in " ".join(task.source.split()), (
                    f"{path.name}: task text of {exercise_id}")


def test_colab_installs_labkit_from_the_branch_its_links_open():
    """The Colab cell installs labkit from the branch the Colab links open the notebooks from: the notebook and the
    code its saved outputs came from are one commit of that branch."""
    from labkit.core.resources import load_json
    from labkit.instructor.authoring import colab_cell_source, colab_install_commands

    branch = load_json("course.json")["branch"]
    install = colab_install_commands()[0][-1]
    assert install.startswith("labkit @ git+https://") and install.endswith(f"@{branch}"), install
    assert install in colab_cell_source()
