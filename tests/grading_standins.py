"""Stand-ins for ``grade_notebook`` on Dask workers: the mechanics of a class run (retries, resuming, refusals,
interrupts) tested in milliseconds per submission instead of a walled notebook's seconds.

A stand-in submission is a notebook whose metadata ``standin`` says what grading it does: ``sleep`` (seconds),
``die`` ("always": kill the worker process every time; a path: kill it the first time only, leaving that file),
``hang`` (never return), ``log`` (a file that gets one line per grading, to count them). Its grade is decided by
its code alone, like a real one: one exercise, passed when the first cell says ``right``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import nbformat

from labkit.instructor.grader.reports import ExerciseResult, SubmissionReport


def standin_notebook(code: str, lab: str = "00", **standin) -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["labkit"] = {"lab": lab}
    notebook.metadata["standin"] = standin
    notebook.cells = [nbformat.v4.new_code_cell(code)]
    for index, cell in enumerate(notebook.cells):
        cell["id"] = f"cell-{index}"  # fixed ids: the same code gives the same bytes
    return notebook


def standin_grader(path, settings):
    """Same signature and report type as ``labkit.instructor.grader.grading.grade_notebook``."""
    notebook = json.loads(Path(path).read_text())
    plan = notebook["metadata"].get("standin", {})
    code = "".join(notebook["cells"][0]["source"]) if notebook["cells"] else ""
    if plan.get("log"):
        with open(plan["log"], "a") as log:
            log.write(f"{code}\n")
    die = plan.get("die")
    if die == "always" or (die and not Path(die).exists()):
        if die != "always":
            Path(die).write_text("died once")
        os.kill(os.getpid(), signal.SIGKILL)
    if plan.get("hang"):
        time.sleep(3600)
    time.sleep(plan.get("sleep", 0))
    passed = code.startswith("right")
    lab = notebook["metadata"]["labkit"]["lab"]
    return SubmissionReport(notebook=str(path), lab=lab, score=2 * passed, max_score=2, exercises=(ExerciseResult(
        f"{lab}.standin", "stand-in", "code", "passed" if passed else "failed", 2 * passed, 2),),
        isolated=settings.isolate, seed=len(settings.secret))
