"""Resource limits for one submission's run: memory, CPU time, processes, file size.

The grader starts each run (bubblewrap and the worker inside it, see :mod:`labkit.instructor.wall.sandbox`) through
this launcher, which applies the limits to itself and then execs the command, so everything the run starts
inherits them::

    python -m labkit.instructor.wall.kernel_limits --memory-mb 4096 --cpu-seconds 900 --max-procs 256 \\
        --output-mb 16 [--cgroup DIR ...] -- COMMAND ...

What is enforced, and how:

- **memory of the whole run**: a cgroup of the ``memory`` controller made for each run (v1
  ``memory.limit_in_bytes``, v2 ``memory.max``; no swap beyond it). Past it the kernel's OOM killer ends the
  largest process of the run, never anything outside it.
- **memory per process**: ``RLIMIT_AS``, the address space of each process. A request beyond it fails at once
  (``MemoryError`` in Python, ``RuntimeError`` from torch) before any page is touched, so a 50 GB allocation
  costs nothing. Address space counts reservations too (glibc reserves 64 MB per thread's malloc arena), which is
  one reason the grader runs kernels with one torch thread.
- **CPU time**: ``RLIMIT_CPU``, CPU seconds of each process over the whole run. At the limit the kernel receives
  SIGXCPU (SIGKILL five seconds later) and dies in that cell; the grader reports why and skips the cell.
- **processes**: a cgroup of the ``pids`` controller made for each run (``pids.max``); a fork beyond it fails
  with ``BlockingIOError``. Linux counts every thread as a task here. When no pids cgroup can be made (no cgroup
  file system, or no permission), a non-root grader falls back to ``RLIMIT_NPROC``, which counts *all* tasks of
  the user, so it is set to the user's current count plus the limit; as root nothing bounds the count then.
- **file size**: ``RLIMIT_FSIZE``, the largest file any process of the run may write.
- **a share of the machine**: a cgroup of the ``cpu`` controller made for each run (v2 ``cpu.max``, v1
  ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``: the same CFS bandwidth limit), ``cpu_percent`` of one CPU for
  everything the run starts together. A fork bomb of busy processes is throttled to that share, so an honest
  submission beside it keeps its own (its answers have a time limit). Without a cpu cgroup only the per-process
  CPU time holds, and the report says so.

The cgroups are removed after the run, once everything in them has been killed. The grader states in every
report which mechanism held (:meth:`Confinement.describe`). These limits are one half of the wall; the other
(namespaces, a private folder, no capabilities, so that code inside cannot leave its cgroups or lift its limits)
is bubblewrap's.

Layer 5 (instructor tools): standard library only.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from labkit.instructor.wall import cgroups

CPU_GRACE_S = 5  # between SIGXCPU (soft limit) and SIGKILL (hard limit)
SUBMISSION_BYTES = 32 * 2**20  # the largest notebook the grader reads: the wall must be able to hold it


def file_limit_bytes(limits: "Limits") -> int:
    """RLIMIT_FSIZE of the run: the output limit, but never below the submission itself (written into the wall
    under this limit; the folders' own size limit bounds the disk)."""
    return max(limits.output_mb * 2**20, SUBMISSION_BYTES)


def _limit(default: int, least: int, help: str) -> Any:
    """A field of :class:`Limits`: its default, the least value accepted and what it bounds (``labkit grade``'s
    option of the same name, ``--memory-mb`` for ``memory_mb``, says it)."""
    return field(default=default, metadata={"least": least, "help": help})


@dataclass(frozen=True)
class Limits:
    """What one submission may use."""

    memory_mb: int = _limit(4096, 256, "address space of each kernel process, MB (the embedded model needs about "
                                       "1.8 GB of it)")
    cpu_seconds: int = _limit(900, 1, "CPU time of each kernel process over the whole notebook")
    max_procs: int = _limit(256, 16, "processes and threads of a kernel and its children together")
    total_memory_mb: int = _limit(6144, 256, "memory of everything one notebook runs together, MB (a memory cgroup)")
    wall_seconds: int = _limit(1800, 10, "one notebook, start to last answer; then everything it runs is killed")
    output_mb: int = _limit(16, 1, "printed output kept per notebook, and the largest file it may write, MB")
    disk_mb: int = _limit(256, 16, "the submission's folders (/job, /tmp) together, MB: a filesystem in memory")
    budget_seconds: int = _limit(600, 10, "the notebook's cells together, seconds; later cells are not run")
    cpu_percent: int = _limit(100, 10, "share of one CPU for everything one notebook runs, percent (a cpu cgroup)")

    def __post_init__(self) -> None:
        for item in fields(self):
            value, least = getattr(self, item.name), item.metadata["least"]
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"{item.name} must be an integer of at least {least}, got {value!r}")


# --------------------------------------------------------------------------------------------------------------
# The grader's side: the run's cgroups made, its leftovers killed


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
    """The limits of one run: the launcher's command line, and the clean-up of what the run left.

    >>> Confinement(Limits(memory_mb=512, cpu_seconds=10, max_procs=32)).launcher()[-9:]
    ['--memory-mb', '512', '--cpu-seconds', '10', '--max-procs', '32', '--output-mb', '16', '--']
    """

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.cgroup: Path | None = None  # pids
        self.memory_cgroup: Path | None = None
        self.cpu_cgroup: Path | None = None
        self.kernel_pgid: int | None = None  # set by the grader once the kernel runs: its group is cleaned up

    def __enter__(self) -> Confinement:
        self.cgroup = cgroups.make_pids_cgroup(self.limits.max_procs)
        self.memory_cgroup = cgroups.make_memory_cgroup(self.limits.total_memory_mb)
        self.cpu_cgroup = cgroups.make_cpu_cgroup(self.limits.cpu_percent)
        return self

    def launcher(self, user: int | None = None, staged: list[str] = ()) -> list[str]:
        """The command that goes before the confined command line (run as ``user`` when started as root;
        ``staged``: ``--stage SOURCE FOLDER`` arguments, folders bound for it before it leaves root)."""
        limits = self.limits
        cgroups = [arg for group in self._cgroups() if group for arg in ("--cgroup", str(group))]
        as_user = ([] if user is None else ["--user", str(user)]) + list(staged)
        return [sys.executable, "-m", "labkit.instructor.wall.kernel_limits", *cgroups, *as_user,
                "--memory-mb", str(limits.memory_mb), "--cpu-seconds", str(limits.cpu_seconds),
                "--max-procs", str(limits.max_procs), "--output-mb", str(limits.output_mb), "--"]

    def _cgroups(self) -> tuple[Path | None, ...]:
        return self.cgroup, self.memory_cgroup, self.cpu_cgroup

    def describe(self) -> dict[str, str]:
        """Which mechanism enforces each limit on this machine (goes into the report)."""
        limits = self.limits
        if self.cgroup:
            procs = f"{limits.max_procs} tasks (pids cgroup)"
        elif os.geteuid() != 0:
            procs = f"{limits.max_procs} tasks beyond the user's current ones (RLIMIT_NPROC)"
        else:
            procs = "not enforced: no pids cgroup could be made and RLIMIT_NPROC does not apply to root"
        total = (f"{limits.total_memory_mb} MB for everything the notebook runs (memory cgroup)" if self.memory_cgroup
                 else "not enforced: no memory cgroup could be made (only the per-process limit holds)")
        share = (f"{limits.cpu_percent} % of one CPU for everything the notebook runs (cpu cgroup)" if self.cpu_cgroup
                 else "not enforced: no cpu cgroup could be made (only the CPU time per process holds)")
        return {"memory": f"{limits.memory_mb} MB address space per process (RLIMIT_AS)", "total memory": total,
                "cpu share": share,
                "cpu": f"{limits.cpu_seconds} CPU seconds per process (RLIMIT_CPU)", "processes": procs,
                "wall": f"{limits.wall_seconds} s for the whole notebook (then everything it runs is killed)",
                "output": f"{limits.output_mb} MB of printed output kept",
                "file": f"{file_limit_bytes(limits) // 2**20} MB per file written (RLIMIT_FSIZE)",
                "disk": f"{limits.disk_mb} MB for the submission's folders together (a filesystem of that size)",
                "budget": f"{limits.budget_seconds} s for the notebook's cells together (later cells are not run)"}

    def kill_all(self) -> None:
        """Kill whatever the run left (the kernel's group, and every task still in its cgroups)."""
        if self.kernel_pgid is not None:
            try:
                os.killpg(self.kernel_pgid, signal.SIGKILL)  # jupyter_client starts the kernel in a new session
            except OSError:
                pass  # the group is gone already
        for group in self._cgroups():
            if group is None:
                continue
            deadline = time.monotonic() + 10
            while True:  # children that left the process group (setsid) are still in the cgroup
                try:
                    pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
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

    def __exit__(self, *exc_info: object) -> None:
        """Kill whatever the run left running (e.g. forked children) and remove the cgroups."""
        self.kill_all()
        for group in self._cgroups():
            if group is None:
                continue
            for _ in range(50):  # a killed task leaves its cgroup a moment after the signal
                try:
                    group.rmdir()
                    break
                except OSError as error:
                    last = error
                    time.sleep(0.02)
            else:
                print(f"labkit: could not remove {group}: {last}", file=sys.stderr)


# --------------------------------------------------------------------------------------------------------------
# The launcher: runs in the kernel's process, before the kernel


def _stage(stage: list[tuple[str, str]]) -> None:
    """Bind each source folder on its staging folder, in a mount namespace of this process's own (so nothing
    changes for the rest of the machine): the user the wall runs as can then reach folders it could not walk to.

    Hand-written with ctypes: Python 3.11's ``os`` has neither ``unshare`` nor ``mount``."""
    if not stage:
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    clone_newns, ms_bind, ms_rec, ms_private = 0x20000, 4096, 16384, 1 << 18
    if libc.unshare(clone_newns) != 0 or libc.mount(None, b"/", None, ms_rec | ms_private, None) != 0:
        raise SystemExit(f"labkit: no mount namespace for the wall: {os.strerror(ctypes.get_errno())}")
    for source, folder in stage:
        if libc.mount(source.encode(), folder.encode(), None, ms_bind | ms_rec, None) != 0:
            raise SystemExit(f"labkit: could not stage {source}: {os.strerror(ctypes.get_errno())}")


def apply_limits(limits: Limits, cgroups: list[Path], user: int | None = None,
                 stage: list[tuple[str, str]] = ()) -> None:
    """Limit the current process (inherited by what it execs and forks); then, when ``user`` is given and this
    process is root, become that user (no supplementary groups), so the wall is never root outside."""
    for cgroup in cgroups:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    if not any(group.name and (group / "pids.max").exists() for group in cgroups) and os.geteuid() != 0:
        ceiling = _user_tasks(os.getuid()) + limits.max_procs
        resource.setrlimit(resource.RLIMIT_NPROC, (ceiling, ceiling))
    memory_bytes = limits.memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + CPU_GRACE_S))
    file_bytes = file_limit_bytes(limits)
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    if user is not None and os.geteuid() == 0:
        _stage(stage)
        os.setgroups([])
        os.setresgid(user, user, user)
        os.setresuid(user, user, user)
        if os.geteuid() == 0 or os.getegid() == 0:
            raise SystemExit("labkit: could not leave root before starting the wall")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("usage: python -m labkit.instructor.wall.kernel_limits [options] -- COMMAND ...")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m labkit.instructor.wall.kernel_limits")
    parser.add_argument("--memory-mb", type=int, required=True)
    parser.add_argument("--cpu-seconds", type=int, required=True)
    parser.add_argument("--max-procs", type=int, required=True)
    parser.add_argument("--output-mb", type=int, default=Limits.output_mb)
    parser.add_argument("--cgroup", type=Path, action="append", default=[])
    parser.add_argument("--user", type=int, default=None, help="run as this uid and gid when started as root")
    parser.add_argument("--stage", nargs=2, action="append", default=[], metavar=("SOURCE", "FOLDER"))
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        parser.error("no command after --")
    apply_limits(Limits(args.memory_mb, args.cpu_seconds, args.max_procs, output_mb=args.output_mb), args.cgroup,
                 args.user, [tuple(pair) for pair in args.stage])
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
