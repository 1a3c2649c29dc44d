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
    OUT/reports/NAME.json  one report per submission; NAME is its path in the class, URL-quoted ("/" is %2F)
    OUT/results/KEY.json   the result store

so no learner's file or folder name can take the place of another output.

    labkit grade submissions/ [--out submissions-grades] [--jobs 2] [--scheduler tls://host:8786]
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable

from labkit.instructor.grader.gradebook import csv_safe, csv_text, format_class_summary, gradebook, plain  # noqa: F401
from labkit.instructor.grader.grading import printable
from labkit.instructor.wall.kernel_limits import Limits
from labkit.instructor.grader.results import (STORE, ResultStore, content_hash, grading_context, result_key,
                                       write_atomically)

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


def _unreadable(path: Path, error: BaseException | str) -> dict[str, Any]:
    if isinstance(error, str):
        text = error
    else:
        text = f"could not be graded: {type(error).__name__}: {printable((str(error).splitlines() or [''])[0])}"
    return {"notebook": str(path), "lab": None, "score": 0, "max_score": 0, "exercises": [], "cell_errors": [],
            "error": text}


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


def grade_class(folder: Path, out: Path, jobs: int = 1, cell_timeout_s: int = 120, limits: Limits = Limits(),
                progress: Callable[[str], None] | None = print, *, secret: bytes | None = None, isolate: bool = True,
                scheduler: str | None = None, security: Any = None, insecure_plain_tcp: bool = False,
                worker_secret_file: Path | None = None, bar: bool = False, dashboard: bool = False,
                grader: Callable[..., dict[str, Any]] | None = None, cluster: str = "local") -> list[dict[str, Any]]:
    """Grade every submission in ``folder`` on ``jobs`` local workers (``cluster="slurm"``: ``jobs`` batch jobs,
    :mod:`labkit.instructor.cluster.jobqueue`; or the running cluster at ``scheduler``); write the reports, the gradebook
    and the class picture to ``out``. Returns the reports in path order.

    ``secret`` salts the random cases (default :func:`~labkit.instructor.grader.judging.grading_secret`); it reaches the
    workers once each, over TLS; over a plain-TCP ``scheduler`` (loopback, or anywhere with
    ``insecure_plain_tcp``) each worker reads it from ``worker_secret_file`` instead. ``grader`` replaces
    :func:`~labkit.instructor.grader.grading.grade_notebook` on the workers (same signature; the benchmarks' stand-in).
    On an interrupt (Ctrl-C) every sandbox is stopped, what was finished is written (the rest noted on its rows)
    and ``KeyboardInterrupt`` is raised again. When no worker can grade, what was finished is written (the rest
    noted with the reason) and :class:`~labkit.instructor.cluster.workers.NoUsableWorkers` is raised again.
    """
    from labkit.instructor.grader.judging import grading_secret

    folder, out = Path(folder), Path(out)
    say = progress or (lambda line: None)
    if not folder.is_dir():
        raise FileNotFoundError(f"path {folder} is not a folder")
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer, got {jobs!r}")
    if cluster != "local" and scheduler is not None:
        raise ValueError(f"--cluster {cluster} starts its own scheduler: give it or --scheduler, not both")
    submissions = find_submissions(folder)
    if not submissions:
        raise ValueError(f"folder {folder} holds no .ipynb submissions")
    plan = None
    if cluster != "local":
        from labkit.instructor.cluster.workers import GRADER_MEMORY_BYTES
        from labkit.instructor.cluster.jobqueue import plan_jobs

        plan = plan_jobs(cluster, jobs, out, _deadline_s({"limits": limits, "cell_timeout_s": cell_timeout_s}),
                         limits.total_memory_mb * 2**20 + GRADER_MEMORY_BYTES)
    if scheduler is None and plan is None and isolate:
        from labkit.instructor.grader.grading import require_isolation

        require_isolation()
    secret = grading_secret() if secret is None else secret
    context = grading_context(secret, cell_timeout_s, limits, isolate)
    store = ResultStore(out / STORE)
    entries: dict[Path, dict[str, Any]] = {}
    for learner, path in submissions:  # checked here, before anything is shipped
        try:
            data, lab, code = _check_submission(path)
        except Exception as error:  # noqa: BLE001 - one unreadable file is its learner's note, never the class's
            entries[path] = {"learner": learner, "report": _unreadable(path, error)}
            continue
        entries[path] = {"learner": learner, "key": result_key(content_hash(data), {**context, "lab": lab}),
                         "code": code, "lab": lab}
    wanted = {entry["key"]: path for path, entry in entries.items() if "key" in entry}
    stored = store.keys()
    todo = {key: path for key, path in wanted.items() if key not in stored}
    failures: dict[str, str] = {}
    started, workers, interrupted, unusable = time.monotonic(), 0, False, None
    if todo:
        from labkit.instructor.cluster.workers import NoUsableWorkers

        try:
            workers = _grade_on_cluster(todo, entries, store, failures, say, jobs=jobs, scheduler=scheduler,
                                        plan=plan, security=security, insecure_plain_tcp=insecure_plain_tcp,
                                        worker_secret_file=worker_secret_file, secret=secret, bar=bar,
                                        dashboard=dashboard, options={"cell_timeout_s": cell_timeout_s,
                                                                      "limits": limits, "isolate": isolate,
                                                                      "grader": grader})
        except KeyboardInterrupt:
            interrupted = True
        except NoUsableWorkers as error:
            unusable = error
            for key in todo:
                failures.setdefault(key, f"not graded: {error} (run the same command again when workers can grade)")
    reports = _assemble(submissions, entries, store, failures, interrupted)
    _write_outputs(folder, out, submissions, reports)
    kept = store.keys()
    with_key = sum(1 for entry in entries.values() if "key" in entry)
    say(_throughput(len(todo), sum(1 for key in todo if key in kept), len(wanted) - len(todo),
                    len(entries) - with_key, with_key - len(wanted), time.monotonic() - started, workers))
    if interrupted:
        raise KeyboardInterrupt(f"interrupted: what was finished is in {out}")
    if unusable is not None:
        raise unusable
    return reports


def _grade_on_cluster(todo: dict[str, Path], entries: dict[Path, dict[str, Any]], store: ResultStore,
                      failures: dict[str, str], say: Callable[[str], None], *, jobs: int, scheduler: str | None,
                      plan: Any, security: Any, insecure_plain_tcp: bool, worker_secret_file: Path | None,
                      secret: bytes, bar: bool, dashboard: bool, options: dict[str, Any]) -> int:
    """Grade the submissions of ``todo`` (key -> path), storing each report as it comes; the number of workers."""
    from tqdm.auto import tqdm

    from labkit.instructor.cluster.workers import (PLUGIN, ClassRun, GraderPlugin, machine_identity, open_client,
                                          prepare_model_cache)
    from labkit.instructor.grader.grading import read_submission
    from labkit.instructor.grader.results import secret_identity

    prepare_model_cache()  # once on this machine, before any local worker starts
    with open_client(jobs, scheduler, security=security, insecure_plain_tcp=insecure_plain_tcp, plan=plan,
                     say=say) as (client, encrypted):
        expected = machine_identity()
        if not encrypted and worker_secret_file is None:
            raise ValueError("over a plain-TCP scheduler the secret does not travel: give worker_secret_file "
                             "(--worker-secret-file), a file holding it on every worker, or use tls://")
        secret_option = {"secret": secret} if encrypted else {"secret_file": str(worker_secret_file)}
        with tqdm(total=len(todo), unit="submission", disable=not bar, dynamic_ncols=True) as meter:
            write = meter.write if bar else say
            run = ClassRun(client, options, deadline_s=_deadline_s(options), say=write)
            watch = None
            if plan is not None:  # before the plugin: a worker may refuse (naming its job's log) as soon as it has it
                from labkit.instructor.cluster.jobqueue import JobWatch

                watch = JobWatch(client.cluster, plan.kind)
                run.log_of_worker = watch.log_of_worker
            client.register_plugin(GraderPlugin(expected, options["isolate"], secret_identity(secret),
                                                leave_after_s=plan.leave_after_s if plan else None,
                                                **secret_option), name=PLUGIN)
            try:
                if dashboard and client.dashboard_link:
                    write(f"Dask dashboard: {client.dashboard_link}")
                if plan is None or watch is None:
                    workers = run.usable_workers()
                else:  # a batch queue may hold the jobs a while; a job that fails says why within the wait
                    write(f"{plan.kind}: waiting up to {JOB_WAIT_S // 60} minutes for a job's worker to join")
                    workers = run.usable_workers(JOB_WAIT_S, watch=watch, jobs=plan.jobs)
                learners = _learners_by_key(entries)

                def done(key: str, outcome: dict[str, Any]) -> None:
                    if "report" in outcome:
                        store.put(key, outcome["report"])
                        report = outcome["report"]
                        text = f"lab {report['lab']}: {report['score']}/{report['max_score']}"
                    else:
                        failures[key] = outcome["error"]
                        text = outcome["error"]
                    for learner, path in learners.get(key, []):
                        write(plain(f"graded {learner} ({path.name}): {text}"))
                    meter.update(1)
                    meter.set_postfix(failures=len(failures), refresh=False)

                def load(path: Path, key: str) -> Callable[[], bytes]:
                    return lambda: read_submission(path)

                run.run([(key, path.name, load(path, key)) for key, path in todo.items()], done,
                        window=max(4, 2 * workers))
            except KeyboardInterrupt:
                run.stop()  # every sandbox on every worker ends now; a local cluster closes with its processes
                raise
            finally:
                try:
                    client.unregister_worker_plugin(PLUGIN)  # the scheduler keeps no copy of the secret
                except Exception:  # noqa: BLE001 - a closing cluster may not answer
                    pass
            if run.retries:
                write(f"{run.retries} submissions were started again after their worker died")
        return workers


def _deadline_s(options: dict[str, Any]) -> float:
    """How long one submission may hold a worker before the client gives up on it: its wall time plus the
    answering step and the judge's time."""
    return options["limits"].wall_seconds + max(300, options["cell_timeout_s"]) + 300


def _learners_by_key(entries: dict[Path, dict[str, Any]]) -> dict[str, list[tuple[str, Path]]]:
    found: dict[str, list[tuple[str, Path]]] = {}
    for path, entry in entries.items():
        if "key" in entry:
            found.setdefault(entry["key"], []).append((entry["learner"], path))
    return found


def _assemble(submissions: list[tuple[str, Path]], entries: dict[Path, dict[str, Any]], store: ResultStore,
              failures: dict[str, str], interrupted: bool) -> list[dict[str, Any]]:
    reports = []
    for learner, path in submissions:
        entry = entries[path]
        if "report" in entry:
            report = entry["report"]
        elif (stored := store.get(entry["key"])) is not None:
            report = {**stored, "notebook": str(path), "code_sha256": entry["code"]}
        else:
            report = _unreadable(path, failures.get(entry["key"], INTERRUPTED if interrupted else
                                                    "could not be graded: no result came back"))
        reports.append({**report, "learner": learner})
    return reports


def _write_outputs(folder: Path, out: Path, submissions: list[tuple[str, Path]], reports: list[dict[str, Any]]) -> None:
    from labkit.instructor.grader.class_picture import save_class_picture

    for (_, path), report in zip(submissions, reports):
        write_atomically(report_path(out, folder, path), json.dumps(report, indent=2))
    for learner, link in symlinked_submissions(folder):
        reports.append({"learner": learner, "notebook": link.name, "lab": None, "score": 0, "max_score": 0,
                        "exercises": [], "cell_errors": [],
                        "error": "not graded: a symbolic link, not a notebook handed in"})
    write_atomically(out / "gradebook.csv", csv_text(reports))
    save_class_picture(reports, out / "class.png")


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
