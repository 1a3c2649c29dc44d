"""The seccomp filter that keeps the learner's kernel from starting a process while the answering step runs.

:func:`no_new_processes` builds it when the grader's first cell runs (libseccomp's, through ``pyseccomp``) and
returns the function that loads it at the step (:mod:`labkit.instructor.wall.answering`, which runs it on a
private copy of this module's names). Layer 5 (instructor tools).
"""

from __future__ import annotations

from typing import Callable

_CLONE_THREAD = 0x00010000


def no_new_processes() -> Callable[[], None]:
    """``load()``: once called, keeps every thread of this process from starting a process or running a program:
    the kernel refuses ``fork``, ``vfork``, ``clone`` of a process, ``clone3`` and ``execve`` (a seccomp filter on
    every thread, libseccomp's, that cannot be removed). ``_posixsubprocess``, ``multiprocessing`` and
    ``os.posix_spawn`` raise ``PermissionError``. New threads stay allowed: torch's OpenMP may start its pool
    during the step, and libgomp aborts the process when it cannot (what a new thread can reach is disarmed all
    the same).

    The filter is built now; ``load()`` hands it to the kernel through a libseccomp function of its own (not
    pyseccomp's, whose methods and library object a learner cell could replace), then reads back from the kernel
    (``/proc/self/status``) that one more filter is in place, and raises if not."""
    import ctypes
    import errno
    import os

    import pyseccomp as seccomp

    rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    rules.set_attr(seccomp.Attr.CTL_TSYNC, 1)  # every thread of the process, not only this one
    for name in ("fork", "vfork", "execve", "execveat"):
        rules.add_rule(seccomp.ERRNO(errno.EPERM), name)
    rules.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, _CLONE_THREAD, 0))
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")  # its flags are out of reach: the C library falls back
    seccomp_load = ctypes.CDLL(seccomp._libseccomp._name).seccomp_load  # a library object nobody else holds
    seccomp_load.argtypes, seccomp_load.restype = [ctypes.c_void_p], ctypes.c_int
    handle, open_, read, close = rules._filter, os.open, os.read, os.close

    def filters() -> tuple[int, bool]:
        """How many seccomp filters the kernel says this process has, and whether it counts them (Linux 5.9+;
        before, 1 for "some", 0 for none)."""
        descriptor = open_("/proc/self/status", os.O_RDONLY)
        try:
            status = read(descriptor, 1 << 16).decode()
        finally:
            close(descriptor)
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if "Seccomp_filters" in fields:
            return int(fields["Seccomp_filters"]), True
        return int(fields.get("Seccomp", "0").strip() == "2"), False

    def load() -> None:
        before, counted = filters()
        loaded = seccomp_load(handle)
        after, _ = filters()
        if loaded != 0 or after != (before + 1 if counted else 1):
            raise PermissionError("labkit grade: the filter that keeps the step from starting processes did not load")

    load.rules = rules  # kept alive with the filter's handle
    return load
