"""A fresh control group for one submission's run, of the ``pids``, ``memory`` or ``cpu`` controller (v1 or v2).

:class:`labkit.instructor.wall.kernel_limits.Confinement` makes one of each before a run and removes them after;
each maker returns None where this machine or user allows no such group (the report then says the limit is not
enforced that way). Hand-written over the cgroup file system: the standard library has no cgroup interface, and
the few writes needed do not justify a dependency.

Layer 5 (instructor tools): standard library only.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

CPU_PERIOD_US = 100_000  # the CFS period the quota is a share of


def _hierarchy(controller: str) -> Path | None:
    """The directory under which this process may make a cgroup of ``controller`` (v1 or v2), or None."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        memberships = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        _, mountpoint, kind, options, *_ = line.split()
        if kind == "cgroup" and controller in options.split(","):  # v1: a hierarchy of its own
            own = next((m.split(":", 2)[2] for m in memberships if controller in m.split(":", 2)[1].split(",")), "/")
            return Path(mountpoint) / own.lstrip("/")
    for line in mounts:
        _, mountpoint, kind, *_ = line.split()
        if kind != "cgroup2":
            continue
        # v2: only where the controller is handed down to children (at the root it usually is).
        try:
            if controller in (Path(mountpoint) / "cgroup.subtree_control").read_text().split():
                return Path(mountpoint)
        except OSError:
            continue
    return None


def make_pids_cgroup(max_procs: int) -> Path | None:
    """A fresh cgroup allowing ``max_procs`` tasks, or None when this machine or user does not allow one."""
    return _make_cgroup("pids", [("pids.max", str(max_procs))])


def make_memory_cgroup(memory_mb: int) -> Path | None:
    """A fresh cgroup whose processes together may use ``memory_mb`` of memory (no swap beyond it), or None."""
    limit = str(memory_mb * 2**20)
    # v1 names, then v2 names; the swap settings are optional (absent where the kernel does not account swap). In
    # v1 a swappiness of 0 keeps the group's memory out of swap even where swap is not accounted.
    return (_make_cgroup("memory", [("memory.limit_in_bytes", limit)],
                         [("memory.memsw.limit_in_bytes", limit), ("memory.swappiness", "0")])
            or _make_cgroup("memory", [("memory.max", limit)], [("memory.swap.max", "0")]))


def make_cpu_cgroup(cpu_percent: int) -> Path | None:
    """A fresh cgroup whose processes together may run ``cpu_percent`` of one CPU, or None."""
    quota = str(cpu_percent * CPU_PERIOD_US // 100)
    return (_make_cgroup("cpu", [("cpu.cfs_period_us", str(CPU_PERIOD_US)), ("cpu.cfs_quota_us", quota)])
            or _make_cgroup("cpu", [("cpu.max", f"{quota} {CPU_PERIOD_US}")]))


def _make_cgroup(controller: str, settings: list[tuple[str, str]],
                 optional: list[tuple[str, str]] = ()) -> Path | None:
    base = _hierarchy(controller)
    if base is None:
        return None
    path = base / f"labkit-grade-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError:
        return None
    try:
        for name, value in settings:
            (path / name).write_text(value)
    except OSError:
        path.rmdir()
        return None
    for name, value in optional:
        try:
            (path / name).write_text(value)
        except OSError:
            pass
    return path
