"""Which cells of a submitted notebook are the course's own, and which of those the grader may leave unrun.

A cell whose source is the shipped learner notebook's (:func:`course_cells`) is not the learner's writing: the
review does not read it. A course cell that only measures or draws for the reader, whose names nothing graded
reads (:func:`skippable_cells`, on the names each cell binds and reads: :func:`cell_names`), is tagged
:data:`GRADER_SKIPS_TAG` by ``labkit build`` and not run by ``labkit grade``.

Layer 5 (instructor tools).
"""

from __future__ import annotations

import ast
import functools
import json
import symtable
from pathlib import Path


# A course cell that only measures or draws for the reader, whose names no later cell (no exercise, check or
# prediction) uses (:func:`skippable_cells`): `labkit build` tags it, and `labkit grade` does not run it
# (tests/test_instructor_grading_course.py holds the tagged cells to that), so a class is graded in the time its
# exercises need rather than the course's measurements.
GRADER_SKIPS_TAG = "labkit-grader-skips"


def python_of(source: str) -> str:
    try:  # IPython's own rules turn magics and shell escapes into Python
        from IPython.core.inputtransformer2 import TransformerManager

        return TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - without IPython, lines starting with % or ! are left out
        return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


@functools.cache  # read once per process: the review and the grader's skip both ask, for every submission
def cell_names(source: str) -> tuple[set[str], set[str]]:
    """(the global names a cell binds, the global names it reads): what it reads at its top level and what its
    functions, classes, lambdas and comprehensions read from the notebook's globals when they run (Python's own
    ``symtable`` tells a function's parameters and locals from a global, so a parameter named like a course
    variable keeps no cell run). Generous where it cannot know: a star import binds ``"*"``, and code that does not
    parse binds and reads everything it could: ``({"*"}, {"*"})``."""
    try:
        code = python_of(source)
        table = symtable.symtable(code, "<cell>", "exec")
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {"*"}, {"*"}
    bound, read = set(), set()
    scopes = [(table, True)]
    while scopes:
        scope, top = scopes.pop()
        for symbol in scope.get_symbols():
            if top or symbol.is_global():  # a nested scope's name resolved in the notebook's globals
                if symbol.is_referenced():
                    read.add(symbol.get_name())
                if symbol.is_assigned() or symbol.is_imported():
                    bound.add(symbol.get_name())
        scopes += [(child, False) for child in scope.get_children()]
    if any(isinstance(node, ast.ImportFrom) and any(alias.name == "*" for alias in node.names)
           for node in ast.walk(tree)):
        bound.add("*")
    return bound, read


def skippable_cells(sources: list[str], graded_names: set[str], may_skip: list[bool] | None = None) -> list[bool]:
    """For each code cell of a lab's notebook (in order, the Colab set-up cell first): whether the grader may skip
    it. A cell may be skipped when it checks nothing (no ``check(``), binds none of ``graded_names`` (the lab's
    exercise functions and answers) and binds nothing a later cell the grader runs reads; the first cell always runs;
    with ``may_skip``, only the cells it marks are candidates. The largest such set, found from the last cell back.

    The build tags it on the solution (a course's measurements and figures, whose minutes a submission's grading
    then does not spend: lab 06's grading ran 250 s of cells, of which about 160 s feed nothing graded); the grader
    applies it again to each submission, the tagged cells as candidates, so a learner's own function that reads a
    name a tagged cell binds (an import the solution did not need) keeps that cell run."""
    needed: set[str] = set()
    skip = [False] * len(sources)
    for index in range(len(sources) - 1, 0, -1):
        bound, read = cell_names(sources[index])
        if (may_skip is not None and not may_skip[index]) or "check(" in sources[index] or "*" in bound \
                or bound & (graded_names | needed):
            needed |= read
        else:
            skip[index] = True
    return skip


def course_cells(lab: str, tag: str | None = None) -> frozenset[str]:
    """The code cells of the course's own learner notebook of ``lab`` as shipped (those carrying ``tag``, if
    given): not the learner's writing, so not read (its setup cell installs packages, some cells import labkit's
    answers to show them). A submission's cell counts as one only when its source is the same."""
    import labkit

    cells: set[str] = set()
    for root in labkit.__path__:
        for path in sorted((Path(root).parent / "notebooks").glob(f"{lab}_*.ipynb")):
            try:
                cells |= {cell["source"].strip() if isinstance(cell["source"], str) else "".join(cell["source"]).strip()
                          for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]
                          if cell.get("cell_type") == "code" and (tag is None or tag in cell["metadata"].get("tags", []))}
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
    return frozenset(cells)
