"""One submission's run, walled off: Debian's bubblewrap around the notebook, the limits of ``kernel_limits`` on it.

Inside the wall the submission sees a private folder (``/job``: its own copy of the notebook and its home) and
``/tmp``, both on one filesystem of :attr:`~labkit.instructor.wall.kernel_limits.Limits.disk_mb` held in memory
(nothing is written on the grader's disk, and nothing is left to clean up: the folder ends with the run), and
read-only the system's programs and libraries, the Python environment, the labkit package and the embedded
model's cache; of ``/etc`` only what a program needs to start (the loader's cache, the time zone) and a
``passwd`` naming ``nobody``. It does not see the class folder, the other submissions, the solutions, the
output folder, the instructor's home or the host's ``/etc``. bubblewrap itself starts with a bare environment
(no secret, none of the instructor's variables: the PID namespace's first process shows only ``PATH`` and
``LANG``), and when the grader is root it becomes ``nobody`` before starting bubblewrap, so the sandbox's user
is ``nobody`` outside too (``/proc/self/uid_map`` inside reads ``65534 65534 1``). Folders outside the
grader's reach as ``nobody`` (a Python under ``/root``) are handed to bubblewrap open (``--ro-bind-fd``).

The run has no network (its own empty network namespace), its own PID namespace (it cannot see or signal the
grader, and when the run ends the kernel kills everything left in it), no capabilities, a new terminal session
(it cannot type into the instructor's terminal), and the limits of
:class:`~labkit.instructor.wall.kernel_limits.Limits`: memory of all its processes together, memory per process, CPU
time, the number of tasks, bytes per file, and a wall time after which everything is killed. What it prints is
read by the grader up to a cap, the rest counted and dropped. The grader and the worker inside talk over two
pipes only (:func:`run_walled`'s ``exchange``): the grader never opens a file the submission could have made.

Where bubblewrap is missing or cannot make namespaces, :func:`isolation_problem` says why and the grader refuses
to run (``apt-get install bubblewrap``), unless the instructor opts in to grading without isolation; every report
then says "not isolated".

Layer 5 (instructor tools): standard library only.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import signal
import subprocess
import sys
import sysconfig
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from labkit.instructor.wall.kernel_limits import Confinement, Limits

LOG_TAIL_BYTES = 64 * 1024  # what the grader keeps of a run's own printing (the rest is counted)
INSIDE_JOB = "/job"
NOBODY = 65534
BARE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}  # all bubblewrap itself is started with
# A /dev of the few devices a notebook uses (bubblewrap's own --dev mounts a terminal file system, which makes it
# nest a second user namespace: the sandbox would then read as root in /proc/self/uid_map, though it is not).
_DEVICES = ["--tmpfs", "/dev", *(arg for name in ("null", "zero", "full", "random", "urandom")
                                  for arg in ("--dev-bind", f"/dev/{name}", f"/dev/{name}")),
            "--symlink", "/proc/self/fd", "/dev/fd", "--symlink", "/proc/self/fd/0", "/dev/stdin",
            "--symlink", "/proc/self/fd/1", "/dev/stdout", "--symlink", "/proc/self/fd/2", "/dev/stderr",
            "--size", str(64 * 2**20), "--tmpfs", "/dev/shm"]
# Of /etc, what programs need to start; the rest (shadow, the host's users, its configuration) stays outside.
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime", "/etc/nsswitch.conf")
PASSWD = b"nobody:x:65534:65534:nobody:/job/home:/usr/sbin/nologin\n"
GROUP = b"nobody:x:65534:\n"
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
    as_nobody = dict(user=NOBODY, group=NOBODY, extra_groups=[]) if os.geteuid() == 0 else {}
    probe = subprocess.run([bwrap, *_wall_options(), "--ro-bind", "/", "/", "true"], capture_output=True, text=True,
                           timeout=60, env=BARE_ENV, cwd="/", **as_nobody)
    if probe.returncode != 0:
        return f"bubblewrap cannot make its namespaces here: {probe.stderr.strip()[:300]}"
    return None


def _wall_options() -> list[str]:
    return ["--unshare-all", "--uid", str(NOBODY), "--gid", str(NOBODY), "--cap-drop", "ALL", "--die-with-parent",
            "--new-session", "--hostname", "grader"]


def _readable_roots(extra: list[Path]) -> list[Path]:
    """What the run may read: the system's programs and libraries, this Python and its packages, labkit (code and
    data), the model cache."""
    import labkit

    roots = {Path(p) for p in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")}
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


def _memory_file(data: bytes) -> int:
    """A file descriptor reading ``data`` from its start (an anonymous file in memory, never on disk)."""
    descriptor = os.memfd_create("labkit-wall", 0)
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view):]
    os.lseek(descriptor, 0, os.SEEK_SET)
    return descriptor


class Wall:
    """The bubblewrap command line of one run, and the file descriptors it hands to bubblewrap (closed by
    :meth:`close` once bubblewrap has them)."""

    def __init__(self, job_files: dict[str, bytes], readable: list[Path], disk_mb: int) -> None:
        self.fds: list[int] = []
        args = ["--size", str(disk_mb * 2**20), "--tmpfs", "/tmp"]
        # /tmp first: a bind below /tmp (a checkout or venv under /tmp, as CI clones it) lands on top of the
        # tmpfs, not under it.
        self.stage: Path | None = None
        self.staged: list[tuple[str, str]] = []  # (source, staging folder) the launcher binds as root
        for root in _readable_roots(readable):
            args += ["--ro-bind", self._reachable(root), str(root)]
        args += [arg for target, link in _top_links() for arg in ("--symlink", target, link)]
        for path in ETC_FILES:
            if os.path.isfile(path):
                args += ["--ro-bind", os.path.realpath(path), path]
        args += ["--ro-bind-data", self._keep(_memory_file(PASSWD)), "/etc/passwd",
                 "--ro-bind-data", self._keep(_memory_file(GROUP)), "/etc/group"]
        # The job folder: a filesystem of its own size, gone with the run (its files copied in from memory).
        args += ["--size", str(disk_mb * 2**20), "--perms", "0755", "--tmpfs", INSIDE_JOB,
                 "--dir", f"{INSIDE_JOB}/home"]
        for name, data in job_files.items():
            args += ["--file", self._keep(_memory_file(data)), f"{INSIDE_JOB}/{name}"]
        self.args = args

    def _reachable(self, root: Path) -> str:
        """``root``, or a staging folder it is bound on when ``nobody`` could not walk to it (a Python under
        ``/root``): the launcher binds it there, as root, in a mount namespace of the run's own."""
        if os.geteuid() != 0 or _walkable_by_others(root):
            return str(root)
        if self.stage is None:
            import tempfile

            self.stage = Path(tempfile.mkdtemp(prefix="labkit-stage-"))
            os.chmod(self.stage, 0o755)
        folder = self.stage / str(len(self.staged))
        folder.mkdir()
        self.staged.append((str(root), str(folder)))
        return str(folder)

    def _keep(self, descriptor: int) -> str:
        self.fds.append(descriptor)
        return str(descriptor)

    def command(self, command: list[str], env: dict[str, str]) -> list[str]:
        setenv = [arg for key, value in env.items() for arg in ("--setenv", key, value)]
        return ["bwrap", *_wall_options(), *self.args, "--proc", "/proc", *_DEVICES, "--chdir", INSIDE_JOB,
                "--clearenv", *setenv, "--", *command]

    def close(self) -> None:
        for descriptor in self.fds:
            os.close(descriptor)
        self.fds = []

    def remove_stage(self) -> None:
        if self.stage is not None:
            remove_tree(self.stage)


def _walkable_by_others(path: Path) -> bool:
    """Whether a user with no rights of its own can walk down to ``path`` (every folder above it searchable)."""
    return all(os.stat(folder).st_mode & stat.S_IXOTH for folder in [*reversed(path.parents), path])


def remove_tree(path: Path) -> None:
    """Remove a folder whatever the run left in it (any depth, any names, modes): GNU ``rm`` walks by file
    descriptors, so neither Python's recursion limit nor PATH_MAX stops it."""
    subprocess.run(["chmod", "-R", "u+rwx", "--", str(path)], capture_output=True, timeout=600)
    subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], capture_output=True, timeout=600)


@dataclass
class WallRun:
    """How a walled-off run ended."""

    returncode: int | None
    stopped: str | None  # why the grader stopped it ("wall time"), else None
    log_tail: str  # the end of what it printed outside cells
    log_bytes: int  # how much it printed in all
    limits: dict[str, str] = field(default_factory=dict)  # which mechanism held each limit


def run_walled(command: list[str], job: Path | None, limits: Limits, *, isolate: bool, env: dict[str, str],
               readable: list[Path] = (), job_files: dict[str, bytes] | None = None,
               exchange: Callable[[int, int], None] | None = None) -> WallRun:
    """Run ``command`` (a worker) under ``limits``, isolated unless told not.

    Isolated, the worker's folder is ``/job`` inside the wall, holding ``job_files``; without the wall it is
    ``job`` (a folder the caller made, the files written there). With ``exchange``, two pipes join the grader and
    the worker: the command line's ``{to_worker}`` and ``{from_worker}`` become the worker's ends (file
    descriptor numbers), and ``exchange(read_fd, write_fd)`` runs in a thread of the grader with its own ends
    until the worker's end closes. Returns when everything the run started has ended: at its own end or at the
    wall time, killed.
    """
    job_files = job_files or {}
    to_worker, from_worker = os.pipe(), os.pipe()
    worker_ends = [to_worker[0], from_worker[1]]
    command = [part.format(to_worker=to_worker[0], from_worker=from_worker[1]) for part in command]
    wall = None
    if isolate:
        wall = Wall(job_files, list(readable), limits.disk_mb)
        inner, popen_env = wall.command(command, env), BARE_ENV
    else:
        for name, data in job_files.items():
            (job / name).write_bytes(data)
        inner, popen_env = command, env
    talk = None
    try:
        with Confinement(limits) as confinement:
            user = NOBODY if isolate and os.geteuid() == 0 else None
            staged = [arg for source, folder in (wall.staged if wall else []) for arg in ("--stage", source, folder)]
            process = subprocess.Popen([*confinement.launcher(user, staged), *inner], stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                       env=popen_env, cwd="/" if isolate else str(job),
                                       pass_fds=[*worker_ends, *(wall.fds if wall else [])])
            for descriptor in worker_ends:
                os.close(descriptor)
            worker_ends = []
            if wall:
                wall.close()
            confinement.kernel_pgid = process.pid  # its own session: the group is killed at the end
            with _LIVE_LOCK:
                _LIVE.add(process)
            if exchange is not None:
                talk = threading.Thread(target=_exchange, args=(exchange, from_worker[0], to_worker[1]), daemon=True)
                talk.start()
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
    finally:
        for descriptor in worker_ends:
            os.close(descriptor)
        if wall:
            wall.close()
            wall.remove_stage()
        if talk is not None:
            talk.join(timeout=10)  # the worker's ends are closed now: the exchange sees the end of its stream
        for descriptor in (from_worker[0], to_worker[1]):
            try:
                os.close(descriptor)
            except OSError:
                pass
    if not isolate:
        described["isolation"] = "not isolated: the notebook ran with the grader's own view of files and network"
    else:
        described["isolation"] = ("bubblewrap: private copy of the notebook, no network, own PID and user "
                                  "namespace as nobody, read-only environment, bare environment variables")
    return WallRun(process.returncode, stopped, tail.text(), tail.total, described)


def _exchange(exchange: Callable[[int, int], None], read_fd: int, write_fd: int) -> None:
    try:
        exchange(read_fd, write_fd)
    except Exception:  # noqa: BLE001 - the caller's exchange keeps its own record; a broken pipe ends it
        pass


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
