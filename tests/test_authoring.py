"""labkit.instructor.authoring: learner notebooks are exactly the solutions with answers stubbed."""

from pathlib import Path

import nbformat
import pytest

from labkit.instructor.authoring import KERNELSPEC, STUB, learner_version, strip_solutions

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
    # Both are committed executed, with outputs, so they render on a code host.
    for notebook in (solution, learner):
        code = [c for c in notebook.cells if c.cell_type == "code"]
        assert all(c.execution_count is not None for c in code)
        assert sum(bool(c.outputs) for c in code) >= len(code) // 2


@pytest.mark.parametrize("solution_path", SOLUTIONS, ids=lambda p: p.name)
def test_check_markers_are_cell_tags_that_the_learner_copy_keeps(solution_path):
    solution = nbformat.read(solution_path, as_version=4)
    committed = nbformat.read(ROOT / "notebooks" / solution_path.name, as_version=4)
    assert not any("NBVAL" in c.source for c in solution.cells), "use the nbval-check-output cell tag, not a comment"
    tags = [c.metadata.get("tags", []) for c in solution.cells]
    assert any("nbval-check-output" in t for t in tags)
    assert tags == [c.metadata.get("tags", []) for c in learner_version(solution).cells]
    assert tags == [c.metadata.get("tags", []) for c in committed.cells]


def test_learner_and_solution_carry_the_kernelspec_jupyterlab_writes():
    for path in [*SOLUTIONS, *(ROOT / "notebooks" / p.name for p in SOLUTIONS)]:
        assert nbformat.read(path, as_version=4).metadata["kernelspec"] == KERNELSPEC, path.name


def test_every_notebook_starts_with_the_one_colab_cell():
    from labkit.core.course import colab_cell_source

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
                assert get(exercise_id).allowed_text in task.source, f"{path.name}: task text of {exercise_id}"
