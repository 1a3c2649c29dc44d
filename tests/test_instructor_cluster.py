"""labkit.instructor.cluster.workers: a class graded through a real Dask scheduler and worker processes on loopback (#34),
and through a real single-node SLURM as the README says (#43; its mechanics in tests/test_instructor_slurm.py).

The test starts ``dask scheduler`` and two ``dask worker`` processes (each with its nanny) and stops them by their
process ids. The mechanics (a worker killed mid-run, a client killed mid-run, refusals) use the stand-in grader of
tests/grading_standins.py; one small class of real notebooks goes through the walled grader, on the cluster and on
a local cluster, and through the README's SLURM command, and must give the same gradebook byte for byte.
"""

import contextlib
import csv
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest

from grading_standins import standin_grader, standin_notebook
from honest_corpus import SAMPLE, SOFTMAX
from labkit.instructor.cluster import classroom, workers
from labkit.instructor.grader.results import ResultStore, content_hash, result_key
from labkit.instructor.grader.settings import GradingSettings
from labkit.instructor.wall.kernel_limits import Limits
from labkit.instructor.wall.sandbox import isolation_problem
from slurm_cluster import NO_SLURM, our_jobs, single_node_slurm, site_config
from slurm_cluster import stop as _stop

HERE = Path(__file__).resolve().parent
DASK = str(Path(sys.executable).with_name("dask"))
SECRET = b"cluster secret"
ALLOWED_FAILURES = 1  # the scheduler's: a submission whose worker dies twice is reported


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start(args: list[str], log: Path, **env: str) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
                   "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": str(ALLOWED_FAILURES),
                   "DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION": "1.0", **env}  # as the README asks
    with open(log, "ab") as output:
        return subprocess.Popen(args, stdout=output, stderr=subprocess.STDOUT, env=environment,
                                start_new_session=True)


def _scheduler(tmp: Path, name: str) -> tuple[str, list[subprocess.Popen]]:
    port = _free_port()
    process = _start([DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                     tmp / f"{name}.log")
    return f"tcp://127.0.0.1:{port}", [process]


def _worker(address: str, tmp: Path, name: str, *extra: str, **env: str) -> subprocess.Popen:
    return _start([DASK, "worker", address, "--nthreads", "1", "--memory-limit", "0", "--no-dashboard",
                   "--name", name, *extra], tmp / f"{name}.log", **env)


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory):
    """A scheduler and two workers on loopback, plain TCP (allowed on loopback): the secret is read from a file."""
    tmp = tmp_path_factory.mktemp("cluster")
    (tmp / "secret").write_bytes(SECRET)
    address, processes = _scheduler(tmp, "scheduler")
    processes += [_worker(address, tmp, f"worker-{i}") for i in range(2)]
    try:
        from distributed import Client

        with Client(address, timeout=120) as client:
            client.wait_for_workers(2, timeout=300)
        yield {"address": address, "tmp": tmp, "secret_file": tmp / "secret"}
    finally:
        for process in processes:
            _stop(process)


def _class(folder: Path, n: int, log: Path, **standin) -> dict[str, str]:
    """n learners, every third one wrong; learner -> the total the gradebook must show."""
    expected = {}
    for i in range(n):
        right = i % 3 != 0
        nbformat.write(standin_notebook(f"{'right' if right else 'wrong'} {i}", log=str(log), **standin),
                       folder / f"l{i:02d}.ipynb")
        expected[f"l{i:02d}"] = "2" if right else "0"
    return expected


def _rows(out: Path) -> dict[str, dict[str, str]]:
    with open(out / "gradebook.csv", newline="") as file:
        return {row["learner"]: row for row in csv.DictReader(file)}


def _on_cluster(scheduler, **settings):
    return {"settings": GradingSettings(scheduler=scheduler["address"], worker_secret_file=scheduler["secret_file"],
                                        secret=SECRET, **settings), "grader": standin_grader, "progress": None}


def test_a_worker_killed_mid_run_loses_nothing_and_changes_no_grade(scheduler, tmp_path):
    from distributed import Client

    folder, out, log = tmp_path / "class", tmp_path / "out", tmp_path / "graded.log"
    folder.mkdir()
    expected = _class(folder, 16, log, sleep=1.0)
    nbformat.write(standin_notebook("right but kills its worker", die="always"), folder / "zed.ipynb")
    run = threading.Thread(target=classroom.grade_class, args=(folder, out), kwargs=_on_cluster(scheduler))
    run.start()
    deadline = time.monotonic() + 300
    while len(list((out / "results").glob("*.json"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    with Client(scheduler["address"]) as client:
        pids = client.run(os.getpid)
    os.kill(sorted(pids.values())[0], signal.SIGKILL)  # one worker process, by its id, mid-run
    run.join(timeout=600)
    assert not run.is_alive()
    rows = _rows(out)
    assert {learner: row["total"] for learner, row in rows.items() if learner != "zed"} == expected
    assert rows["zed"]["notes"].startswith(f"zed.ipynb could not be graded: its worker died {ALLOWED_FAILURES + 1} "
                                           "times")
    assert sorted(set(log.read_text().split("\n")) - {""}) == sorted(
        f"{'right' if t == '2' else 'wrong'} {int(l[1:])}" for l, t in expected.items())


def _keys(folder: Path) -> dict[str, str]:
    """The store key of every stand-in submission (default options), by its code."""
    context = GradingSettings(secret=SECRET).context()
    keys = {}
    for path in folder.glob("*.ipynb"):
        data, lab, _ = classroom._check_submission(path)
        keys["".join(json.loads(data)["cells"][0]["source"])] = result_key(content_hash(data), {**context, "lab": lab})
    return keys


RESUMABLE_RUN = """
import sys
from pathlib import Path
from grading_standins import standin_grader
from labkit.instructor.cluster import classroom
from labkit.instructor.grader.settings import GradingSettings
classroom.grade_class(Path(sys.argv[1]), Path(sys.argv[2]), GradingSettings(
    scheduler=sys.argv[3], worker_secret_file=Path(sys.argv[4]), secret=b"cluster secret"), grader=standin_grader,
    progress=None)
"""


def test_a_client_killed_mid_run_resumes_with_only_what_was_missing(scheduler, tmp_path):
    folder, out, log = tmp_path / "class", tmp_path / "out", tmp_path / "graded.log"
    folder.mkdir()
    expected = _class(folder, 12, log, sleep=1.0)
    client = _start([sys.executable, "-c", RESUMABLE_RUN, str(folder), str(out), scheduler["address"],
                     str(scheduler["secret_file"])], tmp_path / "client.log")
    deadline = time.monotonic() + 300
    while len(list((out / "results").glob("*.json"))) < 4:
        assert client.poll() is None and time.monotonic() < deadline, (tmp_path / "client.log").read_text()[-2000:]
        time.sleep(0.2)
    _stop(client)  # killed by its id mid-run
    stored = ResultStore(out / "results").keys()
    assert 4 <= len(stored) < 12
    time.sleep(2)  # what its workers were running when it died ends (Dask drops a lost client's other tasks)
    before = log.read_text().splitlines()
    classroom.grade_class(folder, out, **_on_cluster(scheduler))
    graded_again = log.read_text().splitlines()[len(before):]
    # What the rerun graded is exactly what the killed client had not stored (a task the lost client left
    # running may still log a second time: it was missing too).
    assert set(graded_again) == {code for code, key in _keys(folder).items() if key not in stored}
    assert {learner: row["total"] for learner, row in _rows(out).items()} == expected
    gradebook = (out / "gradebook.csv").read_bytes()
    classroom.grade_class(folder, out, **_on_cluster(scheduler))  # complete: nothing graded, the same bytes
    assert log.read_text().splitlines()[len(before) + len(graded_again):] == []
    assert (out / "gradebook.csv").read_bytes() == gradebook


PRELOAD = "import labkit\nlabkit.__version__ = '0.0.0-other'\n"


def test_workers_without_the_wall_or_with_another_labkit_are_refused_with_the_reason(tmp_path):
    address, processes = _scheduler(tmp_path, "scheduler")
    (tmp_path / "other_version.py").write_text(PRELOAD)
    (tmp_path / "secret").write_bytes(SECRET)
    venv_only = str(Path(sys.executable).parent)  # no /usr/bin: no bwrap on this worker's PATH
    processes += [_worker(address, tmp_path, "no-wall", PATH=venv_only),
                  _worker(address, tmp_path, "other-labkit", "--preload", str(tmp_path / "other_version.py"))]
    nbformat.write(standin_notebook("right"), tmp_path / "ana.ipynb")
    lines = []
    try:
        from distributed import Client

        with Client(address, timeout=120) as client:
            client.wait_for_workers(2, timeout=300)
        with pytest.raises(workers.NoUsableWorkers) as refused:
            classroom.grade_class(tmp_path, tmp_path / "out", GradingSettings(
                scheduler=address, secret=SECRET, worker_secret_file=tmp_path / "secret"), progress=lines.append,
                grader=standin_grader)
    finally:
        for process in processes:
            _stop(process)
    message = str(refused.value)
    assert "it cannot wall off submissions: bubblewrap is not installed" in message
    assert "labkit 0.0.0-other here, " in message and "on the client" in message
    assert sum("refused to grade" in line for line in lines) == 2
    assert not (tmp_path / "out" / "results").exists()  # nothing graded


def test_a_grading_worker_keeps_jsonschemas_iri_grammars_out_from_its_plugins_setup():
    """GraderPlugin.setup, first thing: nbformat's jsonschema then goes without rfc3987_syntax (38 Lark grammars, 2.9 s
    of CPU per worker process on a 2 GHz Zen 1), even in a worker that refuses. A fresh process: a worker that had
    already imported nbformat (a task's arguments unpickled before its plugin came) keeps the module it has."""
    code = """
import asyncio, sys
from labkit.instructor.cluster.grader_plugin import GraderPlugin

class Worker:
    address = name = "w"
    def log_event(self, *args): pass
    async def close(self, **kwargs): pass

plugin = GraderPlugin({"labkit": "0.0-another"}, False, "id", secret=b"x")
asyncio.run(plugin.setup(Worker()))
import nbformat
print(plugin.problem)
print(sys.modules["rfc3987_syntax"])
"""
    lines = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert lines[0].startswith("labkit ") and lines[0].endswith("0.0-another on the client"), lines
    assert lines[-1] == "None"


def test_a_plain_tcp_scheduler_off_loopback_needs_tls_or_words():
    with pytest.raises(ValueError, match="plain TCP off this machine.*--insecure-plain-tcp"):
        workers.check_scheduler("tcp://10.1.2.3:8786")
    assert workers.check_scheduler("tcp://10.1.2.3:8786", insecure_plain_tcp=True) == "tcp"
    assert workers.check_scheduler("tls://10.1.2.3:8786") == "tls"
    assert workers.check_scheduler("tcp://127.0.0.1:8786") == "tcp"
    with pytest.raises(ValueError, match="tcp:// or tls://"):
        workers.check_scheduler("inproc://x")


@pytest.fixture(scope="module")
def real_class(tmp_path_factory, embedded):
    """A small class of real lab 00 notebooks, and its gradebook graded on a local cluster (once for the module:
    every other way of grading it must write the same bytes)."""
    if isolation_problem() is not None:
        pytest.skip("the walled grader needs bubblewrap")
    tmp = tmp_path_factory.mktemp("real-class")
    folder = tmp / "submissions"
    (folder / "cy").mkdir(parents=True)
    honest = standin_notebook(SOFTMAX)
    honest.cells.append(nbformat.v4.new_code_cell(SAMPLE))
    broken = standin_notebook(SOFTMAX.replace("logits / temperature", "logits"))
    broken.cells += [nbformat.v4.new_code_cell("1 / 0"), nbformat.v4.new_code_cell(SAMPLE)]
    for notebook in (honest, broken):
        del notebook.metadata["standin"]
    nbformat.write(honest, folder / "ana.ipynb")
    nbformat.write(honest, folder / "cy" / "00_start_here.ipynb")  # the same bytes: graded once, both rows noted
    nbformat.write(broken, folder / "bo.ipynb")
    (folder / "dee.ipynb").write_text("{ not a notebook")
    (tmp / "secret").write_bytes(SECRET)
    options = {"cell_timeout_s": 30, "limits": Limits(wall_seconds=240), "secret": SECRET}
    classroom.grade_class(folder, tmp / "local", GradingSettings(jobs=2, **options), progress=None)
    rows = _rows(tmp / "local")
    assert (rows["ana"]["00.softmax_temperature"], rows["ana"]["00.sample_token"]) == ("2", "2")
    assert (rows["bo"]["00.softmax_temperature"], rows["bo"]["00.sample_token"]) == ("0", "2")
    assert rows["ana"]["notes"] == "lab 00: the same code as cy" and "NotJSONError" in rows["dee"]["notes"]
    return {"tmp": tmp, "folder": folder, "options": options, "gradebook": (tmp / "local" / "gradebook.csv"),
            "secret_file": tmp / "secret"}


def test_a_real_class_through_the_cluster_gets_the_local_runs_gradebook(scheduler, real_class, tmp_path):
    classroom.grade_class(real_class["folder"], tmp_path / "on-cluster", GradingSettings(
        scheduler=scheduler["address"], worker_secret_file=scheduler["secret_file"], **real_class["options"]),
        progress=None)
    assert (tmp_path / "on-cluster" / "gradebook.csv").read_bytes() == real_class["gradebook"].read_bytes()


@pytest.mark.skipif(NO_SLURM is not None, reason=NO_SLURM or "")
def test_the_readmes_slurm_command_gets_the_local_runs_gradebook(real_class, tmp_path):
    """`labkit grade submissions/ --cluster slurm --jobs 2` as the README gives it, with its docs/slurm/jobqueue.yaml
    (the two "your site" lines set), on a real single-node SLURM (tests/slurm_cluster.py; #43)."""
    with single_node_slurm(tmp_path / "slurm") as slurm:
        config = site_config(tmp_path / "dask", slurm["partition"])
        # The README's command as an instructor types it, in the folder above the class.
        command = subprocess.run([str(Path(sys.executable).with_name("labkit")), "grade", "submissions/",
                                  "--out", str(tmp_path / "out"), "--cluster", "slurm", "--jobs", "2",
                                  "--cell-timeout", "30", "--wall-seconds", "240",
                                  "--secret-file", str(real_class["secret_file"])],
                                 cwd=real_class["tmp"], capture_output=True, text=True, timeout=900,
                                 env={**os.environ, "DASK_CONFIG": str(config)})
        assert command.returncode == 0, command.stdout[-3000:] + command.stderr[-3000:]
        assert our_jobs() == []  # the cluster cancelled its jobs when it closed
    said = command.stdout
    for choice in ("slurm: 2 jobs of one single-threaded worker each", "slurm: memory 8GiB per job",
                   "slurm: walltime 08:00:00 (from jobqueue.slurm.walltime); workers live 28224 s",
                   "slurm: nanny memory limit off (--memory-limit 0)", "slurm: TLS with certificates made for this run",
                   f"slurm: each job's output and errors in {tmp_path / 'out-jobs'}"):
        assert said.count(choice) == 1, (choice, said[-3000:])  # each choice said once
    assert "graded 2 of 2 submissions sent in " in said  # on 1 or 2 workers: the run starts with the first ready
    logs = sorted((tmp_path / "out-jobs").glob("labkit-grade-*.err"))
    assert len(logs) == 2 and all("Registered to:" in log.read_text() for log in logs)
    assert (tmp_path / "out" / "gradebook.csv").read_bytes() == real_class["gradebook"].read_bytes()
    local_keys = ResultStore(real_class["tmp"] / "local" / "results").keys()
    assert ResultStore(tmp_path / "out" / "results").keys() == local_keys
