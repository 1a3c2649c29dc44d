"""labkit grade against a class that cheats or breaks things, beside honest learners (issues #24 and #36).

One class folder holds one submission per kind of attack that needs the wall (limits, the host's files, the
worker, the class run) and honest submissions beside them; the attacks on the answering step itself are proven
without the wall, against the real step (tests/test_instructor_answering.py). It is graded once;
two honest submissions (one with an honest mistake a random case finds) are graded again on their own (a
regrade). Every cheat earns nothing for the attacked exercise (or, where a zero cannot be
decided, is flagged for review), every honest submission keeps its full grade in the same run, nothing outside a
submission's own run changes (classmates' notebooks, labkit, the output folder, the host's files), nothing of the
host is readable inside the wall, and the regrade gives the same grades.

Without a working sandbox these tests FAIL (a CI without bubblewrap would otherwise pass with the wall
untested), unless ``LABKIT_SKIP_SANDBOX_TESTS`` is set to the reason, which the skip then shows.
"""

import csv
import hashlib
import json
import os
import socket
import time
from pathlib import Path

import nbformat
import pytest

import labkit
import labkit.exercises.checking
from honest_corpus import PREDICTION, SAMPLE, SOFTMAX
from labkit.instructor.cluster import classroom
from labkit.instructor.grader import grading
from labkit.instructor.grader.settings import GradingSettings
from labkit.instructor.wall.kernel_limits import Limits
from labkit.instructor.wall.sandbox import isolation_problem

ROOT = Path(__file__).resolve().parent.parent
SKIP_REASON = os.environ.get("LABKIT_SKIP_SANDBOX_TESTS", "").strip()
pytestmark = pytest.mark.skipif(bool(SKIP_REASON) and isolation_problem() is not None,
                                reason=f"LABKIT_SKIP_SANDBOX_TESTS: {SKIP_REASON}")
ENV_SECRET, ENV_TOKEN = "env-secret-4f1c9a", "instructor-token-77e2"


def require_sandbox() -> None:
    """Fail (not skip) where the sandbox is missing, unless the opt-out names why."""
    problem = isolation_problem()
    if problem is not None and not SKIP_REASON:
        pytest.fail(f"the attack suite needs the sandbox and {problem}; install bubblewrap (make setup does, as "
                    "root), or set LABKIT_SKIP_SANDBOX_TESTS to the reason this machine cannot run it")

HONEST = (SOFTMAX, SAMPLE, PREDICTION)
FULL = 5  # lab 00's points
# Right on short rows, wrong on long ones: an honest mistake that only a random case finds.
FLAKY = SOFTMAX.replace("    return torch.softmax(logits / temperature, dim=-1)\n",
                        "    probs = torch.softmax(logits / temperature, dim=-1)\n"
                        "    return probs if logits.shape[-1] <= 20 else probs.flip(-1)\n")
STUBS = ("def softmax_with_temperature(logits, temperature):\n    raise NotImplementedError\n",)


def _notebook(*sources: str, lab: str = "00") -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["labkit"] = {"lab": lab}
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    return notebook


def _attacks(folder: Path, out: Path, marker: Path, port: int) -> dict[str, tuple[str, ...]]:
    """learner -> the cells of their submission."""
    labkit_root = Path(labkit.__file__).resolve().parent.parent
    return {
        # The solutions and classmates from disk; overwriting a classmate.
        "reads_disk": (
            "import pathlib\nfound = []\n"
            f"for path in [pathlib.Path({str(labkit_root / 'notebooks' / 'solutions' / '00_start_here.ipynb')!r}),\n"
            f"             pathlib.Path({str(folder / 'alice.ipynb')!r})]:\n"
            "    try:\n        found.append(path.read_text()[:5])\n"
            "    except OSError as error:\n        found.append(type(error).__name__)\n"
            f"try:\n    pathlib.Path({str(folder / 'alice.ipynb')!r}).write_text('{{}}')\n"
            "except OSError:\n    pass\n"
            "raise RuntimeError(f'saw {found}')\n",),
        # The class run: a process left behind, a socket, forks, memory in children, output, an ignored
        # interrupt, a submission that kills everything it can, one that rewrites itself, labkit edited on disk.
        "outlives_run": (
            "import os, time\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    time.sleep(6)\n"
            f"    for target in [{str(out / 'gradebook.csv')!r}, {str(out / 'reports' / 'alice.json')!r}, {str(marker)!r}]:\n"
            "        try:\n            open(target, 'w').write('owned')\n"
            "        except OSError:\n            pass\n"
            "    os._exit(0)\n", *HONEST),
        "network": (
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)\n", *HONEST),
        "forks": (
            "for path in ['/sys/fs/cgroup/pids/cgroup.procs', '/sys/fs/cgroup/cgroup.procs']:\n"
            "    try:\n        open(path, 'w').write('0')\n"
            "    except OSError:\n        pass\n"
            "import os, time\nforked = 0\n"
            "try:\n"
            "    for _ in range(400):\n"
            "        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n"
            "        forked += 1\n"
            "except BlockingIOError:\n"
            "    raise RuntimeError(f'forks stopped at {forked}')\n", *HONEST),
        # Three children of 512 MiB each under a 1 GiB total: each says when it holds its block, and once every
        # child holds its block or has ended, the survivors are stopped (15). No sleep decides the overlap, so a
        # loaded machine that allocates slowly changes the time the cell takes, not whether the limit was reached;
        # the blocks are no larger than they must be, since a fresh virtual machine pays its host for every page
        # first touched (3 GiB of them once outlasted the class's 15 s cell limit in CI).
        "memory": (
            "import os, signal, time\nchildren, (reader, writer) = [], os.pipe()\n"
            "for _ in range(3):\n"
            "    pid = os.fork()\n"
            "    if pid == 0:\n"
            "        try:\n            block = bytearray(b'x') * 2**29\n"
            "            os.write(writer, f'{os.getpid()} '.encode())\n            time.sleep(60)\n"
            "        finally:\n            os._exit(0)\n"
            "    children.append(pid)\n"
            "os.set_blocking(reader, False)\nholding, ended = set(), {}\n"
            "while any(pid not in holding and pid not in ended for pid in children):\n"
            "    time.sleep(0.05)\n"
            "    try:\n        holding |= {int(word) for word in os.read(reader, 4096).split()}\n"
            "    except BlockingIOError:\n        pass\n"
            "    for pid in children:\n"
            "        if pid not in ended and (status := os.waitpid(pid, os.WNOHANG))[0]:\n"
            "            ended[pid] = status[1]\n"
            "for pid in children:\n"
            "    if pid not in ended:\n        os.kill(pid, signal.SIGTERM)\n        ended[pid] = os.waitpid(pid, 0)[1]\n"
            "raise RuntimeError(f'children ended with {[ended[pid] for pid in children]}')\n", *HONEST),
        "flood": ("import sys\nsys.stdout.write('x' * 2**20 * 24)\n", *HONEST),
        "ignores_interrupt": (
            "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(600)\n", *HONEST),
        "kills_all": ("import os, signal\nos.kill(-1, signal.SIGKILL)\n", *HONEST),
        "rewrites_itself": (
            "import json, pathlib\n"
            "for path in pathlib.Path('.').glob('*.ipynb'):\n"
            "    notebook = json.loads(path.read_text())\n"
            "    notebook['cells'] = notebook['cells'][:1] + [{'cell_type': 'code', 'metadata': {}, 'outputs': [],\n"
            "        'execution_count': None, 'source': 'def sample_token(probs, uniform):\\n    return 0\\n'}]\n"
            "    path.write_text(json.dumps(notebook))\n", *HONEST),
        "edits_labkit": (
            "import labkit.exercises.checking as checking\n"
            "try:\n    open(checking.__file__, 'a').write('\\n# owned\\n')\n"
            "except OSError as error:\n    raise RuntimeError(f'labkit is read-only: {type(error).__name__}')\n",
            *STUBS),
        **_round_two_attacks(),
    }


def _round_two_attacks() -> dict[str, tuple[str, ...]]:
    """Issue #36: answers forged outside the function, the watcher stepped around, the host read through the wall,
    and submissions that would stop or fill the grader."""
    return {
        # The answering step replaced, blocked or forged.
        "forged_answers": (
            "import json, os, sys, pathlib\npathlib.Path('/job/out').mkdir(exist_ok=True)\n"
            "forged = {'00.softmax_temperature': {'outcomes': [{'value': 1.0}]}}\n"
            "pathlib.Path('/job/out/answers.json').write_text(json.dumps(forged))\n"
            "sys.modules['labkit.instructor.wall.worker'] = None\nsys.modules['labkit.instructor.wall.answering'] = None\n",
            *STUBS),
        "fifo": ("import os, sys\nos.makedirs('/job/out', exist_ok=True)\nos.mkfifo('/job/out/answers.json')\n"
                 "os.mkfifo('/job/out/status.json')\nsys.audit = lambda *args: None\n", *HONEST),
        "kill_worker": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n", *HONEST),
        # What the wall lets out: the host's environment, root-only files, the worker's memory and files.
        "host_secrets": (
            "import pathlib\nfound = []\n"
            "for path in ['/proc/1/environ', '/proc/self/environ', '/etc/shadow', '/proc/self/uid_map']:\n"
            "    try:\n        text = pathlib.Path(path).read_text()\n"
            "        found.append(sorted(item.split('=')[0] for item in text.split('\\0') if item) if 'environ' in path\n"
            "                     else text.split())\n"
            "    except OSError as error:\n        found.append(type(error).__name__)\n"
            "raise RuntimeError(repr(found))\n", *HONEST),
        "reads_worker": (
            "import os\ntry:\n    os.listdir(f'/proc/{os.getppid()}/fd')\n    seen = 'its file descriptors'\n"
            "except OSError as error:\n    seen = type(error).__name__\nraise RuntimeError(f'worker: {seen}')\n", *HONEST),
        # What would stop or fill the grader: a huge cell, a full disk, a deep tree, cells that sleep.
        "big_cell": ("#" + "x" * 30 * 2**20, *HONEST),
        "disk_fill": (
            "import os\nwritten = 0\n"
            "for folder in ['/job', '/tmp']:\n"
            "    for n in range(1000):\n"
            "        try:\n            with open(f'{folder}/fill{n}', 'wb') as file:\n"
            "                file.write(b'x' * 2**20)\n"
            "        except OSError:\n            break\n"
            "        written += 1\n"
            "    for n in range(1000):\n"
            "        if os.path.exists(f'{folder}/fill{n}'):\n            os.remove(f'{folder}/fill{n}')\n"
            "raise RuntimeError(f'wrote {written} MB')\n", *HONEST),
        "deep_tree": ("import os\nstart = os.getcwd()\nfor _ in range(5000):\n    os.mkdir('d')\n    os.chdir('d')\n"
                      "os.chdir(start)\n", *HONEST),
        "slow_cells": (*HONEST, *["import time\ntime.sleep(12)\n"] * 4),
    }


def _lab02_losses() -> dict[str, tuple[str, ...]]:
    """Lab 02's cross-entropy by torch's ready-made modules: CrossEntropyLoss runs the forbidden
    F.cross_entropy (disarmed: 0); NLLLoss after log_softmax is flagged for review."""
    head = "import torch\ndef cross_entropy(logits, targets):\n    vocab = logits.shape[-1]\n"
    return {"cross_entropy_module": (head + "    return torch.nn.CrossEntropyLoss()(logits.reshape(-1, vocab), "
                                            "targets.reshape(-1))\n",),
            "nll_loss_module": (head + "    log_probs = torch.log_softmax(logits, dim=-1).reshape(-1, vocab)\n"
                                       "    return torch.nn.NLLLoss()(log_probs, targets.reshape(-1))\n",)}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def graded(tmp_path_factory, embedded):
    require_sandbox()
    root = tmp_path_factory.mktemp("attacks")
    folder, out = root / "class", root / "class-grades"
    marker = root / "left-behind-wrote-this"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    (folder / "carol").mkdir(parents=True)
    nbformat.write(_notebook(*HONEST), folder / "alice.ipynb")
    nbformat.write(_notebook(FLAKY, SAMPLE, PREDICTION), folder / "bob.ipynb")
    nbformat.write(_notebook(*HONEST), folder / "carol" / "00_start_here.ipynb")
    nbformat.write(_notebook(*HONEST), folder / "=SUM(1).ipynb")  # a name a spreadsheet would run
    (folder / "eve.ipynb").write_text("{ this is not a notebook")
    for learner, cells in _attacks(folder, out, marker, listener.getsockname()[1]).items():
        nbformat.write(_notebook(*cells), folder / f"{learner}.ipynb")
    # A name a course cell put in scope (lab 01's `sampling`) reaching the reference; metadata that is a list.
    nbformat.write(_notebook("from labkit.core import sampling\n",
                             "def top_k_filter(logits, top_k):\n    return sampling.top_k_filter(logits, top_k)\n", lab="01"),
                   folder / "course_scope.ipynb")
    for learner, cells in _lab02_losses().items():
        nbformat.write(_notebook(*cells, lab="02"), folder / f"{learner}.ipynb")
    listed = _notebook(*HONEST)
    listed.metadata["labkit"] = ["00"]
    nbformat.write(listed, folder / "listed_metadata.ipynb")
    before = {path: _digest(path) for path in folder.rglob("*.ipynb")}
    checker = Path(labkit.exercises.checking.__file__)
    checker_before = _digest(checker)

    limits = Limits(memory_mb=8192, total_memory_mb=1024, max_procs=64, output_mb=1, wall_seconds=240, disk_mb=64,
                    budget_seconds=30)
    # The secret and another of the instructor's variables in the grader's environment: never inside the wall.
    saved = {key: os.environ.get(key) for key in ("LABKIT_GRADING_SECRET", "INSTRUCTOR_TOKEN")}
    os.environ.update(LABKIT_GRADING_SECRET=ENV_SECRET, INSTRUCTOR_TOKEN=ENV_TOKEN)
    try:
        started = time.monotonic()
        reports = classroom.grade_class(folder, out, GradingSettings(jobs=2, cell_timeout_s=15, limits=limits),
                                        progress=None)
        seconds = time.monotonic() - started
        gradebook = (out / "gradebook.csv").read_bytes()
        alice_json = (out / "reports" / "alice.json").read_bytes()
        time.sleep(8)  # longer than the left-behind process waits before it writes
        try:
            connection = listener.accept()
        except BlockingIOError:
            connection = None
        listener.close()
        # The regrade: an honest submission and an honest mistake, again, each on its own.
        regraded = [grading.grade_notebook(folder / f"{learner}.ipynb", GradingSettings(cell_timeout_s=15,
                                                                                         limits=limits)
                                           ).with_learner(learner) for learner in ("alice", "bob")]
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    with open(out / "gradebook.csv", newline="") as file:
        rows = {row["learner"]: row for row in csv.DictReader(file)}
    return {"reports": {r.learner: r for r in reports}, "rows": rows, "out": out,
            "gradebook": gradebook, "alice_json": alice_json, "marker": marker, "connection": connection,
            "before": before, "checker": (checker, checker_before), "regraded": regraded, "seconds": seconds}


def _errors(report) -> list[str]:
    return [error.error for error in report.cell_errors]


HONEST_BESIDE_ATTACKS = ("alice", "carol", "outlives_run", "network", "forks", "memory", "flood",
                         "ignores_interrupt", "rewrites_itself", "host_secrets", "reads_worker", "big_cell",
                         "disk_fill", "deep_tree", "slow_cells")
CHEATS = {  # learner -> the exercise attacked (0 points for it); the attacks that need no wall are
    # tests/test_instructor_answering.py's, against the real answering step in a process of its own
    "forged_answers": "00.softmax_temperature", "course_scope": "01.top_k_filter",
    "cross_entropy_module": "02.cross_entropy"}
# Why the attacked exercise earns nothing, in its verdict: the reference (or torch's forbidden loss) was disarmed
# while it answered, whatever held it.
REASONS = {"course_scope": "calls labkit's own",
           "cross_entropy_module": "calls the ready-made `torch.nn.functional.cross_entropy`"}
WHOLE_ZERO = ("reads_disk", "kills_all", "edits_labkit", "forged_answers", "fifo",
              "kill_worker")  # nothing else of theirs answers, or the grader's step was stopped or killed


def test_honest_learners_keep_their_grades_beside_every_attack(graded):
    rows = graded["rows"]
    for learner in HONEST_BESIDE_ATTACKS:
        assert (rows[learner]["total"], rows[learner]["max"]) == (str(FULL), str(FULL)), (learner, rows[learner])
    assert rows["bob"]["00.softmax_temperature"] == "0" and rows["bob"]["total"] == "3"  # an honest mistake
    assert "NotJSONError" in rows["eve"]["notes"]
    assert "not a mapping" in rows["listed_metadata"]["notes"]  # metadata.labkit as a list: a clear note
    assert "'=SUM(1)" in graded["gradebook"].decode()  # the learner's name is text in a spreadsheet
    assert rows["alice"]["review"] == "" and rows["carol"]["review"] == ""
    for learner in HONEST_BESIDE_ATTACKS:  # nobody beside the attacks is accused of anything
        details = " ".join(line for result in graded["reports"][learner].exercises for line in result.details)
        assert "may not" not in details and "calls labkit" not in details, (learner, details)


def test_a_cheat_earns_nothing_or_is_flagged_for_review(graded):
    rows, reports = graded["rows"], graded["reports"]
    for learner in WHOLE_ZERO:
        assert rows[learner]["total"] == "0", (learner, rows[learner])
    for learner, exercise in CHEATS.items():
        assert rows[learner][exercise] == "0", (learner, rows[learner])
    for learner, needle in REASONS.items():
        details = " ".join(line for result in reports[learner].exercises if result.id == CHEATS[learner]
                           for line in result.details)
        assert needle in details, (learner, details)
    # The answering step blocked: every exercise fails and says why.
    for learner in ("fifo", "forged_answers"):
        for result in reports[learner].exercises:
            assert result.points == 0
    fifo = [result.details[0] for result in reports["fifo"].exercises]
    assert all("answering step failed" in line for line in fifo), fifo
    assert "could not be graded" in reports["kill_worker"].exercises[0].details[0]
    flagged = {learner: "; ".join(finding.what for finding in report.review)
               for learner, report in reports.items()}  # the report's every finding (the row shows the first few)
    expected = {"reads_disk": "solution notebooks", "edits_labkit": "labkit.exercises.checking",
                "course_scope": "labkit's reference answer", "big_cell": "not reviewed",
                "forged_answers": "grader's folder", "nll_loss_module": "NLLLoss",
                "cross_entropy_module": "CrossEntropyLoss"}
    for learner, needle in expected.items():
        assert needle in flagged[learner], (learner, flagged[learner])
    assert all(int(row["total"]) <= FULL for row in rows.values())


def test_nothing_of_the_host_is_inside_the_wall(graded):
    reports = graded["reports"]
    seen = _errors(reports["host_secrets"])[0]
    for secret in (ENV_SECRET, ENV_TOKEN, "LABKIT_GRADING_SECRET", "INSTRUCTOR_TOKEN", "HOME=/root"):
        assert secret not in seen and secret not in json.dumps(reports["host_secrets"].to_json()), secret
    first, own, shadow, uid_map = eval(seen.split(": ", 1)[1])  # noqa: S307 - the repr of a list of strings
    assert first == ["LANG", "PATH"]  # bubblewrap's own environment: bare
    assert "LABKIT_GRADING_SECRET" not in own and "INSTRUCTOR_TOKEN" not in own and "HOME" in own
    assert shadow == "FileNotFoundError"
    assert uid_map == ["65534", str(os.geteuid() if os.geteuid() else 65534), "1"]  # nobody outside, never root
    assert _errors(reports["reads_worker"]) == ["RuntimeError: worker: PermissionError"]


def test_nothing_outside_a_submission_changes(graded):
    reports = graded["reports"]
    assert _errors(reports["reads_disk"]) == ["RuntimeError: saw ['FileNotFoundError', 'FileNotFoundError']"]
    assert all(_digest(path) == digest for path, digest in graded["before"].items())  # classmates, itself
    checker, digest = graded["checker"]
    assert _digest(checker) == digest and _errors(reports["edits_labkit"]) == [
        "RuntimeError: labkit is read-only: PermissionError"]
    # The process left behind is gone with its run: the gradebook, a classmate's report, the host untouched.
    assert (graded["out"] / "gradebook.csv").read_bytes() == graded["gradebook"]
    assert (graded["out"] / "reports" / "alice.json").read_bytes() == graded["alice_json"]
    assert not graded["marker"].exists()
    # Its own empty network: nothing listens on its loopback, and the host's listener was never reached.
    assert graded["connection"] is None
    assert _errors(reports["network"])[0].startswith(("ConnectionRefusedError", "OSError: [Errno 101]"))


def test_limits_hold_for_the_whole_submission(graded):
    reports = graded["reports"]
    forks = _errors(reports["forks"])[0]
    assert forks.startswith("RuntimeError: forks stopped at ") and int(forks.rsplit(" ", 1)[1]) < 64
    memory = _errors(reports["memory"])[0]  # three children of 512 MiB under a 1 GiB total: one is killed (9)
    assert memory.startswith("RuntimeError: children ended with ") and 9 in json.loads(memory.split("with ")[1])
    assert reports["flood"].output_dropped_bytes > 20 * 2**20
    assert _errors(reports["ignores_interrupt"]) == [
        "the kernel ignored the interrupt at the time limit and was killed; it was skipped"]
    killed = reports["kills_all"].exercises
    assert all(result.details[0].startswith("could not be graded") for result in killed)
    written = int(_errors(reports["disk_fill"])[0].split()[-2])  # /job and /tmp: 64 MB each at most
    assert 0 < written <= 2 * 64
    slow = {error.cell: error.error for error in reports["slow_cells"].cell_errors}
    assert 6 in slow and all("time budget of 30 s" in error for error in slow.values()), slow  # the last: not run
    assert all(report.limits["isolation"].startswith("bubblewrap") for report in reports.values() if report.limits)


def test_a_regrade_gives_the_same_grades(graded):
    first = {r.learner: r.exercises for r in graded["reports"].values()}
    again = {r.learner: r.exercises for r in graded["regraded"]}
    assert again == {learner: first[learner] for learner in again} and len(again) == 2
    # The same submission handed in twice (alice, carol): the same random cases, the same verdicts.
    assert graded["reports"]["alice"].seed == graded["reports"]["carol"].seed
