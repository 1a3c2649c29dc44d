"""Grading a submitted notebook: run it headless, then check every exercise of its lab in the same kernel.

The learner's own check cells run too, but the score does not depend on them: after the notebook's last cell,
the grader runs each registered exercise of the lab against whatever functions the notebook defined. Each cell
has a time limit (a runaway cell is interrupted and the run goes on), a cell that raises does not stop the run,
and a cell that kills the kernel is skipped on a fresh run of the rest. One exercise crashing never stops the
others from being graded.

    labkit grade submission.ipynb [--json grades.json] [--cell-timeout 120]
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

GRADES_MARKER = "LABKIT-GRADES "
MAX_KERNEL_DEATHS = 3


def grade_in_kernel(lab: str, namespace: dict[str, Any]) -> list[dict[str, Any]]:
    """Check every exercise of ``lab`` against the functions in ``namespace`` (runs inside the learner's kernel)."""
    from labkit.checking import check_function
    from labkit.exercises import exercises

    results = []
    for exercise in exercises(lab):
        try:
            verdict = check_function(exercise, namespace.get(exercise.function))
            status, lines = verdict.status, list(verdict.lines)
        except BaseException as error:  # noqa: BLE001 - a grader must finish whatever happens
            status, lines = "failed", [f"the checker could not run: {type(error).__name__}: {error}"]
        results.append({"id": exercise.id, "title": exercise.title, "status": status,
                        "points": exercise.points if status == "passed" else 0, "max_points": exercise.points,
                        "details": lines})
    return results


def lab_of(notebook: Any, path: Path) -> str:
    """The lab a notebook belongs to: its ``labkit.lab`` metadata, else the file name's number prefix."""
    lab = notebook.metadata.get("labkit", {}).get("lab")
    if lab:
        return str(lab)
    prefix = path.name.split("_", 1)[0]
    if prefix.isdigit():
        return prefix
    raise ValueError(f"notebook {path} has no labkit.lab metadata and its name does not start with a lab number")


def _grading_cell(lab: str):
    import nbformat

    source = (
        "from labkit.grading import grade_in_kernel as _labkit_grade\n"
        "import json as _labkit_json\n"
        f"print({GRADES_MARKER!r} + _labkit_json.dumps(_labkit_grade({lab!r}, globals())))"
    )
    return nbformat.v4.new_code_cell(source)


def _run(notebook: Any, cwd: Path, cell_timeout_s: int, env: dict[str, str]) -> tuple[Any, int | None]:
    """Execute the notebook; returns it and the index of the cell during which the kernel died (or None)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    client = NotebookClient(
        notebook, kernel_name="python3", timeout=cell_timeout_s, allow_errors=True, interrupt_on_timeout=True,
        error_on_timeout={"ename": "CellTimeout", "evalue": f"the cell ran longer than {cell_timeout_s} s",
                          "traceback": []},
        resources={"metadata": {"path": str(cwd)}},
    )
    current = {"index": None}
    client.on_cell_start = lambda cell, cell_index: current.update(index=cell_index)
    try:
        client.execute(env=env)
    except DeadKernelError:
        return notebook, current["index"]
    return notebook, None


def grade_notebook(path: Path, cell_timeout_s: int = 120) -> dict[str, Any]:
    """Run a submitted notebook and score each exercise of its lab. Returns the report (also JSON-ready)."""
    import nbformat

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path {path} is not a notebook file")
    original = nbformat.read(path, as_version=4)
    lab = lab_of(original, path)
    skipped: list[int] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        # The learner's own check cells save progress; keep that away from the grader's user's file.
        env = {**os.environ, "LABKIT_PROGRESS": str(Path(scratch) / "progress.json")}
        for _ in range(MAX_KERNEL_DEATHS + 1):
            notebook = nbformat.read(path, as_version=4)
            for index in skipped:
                notebook.cells[index].source = "# skipped by the grader: this cell stopped the kernel"
            notebook.cells.append(_grading_cell(lab))
            notebook, died_at = _run(notebook, path.parent, cell_timeout_s, env)
            if died_at is None or died_at == len(notebook.cells) - 1:
                break
            skipped.append(died_at)
    results = _results_from(notebook.cells[-1], lab)
    timed_out = f"CellTimeout: the cell ran longer than {cell_timeout_s} s and was interrupted"
    errors = [
        # The grader's interrupt surfaces in the kernel as KeyboardInterrupt; name it for what it was.
        {"cell": index, "error": timed_out if output.get("ename") in ("KeyboardInterrupt", "CellTimeout")
         else f"{output.get('ename')}: {output.get('evalue')}"}
        for index, cell in enumerate(notebook.cells[:-1])
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]
    errors += [{"cell": index, "error": "the kernel died in this cell; it was skipped"} for index in skipped]
    return {
        "notebook": str(path),
        "lab": lab,
        "score": sum(r["points"] for r in results),
        "max_score": sum(r["max_points"] for r in results),
        "exercises": results,
        "cell_errors": sorted(errors, key=lambda e: e["cell"]),
        "seconds": round(time.perf_counter() - started, 1),
    }


def _results_from(cell: Any, lab: str) -> list[dict[str, Any]]:
    for output in cell.get("outputs", []):
        for line in output.get("text", "").splitlines():
            if line.startswith(GRADES_MARKER):
                return json.loads(line[len(GRADES_MARKER):])
    # The grading cell itself did not report (the kernel died or the learner broke labkit): zero, with the reason.
    from labkit.exercises import exercises

    reason = next((f"{o.get('ename')}: {o.get('evalue')}" for o in cell.get("outputs", [])
                   if o.get("output_type") == "error"), "the grading cell produced no report")
    return [{"id": ex.id, "title": ex.title, "status": "failed", "points": 0, "max_points": ex.points,
             "details": [f"could not be graded: {reason}"]} for ex in exercises(lab)]


def format_report(report: dict[str, Any]) -> str:
    """The report as a plain-text table."""
    lines = [f"{report['notebook']} (lab {report['lab']}): {report['score']}/{report['max_score']} points",
             f"{'exercise':<28} {'status':<14} points"]
    for result in report["exercises"]:
        lines.append(f"{result['id']:<28} {result['status']:<14} {result['points']}/{result['max_points']}")
        if result["status"] == "failed":
            lines += [f"    {detail}" for detail in result["details"]]
    for error in report["cell_errors"]:
        lines.append(f"cell {error['cell']}: {error['error']}")
    return "\n".join(lines)
