"""One submission's run, walled off: Debian's bubblewrap around the notebook, the limits of ``kernel_limits`` on it.

Inside the wall the submission sees a private folder (``/job``: its own copy of the notebook, the case inputs,
and where its answers go), an empty ``/tmp``, and read-only the system, the Python environment, the labkit package
and the embedded model's cache. It does not see the class folder, the other submissions, the solutions, the
output folder or the instructor's home. It has no network (its own empty network namespace), its own PID
namespace (it cannot see or signal the grader, and when the run ends the kernel kills everything left in it), no
capabilities (it runs as ``nobody`` in its own user namespace, so it cannot leave its cgroups or lift its limits),
a new terminal session (it cannot type into the instructor's terminal), and the limits of
:class:`~labkit.instructor.kernel_limits.Limits`: memory of all its processes together, memory per process, CPU
time, the number of tasks, bytes per file, and a wall time after which everything is killed. What it prints is
read by the grader up to a cap, the rest counted and dropped.

Where bubblewrap is missing or cannot make namespaces, :func:`isolation_problem` says why and the grader refuses
to run (``apt-get install bubblewrap``), unless the instructor opts in to grading without isolation; every report
then says "not isolated".

Layer 5 (instructor tools): standard library only.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
from dataclasses import dataclass, field
from pathlib import Path

from labkit.instructor.kernel_limits import Confinement, Limits

LOG_TAIL_BYTES = 64 * 1024  # what the grader keeps of a run's own printing (the rest is counted)
INSIDE_JOB = "/job"
NOBODY = 65534
_LIVE: set[subprocess.Popen] = set()  # the runs going on now, so an interrupted grader can end them all
_LIVE_LOCK = threading.Lock()


def stop_all() -> None:
    """Kill every run going on (the grader was interrupted): each ends with everything it started."""
    with _LIVE_LOCK:
        for process in list(_LIVE):
            _kill(process)


@functools.lru_cache(maxsize=1)
def isolation_problem() -> str | None:
    """Why submissions cannot be walled off on this machine (None when they can)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    probe = subprocess.run([bwrap, *_wall_options(), "--ro-bind", "/", "/", "true"], capture_output=True, text=True,
                           timeout=60)
    if probe.returncode != 0:
        return f"bubblewrap cannot make its namespaces here: {probe.stderr.strip()[:300]}"
    return None


def _wall_options() -> list[str]:
    return ["--unshare-all", "--uid", str(NOBODY), "--gid", str(NOBODY), "--cap-drop", "ALL", "--die-with-parent",
            "--new-session", "--hostname", "grader"]


def _readable_roots(extra: list[Path]) -> list[Path]:
    """What the run may read: the system, this Python and its packages, labkit (code and data), the model cache."""
    import labkit

    roots = {Path(p) for p in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc")}
    roots |= {Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent.parent}
    roots |= {Path(sysconfig.get_paths()[key]) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= {Path(path) for path in labkit.__path__}
    try:
        from importlib import resources

        roots.add(Path(str(resources.files("labkit.data"))))
    except (ModuleNotFoundError, TypeError):
        pass
    roots |= set(extra)
    existing = sorted(root.resolve() for root in roots if root.exists() and not root.is_symlink())
    # A root inside another is already there.
    return [root for root in existing if not any(other != root and other in root.parents for other in existing)]


def _top_links() -> list[tuple[str, str]]:
    """(target, link) of the top-level links a merged-/usr system has (/bin -> usr/bin, /lib64 -> usr/lib64)."""
    return [(os.readlink(path), path) for path in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
            if os.path.islink(path)]


def wall_command(command: list[str], job: Path, env: dict[str, str], readable: list[Path]) -> list[str]:
    """``command`` run by bubblewrap with ``job`` as ``/job`` (writable) and ``readable`` read-only."""
    binds = [arg for root in _readable_roots(readable) for arg in ("--ro-bind", str(root), str(root))]
    binds += [arg for target, link in _top_links() for arg in ("--symlink", target, link)]
    setenv = [arg for key, value in env.items() for arg in ("--setenv", key, value)]
    # /tmp first: a bind below /tmp (a checkout or venv under /tmp, as CI clones it) lands on top of the tmpfs,
    # not under it.
    return ["bwrap", *_wall_options(), "--tmpfs", "/tmp", *binds, "--proc", "/proc", "--dev", "/dev",
            "--bind", str(job), INSIDE_JOB, "--chdir", INSIDE_JOB, "--clearenv", *setenv, "--", *command]


@dataclass
class RunResult:
    """How a walled-off run ended."""

    returncode: int | None
    stopped: str | None  # why the grader stopped it ("wall time"), else None
    log_tail: str  # the end of what it printed outside cells
    log_bytes: int  # how much it printed in all
    limits: dict[str, str] = field(default_factory=dict)  # which mechanism held each limit


def run_walled(command: list[str], job: Path, limits: Limits, *, isolate: bool, env: dict[str, str],
               readable: list[Path] = ()) -> RunResult:
    """Run ``command`` (a worker that reads and writes only ``job``) under ``limits``, isolated unless told not.

    ``command`` names files in ``job`` by their path inside the wall (``/job/...``) when isolated. Returns when
    everything it started has ended: at its own end or at the wall time, killed.
    """
    with Confinement(limits) as confinement:
        inner = wall_command(command, job, env, list(readable)) if isolate else command
        process = subprocess.Popen([*confinement.launcher(), *inner], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                   env=None if isolate else env, cwd=str(job))
        confinement.kernel_pgid = process.pid  # its own session: the group is killed at the end
        with _LIVE_LOCK:
            _LIVE.add(process)
        tail = _Tail()
        reader = threading.Thread(target=tail.read, args=(process.stdout,), daemon=True)
        reader.start()
        stopped = None
        try:
            process.wait(timeout=limits.wall_seconds)
        except subprocess.TimeoutExpired:
            stopped = f"it ran longer than the wall time limit ({limits.wall_seconds} s) and was killed"
            _kill(process)
        finally:
            confinement.kill_all()  # anything that outlived the run (only possible without the wall)
            process.wait()
            reader.join(timeout=10)
            with _LIVE_LOCK:
                _LIVE.discard(process)
        described = confinement.describe()
    if not isolate:
        described["isolation"] = "not isolated: the notebook ran with the grader's own view of files and network"
    else:
        described["isolation"] = ("bubblewrap: private copy of the notebook, no network, own PID and user "
                                  "namespace, read-only environment")
    return RunResult(process.returncode, stopped, tail.text(), tail.total, described)


def _kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:
        pass


class _Tail:
    """The last :data:`LOG_TAIL_BYTES` of a stream, and how many bytes it carried: never more in memory."""

    def __init__(self) -> None:
        self.kept = bytearray()
        self.total = 0

    def read(self, stream) -> None:
        while True:
            chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
            if not chunk:
                return
            self.total += len(chunk)
            self.kept += chunk
            del self.kept[:-LOG_TAIL_BYTES]

    def text(self) -> str:
        return self.kept.decode("utf-8", errors="replace")
