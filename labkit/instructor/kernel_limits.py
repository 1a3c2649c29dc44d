"""Resource limits for a grading kernel: memory, CPU time and the number of processes.

The grader starts each submission's kernel through this launcher, which applies the limits to itself and then
execs the kernel, so the kernel and everything it forks inherit them::

    python -m labkit.instructor.kernel_limits --memory-mb 4096 --cpu-seconds 900 --max-procs 256 [--cgroup DIR] \\
        -- python -m ipykernel_launcher -f ...

What is enforced, and how:

- **memory**: ``RLIMIT_AS``, the address space of each process. A request beyond it fails at once (``MemoryError``
  in Python, ``RuntimeError`` from torch) before any page is touched, so a 50 GB allocation costs nothing. It is per
  process: a kernel that forks children may use that much again in each of them (their number is bounded below).
  Address space counts reservations too (glibc reserves 64 MB per thread's malloc arena), which is one reason the
  grader runs kernels with one torch thread.
- **CPU time**: ``RLIMIT_CPU``, CPU seconds of each process over the whole run. At the limit the kernel receives
  SIGXCPU (SIGKILL five seconds later) and dies in that cell; the grader reports why and skips the cell.
- **processes**: a cgroup of the ``pids`` controller made for each kernel (``pids.max``, removed afterwards); a fork
  beyond it fails with ``BlockingIOError``. Linux counts every thread as a task here, so the limit covers the
  kernel's own threads too. When no pids cgroup can be made (no cgroup file system, or no permission), a non-root
  grader falls back to ``RLIMIT_NPROC``, which counts *all* tasks of the user, so it is set to the user's current
  count plus the limit. As root nothing bounds the count then: Linux ignores ``RLIMIT_NPROC`` for uid 0. The
  grader states in every report which mechanism held (:meth:`Confinement.describe`).

What it leaves out: these limits stop runaway code (an allocation too big, a fork loop, an endless computation),
not an attacker. Code running as root can raise its own limits or leave the cgroup; grade submissions you
distrust as an unprivileged user or in a container. Wall time is the grader's cell time limit, not this module's.

Layer 5 (instructor tools): standard library only.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

CPU_GRACE_S = 5  # between SIGXCPU (soft limit) and SIGKILL (hard limit)


@dataclass(frozen=True)
class Limits:
    """What one submission's kernel may use."""

    memory_mb: int = 4096  # address space per process; the embedded model needs about 1.8 GB of it
    cpu_seconds: int = 900  # CPU time per process, over the whole notebook
    max_procs: int = 256  # tasks (processes and threads) of the kernel and its children together

    def __post_init__(self) -> None:
        for name, least in [("memory_mb", 256), ("cpu_seconds", 1), ("max_procs", 16)]:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"{name} must be an integer of at least {least}, got {value!r}")


# --------------------------------------------------------------------------------------------------------------
# The pids cgroup


def _pids_hierarchy() -> Path | None:
    """The directory under which this process may make a pids cgroup (cgroup v1 or v2), or None."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        memberships = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        _, mountpoint, kind, options, *_ = line.split()
        if kind == "cgroup" and "pids" in options.split(","):  # v1: a hierarchy of its own
            own = next((m.split(":", 2)[2] for m in memberships if "pids" in m.split(":", 2)[1].split(",")), "/")
            return Path(mountpoint) / own.lstrip("/")
    for line in mounts:
        _, mountpoint, kind, *_ = line.split()
        if kind != "cgroup2":
            continue
        # v2: only where the pids controller is handed down to children (at the root it usually is).
        try:
            if "pids" in (Path(mountpoint) / "cgroup.subtree_control").read_text().split():
                return Path(mountpoint)
        except OSError:
            continue
    return None


def make_pids_cgroup(max_procs: int) -> Path | None:
    """A fresh cgroup allowing ``max_procs`` tasks, or None when this machine or user does not allow one."""
    base = _pids_hierarchy()
    if base is None:
        return None
    path = base / f"labkit-grade-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError:
        return None
    try:
        (path / "pids.max").write_text(str(max_procs))
    except OSError:
        path.rmdir()
        return None
    return path


def _user_tasks(uid: int) -> int:
    """How many tasks (threads included) the user runs now: what ``RLIMIT_NPROC`` counts."""
    count = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:
            continue  # the process ended while we looked
        if int(fields["Uid"].split()[0]) == uid:
            count += int(fields["Threads"])
    return count


class Confinement:
    """The limits of one kernel run: the launcher's command line, and the clean-up of what the kernel left.

    >>> Confinement(Limits(memory_mb=512, cpu_seconds=10, max_procs=32)).launcher()[-7:]
    ['--memory-mb', '512', '--cpu-seconds', '10', '--max-procs', '32', '--']
    """

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.cgroup: Path | None = None
        self.kernel_pgid: int | None = None  # set by the grader once the kernel runs: its group is cleaned up

    def __enter__(self) -> Confinement:
        self.cgroup = make_pids_cgroup(self.limits.max_procs)
        return self

    def launcher(self) -> list[str]:
        """The command that goes before the kernel's own command line."""
        limits = self.limits
        cgroup = ["--cgroup", str(self.cgroup)] if self.cgroup else []
        return [sys.executable, "-m", "labkit.instructor.kernel_limits", *cgroup, "--memory-mb", str(limits.memory_mb),
                "--cpu-seconds", str(limits.cpu_seconds), "--max-procs", str(limits.max_procs), "--"]

    def describe(self) -> dict[str, str]:
        """Which mechanism enforces each limit on this machine (goes into the report)."""
        limits = self.limits
        if self.cgroup:
            procs = f"{limits.max_procs} tasks (pids cgroup)"
        elif os.geteuid() != 0:
            procs = f"{limits.max_procs} tasks beyond the user's current ones (RLIMIT_NPROC)"
        else:
            procs = "not enforced: no pids cgroup could be made and RLIMIT_NPROC does not apply to root"
        return {"memory": f"{limits.memory_mb} MB address space per process (RLIMIT_AS)",
                "cpu": f"{limits.cpu_seconds} CPU seconds per process (RLIMIT_CPU)", "processes": procs}

    def __exit__(self, *exc_info: object) -> None:
        """Kill whatever the kernel left running (e.g. forked children) and remove the cgroup."""
        if self.kernel_pgid is not None:
            try:
                os.killpg(self.kernel_pgid, signal.SIGKILL)  # jupyter_client starts the kernel in a new session
            except OSError:
                pass  # the group is gone already
        if self.cgroup is None:
            return
        deadline = time.monotonic() + 10
        while True:  # children that left the process group (setsid) are still in the cgroup
            try:
                pids = [int(p) for p in (self.cgroup / "cgroup.procs").read_text().split()]
            except OSError:
                pids = []
            if not pids or time.monotonic() > deadline:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.05)
        try:
            self.cgroup.rmdir()
        except OSError as error:
            print(f"labkit: could not remove {self.cgroup}: {error}", file=sys.stderr)


# --------------------------------------------------------------------------------------------------------------
# The launcher: runs in the kernel's process, before the kernel


def apply_limits(limits: Limits, cgroup: Path | None) -> None:
    """Limit the current process (inherited by what it execs and forks)."""
    if cgroup is not None:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    elif os.geteuid() != 0:
        ceiling = _user_tasks(os.getuid()) + limits.max_procs
        resource.setrlimit(resource.RLIMIT_NPROC, (ceiling, ceiling))
    memory_bytes = limits.memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + CPU_GRACE_S))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("usage: python -m labkit.instructor.kernel_limits [options] -- COMMAND ...")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m labkit.instructor.kernel_limits")
    parser.add_argument("--memory-mb", type=int, required=True)
    parser.add_argument("--cpu-seconds", type=int, required=True)
    parser.add_argument("--max-procs", type=int, required=True)
    parser.add_argument("--cgroup", type=Path)
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        parser.error("no command after --")
    apply_limits(Limits(args.memory_mb, args.cpu_seconds, args.max_procs), args.cgroup)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
