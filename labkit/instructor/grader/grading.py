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

import os
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from labkit.instructor.grader.judging import JUDGE, judge, plan, submission_seed
from labkit.instructor.grader.reports import CellError, SubmissionReport, printable
from labkit.instructor.grader.settings import GradingSettings
from labkit.instructor.wall import protocol
from labkit.instructor.wall.kernel_limits import SUBMISSION_BYTES
from labkit.instructor.wall.protocol import WorkerReport

KERNEL_LOG_LINES = 20


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
        data = file.read(SUBMISSION_BYTES + 1)
    if len(data) > SUBMISSION_BYTES:
        raise ValueError(f"notebook {path} is larger than {SUBMISSION_BYTES // 2**20} MB")
    return data


def grade_notebook(path: Path, settings: GradingSettings = GradingSettings()) -> SubmissionReport:
    """Run a submitted notebook walled off and score each exercise of its lab.

    ``settings.isolate`` False runs it without the wall (the report says "not isolated"); with it and no working
    bubblewrap this raises :class:`IsolationUnavailable`.
    """
    import nbformat

    from labkit.instructor.wall import sandbox
    from labkit.instructor.grader.review import refusals, review_notebook

    path = Path(path)
    settings = settings.with_secret()
    limits, isolate = settings.limits, settings.isolate
    if isolate:
        require_isolation()
    original = read_submission(path)
    notebook = nbformat.reads(original.decode("utf-8", errors="replace"), as_version=4)
    lab = lab_of(notebook, path)
    seed = submission_seed(notebook, settings.secret)
    started = time.perf_counter()
    with JUDGE:
        _warm_model_cache()
        chosen, worker_plan, drawn = plan(lab, seed)
    grader_end = protocol.GraderEnd({"exercises": worker_plan})

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
             "--cell-timeout", str(settings.cell_timeout_s), "--answer-timeout", str(settings.answer_timeout_s),
             "--output-bytes", str(limits.output_mb * 2**20), "--budget-seconds", str(limits.budget_seconds),
             *(["--isolated"] if isolate else [])],
            job, limits, isolate=isolate, env=_worker_env(inside), readable=_model_cache(),
            job_files={"submission.ipynb": shipped or original}, exchange=grader_end.exchange)
    finally:
        if scratch is not None:
            sandbox.remove_tree(scratch)
    received = grader_end.result
    answer_problem = None
    if received.answers is None:
        answer_problem = (run.stopped or _answer_cell_problem(received) or received.problem
                          or "the notebook's run ended without answers")
    with JUDGE:
        results = [judge(exercise, drawn.get(exercise.id), received.answers, answer_problem) for exercise in chosen]
    return SubmissionReport(
        notebook=printable(str(path)), lab=lab, score=sum(r.points for r in results),
        max_score=sum(r.max_points for r in results), exercises=tuple(results),
        cell_errors=_cell_errors(received, settings.cell_timeout_s), course_cells_not_run=tuple(not_run),
        review=tuple(review_notebook(notebook, lab) + refusals(notebook, received.refused)), isolated=isolate,
        seed=seed, limits=run.limits, stopped=run.stopped, output_dropped_bytes=received.output_dropped_bytes,
        # the end of what the run printed outside cells
        kernel_log=tuple(printable(run.log_tail.splitlines()[-KERNEL_LOG_LINES:])),
        seconds=round(time.perf_counter() - started, 1))


def _without_measurements(notebook: Any, lab: str) -> tuple[bytes | None, list[int]]:
    """The notebook to run, without the course's cells that only measure or draw for the reader (tagged
    :data:`~labkit.instructor.grader.course_cells.GRADER_SKIPS_TAG` in the shipped learner notebook, matched by their whole
    source: an edited cell is the learner's and runs; one binding a name the submission's cells read runs too), and
    those cells' indices; None when there are none."""
    import copy

    import nbformat

    from labkit.exercises import exercises
    from labkit.instructor.grader.course_cells import GRADER_SKIPS_TAG, course_cells, skippable_cells

    skipped = course_cells(lab, GRADER_SKIPS_TAG)
    code = [index for index, cell in enumerate(notebook.cells) if cell.cell_type == "code"]
    sources = [source if isinstance(source := notebook.cells[index].source, str) else "" for index in code]
    # Only where the submission's own cells read nothing the tagged cell binds (skippable_cells: the learner's
    # function may use an import the solution did not need).
    keep_out = skippable_cells(sources, {exercise.function for exercise in exercises(lab)},
                               may_skip=[source.strip() in skipped for source in sources])
    not_run = [index for index, skip in zip(code, keep_out) if skip]
    if not not_run:
        return None, []
    shipped = copy.deepcopy(notebook)
    for index in not_run:
        shipped.cells[index].source = "# not run by the grader: a course cell that measures or draws for the reader"
    return nbformat.writes(shipped).encode(), not_run


def _warm_model_cache() -> None:
    """The embedded model's cache, built if missing: the wall lets a submission read it, never write it. Checked,
    not loaded: the grader's process does not run the model (a load cost each class worker seconds and 0.5 GB)."""
    from labkit.runtime.models import ensure_model_cache

    ensure_model_cache(progress=False)


def _model_cache() -> list[Path]:
    """The model cache, which the wall shows read-only. A grader running as root makes it readable to others
    (the sandbox is ``nobody``; the cache holds only the public model's weights), or the model would not load."""
    from labkit.core.resources import cache_root

    root = cache_root()
    if os.geteuid() == 0 and root.is_dir():
        import stat

        # chmod go+rX, but only where a mode lacks it: every chmod moves a file's change time, which the cache's
        # record of verified files compares (labkit.runtime.weights_cache), so `chmod -R` made every load re-read them.
        for folder, _, files in os.walk(root):
            for path in [Path(folder)] + [Path(folder, name) for name in files]:
                mode = path.lstat().st_mode
                wanted = mode | 0o044 | (0o011 if stat.S_ISDIR(mode) or mode & 0o100 else 0)
                if not stat.S_ISLNK(mode) and wanted != mode:
                    os.chmod(path, stat.S_IMODE(wanted))
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


def _answer_cell_problem(received: WorkerReport) -> str | None:
    error = received.step_error
    return f"the grader's answering step failed: {error}" if error else None


def _cell_errors(received: WorkerReport, cell_timeout_s: int) -> tuple[CellError, ...]:
    timed_out = f"CellTimeout: the cell ran longer than {cell_timeout_s} s and was interrupted"
    errors = []
    for found, kind in ((received.cell_errors, "error"), (received.skipped, "skipped")):
        for cell, text in found.items():
            if not str(cell).isdigit():
                continue
            text = printable(str(text)[:500])
            if kind == "skipped":
                text = f"{text}; it was skipped"
            elif text.startswith(("CellTimeout", "KeyboardInterrupt")):
                text = timed_out  # the grader's interrupt surfaces in the kernel as KeyboardInterrupt
            errors.append(CellError(int(cell), text))
    return tuple(sorted(errors, key=lambda e: e.cell))
