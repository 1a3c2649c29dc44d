"""labkit.instructor.cluster.jobqueue: a class graded on a real single-node SLURM (#43), as the README says to.

The module's fixture brings up munged, slurmctld and slurmd in a temporary folder (tests/slurm_cluster.py) and
reads the README's configuration file, docs/slurm/jobqueue.yaml, changing only its two lines marked "your site"
(the partition, and loopback for the network). The mechanics (a job cancelled mid-submission, a client killed
mid-run, a job whose worker cannot start) use the stand-in grader of tests/grading_standins.py; the README's command
on a class of real notebooks, compared byte for byte with the local run's gradebook, is in
tests/test_instructor_cluster.py (it shares that file's local run). Where the machine cannot run SLURM (not root,
no packages) those tests skip with the reason; the checks of what labkit asks of dask-jobqueue run everywhere.
"""

import contextlib
import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import yaml

from grading_standins import standin_grader, standin_notebook
from labkit.instructor.cluster import classroom, grader_plugin, jobqueue, workers
from labkit.instructor.grader.results import ResultStore
from labkit.instructor.grader.settings import GradingSettings
from slurm_cluster import NO_JOBQUEUE, NO_SLURM, our_jobs, single_node_slurm, site_config

HERE = Path(__file__).resolve().parent
SECRET = b"slurm secret"
needs_slurm = pytest.mark.skipif(NO_SLURM is not None, reason=NO_SLURM or "")
needs_jobqueue = pytest.mark.skipif(NO_JOBQUEUE is not None, reason=NO_JOBQUEUE or "")


@contextlib.contextmanager
def _dask_config(folder: Path):
    """The folder's jobqueue.yaml in force, key by key over dask-jobqueue's defaults (as DASK_CONFIG would)."""
    import dask

    section = yaml.safe_load((folder / "jobqueue.yaml").read_text())["jobqueue"]["slurm"]
    with dask.config.set({f"jobqueue.slurm.{key}": value for key, value in section.items()}):
        yield


@pytest.fixture(autouse=True)
def _standins_importable(monkeypatch):
    """Jobs inherit this process's environment (sbatch's default): their workers must import the stand-in grader."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("slurm")
    with single_node_slurm(tmp / "slurm") as running:
        running["config"] = site_config(tmp / "dask", running["partition"])
        yield running


def _rows(out: Path) -> dict[str, dict[str, str]]:
    with open(out / "gradebook.csv", newline="") as file:
        return {row["learner"]: row for row in csv.DictReader(file)}


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]), **extra}


def _client(tmp_path: Path, folder: Path, out: Path, slurm: dict) -> tuple[subprocess.Popen, Path]:
    """The instructor's command (:data:`RUN`) on ``folder``, in its own session, printing to client.log."""
    client_log = tmp_path / "client.log"
    with open(client_log, "wb") as output:
        client = subprocess.Popen([sys.executable, "-c", RUN, str(folder), str(out)], stdout=output,
                                  stderr=subprocess.STDOUT, env=_env(DASK_CONFIG=str(slurm["config"])),
                                  start_new_session=True)
    return client, client_log


# --- on the real SLURM -------------------------------------------------------------------------------------------

RUN = """
import sys
from pathlib import Path
import dask
from grading_standins import standin_grader
from labkit.instructor.cluster import classroom
from labkit.instructor.grader.settings import GradingSettings
classroom.grade_class(Path(sys.argv[1]), Path(sys.argv[2]), GradingSettings(jobs=2, cluster="slurm",
                      secret=b"slurm secret"), grader=standin_grader)
"""


def _stored(out: Path) -> int:
    return len(list((out / "results").glob("*.json")))


def _wait(condition, what: str, client: subprocess.Popen, client_log: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert client.poll() is None, client_log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"{what}: {client_log.read_text()[-3000:]}"
        time.sleep(0.2)


@needs_slurm
def test_a_job_cancelled_mid_submission_and_a_client_killed_mid_run_change_no_grade(slurm, tmp_path):
    folder, out, log = tmp_path / "class", tmp_path / "out", tmp_path / "graded.log"
    folder.mkdir()
    expected = {}
    for i in range(8):
        right = i % 3 != 0
        nbformat.write(standin_notebook(f"{'right' if right else 'wrong'} {i}", log=str(log), sleep=3.0),
                       folder / f"l{i}.ipynb")
        expected[f"l{i}"] = "2" if right else "0"
    client, client_log = _client(tmp_path, folder, out, slurm)
    try:
        def both_busy() -> bool:  # two submissions started and not stored: each job's worker holds one
            in_flight = len(log.read_text().splitlines()) - _stored(out) if log.exists() else 0
            return _stored(out) >= 1 and in_flight >= 2 and len(our_jobs("RUNNING")) == 2

        # (a job RUNNING is not yet a worker that joined: on a loaded machine one worker once graded all eight
        # while the other job was still starting)
        _wait(both_busy, "both workers mid-submission after a first one graded", client, client_log)
        started = log.read_text().splitlines()
        # Both workers are mid-submission (3 s each, more queued than workers): one job cancelled, by its id.
        subprocess.run(["scancel", our_jobs("RUNNING")[0]], check=True)

        def cut_one_retried() -> bool:
            lines = log.read_text().splitlines()
            return any(lines.count(code) >= 2 for code in set(started))

        _wait(cut_one_retried, "the cancelled job's submission started again", client, client_log)
        _wait(lambda: _stored(out) >= 5, "five submissions graded", client, client_log)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(client.pid, signal.SIGKILL)  # the client (and its scheduler), killed by its id mid-run
        client.wait(timeout=30)
    # Its orphaned workers would stop themselves after dask-jobqueue's death-timeout (60 s); the test's two CPUs
    # are wanted now, so their jobs are cancelled as an instructor would.
    subprocess.run(["scancel", "--name=labkit-grade"], check=True)
    deadline = time.monotonic() + 60
    while our_jobs() and time.monotonic() < deadline:
        time.sleep(0.5)
    stored = ResultStore(out / "results").keys()
    assert 5 <= len(stored) < 8
    before = log.read_text().splitlines()
    lines = []
    with _dask_config(slurm["config"]):
        classroom.grade_class(folder, out, GradingSettings(jobs=2, cluster="slurm", secret=SECRET),
                              grader=standin_grader,
                              progress=lines.append)
    graded_again = log.read_text().splitlines()[len(before):]
    assert len(graded_again) == 8 - len(stored) and len(set(graded_again)) == len(graded_again)
    assert {learner: row["total"] for learner, row in _rows(out).items()} == expected
    assert any(line.startswith(f"graded {8 - len(stored)} of {8 - len(stored)} submissions sent") for line in lines)
    gradebook = (out / "gradebook.csv").read_bytes()
    with _dask_config(slurm["config"]):  # complete: no job submitted, nothing graded, the same bytes
        classroom.grade_class(folder, out, GradingSettings(jobs=2, cluster="slurm", secret=SECRET),
                              grader=standin_grader,
                              progress=None)
    assert log.read_text().splitlines()[len(before) + len(graded_again):] == []
    assert (out / "gradebook.csv").read_bytes() == gradebook


@needs_slurm
def test_a_job_whose_worker_cannot_start_says_why_within_the_wait(slurm, tmp_path):
    nbformat.write(standin_notebook("right"), tmp_path / "ana.ipynb")
    config = site_config(tmp_path / "dask", slurm["partition"], **{"worker-extra-args": ["--no-such-option"]})
    lines = []
    with _dask_config(config), pytest.raises(workers.NoUsableWorkers) as refused:
        classroom.grade_class(tmp_path, tmp_path / "out", GradingSettings(jobs=2, cluster="slurm", secret=SECRET),
                              grader=standin_grader, progress=lines.append)
    jobs = tmp_path / "out-jobs"
    explained = [line for line in lines if " ended before its worker joined: Error: No such option" in line]
    assert len(explained) == 2 and all(f"(its log: {jobs}/labkit-grade-" in line for line in explained)
    assert "2 jobs ended before their workers joined" in str(refused.value) and str(jobs) in str(refused.value)
    note = _rows(tmp_path / "out")["ana"]["notes"]
    assert note.startswith("ana.ipynb not graded: no worker of the cluster can grade") and "No such option" in note
    assert our_jobs() == []


# --- what labkit asks of dask-jobqueue (no SLURM needed) ---------------------------------------------------------

def test_walltimes_read_as_slurm_writes_them_and_bad_ones_are_named():
    assert [jobqueue.walltime_seconds(text) for text in ("45", "45:30", "08:00:00", "2-00", "1-01:30", "0-00:01:05")] \
        == [2700, 2730, 28800, 172800, 91800, 65]
    with pytest.raises(ValueError, match=r"jobqueue.slurm.walltime must be a batch walltime .* got '7h50m'"):
        jobqueue.walltime_seconds("7h50m", "jobqueue.slurm.walltime")
    assert jobqueue.lifetime_seconds(28800) == 28800 - 576 and jobqueue.lifetime_seconds(1800) == 1740


@needs_jobqueue
def test_a_walltime_too_short_for_one_submission_is_refused_with_what_would_do(tmp_path):
    with _dask_config(site_config(tmp_path / "dask", "grading", walltime="00:30:00")):
        with pytest.raises(ValueError, match=r"jobqueue.slurm.walltime '00:30:00' \(1800 s\) is too short: one "
                                             r"submission may hold its worker 2400 s"):
            jobqueue.plan_jobs("slurm", 2, tmp_path / "out", deadline_s=2400, memory_bytes=8 * 2**30)
    with pytest.raises(ValueError, match="--cluster must be local or one of slurm, pbs, sge, lsf, got 'k8s'"):
        jobqueue.plan_jobs("k8s", 2, tmp_path / "out", deadline_s=10, memory_bytes=1)


@needs_jobqueue
def test_the_job_script_has_one_single_threaded_worker_without_memory_limit_and_labkits_lifetime_last(tmp_path):
    config = site_config(tmp_path / "dask", "grading", **{"worker-extra-args": ["--lifetime", "7h50m"]})
    with _dask_config(config):
        plan = jobqueue.plan_jobs("slurm", 3, tmp_path / "out", deadline_s=840, memory_bytes=8 * 2**30)
        with jobqueue.make_cluster(plan, {}) as unstarted:  # no job submitted: its script only
            text = unstarted.job_script()
    assert "#SBATCH -p grading" in text and "#SBATCH --cpus-per-task=1" in text and "#SBATCH -t 08:00:00" in text
    assert f"#SBATCH -e {tmp_path / 'out-jobs'}/labkit-grade-%J.err" in text
    command = text.splitlines()[-1].split()
    assert command[command.index("--nthreads") + 1] == "1"
    # click keeps an option's last value: labkit's --memory-limit and --lifetime come after the config's
    assert command[len(command) - 1 - command[::-1].index("--memory-limit") + 1] == "0"
    assert command[len(command) - 1 - command[::-1].index("--lifetime") + 1] == "28224s"
    assert (plan.lifetime_s, plan.leave_after_s) == (28224, 28224 - 840)
    assert "--interface" in command and command[command.index("--interface") + 1] == "lo"


@needs_jobqueue
def test_importing_dask_jobqueue_leaves_ctrl_c_as_it_was():
    probe = ("import signal\nfrom labkit.instructor.cluster.jobqueue import import_cluster_class\n"
             "before = signal.getsignal(signal.SIGINT)\nimport_cluster_class('slurm')\n"
             "import dask_jobqueue.runner\nprint(signal.getsignal(signal.SIGINT) is before, "
             "signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n")
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert shown.stdout.split() == ["True", "True"], shown.stderr[-2000:]
    # and dask-jobqueue's import alone does replace it (what the guard is for)
    bare = subprocess.run([sys.executable, "-c", "import signal, dask_jobqueue\n"
                           "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"],
                          capture_output=True, text=True, timeout=120)
    assert bare.stdout.split() == ["False"], bare.stderr[-2000:]


class _Worker:
    """What GraderPlugin.should_leave uses of a Dask worker: its address, events and event loop."""

    def __init__(self):
        self.address, self.events, self.callbacks = "tls://10.0.0.7:40123", [], []
        self.loop = self

    def log_event(self, topic, message):
        self.events.append((topic, message))

    def add_callback(self, callback, **kwargs):
        self.callbacks.append((callback, kwargs))

    def close_gracefully(self, **kwargs):
        pass


def test_a_worker_past_its_last_start_leaves_once_between_submissions_and_one_without_lifetime_never():
    plugin = grader_plugin.GraderPlugin({}, True, "id", secret=b"s", leave_after_s=100.0)
    worker = _Worker()
    assert not plugin.should_leave(worker, age_s=100.0)  # exactly at it: one more submission still fits
    assert plugin.should_leave(worker, age_s=100.5) and plugin.should_leave(worker, age_s=200.0)
    assert worker.events == [(grader_plugin.LEAVING, {"worker": worker.address, "age_s": 100})]
    assert worker.callbacks == [(worker.close_gracefully, {"reason": "labkit: leaving before its lifetime"})]
    forever = grader_plugin.GraderPlugin({}, True, "id", secret=b"s")
    assert not forever.should_leave(_Worker(), age_s=10**9)


@needs_slurm
def test_a_worker_that_refuses_says_why_and_where_its_jobs_log_is(slurm, tmp_path):
    nbformat.write(standin_notebook("right"), tmp_path / "ana.ipynb")
    venv_only = str(Path(sys.executable).parent)  # no /usr/bin: no bwrap for this job's worker
    config = site_config(tmp_path / "dask", slurm["partition"], **{"job-script-prologue": [f"export PATH={venv_only}"]})
    lines = []
    with _dask_config(config), pytest.raises(workers.NoUsableWorkers) as refused:
        classroom.grade_class(tmp_path, tmp_path / "out", GradingSettings(jobs=1, cluster="slurm", secret=SECRET),
                              grader=standin_grader, progress=lines.append)
    said = [line for line in lines if " refused to grade: it cannot wall off submissions: bubblewrap is not "
            "installed" in line]
    assert said and all(f"(its log: {tmp_path / 'out-jobs'}/labkit-grade-" in line for line in said), lines
    assert "bubblewrap is not installed" in str(refused.value)
    assert _rows(tmp_path / "out")["ana"]["notes"].startswith("ana.ipynb not graded: no worker of the cluster")


@needs_slurm
def test_ctrl_c_on_slurm_stops_the_run_and_writes_what_was_finished(slurm, tmp_path):
    """dask-jobqueue 0.9's import makes SIGINT a silent sys.exit() (rc 0, nothing written): not here."""
    folder, out, log = tmp_path / "class", tmp_path / "out", tmp_path / "graded.log"
    folder.mkdir()
    for i in range(6):
        nbformat.write(standin_notebook(f"right {i}", log=str(log), sleep=3.0), folder / f"l{i}.ipynb")
    client, client_log = _client(tmp_path, folder, out, slurm)
    try:
        _wait(lambda: _stored(out) >= 1, "a first submission graded", client, client_log)
        os.kill(client.pid, signal.SIGINT)  # Ctrl-C, to the client alone
        returncode = client.wait(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(client.pid, signal.SIGKILL)
    said = client_log.read_text()
    # Python ends on an uncaught KeyboardInterrupt by SIGINT itself (rc -2), after labkit wrote what was finished
    assert returncode == -signal.SIGINT and "KeyboardInterrupt: interrupted: what was finished is in" in said, \
        said[-3000:]
    notes = [row["notes"] for row in _rows(out).values()]
    graded = _stored(out)
    assert 1 <= graded < 6 and sum(" not graded yet: the run was interrupted" in note for note in notes) \
        == 6 - graded
    deadline = time.monotonic() + 60
    while our_jobs() and time.monotonic() < deadline:  # its cluster closed: the jobs cancelled
        time.sleep(0.5)
    assert our_jobs() == []
