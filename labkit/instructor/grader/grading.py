"""Grading a submitted notebook: the grader judges, the learner's notebook only answers.

The grader (this process, trusted) owns the exercises of the lab, draws their cases, computes labkit's answers,
compares and gives the points. The submission runs walled off (:mod:`labkit.instructor.wall.sandbox`): a worker
(:mod:`labkit.instructor.wall.worker`) executes a private copy of the notebook in a kernel, then calls the learner's
functions on the case inputs the grader wrote, and hands back what they returned as plain data
(:mod:`labkit.instructor.wall.wire`). Nothing the notebook prints is parsed; no object of the learner's takes part
in a comparison; no expected value ever enters the wall.

Random cases are drawn from a seed made of an instructor secret and the submission's code, so a learner cannot
know them beforehand, and grading the same submission again (with the same secret) gives the same grade. The
secret is ``--secret-file``'s content, else ``$LABKIT_GRADING_SECRET``, else a random one labkit makes once and
keeps in the user data directory (``grading-secret``). An exercise may add grader-only hand cases
(``Exercise.grader_cases``). A static read of the submission's code (:mod:`labkit.instructor.grader.review`) lists what
only a cheat needs, for the instructor to look at.

A class (a folder of submissions, a CSV gradebook) is ``labkit.instructor.cluster.classroom``.

    labkit grade submission.ipynb [--json grades.json] [--cell-timeout 120]
    labkit grade submissions/ [--out submissions-grades] [--jobs 2]
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from labkit.instructor.grader.judging import JUDGE, grading_secret, judge, plan, submission_seed
from labkit.instructor.wall.kernel_limits import SUBMISSION_BYTES, Limits
from labkit.instructor.grader.review import summary_text

# Terminal escape sequences and control characters (C0 but newline and tab, DEL, C1): a learner's output must not
# move the instructor's cursor, recolour the terminal or rewrite its title.
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b.|[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(value: Any) -> Any:
    """``value`` (a string, or lists and dicts of them) without terminal escapes and control characters.

    A file name's bytes that are not UTF-8 (kept by Python as lone surrogates) become "?".

    >>> printable({"details": ["\\x1b[31mred\\x1b[0m", "bell\\x07 and title \\x1b]0;pwned\\x07", "caf\\udce9"]})
    {'details': ['red', 'bell and title ', 'caf?']}
    """
    if isinstance(value, str):
        return _CONTROL.sub("", value.encode("utf-8", "replace").decode("utf-8"))
    if isinstance(value, list):
        return [printable(item) for item in value]
    if isinstance(value, dict):
        return {key: printable(item) for key, item in value.items()}
    return value
KERNEL_LOG_LINES = 20
MAX_NOTEBOOK_BYTES = SUBMISSION_BYTES  # a submission larger than this is not read
MAX_ANSWER_BYTES = 64 * 2**20  # the answers the worker hands back


def require_isolation() -> None:
    """Raise :class:`IsolationUnavailable`, saying why and what to do, when submissions cannot be walled off."""
    from labkit.instructor.wall.sandbox import isolation_problem

    problem = isolation_problem()
    if problem:
        raise IsolationUnavailable(
            f"labkit grade walls off each submission with bubblewrap, and {problem}. Install it, or grade without "
            "the wall with --no-isolation (every report then says 'not isolated'; only for submissions you trust)")


class IsolationUnavailable(RuntimeError):
    """Submissions cannot be walled off here, and the instructor did not opt in to grading without the wall."""


def lab_of(notebook: Any, path: Path) -> str:
    """The lab a notebook belongs to: its ``labkit.lab`` metadata, else the file name's number prefix."""
    metadata = notebook.metadata.get("labkit", {})
    if not isinstance(metadata, dict):
        raise ValueError(f"notebook {path} has labkit metadata that is a {type(metadata).__name__}, not a mapping "
                         "with a 'lab' key (for instance {\"lab\": \"01\"})")
    lab = metadata.get("lab")
    if lab:
        return str(lab)
    prefix = path.name.split("_", 1)[0]
    if prefix.isdigit():
        return prefix
    raise ValueError(f"notebook {path} has no labkit.lab metadata and its name does not start with a lab number")


def read_submission(path: Path) -> bytes:
    """A submission's bytes, read once: never through a symbolic link, never more than the cap."""
    try:  # never blocks: a FIFO opens at once (and is refused below), without waiting for a writer
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        if Path(path).is_symlink():
            raise ValueError(f"path {path} is a symbolic link, not a notebook handed in") from None
        raise FileNotFoundError(f"path {path} is not a notebook file ({error.strerror})") from None
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise FileNotFoundError(f"path {path} is not a notebook file")
        data = file.read(MAX_NOTEBOOK_BYTES + 1)
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise ValueError(f"notebook {path} is larger than {MAX_NOTEBOOK_BYTES // 2**20} MB")
    return data


def grade_notebook(path: Path, cell_timeout_s: int = 120, limits: Limits = Limits(), *,
                   secret: bytes | None = None, isolate: bool = True) -> dict[str, Any]:
    """Run a submitted notebook walled off and score each exercise of its lab. Returns the report (JSON-ready).

    ``isolate=False`` runs it without the wall (the report says "not isolated"); with ``isolate`` and no working
    bubblewrap this raises :class:`IsolationUnavailable`.
    """
    import nbformat

    from labkit.instructor.wall import sandbox
    from labkit.instructor.grader.review import refusals, review_notebook

    path = Path(path)
    if isolate:
        require_isolation()
    original = read_submission(path)
    notebook = nbformat.reads(original.decode("utf-8", errors="replace"), as_version=4)
    lab = lab_of(notebook, path)
    secret = grading_secret() if secret is None else secret
    seed = submission_seed(notebook, secret)
    started = time.perf_counter()
    with JUDGE:
        _warm_model_cache()
        chosen, worker_plan, drawn = plan(lab, seed)
    cases = json.dumps({"exercises": worker_plan}).encode()
    received: dict[str, Any] = {}

    def exchange(read_fd: int, write_fd: int) -> None:
        """The grader's end of the pipes: the cases only when the worker's answering step asks, then its result."""
        from labkit.instructor.wall import wire

        while True:
            try:
                message = json.loads(wire.read_frame(read_fd, MAX_ANSWER_BYTES))
            except (wire.WireError, ValueError, RecursionError) as error:
                received.setdefault("problem", f"its worker's message could not be read ({error})")
                return
            if not isinstance(message, dict):
                continue
            if message.get("ready") is True and "sent" not in received:
                received["sent"] = True
                wire.send_frame(write_fd, cases)
            elif "result" in message:
                received["result"] = message["result"]
                return

    shipped, not_run = _without_measurements(notebook, lab)
    scratch = None if isolate else Path(tempfile.mkdtemp(prefix="labkit-grade-"))
    try:
        job = scratch / "job" if scratch else None
        if job:
            (job / "home").mkdir(parents=True)
        inside = Path(sandbox.INSIDE_JOB) if isolate else job
        run = sandbox.run_walled(
            [sys.executable, "-I", "-m", "labkit.instructor.wall.worker", "--job", str(inside), "--lab", lab,
             "--to-grader", "{from_worker}", "--from-grader", "{to_worker}",
             "--cell-timeout", str(cell_timeout_s), "--answer-timeout", str(max(cell_timeout_s, 300)),
             "--output-bytes", str(limits.output_mb * 2**20), "--budget-seconds", str(limits.budget_seconds),
             *(["--isolated"] if isolate else [])],
            job, limits, isolate=isolate, env=_worker_env(inside), readable=_model_cache(),
            job_files={"submission.ipynb": shipped or original}, exchange=exchange)
    finally:
        if scratch is not None:
            sandbox.remove_tree(scratch)
    result = received.get("result") if isinstance(received.get("result"), dict) else {}
    status = result.get("status") if isinstance(result.get("status"), dict) else {}
    step = result.get("answers") if isinstance(result.get("answers"), dict) else {}
    answers = step.get("answers") if isinstance(step.get("answers"), dict) else None
    answer_problem = None
    if answers is None:
        answer_problem = (run.stopped or _answer_cell_problem(status, step) or received.get("problem")
                          or "the notebook's run ended without answers")
    with JUDGE:
        results = [judge(exercise, drawn.get(exercise.id), answers, answer_problem) for exercise in chosen]
    return printable({
        "notebook": str(path),
        "lab": lab,
        "score": sum(r["points"] for r in results),
        "max_score": sum(r["max_points"] for r in results),
        "exercises": results,
        "cell_errors": _cell_errors(status, cell_timeout_s),
        "course_cells_not_run": not_run,
        "review": review_notebook(notebook, lab) + refusals(notebook, step.get("refused")),
        "isolated": isolate,
        "seed": seed,
        "limits": run.limits,
        "stopped": run.stopped,
        "output_dropped_bytes": dropped if type(dropped := status.get("output_dropped_bytes")) is int else 0,
        "kernel_log": run.log_tail.splitlines()[-KERNEL_LOG_LINES:],  # the end of what the run printed outside cells
        "seconds": round(time.perf_counter() - started, 1),
    })


def _without_measurements(notebook: Any, lab: str) -> tuple[bytes | None, list[int]]:
    """The notebook to run, without the course's cells that only measure or draw for the reader (tagged
    :data:`~labkit.instructor.authoring.GRADER_SKIPS_TAG` in the shipped learner notebook, matched by their whole
    source: an edited cell is the learner's and runs), and those cells' indices; None when there are none."""
    import copy

    import nbformat

    from labkit.instructor.authoring import GRADER_SKIPS_TAG
    from labkit.instructor.grader.review import course_cells

    skipped = course_cells(lab, GRADER_SKIPS_TAG)
    not_run = [index for index, cell in enumerate(notebook.cells) if cell.cell_type == "code" and
               isinstance(cell.source, str) and cell.source.strip() in skipped]
    if not not_run:
        return None, []
    shipped = copy.deepcopy(notebook)
    for index in not_run:
        shipped.cells[index].source = "# not run by the grader: a course cell that measures or draws for the reader"
    return nbformat.writes(shipped).encode(), not_run


def _warm_model_cache() -> None:
    """The embedded model's cache, built if missing: the wall lets a submission read it, never write it."""
    from labkit.runtime.models import load_model

    load_model(progress=False)


def _model_cache() -> list[Path]:
    """The model cache, which the wall shows read-only. A grader running as root makes it readable to others
    (the sandbox is ``nobody``; the cache holds only the public model's weights), or the model would not load."""
    from labkit.core.resources import cache_root

    root = cache_root()
    if os.geteuid() == 0 and root.is_dir():
        import subprocess

        subprocess.run(["chmod", "-R", "go+rX", "--", str(root)], capture_output=True, timeout=120)
    return [root]


def _worker_env(job: Path) -> dict[str, str]:
    from labkit.core.resources import cache_root

    home = job / "home"
    return {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home),
            "USER": "nobody", "LOGNAME": "nobody",
            "TMPDIR": "/tmp" if str(job).startswith("/job") else str(home), "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "LABKIT_CACHE": str(cache_root()),
            "LABKIT_PROGRESS": str(home / "progress.json"), "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1",
            "IPYTHONDIR": str(home / ".ipython"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
            "PYTHONUNBUFFERED": "1"}


def _answer_cell_problem(status: dict[str, Any], step: dict[str, Any]) -> str | None:
    error = step.get("error") or status.get("answer_cell_error")
    return f"the grader's answering step failed: {str(error)[:300]}" if error else None


def _cell_errors(status: dict[str, Any], cell_timeout_s: int) -> list[dict[str, Any]]:
    timed_out = f"CellTimeout: the cell ran longer than {cell_timeout_s} s and was interrupted"
    errors = []
    for key, kind in (("errors", "error"), ("skipped", "skipped")):
        found = status.get(key)
        for cell, text in (found.items() if isinstance(found, dict) else []):
            if not str(cell).isdigit():
                continue
            text = str(text)[:500]
            if kind == "skipped":
                text = f"{text}; it was skipped"
            elif text.startswith(("CellTimeout", "KeyboardInterrupt")):
                text = timed_out  # the grader's interrupt surfaces in the kernel as KeyboardInterrupt
            errors.append({"cell": int(cell), "error": text})
    return sorted(errors, key=lambda e: e["cell"])


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
    if report.get("course_cells_not_run"):
        lines.append(f"not run (the course's measurements and figures, which no exercise uses): cells "
                     f"{', '.join(map(str, report['course_cells_not_run']))}")
    lines += [f"review: {summary_text([finding])}" for finding in report.get("review", [])]
    if report.get("stopped"):
        lines.append(f"stopped: {report['stopped']}")
    if report.get("isolated") is False:
        lines.append("note: not isolated (graded without the wall, --no-isolation)")
    if report["limits"]["processes"].startswith("not enforced"):
        lines.append(f"note: the number of processes was {report['limits']['processes']}")
    return printable("\n".join(lines))
