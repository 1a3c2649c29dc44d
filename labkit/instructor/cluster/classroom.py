"""Grading a class: a folder of submissions graded on Dask workers, one JSON report each, a CSV gradebook, a picture.

A notebook directly inside the folder belongs to the learner named by its file's stem, a notebook in a subfolder
to the learner named by the subfolder. :func:`grade_class` checks every file on this machine first (a link, a file
too large, not a notebook, no lab: a note on its learner's row, never shipped), then grades each distinct
submission once, walled off on a worker (:mod:`labkit.instructor.cluster.workers`; ``jobs`` local worker processes, or a
running scheduler). Each finished report is kept at once in the result store (:mod:`labkit.instructor.grader.results`),
so the same command run again after an interruption grades only what is missing and writes the same gradebook.
This process is the only writer of the output folder::

    OUT/gradebook.csv      one row per learner (see labkit.instructor.grader.gradebook)
    OUT/class.png          per exercise passed / failed / not attempted, and the score distribution
    OUT/class_report.html  what the class got wrong (see labkit.instructor.grader.class_report), and its CSV
    OUT/reports/NAME.json  one report per submission; NAME is its path in the class, URL-quoted ("/" is %2F)
    OUT/results/KEY.json   the result store

so no learner's file or folder name can take the place of another output.

    labkit grade submissions/ [--out submissions-grades] [--jobs 2] [--scheduler tls://host:8786]
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from labkit.instructor.grader.gradebook import csv_text, one_line
from labkit.instructor.grader.reports import SubmissionReport, printable
from labkit.instructor.grader.results import STORE, ResultStore, content_hash, result_key, write_atomically
from labkit.instructor.grader.settings import GradingSettings

JOB_WAIT_S = 1800  # how long --cluster slurm waits for its first worker (a busy queue may hold the jobs)
INTERRUPTED = "not graded yet: the run was interrupted (run the same command again to grade the rest)"


def find_submissions(folder: Path) -> list[tuple[str, Path]]:
    """(learner, notebook) for every submission in ``folder``, in path order.

    A notebook directly in the folder belongs to the learner named by its file's stem; one in a subfolder belongs
    to the learner named by that subfolder. Hidden folders (``.ipynb_checkpoints``) are passed over, and so is
    anything reached through a symbolic link (see :func:`symlinked_submissions`): a link could hand in another
    learner's notebook, or read a file outside the folder.
    """
    found = []
    for path in sorted(Path(folder).rglob("*.ipynb")):
        relative = path.relative_to(folder)
        if any(part.startswith(".") for part in relative.parts) or _through_link(folder, relative):
            continue
        found.append((relative.parts[0] if len(relative.parts) > 1 else path.stem, path))
    return found


def _through_link(folder: Path, relative: Path) -> bool:
    return any((Path(folder) / Path(*relative.parts[: depth + 1])).is_symlink() for depth in range(len(relative.parts)))


def symlinked_submissions(folder: Path) -> list[tuple[str, Path]]:
    """(learner, path) of every ``.ipynb`` link in ``folder`` (not graded; the gradebook notes it, never its target)."""
    links = []
    for path in sorted(Path(folder).iterdir()):
        if path.is_symlink() and not path.name.startswith("."):
            links.append((path.stem if path.suffix == ".ipynb" else path.name, path))
        elif path.is_dir() and not path.name.startswith("."):
            links += [(path.name, inner) for inner in sorted(path.iterdir())
                      if inner.is_symlink() and inner.name.endswith(".ipynb")]
    return links


def report_path(out: Path, folder: Path, notebook: Path) -> Path:
    """Where a submission's report goes: one flat folder, the class path URL-quoted, so names cannot collide.

    >>> report_path(Path("o"), Path("c"), Path("c/ana/00_start_here.ipynb")).as_posix()
    'o/reports/ana%2F00_start_here.json'
    >>> report_path(Path("o"), Path("c"), Path("c/ana.json/x.ipynb")) != report_path(Path("o"), Path("c"), Path("c/ana.ipynb"))
    True
    """
    relative = os.fsencode(Path(notebook).relative_to(folder).as_posix())  # the name's bytes, UTF-8 or not
    name = urllib.parse.quote(relative[: -len(b".ipynb")] if relative.endswith(b".ipynb") else relative, safe="")
    if len(name.encode()) > 200:  # a file name has at most 255 bytes: keep a prefix and a hash of the whole
        name = f"{name[:120]}~{hashlib.sha256(relative).hexdigest()[:16]}"
    return Path(out) / "reports" / f"{name}.json"


def _unreadable(path: Path, error: BaseException | str) -> SubmissionReport:
    if isinstance(error, str):
        text = error
    else:
        text = f"could not be graded: {type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
    return SubmissionReport(notebook=printable(str(path)), lab=None, error=printable(text))


@functools.lru_cache(maxsize=1)
def _known_labs() -> tuple[str, ...]:
    from labkit.core.course import labs

    return tuple(entry.notebook.split("_", 1)[0] for entry in labs())


def _check_submission(path: Path) -> tuple[bytes, str, str]:
    """(bytes, lab, code hash) of a submission this machine accepts for shipping; raises with the reason."""
    import nbformat

    from labkit.instructor.grader.grading import lab_of, read_submission

    data = read_submission(path)
    notebook = nbformat.reads(data.decode("utf-8", errors="replace"), as_version=4)
    lab = lab_of(notebook, path)
    known = _known_labs()
    if lab not in known:
        raise ValueError(f"its lab {lab!r} is not one of the course's ({', '.join(known)})")
    code = "\0".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    return data, lab, hashlib.sha256(code.encode()).hexdigest()


@dataclass
class _Class:
    """One class run's submissions: each checked entry (learner, key, code hash, lab; or its report when it was
    refused before shipping), the store, what is still to grade (key -> path) and why some could not be."""

    entries: dict[Path, dict[str, Any]]
    store: ResultStore
    todo: dict[str, Path] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)


def grade_class(folder: Path, out: Path, settings: GradingSettings = GradingSettings(), *,
                progress: Callable[[str], None] | None = print,
                grader: Callable[[Path, GradingSettings], SubmissionReport] | None = None) -> list[SubmissionReport]:
    """Grade every submission in ``folder`` on ``settings.jobs`` local workers (``settings.cluster`` "slurm":
    that many batch jobs, :mod:`labkit.instructor.cluster.jobqueue`; or the running cluster at
    ``settings.scheduler``); write the reports, the gradebook and the class picture to ``out``. Returns the reports
    in path order.

    ``settings.secret`` salts the random cases (default :func:`~labkit.instructor.grader.judging.grading_secret`);
    it reaches the workers once each, over TLS; over a plain-TCP scheduler (loopback, or anywhere with
    ``insecure_plain_tcp``) each worker reads it from ``settings.worker_secret_file`` instead. ``grader``
    replaces :func:`~labkit.instructor.grader.grading.grade_notebook` on the workers (same signature; the
    benchmarks' stand-in). On an interrupt (Ctrl-C) every sandbox is stopped, what was finished is written (the
    rest noted on its rows) and ``KeyboardInterrupt`` is raised again. When no worker can grade, what was finished
    is written (the rest noted with the reason) and :class:`~labkit.instructor.cluster.workers.NoUsableWorkers` is
    raised again.
    """
    folder, out = Path(folder), Path(out)
    say = progress or (lambda line: None)
    if not folder.is_dir():
        raise FileNotFoundError(f"path {folder} is not a folder")
    submissions = find_submissions(folder)
    if not submissions:
        raise ValueError(f"folder {folder} holds no .ipynb submissions")
    plan = None
    if settings.cluster != "local":
        from labkit.instructor.cluster.jobqueue import plan_jobs
        from labkit.instructor.cluster.grader_plugin import GRADER_MEMORY_BYTES

        plan = plan_jobs(settings.cluster, settings.jobs, out, settings.deadline_s,
                         settings.limits.total_memory_mb * 2**20 + GRADER_MEMORY_BYTES)
    if settings.scheduler is None and plan is None and settings.isolate:
        from labkit.instructor.grader.grading import require_isolation

        require_isolation()
    settings = settings.with_secret()
    context = settings.context()
    run = _Class(entries={}, store=ResultStore(out / STORE))
    for learner, path in submissions:  # checked here, before anything is shipped
        try:
            data, lab, code = _check_submission(path)
        except Exception as error:  # noqa: BLE001 - one unreadable file is its learner's note, never the class's
            run.entries[path] = {"learner": learner, "report": _unreadable(path, error)}
            continue
        run.entries[path] = {"learner": learner, "key": result_key(content_hash(data), {**context, "lab": lab}),
                             "code": code, "lab": lab}
    wanted = {entry["key"]: path for path, entry in run.entries.items() if "key" in entry}
    stored = run.store.keys()
    run.todo = {key: path for key, path in wanted.items() if key not in stored}
    started, workers, interrupted, unusable = time.monotonic(), 0, False, None
    if run.todo:
        from labkit.instructor.cluster.workers import NoUsableWorkers

        try:
            workers = _grade_on_cluster(run, settings, plan, say, grader)
        except KeyboardInterrupt:
            interrupted = True
        except NoUsableWorkers as error:
            unusable = error
            for key in run.todo:
                run.failures.setdefault(key, f"not graded: {error} (run the same command again when workers can "
                                             "grade)")
    reports = _assemble(submissions, run, interrupted)
    _write_outputs(folder, out, submissions, reports)
    kept = run.store.keys()
    with_key = sum(1 for entry in run.entries.values() if "key" in entry)
    say(_throughput(len(run.todo), sum(1 for key in run.todo if key in kept), len(wanted) - len(run.todo),
                    len(run.entries) - with_key, with_key - len(wanted), time.monotonic() - started, workers))
    if interrupted:
        raise KeyboardInterrupt(f"interrupted: what was finished is in {out}")
    if unusable is not None:
        raise unusable
    return reports


def _grade_on_cluster(run: _Class, settings: GradingSettings, plan: Any, say: Callable[[str], None],
                      grader: Callable[..., SubmissionReport] | None) -> int:
    """Grade the submissions of ``run.todo``, storing each report as it comes; the number of workers."""
    from tqdm.auto import tqdm

    from labkit.instructor.cluster.grader_plugin import PLUGIN, GraderPlugin, machine_identity, prepare_model_cache
    from labkit.instructor.cluster.workers import ClassRun, open_client
    from labkit.instructor.grader.grading import read_submission
    from labkit.instructor.grader.results import secret_identity

    prepare_model_cache()  # once on this machine, before any local worker starts
    with open_client(settings, plan=plan, say=say) as (client, encrypted):
        expected = machine_identity()
        if not encrypted and settings.worker_secret_file is None:
            raise ValueError("over a plain-TCP scheduler the secret does not travel: give worker_secret_file "
                             "(--worker-secret-file), a file holding it on every worker, or use tls://")
        secret_option = ({"secret": settings.secret} if encrypted
                         else {"secret_file": str(settings.worker_secret_file)})
        with tqdm(total=len(run.todo), unit="submission", disable=not settings.bar, dynamic_ncols=True) as meter:
            write = meter.write if settings.bar else say
            class_run = ClassRun(client, settings.for_workers(), grader, say=write)
            watch = None
            if plan is not None:  # before the plugin: a worker may refuse (naming its job's log) as soon as it has it
                from labkit.instructor.cluster.jobqueue import JobWatch

                watch = JobWatch(client.cluster, plan.kind)
                class_run.log_of_worker = watch.log_of_worker
            client.register_plugin(GraderPlugin(expected, settings.isolate, secret_identity(settings.secret),
                                                leave_after_s=plan.leave_after_s if plan else None,
                                                **secret_option), name=PLUGIN)
            try:
                if settings.dashboard and client.dashboard_link:
                    write(f"Dask dashboard: {client.dashboard_link}")
                if plan is None or watch is None:
                    workers = class_run.usable_workers()
                else:  # a batch queue may hold the jobs a while; a job that fails says why within the wait
                    write(f"{plan.kind}: waiting up to {JOB_WAIT_S // 60} minutes for a job's worker to join")
                    workers = class_run.usable_workers(JOB_WAIT_S, watch=watch, jobs=plan.jobs)
                learners = _learners_by_key(run.entries)

                def done(key: str, outcome: dict[str, Any]) -> None:
                    if "report" in outcome:
                        report = outcome["report"]
                        run.store.put(key, report)
                        text = f"lab {report.lab}: {report.score}/{report.max_score}"
                    else:
                        run.failures[key] = outcome["error"]
                        text = outcome["error"]
                    for learner, path in learners.get(key, []):
                        write(one_line(f"graded {learner} ({path.name}): {text}"))
                    meter.update(1)
                    meter.set_postfix(failures=len(run.failures), refresh=False)

                class_run.run([(key, path.name, functools.partial(read_submission, path))
                               for key, path in run.todo.items()], done, window=max(4, 2 * workers))
            except KeyboardInterrupt:
                class_run.stop()  # every sandbox on every worker ends now; a local cluster closes with its processes
                raise
            finally:
                try:
                    client.unregister_worker_plugin(PLUGIN)  # the scheduler keeps no copy of the secret
                except Exception:  # noqa: BLE001 - a closing cluster may not answer
                    pass
            if class_run.retries:
                write(f"{class_run.retries} submissions were started again after their worker died")
        return workers


def _learners_by_key(entries: dict[Path, dict[str, Any]]) -> dict[str, list[tuple[str, Path]]]:
    found: dict[str, list[tuple[str, Path]]] = {}
    for path, entry in entries.items():
        if "key" in entry:
            found.setdefault(entry["key"], []).append((entry["learner"], path))
    return found


def _assemble(submissions: list[tuple[str, Path]], run: _Class, interrupted: bool) -> list[SubmissionReport]:
    reports = []
    for learner, path in submissions:
        entry = run.entries[path]
        if "report" in entry:
            report = entry["report"]
        elif (stored := run.store.get(entry["key"])) is not None:
            report = dataclasses.replace(stored, notebook=printable(str(path)), code_sha256=entry["code"])
        else:
            report = _unreadable(path, run.failures.get(entry["key"], INTERRUPTED if interrupted else
                                                        "could not be graded: no result came back"))
        reports.append(report.with_learner(learner))
    return reports


def _write_outputs(folder: Path, out: Path, submissions: list[tuple[str, Path]],
                   reports: list[SubmissionReport]) -> None:
    from labkit.instructor.grader.class_picture import save_class_picture
    from labkit.instructor.grader.class_report import write_class_report

    for (_, path), report in zip(submissions, reports):
        write_atomically(report_path(out, folder, path), json.dumps(report.to_json(), indent=2))
    for learner, link in symlinked_submissions(folder):
        reports.append(SubmissionReport(notebook=printable(link.name), lab=None, learner=learner,
                                        error="not graded: a symbolic link, not a notebook handed in"))
    write_atomically(out / "gradebook.csv", csv_text(reports))
    save_class_picture(reports, out / "class.png")
    write_class_report(reports, out, title=f"Class report: {folder.name}")


def _throughput(shipped: int, graded: int, reused: int, rejected: int, copies: int, seconds: float,
                workers: int) -> str:
    minutes = max(seconds, 1e-9) / 60
    rate = (f": {graded / minutes:.1f} per minute, {graded / minutes / workers:.2f} per minute per worker"
            if workers and graded else "")
    extra = [f"{reused} already graded by an earlier run" if reused else "",
             f"{copies} byte-identical copies graded once" if copies else "",
             f"{rejected} rejected before shipping" if rejected else ""]
    return "; ".join(filter(None, [f"graded {graded} of {shipped} submissions sent in {seconds:.0f} s on "
                                   f"{workers} workers{rate}", *extra]))
