"""Grading a submitted notebook: run it headless, then check every exercise of its lab in the same kernel.

The learner's own check cells run too, but the score does not depend on them: after the notebook's last cell,
the grader runs each registered exercise of the lab against whatever functions the notebook defined. Each cell
has a time limit (a runaway cell is interrupted and the run goes on), a cell that raises does not stop the run,
and a cell that kills the kernel is skipped on a fresh run of the rest. One exercise crashing never stops the
others from being graded.

Each kernel runs under the limits of :mod:`labkit.instructor.kernel_limits` (memory, CPU time, processes), over IPC sockets
rather than TCP, with one torch thread unless ``OMP_NUM_THREADS`` says otherwise. The random cases of every check
are drawn from a seed derived from the submission's code, so grading the same submission again gives the same
grade (a learner re-running a check in the notebook still gets fresh cases).

A class (a folder of submissions graded in parallel, a CSV gradebook) is ``labkit.instructor.classroom``.

    labkit grade submission.ipynb [--json grades.json] [--cell-timeout 120]
    labkit grade submissions/ [--out submissions-grades] [--jobs 2]
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager
from traitlets import List, Unicode

from labkit.instructor.kernel_limits import Confinement, Limits

GRADES_MARKER = "LABKIT-GRADES "
# Terminal escape sequences and control characters (C0 but newline and tab, DEL, C1): a learner's output must not
# move the instructor's cursor, recolour the terminal or rewrite its title.
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b.|[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(value: Any) -> Any:
    """``value`` (a string, or lists and dicts of them) without terminal escapes and control characters.

    >>> printable({"details": ["\\x1b[31mred\\x1b[0m", "bell\\x07 and title \\x1b]0;pwned\\x07"]})
    {'details': ['red', 'bell and title ']}
    """
    if isinstance(value, str):
        return _CONTROL.sub("", value)
    if isinstance(value, list):
        return [printable(item) for item in value]
    if isinstance(value, dict):
        return {key: printable(item) for key, item in value.items()}
    return value
MAX_KERNEL_DEATHS = 3
KERNEL_LOG_LINES = 20


def submission_seed(notebook: Any) -> int:
    """The grading seed of a submission: a hash of its code cells (outputs and metadata do not change it)."""
    code = "\0".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    return _hash_to_seed(code)


def _hash_to_seed(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") >> 1  # below 2**31


def grade_in_kernel(lab: str, namespace: dict[str, Any], seed: int | None = None) -> list[dict[str, Any]]:
    """Check every exercise of ``lab`` against the functions in ``namespace`` (runs inside the learner's kernel).

    With a ``seed``, each exercise's random cases, and the global random generators the learner's code may use,
    are seeded from it and the exercise id: the same submission gets the same grade every time.
    """
    from labkit.exercises.checking import check_function
    from labkit.exercises import exercises

    results = []
    for exercise in exercises(lab):
        exercise_seed = None if seed is None else _hash_to_seed(f"{seed}:{exercise.id}")
        try:
            if exercise_seed is not None:
                _seed_global_generators(exercise_seed)
            verdict = check_function(exercise, namespace.get(exercise.function), seed=exercise_seed)
            status, lines, close = verdict.status, list(verdict.lines), verdict.close
        except BaseException as error:  # noqa: BLE001 - a grader must finish whatever happens
            status, lines, close = "failed", [f"the checker could not run: {type(error).__name__}: {error}"], None
        results.append({"id": exercise.id, "title": exercise.title, "kind": exercise.kind, "status": status,
                        "points": exercise.points if status == "passed" else 0, "max_points": exercise.points,
                        "close": close, "details": lines})
    return results


def _seed_global_generators(seed: int) -> None:
    import sys

    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed)


def lab_of(notebook: Any, path: Path) -> str:
    """The lab a notebook belongs to: its ``labkit.lab`` metadata, else the file name's number prefix."""
    lab = notebook.metadata.get("labkit", {}).get("lab")
    if lab:
        return str(lab)
    prefix = path.name.split("_", 1)[0]
    if prefix.isdigit():
        return prefix
    raise ValueError(f"notebook {path} has no labkit.lab metadata and its name does not start with a lab number")


def _grading_cell(lab: str, seed: int):
    import nbformat

    source = (
        "from labkit.instructor.grading import grade_in_kernel as _labkit_grade\n"
        "import json as _labkit_json\n"
        f"print({GRADES_MARKER!r} + _labkit_json.dumps(_labkit_grade({lab!r}, globals(), seed={seed})))"
    )
    return nbformat.v4.new_code_cell(source)


class LimitedKernelManager(AsyncKernelManager):
    """A kernel manager that starts the kernel through :mod:`labkit.instructor.kernel_limits`' launcher."""

    launcher = List(Unicode(), help="the command put before the kernel's own command line").tag(config=True)

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        return [*self.launcher, *super().format_kernel_cmd(extra_arguments)]


def _run(notebook: Any, cwd: Path, cell_timeout_s: int, env: dict[str, str], limits: Limits,
         scratch: Path, log: Path) -> tuple[Any, int | None, str | None, dict[str, str]]:
    """Execute the notebook under ``limits``, the kernel's own stdout and stderr going to ``log``.

    Returns the notebook, the index of the cell during which the kernel died (or None) and why it died, and how
    each limit was enforced.
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError
    from traitlets.config import Config

    with Confinement(limits) as confinement:
        # IPC sockets in the scratch folder: nothing listens on the network, and the kernel does not warn that
        # it "is running over TCP without encryption" into the instructor's terminal.
        config = Config({"LimitedKernelManager": {"launcher": confinement.launcher(), "transport": "ipc",
                                                  "ip": str(scratch / "kernel")}})
        client = NotebookClient(
            notebook, kernel_name="python3", timeout=cell_timeout_s, allow_errors=True, interrupt_on_timeout=True,
            error_on_timeout={"ename": "CellTimeout", "evalue": f"the cell ran longer than {cell_timeout_s} s",
                              "traceback": []},
            resources={"metadata": {"path": str(cwd)}}, kernel_manager_class=LimitedKernelManager, config=config,
        )
        current: dict[str, Any] = {"index": None, "process": None}
        client.on_cell_start = lambda cell, cell_index: current.update(index=cell_index)

        def on_kernel_start(notebook: Any) -> None:
            # jupyter-client 7+ keeps the process in a provisioner; 6.x (Colab's) on the manager as `kernel`.
            provisioner = getattr(client.km, "provisioner", None)
            process = getattr(provisioner, "process", None) or getattr(client.km, "kernel", None)
            current["process"] = process
            pgid = getattr(provisioner, "pgid", None)
            if pgid is None and process is not None:
                try:  # only a kernel that leads its own group may have the group killed; never the grader's
                    pgid = process.pid if os.getpgid(process.pid) == process.pid else None
                except (OSError, AttributeError):
                    pgid = None
            confinement.kernel_pgid = pgid

        client.on_notebook_start = on_kernel_start
        try:
            # What the kernel prints outside cells goes to a log, not into the instructor's terminal.
            with open(log, "ab") as kernel_output:
                client.execute(env=env, stdout=kernel_output, stderr=kernel_output)
        except DeadKernelError:
            return notebook, current["index"], _death(current["process"], limits), confinement.describe()
    return notebook, None, None, confinement.describe()


def _death(process: Any, limits: Limits) -> str:
    """Why the kernel process ended, in words."""
    code = None if process is None else process.poll()
    if code is None:
        return "the kernel died in this cell"
    if code == -signal.SIGXCPU:
        return f"the kernel died in this cell: it used up its CPU time limit ({limits.cpu_seconds} s)"
    if code < 0:
        return f"the kernel died in this cell: killed by {signal.Signals(-code).name}"
    return f"the kernel died in this cell: it exited with code {code}"


def grade_notebook(path: Path, cell_timeout_s: int = 120, limits: Limits = Limits()) -> dict[str, Any]:
    """Run a submitted notebook and score each exercise of its lab. Returns the report (also JSON-ready)."""
    import nbformat

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path {path} is not a notebook file")
    original = nbformat.read(path, as_version=4)
    lab = lab_of(original, path)
    seed = submission_seed(original)
    skipped: dict[int, str] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        # The learner's own check cells save progress; keep that away from the grader's user's file. One thread
        # per kernel: parallel kernels do not oversubscribe the cores, and the grade does not depend on --jobs.
        env = {**os.environ, "LABKIT_PROGRESS": str(Path(scratch) / "progress.json"),
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        for _ in range(MAX_KERNEL_DEATHS + 1):
            notebook = nbformat.read(path, as_version=4)
            for index in skipped:
                notebook.cells[index].source = "# skipped by the grader: this cell stopped the kernel"
            notebook.cells.append(_grading_cell(lab, seed))
            log = Path(scratch) / "kernel.log"
            notebook, died_at, death, enforced = _run(notebook, path.parent, cell_timeout_s, env, limits,
                                                      Path(scratch), log)
            if died_at is None or died_at == len(notebook.cells) - 1:
                break
            skipped[died_at] = death
        kernel_log = log.read_text(errors="replace").splitlines()[-KERNEL_LOG_LINES:] if log.exists() else []
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
    errors += [{"cell": index, "error": f"{death}; it was skipped"} for index, death in skipped.items()]
    return printable({
        "notebook": str(path),
        "lab": lab,
        "score": sum(r["points"] for r in results),
        "max_score": sum(r["max_points"] for r in results),
        "exercises": results,
        "cell_errors": sorted(errors, key=lambda e: e["cell"]),
        "seed": seed,
        "limits": enforced,
        "kernel_log": kernel_log,  # the end of what the kernels printed outside cells (runs of this submission)
        "seconds": round(time.perf_counter() - started, 1),
    })


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
        closeness = {True: "  (prediction close)", False: "  (prediction not close)"}.get(result.get("close"), "")
        lines.append(f"{result['id']:<28} {result['status']:<14} {result['points']}/{result['max_points']}"
                     f"{closeness}")
        if result["status"] in ("failed", "error"):  # "error": labkit's side broke, the details say what
            lines += [f"    {detail}" for detail in result["details"]]
    for error in report["cell_errors"]:
        lines.append(f"cell {error['cell']}: {error['error']}")
    if report["limits"]["processes"].startswith("not enforced"):
        lines.append(f"note: the number of processes was {report['limits']['processes']}")
    return printable("\n".join(lines))
