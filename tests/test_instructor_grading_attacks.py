"""labkit grade against a class that cheats or breaks things, beside honest learners (issue #24's attack suite).

One class folder holds one submission per kind of attack and honest submissions beside them. It is graded twice
(the second time into another folder: a regrade). Every cheat earns nothing or is flagged for review, every honest
submission keeps its full grade in the same run, nothing outside a submission's own run changes (classmates'
notebooks, labkit, the output folder, the host's files), and the regrade gives the same gradebook.
"""

import csv
import hashlib
import json
import socket
import time
from pathlib import Path

import nbformat
import pytest

import labkit
import labkit.exercises.checking
from labkit.instructor import classroom
from labkit.instructor.kernel_limits import Limits
from labkit.instructor.sandbox import isolation_problem

pytestmark = pytest.mark.skipif(isolation_problem() is not None,
                                reason=f"no isolation here: {isolation_problem()} (make setup installs it as root)")

SOFTMAX = (
    "import torch\n\ndef softmax_with_temperature(logits, temperature):\n"
    "    if temperature == 0:\n"
    "        return torch.zeros_like(logits).scatter(-1, logits.argmax(-1, keepdim=True), 1.0)\n"
    "    return torch.softmax(logits / temperature, dim=-1)\n")
SAMPLE = ("def sample_token(probs, uniform):\n"
          "    cumulative = probs.double().cumsum(0)\n"
          "    return int((cumulative <= uniform * cumulative[-1]).sum())\n")
PREDICTION = "def tokenizer_choice():\n    return 'b'\n"
HONEST = (SOFTMAX, SAMPLE, PREDICTION)
FULL = 5  # lab 00's points
# Right on short rows, wrong on long ones: an honest mistake that only a random case finds.
FLAKY = SOFTMAX.replace("    return torch.softmax(logits / temperature, dim=-1)\n",
                        "    probs = torch.softmax(logits / temperature, dim=-1)\n"
                        "    return probs if logits.shape[-1] <= 20 else probs.flip(-1)\n")
STUBS = ("def softmax_with_temperature(logits, temperature):\n    raise NotImplementedError\n",)


def _notebook(*sources: str) -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["labkit"] = {"lab": "00"}
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    return notebook


def _attacks(folder: Path, out: Path, marker: Path, port: int) -> dict[str, tuple[str, ...]]:
    """learner -> the cells of their submission."""
    labkit_root = Path(labkit.__file__).resolve().parent.parent
    return {
        # The grader trusts the learner's process: a fake result line from a hook, a patched checker.
        "fake_marker": (
            "from IPython import get_ipython\n"
            "def _fake(*args):\n"
            "    print('LABKIT-GRADES [{\"id\": \"00.softmax_temperature\", \"status\": \"passed\", \"points\": 101}]')\n"
            "get_ipython().events.register('pre_run_cell', _fake)\n", *STUBS),
        "patched_checker": (
            "import math, torch\nimport labkit.exercises as ex\nimport labkit.exercises.checking as checking\n"
            "checking.compare = lambda *args, **kwargs: None\nchecking._same = lambda a, b: True\n"
            "torch.isclose = lambda *args, **kwargs: torch.tensor(True)\nmath.isclose = lambda *args, **kwargs: True\n"
            "ex._REGISTRY.clear()\n",
            "def softmax_with_temperature(logits, temperature):\n    return logits\n",
            "def sample_token(probs, uniform):\n    return 0\n"),
        # Comparisons the learner can reach: a tensor that says it is close to anything, an answer equal to all.
        "lying_values": (
            "import torch\n"
            "class Close(torch.Tensor):\n"
            "    def isclose(self, *args, **kwargs):\n        return torch.ones(self.shape, dtype=torch.bool)\n"
            "    def __eq__(self, other):\n        return True\n"
            "class Anything:\n    def __eq__(self, other):\n        return True\n"
            "def softmax_with_temperature(logits, temperature):\n    return torch.zeros_like(logits).as_subclass(Close)\n"
            "def tokenizer_choice():\n    return Anything()\n",),
        # Reaching the reference another way: watcher switched off, code recompiled, another thread, the stack,
        # a lower-level torch name.
        "watcher_off": (
            "import sys\n"
            "def softmax_with_temperature(logits, temperature):\n"
            "    sys.setprofile(None)\n"
            "    from labkit.core.sampling import softmax_with_temperature as reference\n"
            "    return reference(logits, temperature)\n",),
        "recompiled": (
            "import types\nfrom labkit.core import sampling\n"
            "_code = sampling.softmax_with_temperature.__code__.replace(co_filename='mine.py')\n"
            "softmax_with_temperature = types.FunctionType(_code, sampling.__dict__)\n",),
        "other_thread": (
            "import threading\nimport labkit.core.sampling as s\n"
            "def softmax_with_temperature(logits, temperature):\n"
            "    box = []\n"
            "    worker = threading.Thread(target=lambda: box.append(s.softmax_with_temperature(logits, temperature)))\n"
            "    worker.start(); worker.join()\n"
            "    return box[0]\n",),
        "stack_peek": (
            "import sys, torch\n"
            "def softmax_with_temperature(logits, temperature):\n"
            "    caller = sys._getframe(1)\n"
            "    return torch.softmax(logits / max(temperature, 1e-9), dim=-1)\n",),
        "lower_level": (
            "import torch\n"
            "def sample_token(probs, uniform):\n"
            "    return int(torch._C._VariableFunctions.multinomial(probs, 1))\n",),
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
        "memory": (
            "import os, time\nchildren = []\n"
            "for _ in range(3):\n"
            "    pid = os.fork()\n"
            "    if pid == 0:\n"
            "        try:\n            block = bytearray(b'x') * 2**30\n            time.sleep(5)\n"
            "        finally:\n            os._exit(0)\n"
            "    children.append(pid)\n"
            "raise RuntimeError(f'children ended with {[os.waitpid(pid, 0)[1] for pid in children]}')\n", *HONEST),
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
    }


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def graded(tmp_path_factory, embedded):
    root = tmp_path_factory.mktemp("attacks")
    folder, out, again = root / "class", root / "class-grades", root / "regrade"
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
    before = {path: _digest(path) for path in folder.rglob("*.ipynb")}
    checker = Path(labkit.exercises.checking.__file__)
    checker_before = _digest(checker)

    limits = Limits(memory_mb=8192, total_memory_mb=2048, max_procs=64, output_mb=1, wall_seconds=240)
    options = dict(jobs=2, cell_timeout_s=15, limits=limits, progress=lambda line: None, secret=b"class secret")
    started = time.monotonic()
    reports = classroom.grade_class(folder, out, **options)
    seconds = time.monotonic() - started
    gradebook = (out / "gradebook.csv").read_bytes()
    alice_json = (out / "reports" / "alice.json").read_bytes()
    time.sleep(8)  # longer than the left-behind process waits before it writes
    try:
        connection = listener.accept()
    except BlockingIOError:
        connection = None
    listener.close()
    regraded = classroom.grade_class(folder, again, **options)
    with open(out / "gradebook.csv", newline="") as file:
        rows = {row["learner"]: row for row in csv.DictReader(file)}
    return {"reports": {r["learner"]: r for r in reports}, "rows": rows, "out": out, "again": again,
            "gradebook": gradebook, "alice_json": alice_json, "marker": marker, "connection": connection,
            "before": before, "checker": (checker, checker_before), "regraded": regraded, "seconds": seconds}


def _errors(report) -> list[str]:
    return [error["error"] for error in report["cell_errors"]]


def test_honest_learners_keep_their_grades_beside_every_attack(graded):
    rows = graded["rows"]
    for learner in ("alice", "carol", "outlives_run", "network", "forks", "memory", "flood", "ignores_interrupt",
                    "rewrites_itself"):
        assert (rows[learner]["total"], rows[learner]["max"]) == (str(FULL), str(FULL)), learner
    assert rows["bob"]["00.softmax_temperature"] == "0" and rows["bob"]["total"] == "3"  # an honest mistake
    assert "NotJSONError" in rows["eve"]["notes"]
    assert "'=SUM(1)" in graded["gradebook"].decode()  # the learner's name is text in a spreadsheet
    assert rows["alice"]["review"] == "" and rows["carol"]["review"] == ""


def test_a_cheat_earns_nothing_or_is_flagged_for_review(graded):
    rows = graded["rows"]
    for learner in ("fake_marker", "patched_checker", "lying_values", "reads_disk", "kills_all", "edits_labkit"):
        assert rows[learner]["total"] == "0", learner
    flagged = {learner: rows[learner]["review"] for learner in rows}
    expected = {"fake_marker": "pre_run_cell", "patched_checker": "labkit.exercises.checking",
                "lying_values": "defines __eq__: a comparison or type that can lie", "watcher_off": "setprofile",
                "recompiled": "__code__", "other_thread": "threading", "stack_peek": "_getframe",
                "lower_level": "private torch name", "reads_disk": "solution notebooks",
                "edits_labkit": "labkit.exercises.checking"}
    for learner, needle in expected.items():
        assert needle in flagged[learner], (learner, flagged[learner])
    # The fake result line was never read as a result: nothing has 101 points, and no submission more than lab 00's.
    assert all(int(row["total"]) <= FULL for row in rows.values())


def test_nothing_outside_a_submission_changes(graded):
    reports = graded["reports"]
    assert _errors(reports["reads_disk"]) == ["RuntimeError: saw ['FileNotFoundError', 'FileNotFoundError']"]
    assert all(_digest(path) == digest for path, digest in graded["before"].items())  # classmates, itself
    checker, digest = graded["checker"]
    assert _digest(checker) == digest and _errors(reports["edits_labkit"]) == [
        "RuntimeError: labkit is read-only: OSError"]
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
    memory = _errors(reports["memory"])[0]  # three children of 1 GiB under a 2 GiB total: one is killed (9)
    assert memory.startswith("RuntimeError: children ended with ") and 9 in json.loads(memory.split("with ")[1])
    assert reports["flood"]["output_dropped_bytes"] > 20 * 2**20
    assert _errors(reports["ignores_interrupt"]) == [
        "the kernel ignored the interrupt at the time limit and was killed; it was skipped"]
    killed = reports["kills_all"]["exercises"]
    assert all(result["details"][0].startswith("could not be graded") for result in killed)
    assert all(report["limits"]["isolation"].startswith("bubblewrap") for report in reports.values()
               if "limits" in report)


def test_a_regrade_gives_the_same_gradebook(graded):
    assert (graded["again"] / "gradebook.csv").read_bytes() == graded["gradebook"]
    first = {r["learner"]: r["exercises"] for r in graded["reports"].values()}
    assert {r["learner"]: r["exercises"] for r in graded["regraded"]} == first
    # The same submission handed in twice (alice, carol): the same random cases, the same verdicts.
    assert graded["reports"]["alice"]["seed"] == graded["reports"]["carol"]["seed"]
