"""Checking a learner's function against labkit's reference, kindly and honestly.

An :class:`Exercise` is registered once: the function name the learner defines, the reference it is compared
with, hand-computed cases (boundaries included), a generator of random cases, tolerances, the labkit helpers the
learner may call, and the mistakes learners really make, each with the hint that points at it.
:func:`check_function` runs every case and returns a :class:`Verdict`: passed, failed (first failing case,
expected, got, the difference and a hint), not attempted (the stub still raises ``NotImplementedError``), or
error (labkit's own side broke: the reference or the random cases raised; never the learner's fault).

The learner's code never throws a traceback from here. Each call runs on copies of the inputs, with its output
captured and a time limit that no ``except`` or ``finally`` can swallow (see :class:`_Deadline` for how, and
for its limits). While it runs, a profile hook reports any call into labkit (the reference or any other labkit
function, except the helpers the exercise allows) and into torch's ready-made equivalents the exercise forbids.
Random cases draw a fresh seed every check, so a memorized answer fails; the seed is printed with a failure so it
can be replayed.

Layer 4 (exercises): imports the core, never widgets.
"""

from __future__ import annotations

import contextlib
import copy
import dis
import functools
import inspect
import io
import math
import os
import random
import signal
import sys
import sysconfig
import threading
import time
import traceback
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any, Callable

import torch

FLOOD_CHARS = 2_000  # more printed output than this from one call is reported as a failure


@dataclass(frozen=True)
class Case:
    """One call of the learner's function: positional and keyword arguments, and what the case is about."""

    args: tuple
    kwargs: dict = field(default_factory=dict)
    label: str = ""  # shown when the case fails, e.g. "temperature 0 is greedy"


@dataclass(frozen=True)
class Mistake:
    """A mistake learners make, recognised from the output it produces on a failing case."""

    hint: str  # what to look at, shown when the mistake is recognised
    wrong: Callable[..., Any]  # a deliberately wrong implementation with the exercise's signature


def _dotted_name(item: Any) -> str:
    return f"{getattr(item, '__module__', None) or '?'}.{getattr(item, '__qualname__', None) or item.__name__}"


@dataclass(frozen=True)
class Exercise:
    """A graded exercise: what the learner writes and how it is checked.

    Any call into labkit from the learner's function is reported (labkit holds the answers), except ``allowed``:
    functions, or classes whose methods and properties may all be used (e.g. the ``ModelSpec`` passed in).
    ``forbidden`` adds torch's ready-made equivalents (``torch.nn.functional.cross_entropy`` in a loss exercise).
    """

    id: str  # "<lab>.<name>", e.g. "00.softmax_temperature"
    title: str
    function: str  # the name the learner's notebook defines
    reference: Callable[..., Any]  # labkit's implementation, the source of truth
    hand_cases: tuple[Case, ...]  # computed by hand, boundaries included
    random_case: Callable[[torch.Generator], Case]  # draws one random case
    points: int = 1
    n_random: int = 25
    rtol: float = 1e-5  # tolerances, also stated in the notebook's task text
    atol: float = 1e-6
    hints: tuple[str, ...] = ()  # general hints when no known mistake matches
    mistakes: tuple[Mistake, ...] = ()
    allowed: tuple[Any, ...] = ()  # labkit functions (or classes) the learner may call; any other labkit call fails
    forbidden: tuple[Callable[..., Any], ...] = ()  # torch's ready-made equivalents the learner may not call
    time_limit_s: float = 5.0  # per call

    @property
    def lab(self) -> str:
        return self.id.split(".", 1)[0]

    @property
    def allowed_text(self) -> str:
        """One sentence for the task text: which labkit helpers the learner may call, and what is reported.

        >>> Exercise("zz.x", "X", "x", abs, (), lambda g: Case(())).allowed_text
        'No labkit function may be called inside your function: the check reports any call into labkit.'
        """
        names = [f"`{_dotted_name(item)}`" + (" (its methods and properties)" if isinstance(item, type) else "")
                 for item in self.allowed]
        torch_names = [f"`{_dotted_name(item)}`" for item in self.forbidden if _dotted_name(item).startswith("torch")]
        ready_made = f"torch's ready-made {_join(torch_names)}" if torch_names else ""
        if names:
            also = f", and {ready_made}," if ready_made else ""
            return f"You may call {_join(names)}; any other labkit function{also} is reported by the check."
        if ready_made:
            return (f"Neither labkit's functions nor {ready_made} may be called inside your function: the check "
                    "reports any such call.")
        return "No labkit function may be called inside your function: the check reports any call into labkit."


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check, printable as plain text (and as HTML in a notebook)."""

    exercise: Exercise
    status: str  # "passed", "failed", "not attempted", or "error" (labkit's side could not check the answer)
    lines: tuple[str, ...]  # the explanation, one line each

    @property
    def points(self) -> int:
        return self.exercise.points if self.status == "passed" else 0

    def __str__(self) -> str:
        mark = _MARKS[self.status]
        head = f"[{mark}] {self.exercise.title} ({self.points}/{self.exercise.points} points)"
        return "\n".join([head, *(f"  {line}" for line in self.lines)])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        import html

        colour = {"passed": "#1a7f37", "failed": "#cf222e", "not attempted": "#9a6700", "error": "#6e40c9"}[self.status]
        body = "<br>".join(html.escape(line) for line in self.lines)
        title = html.escape(f"{_MARKS[self.status]}: {self.exercise.title} ({self.points}/{self.exercise.points})")
        return (f'<div style="border-left:4px solid {colour};padding:4px 10px;font-family:monospace">'
                f'<b style="color:{colour}">{title}</b><br>{body}</div>')


_MARKS = {"passed": "PASSED", "failed": "FAILED", "not attempted": "NOT ATTEMPTED", "error": "LABKIT ERROR"}


# --------------------------------------------------------------------------------------------------------------
# Where code lives: labkit's (reported when the learner calls it), the checker's own, and the learner's

_CHECKER_FILE = os.path.normcase(os.path.abspath(__file__))
_LABKIT_DIR = os.path.dirname(_CHECKER_FILE)
_TORCH_DIR = os.path.dirname(os.path.normcase(os.path.abspath(torch.__file__)))
_LIBRARY_DIRS = tuple(os.path.normcase(os.path.abspath(path)) for path in {
    sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")})
_LABKIT_NAMES: dict[CodeType, str | None] = {}  # code object -> "labkit.module.qualname", None when not labkit's
_EXACT = hasattr(dis, "_parse_exception_table")  # Python 3.11+: exception tables say where a raise is caught


def _is_checker_code(code: CodeType) -> bool:
    return code.co_filename == __file__ or os.path.normcase(os.path.abspath(code.co_filename)) == _CHECKER_FILE


def _labkit_name(code: CodeType) -> str | None:
    """``labkit.sampling.top_k_filter`` for code that lives in the labkit package (not the checker itself)."""
    if code in _LABKIT_NAMES:
        return _LABKIT_NAMES[code]
    path = os.path.normcase(os.path.abspath(code.co_filename))
    name = None
    if path.startswith(_LABKIT_DIR + os.sep) and path != _CHECKER_FILE:
        module = os.path.relpath(path, os.path.dirname(_LABKIT_DIR))[: -len(".py")].replace(os.sep, ".")
        module = module[: -len(".__init__")] if module.endswith(".__init__") else module
        name = f"{module}.{getattr(code, 'co_qualname', code.co_name)}"
    _LABKIT_NAMES[code] = name
    return name


def _codes_of(item: Any) -> set[CodeType]:
    """The code objects an ``allowed`` entry stands for: a function's, or every method and property of a class."""
    if not isinstance(item, type):
        members = [item]
    else:
        members = []
        for klass in item.__mro__[:-1]:  # object's own methods are C code: nothing to allow
            for member in vars(klass).values():
                if isinstance(member, property):
                    members += [member.fget, member.fset, member.fdel]
                else:
                    members.append(getattr(member, "__func__", member))  # staticmethod, classmethod
    functions = (inspect.unwrap(member) for member in members if callable(member))
    return {function.__code__ for function in functions if hasattr(function, "__code__")}


def _learner_frame(tb: Any) -> traceback.FrameSummary | None:
    """The last traceback entry in the learner's own code (not torch, labkit or an installed library)."""
    for entry in reversed(traceback.extract_tb(tb)):
        path = os.path.normcase(os.path.abspath(entry.filename))
        if not path.startswith((_LABKIT_DIR + os.sep, _TORCH_DIR + os.sep, *(d + os.sep for d in _LIBRARY_DIRS))):
            return entry
    return None


# --------------------------------------------------------------------------------------------------------------
# A time limit that the learner's code cannot swallow


class _TimeLimit(BaseException):
    """Raised inside the learner's code when its time is up (a BaseException, though a bare ``except`` eats it)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        # Off the main thread this exception is sent from a watchdog and created here, in the learner's thread:
        # the only place the deadline can arm its trace for that thread.
        deadline = _DEADLINES.get(threading.get_ident())
        if deadline is not None and deadline.expired and not deadline.done and not deadline.in_main_thread:
            deadline.arm_trace(sys._getframe(1))


_DEADLINES: dict[int, "_Deadline"] = {}  # thread id -> the deadline of the call running in it


@functools.lru_cache(maxsize=4096)
def _handlers(code: CodeType) -> tuple[tuple[tuple[int, int, int], ...], dict[int, str]] | None:
    """The exception table ``(start, end, handler)`` and the opcode names by offset; None before Python 3.11."""
    if not _EXACT:
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


class _Deadline:
    """Stops one call of the learner's function once ``limit_s`` has passed, whatever the call catches.

    Three layers, each for what the one before cannot stop:

    1. At the limit, ``_TimeLimit`` is raised in the learner's code: by SIGALRM in the main thread (where Jupyter
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
        if self.done or frame is None or _is_checker_code(frame.f_code):
            return  # never interrupt the checker itself (its own hooks included)
        self.expired = True
        self.arm_trace(frame)
        raise _TimeLimit(f"no answer within {self.limit_s:g} s")

    def _watch(self) -> None:
        if self._wake.wait(self.limit_s):
            return
        while True:
            with self._lock:
                if self.done:
                    return
                self.expired = True
                _send_async(self.thread_id, _TimeLimit)
            if self._wake.wait(self.TICK_S):
                return

    def arm_trace(self, frame: FrameType) -> None:
        """Trace every frame of the learner's call from ``frame`` up (and every new one): layer 3."""
        walk: FrameType | None = frame
        while walk is not None and walk is not self._boundary:
            if not _is_checker_code(walk.f_code):
                walk.f_trace, walk.f_trace_opcodes = self._trace, _EXACT
            walk = walk.f_back
        if walk is self._boundary:
            self._traced = True
            sys.settrace(self._trace)

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if self.done or _is_checker_code(frame.f_code):
            return None
        if event == "call":
            frame.f_trace_opcodes = _EXACT
        if self._escapes(frame):
            raise _TimeLimit(f"no answer within {self.limit_s:g} s")  # Python then drops this trace: layer 1 re-arms
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
    and signal handlers then re-enter themselves. A stop that arrives late lands in :func:`_call`, which retries.
    """
    try:
        import ctypes

        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exception))
    except (ImportError, AttributeError):  # not CPython: the time limit off the main thread is then best-effort
        pass


# --------------------------------------------------------------------------------------------------------------
# Running one call of untrusted code


class _Outcome:
    def __init__(self) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.timed_out = False
        self.printed = ""
        self.called_forbidden: str | None = None
        self.mutated: str | None = None


def _snapshot(value: Any) -> Any:
    return copy.deepcopy(value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.nan_to_num(), b.nan_to_num())
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    try:
        return bool(a == b) or (isinstance(a, float) and math.isnan(a) and math.isnan(b))
    except Exception:  # noqa: BLE001 - objects whose == misbehaves are compared by identity
        return a is b


def _tripwire(exercise: Exercise, outcome: _Outcome) -> Callable[[FrameType, str, Any], None]:
    """A profile hook that names the first labkit function (or forbidden torch function) the learner's code calls.

    It runs on every call while the learner's function runs, so it does little: a dictionary look-up or two.
    Calls made from inside an allowed helper are the helper's business and are not looked at. Not seen: a labkit
    function behind ``functools.lru_cache`` answering from its cache (no Python call happens).
    """
    allowed = set().union(*(_codes_of(item) for item in exercise.allowed)) if exercise.allowed else set()
    forbidden: dict[Any, str] = {}
    for item in (exercise.reference, *exercise.forbidden):
        function = inspect.unwrap(item)
        forbidden[getattr(function, "__code__", function)] = _dotted_name(item)
    inside_allowed: list[FrameType] = []

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            if inside_allowed or outcome.called_forbidden:
                return
            code = frame.f_code
            if code in allowed:
                inside_allowed.append(frame)
            elif code in forbidden:
                outcome.called_forbidden = forbidden[code]
            else:
                outcome.called_forbidden = _labkit_name(code)
        elif event == "return":
            if inside_allowed and frame is inside_allowed[-1]:
                inside_allowed.pop()
        elif event == "c_call" and not inside_allowed and not outcome.called_forbidden and arg in forbidden:
            outcome.called_forbidden = forbidden[arg]  # a forbidden torch function written in C

    return hook


def _call(exercise: Exercise, fn: Callable[..., Any], case: Case) -> _Outcome:
    """Call ``fn`` on copies of the case's arguments with a time limit, captured output and a labkit tripwire."""
    outcome = _Outcome()
    args, kwargs = _snapshot(case.args), _snapshot(case.kwargs)
    originals = _snapshot((args, kwargs))
    tripwire = _tripwire(exercise, outcome)
    deadline = _Deadline(exercise.time_limit_s)
    previous_profile = sys.getprofile()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        try:
            deadline.start(sys._getframe())
            sys.setprofile(tripwire)
            try:
                outcome.value = fn(*args, **kwargs)
            finally:
                sys.setprofile(previous_profile)
                deadline.stop()
        except _TimeLimit:
            pass
        except BaseException as error:  # noqa: BLE001 - anything the learner's code raises becomes a verdict
            if isinstance(error, KeyboardInterrupt) and not deadline.expired:
                raise  # the learner pressed stop: respect it
            outcome.error = error
        finally:
            while True:  # a stop sent from another thread may still land here, once: stop for good, then go on
                try:
                    deadline.stop()
                    break
                except _TimeLimit:
                    continue
    outcome.timed_out = deadline.expired
    outcome.printed = printed.getvalue()
    if not _same((args, kwargs), originals):
        outcome.mutated = "your function changed its input in place; work on a copy (or use out-of-place operations)"
    return outcome


# --------------------------------------------------------------------------------------------------------------
# Comparing results


def _describe(value: Any, limit: int = 8) -> str:
    try:
        if isinstance(value, torch.Tensor):
            flat = value.detach().flatten()
            shown = ", ".join(f"{x:.6g}" for x in flat[:limit].tolist())
            more = ", ..." if flat.numel() > limit else ""
            return f"tensor of shape {tuple(value.shape)}: [{shown}{more}]"
        text = repr(value)
    except Exception as error:  # noqa: BLE001 - a value whose repr breaks is still described
        return f"a {type(value).__name__} that cannot be shown ({type(error).__name__})"
    return text if len(text) <= 120 else text[:117] + "..."


def _entry(value: float, other: float) -> str:
    """A number in a difference; -inf against a finite number is a removed token against a kept one."""
    if value == -math.inf and math.isfinite(other):
        return "-inf (removed)"
    if math.isfinite(value) and other == -math.inf:
        return f"{value:.6g} (kept)"
    return f"{value:.6g}"


def compare(expected: Any, got: Any, rtol: float, atol: float) -> str | None:
    """Why ``got`` does not match ``expected`` (None when it does), within the given tolerances.

    The difference shown is the largest among the entries that fail ``isclose`` (equal infinities are equal).

    >>> compare(torch.tensor([0.5, 0.5]), torch.tensor([0.5, 0.5]), 1e-5, 1e-6) is None
    True
    >>> compare(torch.tensor([0.5, 0.5]), [0.5, 0.5], 1e-5, 1e-6)
    'expected a torch.Tensor, got list'
    >>> compare(torch.tensor([-math.inf, 2.0, 2.0]), torch.tensor([-math.inf, 2.0, 1.0]), 1e-5, 1e-6)
    'largest difference at index (2,): expected 2, got 1 (tolerance rtol=1e-05, atol=1e-06)'
    """
    if isinstance(expected, torch.Tensor):
        if got is None:
            return "your function returned None (is a `return` missing?)"
        if not isinstance(got, torch.Tensor):
            return f"expected a torch.Tensor, got {type(got).__name__}"
        if got.shape != expected.shape:
            return f"expected shape {tuple(expected.shape)}, got shape {tuple(got.shape)}"
        if not got.is_floating_point() and expected.is_floating_point():
            return f"expected a floating-point tensor, got dtype {got.dtype}"
        got64, expected64 = got.detach().double(), expected.detach().double()
        close = torch.isclose(got64, expected64, rtol=rtol, atol=atol, equal_nan=True)
        if bool(close.all()):
            return None
        # inf - inf is nan: a failing entry with no finite difference counts as infinitely far
        distance = (got64 - expected64).abs().nan_to_num(nan=math.inf, posinf=math.inf).masked_fill(close, -1.0)
        worst = int(distance.flatten().argmax())
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), expected.shape))
        wanted, answered = expected64.flatten()[worst].item(), got64.flatten()[worst].item()
        return (f"largest difference at index {index}: expected {_entry(wanted, answered)}, "
                f"got {_entry(answered, wanted)} (tolerance rtol={rtol:g}, atol={atol:g})")
    if isinstance(expected, float):
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            return f"expected a number, got {type(got).__name__}"
        return None if math.isclose(got, expected, rel_tol=rtol, abs_tol=atol) else f"expected {expected:.6g}, got {got!r}"
    return None if _same(expected, got) else f"expected {expected!r}, got {got!r}"


# --------------------------------------------------------------------------------------------------------------
# The check


def _format_case(case: Case) -> str:
    parts = [_describe(a) for a in case.args] + [f"{k}={_describe(v)}" for k, v in case.kwargs.items()]
    return ", ".join(parts)


def _error_text(error: BaseException) -> str:
    """``TypeError: <the first line of its message>``: torch's messages go on to list every signature."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def _labkit_error(exercise: Exercise, what: str, error: BaseException) -> Verdict:
    return Verdict(exercise, "error", (
        f"{what}: {_error_text(error)}",
        "this is a problem on labkit's side, not in your code: your answer could not be checked",
        "run the check again; if it persists, restart the kernel, and tell your instructor if that does not help",
    ))


def check_function(exercise: Exercise, fn: Any, seed: int | None = None) -> Verdict:
    """Run every hand case, then ``n_random`` random cases, and return the verdict. Never raises.

    Only a KeyboardInterrupt (the learner pressed stop) goes through.
    """
    try:
        return _check(exercise, fn, seed)
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # noqa: BLE001 - the checker's own failure is reported, not raised
        return _labkit_error(exercise, "labkit's checker failed", error)


def _check(exercise: Exercise, fn: Any, seed: int | None) -> Verdict:
    if fn is None:
        return Verdict(exercise, "not attempted", (f"define `{exercise.function}` in the cell above and run it",))
    if not callable(fn):
        return Verdict(exercise, "failed", (f"`{exercise.function}` should be a function, it is a {type(fn).__name__}",))
    seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    generator = torch.Generator().manual_seed(seed)
    hand = list(exercise.hand_cases)
    try:
        cases = hand + [exercise.random_case(generator) for _ in range(exercise.n_random)]
    except Exception as error:  # noqa: BLE001
        return _labkit_error(exercise, f"labkit could not draw the random cases (seed {seed})", error)
    for number, case in enumerate(cases):
        kind = f"hand case {number + 1} of {len(hand)}" if number < len(hand) else (
            f"random case {number - len(hand) + 1} of {exercise.n_random} (seed {seed})")
        outcome = _call(exercise, fn, case)
        if isinstance(outcome.error, NotImplementedError) and not outcome.called_forbidden:
            return Verdict(exercise, "not attempted", (f"`{exercise.function}` still raises NotImplementedError: "
                                                       "replace the stub with your code and run that cell",))
        try:
            expected = exercise.reference(*copy.deepcopy(case.args), **copy.deepcopy(case.kwargs))
        except Exception as error:  # noqa: BLE001
            return _labkit_error(exercise, f"labkit's reference answer failed on {kind}", error)
        problem, hint, where = _judge(exercise, case, outcome, expected)
        if problem is not None:
            lines = [f"{kind}{': ' + case.label if case.label else ''}", f"  input:    {_format_case(case)}"]
            if outcome.error is None and not outcome.timed_out:
                lines += [f"  expected: {_describe(expected)}", f"  got:      {_describe(outcome.value)}"]
            lines.append(f"  problem:  {problem}")
            if where:
                lines.append(f"  where:    {where}")
            if hint:
                lines.append(f"  hint:     {hint}")
            return Verdict(exercise, "failed", tuple(lines))
    return Verdict(exercise, "passed", (
        f"{len(hand)} hand-computed cases and {exercise.n_random} random cases agree with labkit's reference "
        f"(rtol={exercise.rtol:g}, atol={exercise.atol:g})",))


def _judge(exercise: Exercise, case: Case, outcome: _Outcome,
           expected: Any) -> tuple[str | None, str | None, str | None]:
    """(problem, hint, where in the learner's code) for one call, or (None, None, None) when it is right."""
    if outcome.called_forbidden:
        if outcome.called_forbidden.startswith("torch."):  # e.g. torch's own loss in a loss exercise
            return (f"your function calls the ready-made `{outcome.called_forbidden}`",
                    "the point is to write it yourself from basic tensor operations", None)
        return (f"your function calls labkit's own `{outcome.called_forbidden}`",
                "the point is to write it yourself; " + exercise.allowed_text[0].lower() + exercise.allowed_text[1:],
                None)
    if outcome.timed_out:
        return (f"no answer within {exercise.time_limit_s:g} s", "look for a loop that never ends", None)
    if outcome.error is not None:
        error = outcome.error
        frame = _learner_frame(error.__traceback__)
        where = f"in {frame.name}: {frame.line}" if frame is not None and frame.line else None
        return f"your function raised {_error_text(error)}", _first_line(exercise.hints), where
    if len(outcome.printed) > FLOOD_CHARS:
        return (f"your function printed {len(outcome.printed):,} characters",
                "remove the print statements inside the function before checking", None)
    if outcome.mutated:
        return (outcome.mutated, "e.g. `logits = logits / t` makes a new tensor; `logits /= t` overwrites the caller's",
                None)
    problem = compare(expected, outcome.value, exercise.rtol, exercise.atol)
    if problem is None:
        return None, None, None
    return problem, _diagnose(exercise, case, outcome.value) or _first_line(exercise.hints), None


def _diagnose(exercise: Exercise, case: Case, got: Any) -> str | None:
    """The hint of the first known mistake that reproduces the learner's output on this case."""
    for mistake in exercise.mistakes:
        try:
            wrong = mistake.wrong(*copy.deepcopy(case.args), **copy.deepcopy(case.kwargs))
            if compare(wrong, got, exercise.rtol, exercise.atol) is None:
                return mistake.hint
        except Exception:  # noqa: BLE001 - a mistake that cannot run on this case does not match it
            continue
    return None


def _first_line(hints: tuple[str, ...]) -> str | None:
    return hints[0] if hints else None
