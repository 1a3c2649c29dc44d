"""A time limit on a learner's function that no ``except`` or ``finally`` in it can swallow.

A one-shot alarm is not enough: ``while True: try: ... except: pass`` catches the exception it raises, and the
loop goes on for ever. So: in the main thread SIGALRM raises :class:`TimeLimit` at the limit (off the main thread
a watchdog thread sends it); it is raised again every 20 ms until the call returns; and from the limit on, a
trace function follows every instruction of the learner's code and raises where no handler on the stack can
catch it (Python 3.11+ exception tables say where that is). No process is started per call.

Where it stops: one long C call runs to its end; code that resets ``sys.settrace`` or the signal handler, or a
recursion that catches ``RecursionError`` and recurses again, can outlast it; on Python 3.10 (no exception
tables) it is best-effort.

Layer 4 (exercises); used by ``labkit.exercises.calling``.
"""

from __future__ import annotations

import dis
import functools
import os
import signal
import sys
import threading
import time
from types import CodeType, FrameType
from typing import Any

EXACT = hasattr(dis, "_parse_exception_table")  # Python 3.11+: exception tables say where a raise is caught
# The checker's own files: its frames are never traced or interrupted (it must always finish the check).
_CHECKER_FILES = frozenset(os.path.normcase(os.path.join(os.path.dirname(os.path.abspath(__file__)), name))
                           for name in ("definitions.py", "calling.py", "comparing.py", "checking.py", "deadline.py"))


def is_checker_code(code: CodeType) -> bool:
    """Whether ``code`` belongs to the checker itself (this module, ``definitions``, ``calling``, ``comparing`` or
    ``checking``)."""
    return os.path.normcase(os.path.abspath(code.co_filename)) in _CHECKER_FILES


class TimeLimit(BaseException):
    """Raised inside the learner's code when its time is up (a BaseException, though a bare ``except`` eats it)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        # Off the main thread this exception is sent from a watchdog and created here, in the learner's thread:
        # the only place the deadline can arm its trace for that thread.
        deadline = _DEADLINES.get(threading.get_ident())
        if deadline is not None and deadline.expired and not deadline.done and not deadline.in_main_thread:
            deadline.arm_trace(sys._getframe(1))


_DEADLINES: dict[int, "Deadline"] = {}  # thread id -> the deadline of the call running in it


@functools.lru_cache(maxsize=4096)
def _handlers(code: CodeType) -> tuple[tuple[tuple[int, int, int], ...], dict[int, str]] | None:
    """The exception table ``(start, end, handler)`` and the opcode names by offset; None before Python 3.11."""
    if not EXACT:
        return None
    try:
        table = tuple((entry.start, entry.end, entry.target) for entry in dis._parse_exception_table(code))
        return table, {ins.offset: ins.opname for ins in dis.get_instructions(code)}
    except Exception:  # noqa: BLE001 - a bytecode this version does not describe: fall back to the timer alone
        return None


def _may_catch(code: CodeType, offset: int) -> bool:
    """Whether an exception raised at ``offset`` may be caught inside this code (not only cleaned up and re-raised).

    A handler that only restores state and re-raises (the clean-up after an ``except`` body, an empty
    ``finally``) passes the exception on to whatever covers its own ``RERAISE``; any other handler (``except``,
    ``finally`` with a body, ``with``) may keep it.
    """
    described = _handlers(code)
    if described is None:
        return False
    table, opnames = described
    for _ in range(len(table) + 1):
        handler = next((target for start, end, target in table if start <= offset < end), None)
        if handler is None:
            return False
        first = [opnames.get(handler + 2 * i) for i in range(3)]
        if first == ["COPY", "POP_EXCEPT", "RERAISE"]:
            offset = handler + 4
        elif first[:2] == ["PUSH_EXC_INFO", "RERAISE"]:
            offset = handler + 2
        else:
            return True
    return True


class Deadline:
    """Stops one call of the learner's function once ``limit_s`` has passed, whatever the call catches.

    Three layers, each for what the one before cannot stop:

    1. At the limit, ``TimeLimit`` is raised in the learner's code: by SIGALRM in the main thread (where Jupyter
       runs cells; a signal also cuts a ``time.sleep`` short), by an asynchronous exception sent from a watchdog
       thread anywhere else.
    2. It is raised again every ``TICK_S`` until the call returns, so a loop that swallows one exception
       meets the next.
    3. From the limit on, a trace function follows every instruction of the learner's code and raises where no
       handler on the stack can catch it (Python 3.11+ reads the exception tables). So ``while True: try: ...
       except: pass``, ``except BaseException: while True: pass`` and ``finally: while True: pass`` all end
       within a tick or two.

    Limits, honestly: one long call into C (a huge matrix product, ``time.sleep`` off the main thread) runs to
    its end before anything can act; code that resets ``sys.settrace`` or the SIGALRM handler, or a recursion
    that catches ``RecursionError`` and recurses again (exponential work), can outlast it. Python 3.10 is
    best-effort: it has no exception tables, so layer 3 raises at the next line wherever that is, and its
    interpreter never looks at signals in a loop whose body is one ``try`` with no call in it (Ctrl-C cannot stop
    that loop either); checked here on 3.11, 3.12 and 3.13. A call that returns after the limit (a
    ``finally: return``) is still reported as too slow.
    """

    TICK_S = 0.02

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.thread_id = threading.get_ident()
        self.in_main_thread = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
        self.expired = False
        self.done = False
        self._boundary: FrameType | None = None  # the checker's frame that calls the learner's function
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._previous_trace = sys.gettrace()
        self._previous_handler: Any = None
        self._previous_timer = (0.0, 0.0)
        self._started = 0.0
        self._traced = False  # layer 3 is armed in this thread

    def start(self, boundary: FrameType) -> None:
        self._boundary, self._started = boundary, time.monotonic()
        _DEADLINES[self.thread_id] = self
        if self.in_main_thread:
            self._previous_handler = signal.signal(signal.SIGALRM, self._on_alarm)
            self._previous_timer = signal.setitimer(signal.ITIMER_REAL, self.limit_s, self.TICK_S)
        else:
            threading.Thread(target=self._watch, name="labkit-time-limit", daemon=True).start()

    def stop(self) -> None:
        """End the deadline; safe to call twice (a late exception may land in the first call)."""
        with self._lock:
            self.done = True
        self._wake.set()
        if self.in_main_thread and self._previous_handler is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous_handler)
            self._previous_handler = None
            delay, interval = self._previous_timer
            if delay > 0:  # someone else's alarm (a test runner's timeout) keeps ticking
                signal.setitimer(signal.ITIMER_REAL, max(delay - (time.monotonic() - self._started), 1e-3), interval)
        if self._traced:
            self._traced = False
            sys.settrace(self._previous_trace)
        if _DEADLINES.get(self.thread_id) is self:
            del _DEADLINES[self.thread_id]

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        if self.done or frame is None or is_checker_code(frame.f_code):
            return  # never interrupt the checker itself (its own hooks included)
        self.expired = True
        self.arm_trace(frame)
        raise TimeLimit(f"no answer within {self.limit_s:g} s")

    def _watch(self) -> None:
        if self._wake.wait(self.limit_s):
            return
        while True:
            with self._lock:
                if self.done:
                    return
                self.expired = True
                _send_async(self.thread_id, TimeLimit)
            if self._wake.wait(self.TICK_S):
                return

    def arm_trace(self, frame: FrameType) -> None:
        """Trace every frame of the learner's call from ``frame`` up (and every new one): layer 3."""
        walk: FrameType | None = frame
        while walk is not None and walk is not self._boundary:
            if not is_checker_code(walk.f_code):
                walk.f_trace, walk.f_trace_opcodes = self._trace, EXACT
            walk = walk.f_back
        if walk is self._boundary:
            self._traced = True
            sys.settrace(self._trace)

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if self.done or is_checker_code(frame.f_code):
            return None
        if event == "call":
            frame.f_trace_opcodes = EXACT
        if self._escapes(frame):
            raise TimeLimit(f"no answer within {self.limit_s:g} s")  # Python then drops this trace: layer 1 re-arms
        return self._trace

    def _escapes(self, frame: FrameType) -> bool:
        """True when an exception raised at this instruction reaches the checker: no handler on the way."""
        walk: FrameType | None = frame
        while walk is not None and walk is not self._boundary:
            if _may_catch(walk.f_code, walk.f_lasti):
                return False
            walk = walk.f_back
        return walk is self._boundary


def _send_async(thread_id: int, exception: type[BaseException]) -> None:
    """Raise ``exception`` in another thread at its next bytecode boundary.

    Never called with NULL to cancel one: on CPython 3.11 that leaves the interpreter's eval breaker set for good,
    and signal handlers then re-enter themselves. A stop that arrives late lands in
    :func:`labkit.exercises.calling.call_safely`, which retries.
    """
    try:
        import ctypes

        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exception))
    except (ImportError, AttributeError):  # not CPython: the time limit off the main thread is then best-effort
        pass


