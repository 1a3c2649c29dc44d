"""Grading a class on Dask (issue #34): ``python -m benchmarks grading``.

1. Real submissions (the course's lab 00 solution notebook, each copy made distinct by a comment cell), graded
   walled off: directly with ``grade_notebook`` one after another (the runner without Dask), then through
   ``grade_class`` on a local cluster of 1 and of 2 workers. Printed: seconds per submission per worker (median
   and spread of the grader's own timing, and the class's wall time x workers / submissions), the cluster's
   start-up, and Dask's overhead per submission (1-worker wall per submission minus the direct median).
   Then the same class through ``labkit grade --cluster slurm`` (issue #43) on a real single-node SLURM brought up
   here (tests/slurm_cluster.py; skipped with the reason where it cannot run: not root, no slurm-wlm): 1 and 2 jobs,
   submissions per minute per worker beside the local cluster's, SLURM's overhead per submission against the local
   cluster's, the jobs' start (sbatch to the worker registered, from the jobs' logs), and what that makes for 500
   learners x 8 labs in an hour.
2. A simulated class of 2,000 submissions whose grading is stand-in work of scaled-down durations (log-normal,
   median 0.1 s: real submissions take 40-180 s), on a local cluster of 2 workers, one worker process killed when
   a third of the class is done: wall time against the ideal (total work / workers), retries, nothing lost.

3. ``--corpus``: the honest corpus of tests/honest_corpus.py (issue #41) as one class through the wall: every lab's
   solution and untouched learner copy, the natural first attempts, and every registered mistake of every exercise
   written as a learner would in that lab's solution notebook. Each must earn exactly what the notebook's own check
   gives, exercise by exercise, with no accusation: printed are the submissions, the points lost and gained against
   the check, the accusations and the review findings (``LABKIT_BENCH_CORPUS_LABS="00 03"`` grades those labs only).

Timings on a shared machine vary; compare the ratios printed in one run.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

import nbformat

from labkit.instructor.grader.settings import GradingSettings

ROOT = Path(__file__).resolve().parent.parent


def simulated_grader(path, settings):
    """Stand-in for grade_notebook: sleeps the duration the notebook's metadata says, grades by its first cell."""
    from labkit.instructor.grader.reports import ExerciseResult, SubmissionReport

    notebook = json.loads(Path(path).read_text())
    time.sleep(notebook["metadata"]["simulated_seconds"])
    right = "".join(notebook["cells"][0]["source"]).startswith("right")
    return SubmissionReport(notebook=str(path), lab="00", score=2 * right, max_score=2, exercises=(ExerciseResult(
        "00.simulated", "simulated", "code", "passed" if right else "failed", 2 * right, 2),), isolated=settings.isolate)


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f} {min(values):8.1f} {max(values):8.1f}"


def real_class(n: int = 4) -> None:
    from labkit.instructor.cluster import classroom
    from labkit.instructor.grader import grading

    source = nbformat.read(ROOT / "notebooks" / "solutions" / "00_start_here.ipynb", as_version=4)
    secret = b"benchmark secret"
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "class"
        folder.mkdir()
        for i in range(n):
            copy = nbformat.from_dict(json.loads(json.dumps(source)))
            copy.cells.append(nbformat.v4.new_code_cell(f"# learner {i}"))
            nbformat.write(copy, folder / f"learner{i}.ipynb")
        paths = sorted(folder.glob("*.ipynb"))
        direct = [grading.grade_notebook(path, GradingSettings(secret=secret)).seconds for path in paths]
        print(f"\nreal lab-00 submissions, {n} per run       {'median':>8} {'min':>8} {'max':>8}  (seconds)")
        print(f"{'direct grade_notebook, one at a time':<40} {_spread(direct)}")
        per_submission, graders = {}, {}
        for workers in (1, 2):
            lines: list[str] = []
            started = time.perf_counter()
            reports = classroom.grade_class(folder, Path(scratch) / f"out{workers}",
                                            GradingSettings(jobs=workers, secret=secret), progress=lines.append)
            wall = time.perf_counter() - started
            graded = [r.seconds for r in reports]
            per_submission[workers] = wall * workers / n
            print(f"{f'local cluster, {workers} worker(s): grader':<40} {_spread(graded)}")
            print(f"{f'  wall x workers / submissions':<40} {per_submission[workers]:8.1f}   "
                  f"(class wall {wall:.0f} s, start-up and checks included)")
            graders[workers] = statistics.median(graded)
        overhead = per_submission[1] - statistics.median(direct)
        print(f"Dask's cost per submission at 1 worker (start-up spread over {n}): {overhead:+.1f} s "
              f"({100 * overhead / statistics.median(direct):+.0f} % of a direct grading)")
        slurm_class(folder, Path(scratch), n, per_submission, graders, secret)


COURSE_SUBMISSIONS = 500 * 8
COURSE_SECONDS = 30.0  # a course's submission on one worker, on average (README: the labs' notebooks, 7 to 55 s)


def slurm_class(folder: Path, scratch: Path, n: int, local: dict[int, float], local_graders: dict[int, float],
                secret: bytes) -> None:
    """The class of :func:`real_class` through ``--cluster slurm`` on a single-node SLURM made here. The scheduling
    overhead per submission is measured within each run (wall x workers / submissions minus the grader's own median
    in that run), so a shared machine's load, which moves both, cancels out more than across runs."""
    import gc
    import re
    import sys

    import dask
    import yaml

    from labkit.instructor.cluster import classroom

    sys.path.insert(0, str(ROOT / "tests"))  # the tests' SLURM, brought up the same way
    from slurm_cluster import NO_SLURM, single_node_slurm, site_config

    if NO_SLURM:
        print(f"\nSLURM: not run here: {NO_SLURM}")
        return
    per_submission, graders, starts = {}, {}, []
    with single_node_slurm(scratch / "slurm") as slurm:
        section = yaml.safe_load((site_config(scratch / "dask", slurm["partition"]) / "jobqueue.yaml").read_text())
        with dask.config.set({f"jobqueue.slurm.{key}": value for key, value in section["jobqueue"]["slurm"].items()}):
            for jobs in (1, 2):
                out, lines = scratch / f"slurm{jobs}", []
                started = time.perf_counter()
                submitted = time.time()
                reports = classroom.grade_class(folder, out, GradingSettings(jobs=jobs, secret=secret,
                                                                             cluster="slurm"), progress=lines.append)
                wall = time.perf_counter() - started
                gc.collect()  # the closed cluster's TLS files go now, while their folder is still there
                per_submission[jobs] = wall * jobs / n
                for log in sorted(scratch.glob(f"slurm{jobs}-jobs/*.err")):
                    stamps = re.findall(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) .*Registered to:",
                                        log.read_text(), re.M)
                    if stamps:
                        registered = time.mktime(time.strptime(stamps[0][:19], "%Y-%m-%d %H:%M:%S"))
                        starts.append(registered + float("0." + stamps[0][20:]) - submitted)
                graded = [r.seconds for r in reports]
                graders[jobs] = statistics.median(graded)
                said = next((line for line in lines if " submissions sent in " in line), "")
                print(f"{f'SLURM, {jobs} job(s): grader':<40} {_spread(graded)}")
                print(f"{f'  wall x workers / submissions':<40} {per_submission[jobs]:8.1f}   "
                      f"(class wall {wall:.0f} s; local cluster {local[jobs]:.1f})")
                print(f"  {said.split('; ')[0]}")
    overheads = {jobs: per_submission[jobs] - graders[jobs] for jobs in per_submission}
    local_overheads = {workers: local[workers] - local_graders[workers] for workers in local}
    start_s = statistics.median(starts) if starts else float("nan")
    print(f"scheduling overhead per submission (wall x workers / submissions - the grader's median, start-up spread "
          f"over {n}): SLURM {overheads[1]:.1f} s at 1 job, {overheads[2]:.1f} s at 2; local cluster "
          f"{local_overheads[1]:.1f} s at 1 worker, {local_overheads[2]:.1f} s at 2")
    print(f"a job's worker registered {start_s:.1f} s after the run began (median of {len(starts)}: sbatch, the job's "
          "start, the worker's imports; the grader's checks follow)")
    # Sizing: each job grades one submission at a time, and pays its overhead (start-up included, spread over this
    # small class: an over-estimate for an hour's run) on each.
    per_job_s = COURSE_SECONDS + max(0.0, overheads[1])
    needed = -(-COURSE_SUBMISSIONS * per_job_s // 3600)
    print(f"500 learners x 8 labs ({COURSE_SUBMISSIONS:,} submissions of ~{COURSE_SECONDS:.0f} s) in an hour: "
          f"{needed:.0f} jobs ({per_job_s:.1f} s a submission with SLURM's overhead at 1 job)")


def _kill_one_worker_when(store: Path, count: int, killed: list[int]) -> None:
    import psutil

    while len(list(store.glob("*.json"))) < count:
        time.sleep(0.2)
    # A LocalCluster's nannies run in this process and start each worker as a child of it, by multiprocessing's
    # spawn (the resource tracker, the other child, is not one).
    workers = [child for child in psutil.Process().children()
               if "spawn_main" in " ".join(child.cmdline())]
    if workers:
        os.kill(workers[0].pid, signal.SIGKILL)
        killed.append(workers[0].pid)


def simulated_class(n: int = 2000, workers: int = 2, median_s: float = 0.1) -> None:
    from labkit.instructor.cluster import classroom

    rng = random.Random(34)
    durations = [median_s * rng.lognormvariate(0, 0.5) for _ in range(n)]
    with tempfile.TemporaryDirectory() as scratch:
        folder, out = Path(scratch) / "class", Path(scratch) / "out"
        folder.mkdir()
        for i, seconds in enumerate(durations):
            notebook = nbformat.v4.new_notebook()
            notebook.metadata["labkit"] = {"lab": "00"}
            notebook.metadata["simulated_seconds"] = seconds
            notebook.cells = [nbformat.v4.new_code_cell(f"{'right' if i % 4 else 'wrong'} {i}")]
            nbformat.write(notebook, folder / f"l{i:04d}.ipynb")
        lines: list[str] = []
        killed: list[int] = []
        killer = threading.Thread(target=_kill_one_worker_when, args=(out / "results", n // 3, killed), daemon=True)
        killer.start()
        started = time.perf_counter()
        reports = classroom.grade_class(folder, out, GradingSettings(jobs=workers, secret=b"s"),
                                        grader=simulated_grader, progress=lines.append)
        wall = time.perf_counter() - started
    graded = [r for r in reports if r.error is None]
    right = sum(r.score == 2 for r in graded) == sum(1 for i in range(n) if i % 4)
    retries = next((line.split()[0] for line in lines if "started again" in line), "0")
    ideal = sum(durations) / workers
    print(f"\nsimulated class: {n} submissions, median {median_s} s of stand-in work, {workers} workers, "
          f"{len(killed)} worker killed mid-run")
    print(f"wall {wall:.1f} s (cluster start-up and checks included), ideal {ideal:.1f} s (work / workers): "
          f"{100 * ideal / wall:.1f} % of ideal; retries {retries}; graded {len(graded)}/{n}, "
          f"lost {n - len(graded)}, every grade as expected: {right}")
    print(f"  {lines[-2] if len(lines) > 1 else ''}")


def corpus_class(labs: list[str] | None = None, workers: int = 2) -> None:
    import csv
    import sys

    from labkit.instructor.cluster import classroom
    from labkit.instructor.wall.kernel_limits import Limits

    sys.path.insert(0, str(ROOT / "tests"))  # the corpus is the tests' regression set
    import honest_corpus

    started = time.perf_counter()
    submissions = honest_corpus.corpus(labs)
    with tempfile.TemporaryDirectory() as scratch:
        folder, out = Path(scratch) / "class", Path(scratch) / "out"
        folder.mkdir()
        for submission in submissions:
            nbformat.write(submission.notebook, folder / f"{submission.name}.ipynb")
        reports = {r.learner: r for r in classroom.grade_class(folder, out, GradingSettings(
            jobs=workers, cell_timeout_s=600, limits=Limits(wall_seconds=3600), secret=b"corpus"))}
        with open(out / "gradebook.csv", newline="") as file:
            reviewed = {row["learner"]: row["review"] for row in csv.DictReader(file) if row["review"]}
    lost = gained = 0
    wrong, accused = [], []
    for submission in submissions:
        report = reports[submission.name]
        got = {result.id: result.points for result in report.exercises}
        for exercise_id, expected in submission.expected.items():
            lost += max(0, expected - got.get(exercise_id, 0))
            gained += max(0, got.get(exercise_id, 0) - expected)
        if got != submission.expected:
            wrong.append(f"{submission.name}: {report.error or got}")
        details = " ".join(line for result in report.exercises for line in result.details)
        if any(word in details for word in ("may not", "a copy of")):
            accused.append(submission.name)
    print(f"\nhonest corpus: {len(submissions)} submissions (labs {' '.join(labs) if labs else 'all'}), "
          f"{workers} workers, {time.perf_counter() - started:.0f} s")
    print(f"points lost against the notebook's check: {lost}; gained: {gained}; submissions off: {len(wrong)}; "
          f"accused: {len(accused)}; with review findings: {len(reviewed)}")
    for line in [*wrong, *(f"accused: {name}" for name in accused),
                 *(f"review: {name}: {text}" for name, text in reviewed.items())]:
        print(f"  {line}")


def main(corpus: bool = False) -> None:
    """``LABKIT_BENCH_SUBMISSIONS`` (default 2000) simulated, ``LABKIT_BENCH_REAL`` (default 4, 0 to skip) real;
    with ``corpus`` (``python -m benchmarks grading --corpus``), the honest corpus only."""
    if corpus:
        corpus_class(os.environ.get("LABKIT_BENCH_CORPUS_LABS", "").split() or None)
        return
    simulated_class(int(os.environ.get("LABKIT_BENCH_SUBMISSIONS", "2000")))
    if int(os.environ.get("LABKIT_BENCH_REAL", "4")):
        real_class(int(os.environ.get("LABKIT_BENCH_REAL", "4")))


if __name__ == "__main__":
    import sys

    main(corpus="--corpus" in sys.argv)
