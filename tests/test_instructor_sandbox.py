"""labkit.instructor.wall.sandbox: nothing of the host inside the wall, and nothing of the run left outside it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.instructor.wall import sandbox
from labkit.instructor.wall.kernel_limits import Limits

needs_wall = pytest.mark.skipif(sandbox.isolation_problem() is not None and bool(
    os.environ.get("LABKIT_SKIP_SANDBOX_TESTS")), reason="LABKIT_SKIP_SANDBOX_TESTS is set")

PROBE = r"""
import os, pathlib, shutil
def read(path):
    try:
        return pathlib.Path(path).read_text()
    except OSError as error:
        return type(error).__name__
print("first", sorted(item.split("=")[0] for item in read("/proc/1/environ").split("\0") if item))
print("own", sorted(item.split("=")[0] for item in read("/proc/self/environ").split("\0") if item))
print("shadow", read("/etc/shadow"))
print("etc", sorted(os.listdir("/etc")))
print("uid_map", read("/proc/self/uid_map").split())
print("job", sorted(os.listdir("/job")), read("/job/submission.ipynb"))
print("disk", shutil.disk_usage("/job").total // 2**20, shutil.disk_usage("/tmp").total // 2**20)
message = os.read(int(os.environ["FROM_GRADER"]), 100)
os.write(int(os.environ["TO_GRADER"]), message.upper())
"""


@needs_wall
def test_the_wall_shows_nothing_of_the_host_and_talks_only_over_its_pipes(tmp_path, monkeypatch):
    if sandbox.isolation_problem():
        pytest.fail(f"the sandbox is missing: {sandbox.isolation_problem()} (LABKIT_SKIP_SANDBOX_TESTS opts out)")
    monkeypatch.setenv("LABKIT_GRADING_SECRET", "do-not-show")
    heard = {}

    def exchange(read_fd, write_fd):
        os.write(write_fd, b"cases")
        heard["reply"] = os.read(read_fd, 100)

    run = sandbox.run_walled(
        [sys.executable, "-c", PROBE.replace('os.environ["FROM_GRADER"]', "{to_worker}").replace(
            'os.environ["TO_GRADER"]', "{from_worker}")], None, Limits(wall_seconds=120, disk_mb=32),
        isolate=True, env={"PATH": "/usr/bin:/bin", "HOME": "/job/home"}, job_files={"submission.ipynb": b"NB"},
        exchange=exchange)
    lines = dict(line.split(" ", 1) for line in run.log_tail.splitlines())
    assert run.returncode == 0, run.log_tail
    assert lines["first"] == "['LANG', 'PATH']"  # bubblewrap's own environment: bare, no secret
    assert lines["own"] == "['HOME', 'PATH', 'PWD']" and "do-not-show" not in run.log_tail
    assert lines["shadow"] == "FileNotFoundError" and "shadow" not in lines["etc"]
    outside = os.geteuid() if os.geteuid() else 65534  # root's sandbox is nobody outside
    assert lines["uid_map"] == str(["65534", str(outside), "1"])
    assert lines["job"] == "['home', 'submission.ipynb'] NB"
    assert lines["disk"] == "32 32"  # the job folder and /tmp: filesystems of the set size
    assert heard["reply"] == b"CASES"


@needs_wall
def test_the_wall_shows_what_it_binds_even_below_tmp_and_nothing_else(tmp_path):
    """CI clones the repository under /tmp: the environment bound from there must not vanish under the wall's own
    /tmp; the folder beside it (a class folder, the output) must not be there at all."""
    if sandbox.isolation_problem():
        pytest.fail(f"the sandbox is missing: {sandbox.isolation_problem()} (LABKIT_SKIP_SANDBOX_TESTS opts out)")
    shown, hidden = tmp_path / "environment", tmp_path / "class"
    for folder in (shown, hidden):
        folder.mkdir()
    (shown / "fact.txt").write_text("visible")
    (hidden / "alice.ipynb").write_text("{}")
    probe = ("import pathlib\n"
             f"print(pathlib.Path({str(shown / 'fact.txt')!r}).read_text())\n"
             f"print(pathlib.Path({str(hidden / 'alice.ipynb')!r}).exists())\n"
             f"try:\n    pathlib.Path({str(shown / 'fact.txt')!r}).write_text('changed')\n"
             "except OSError as error:\n    print(type(error).__name__)\n")
    run = sandbox.run_walled([sys.executable, "-c", probe], None, Limits(wall_seconds=60), isolate=True,
                             env={"PATH": "/usr/bin:/bin"}, readable=[shown])
    assert run.returncode == 0, run.log_tail
    assert run.log_tail.split() == ["visible", "False", "OSError"]
    assert (shown / "fact.txt").read_text() == "visible"


def test_a_folder_tree_of_any_depth_is_removed(tmp_path):
    """Without the wall the job folder is on disk: 5,000 nested folders (deeper than PATH_MAX) still go."""
    top = tmp_path / "job"
    top.mkdir()
    subprocess.run([sys.executable, "-c", "import os\nos.chdir(os.sys.argv[1])\nfor _ in range(5000):\n"
                    "    os.mkdir('d')\n    os.chdir('d')\nos.chmod('.', 0)\n", str(top)], check=True)
    sandbox.remove_tree(top)
    assert not top.exists()


BUSY = ("import os, resource, time\nchildren = []\nfor _ in range(3):\n    pid = os.fork()\n    if pid == 0:\n"
        "        break\n    children.append(pid)\nend = time.monotonic() + 3\nwhile time.monotonic() < end:\n    pass\n"
        "if children:\n    for pid in children:\n        os.waitpid(pid, 0)\n"
        "    used = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]\n"
        "    print(sum(u.ru_utime + u.ru_stime for u in used))\nelse:\n    os._exit(0)\n")
STEADY = "import time\nend = time.monotonic() + 3\nwhile time.monotonic() < end:\n    pass\nprint('done')\n"


@needs_wall
def test_a_busy_submission_is_held_to_its_share_beside_an_honest_one():
    """Four busy processes in one submission for 3 s, a busy loop in another at the same time: the cpu cgroup holds
    the first to half a CPU in all (unheld, on two cores, it would use about 2 x 3 s), the second ends as it
    should, and the report says which mechanism held the share."""
    import threading

    if sandbox.isolation_problem():
        pytest.fail(f"the sandbox is missing: {sandbox.isolation_problem()} (LABKIT_SKIP_SANDBOX_TESTS opts out)")
    runs = {}

    def run(name, source):
        runs[name] = sandbox.run_walled([sys.executable, "-c", source], None,
                                        Limits(wall_seconds=60, cpu_percent=50), isolate=True,
                                        env={"PATH": "/usr/bin:/bin"})

    threads = [threading.Thread(target=run, args=item) for item in (("busy", BUSY), ("steady", STEADY))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    busy, steady = runs["busy"], runs["steady"]
    assert busy.returncode == 0 and steady.returncode == 0, (busy.log_tail, steady.log_tail)
    if "not enforced" in busy.limits["cpu share"]:
        pytest.skip(busy.limits["cpu share"])
    assert busy.limits["cpu share"] == "50 % of one CPU for everything the notebook runs (cpu cgroup)"
    # The quota is 0.5 CPU-seconds per second over about 3 s (the processes start and end a little apart): the
    # kernel's CFS bandwidth control holds it to the period (0.1 s), so a 25 % margin covers the edges.
    assert float(busy.log_tail.split()[-1]) <= 0.5 * 3 * 1.25, busy.log_tail
    assert steady.log_tail.split() == ["done"]


def test_the_worker_reads_and_checks_notebooks_without_the_iri_grammars():
    # The worker keeps jsonschema's optional IRI grammars out (1.5 s of CPU a submission): nbformat still reads
    # and validates a notebook, and still refuses one that breaks its schema.
    script = """
import sys
from labkit.instructor.wall.worker import keep_out_iri_grammars
keep_out_iri_grammars()
import nbformat
notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")])
nbformat.validate(nbformat.reads(nbformat.writes(notebook), as_version=4))
notebook.cells[0]["execution_count"] = "one"
try:
    nbformat.validate(notebook)
except nbformat.ValidationError:
    print("refused")
print(sys.modules.get("rfc3987_syntax", "absent"))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["refused", "None"]  # the import was refused, not made
