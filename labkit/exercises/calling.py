"""Calling a learner's function safely: on copies of its inputs, with its output captured, a time limit and a
tripwire on calls into labkit, so the learner's code never throws a traceback from here.

Each call runs on copies of the inputs, with its output captured and a time limit that no ``except`` or
``finally`` can swallow (``labkit.exercises.deadline`` says how, and where it stops). While it runs, a profile
hook reports any call into labkit (the reference or any other labkit function, except the helpers the exercise
allows) and into torch's ready-made equivalents the exercise forbids. What the call did is an :class:`Outcome`;
``labkit.exercises.checking`` judges it (in the notebook), or a grading worker sends it to the grader as plain
data (:func:`plain`, :func:`learner_frame`).

Layer 4 (exercises): imports the core, never widgets.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import io
import os
import sys
import sysconfig
import traceback
from types import CodeType, FrameType
from typing import Any, Callable

import torch

from labkit.exercises.comparing import same
from labkit.exercises.deadline import Deadline, TimeLimit, is_checker_code
from labkit.exercises.definitions import Case, Exercise, dotted_name

FLOOD_CHARS = 2_000  # more printed output than this from one call is reported as a failure


# --------------------------------------------------------------------------------------------------------------
# Where code lives: labkit's (reported when the learner calls it), the checker's own, and the learner's

_CHECKER_FILE = os.path.normcase(os.path.abspath(__file__))
_LABKIT_DIR = os.path.dirname(os.path.dirname(_CHECKER_FILE))  # labkit/, this file being labkit/exercises/calling.py
_TORCH_DIR = os.path.dirname(os.path.normcase(os.path.abspath(torch.__file__)))
_LIBRARY_DIRS = tuple(os.path.normcase(os.path.abspath(path)) for path in {
    sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")})
_LABKIT_NAMES: dict[CodeType, str | None] = {}  # code object -> "labkit.module.qualname", None when not labkit's


def labkit_name(code: CodeType) -> str | None:
    """``labkit.core.sampling.top_k_filter`` for code that lives in the labkit package (not the checker itself)."""
    if code in _LABKIT_NAMES:
        return _LABKIT_NAMES[code]
    path = os.path.normcase(os.path.abspath(code.co_filename))
    name = None
    if path.startswith(_LABKIT_DIR + os.sep) and not is_checker_code(code):
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


def learner_frame(tb: Any) -> traceback.FrameSummary | None:
    """The last traceback entry in the learner's own code (not torch, labkit or an installed library)."""
    for entry in reversed(traceback.extract_tb(tb)):
        path = os.path.normcase(os.path.abspath(entry.filename))
        if not path.startswith((_LABKIT_DIR + os.sep, _TORCH_DIR + os.sep, *(d + os.sep for d in _LIBRARY_DIRS))):
            return entry
    return None


# --------------------------------------------------------------------------------------------------------------
# Running one call of untrusted code


class Outcome:
    """What one call of the learner's function did: its value, or why there is none."""

    def __init__(self) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.timed_out = False
        self.printed = ""
        self.called_forbidden: str | None = None
        self.mutated: str | None = None
        self.where: str | None = None  # the learner's line that raised, when the error came without a traceback


def _snapshot(value: Any) -> Any:
    return copy.deepcopy(value)


def _tripwire(exercise: Exercise, outcome: Outcome) -> Callable[[FrameType, str, Any], None]:
    """A profile hook that names the first labkit function (or forbidden torch function) the learner's code calls.

    It runs on every call while the learner's function runs, so it does little: a dictionary look-up or two.
    Calls made from inside an allowed helper are the helper's business and are not looked at. Not seen: a labkit
    function behind ``functools.lru_cache`` answering from its cache (no Python call happens).
    """
    allowed = set().union(*(_codes_of(item) for item in exercise.allowed)) if exercise.allowed else set()
    forbidden: dict[Any, str] = {}
    for item in (exercise.reference, *exercise.forbidden):
        function = inspect.unwrap(item)
        forbidden[getattr(function, "__code__", function)] = dotted_name(item)
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
                outcome.called_forbidden = labkit_name(code)
        elif event == "return":
            if inside_allowed and frame is inside_allowed[-1]:
                inside_allowed.pop()
        elif event == "c_call" and not inside_allowed and not outcome.called_forbidden and arg in forbidden:
            outcome.called_forbidden = forbidden[arg]  # a forbidden torch function written in C

    return hook


def _with_own_exception_state(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)`` run inside a generator: a generator has its own "exception being handled" slot, so
    a time limit that fires inside the learner's ``except`` block cannot leave that exception behind as the
    context (``During handling of the above exception ...``) of every later, unrelated error in the process."""
    def run():
        yield fn(*args, **kwargs)

    return next(run())


def call_safely(exercise: Exercise, fn: Callable[..., Any], case: Case) -> Outcome:
    """Call ``fn`` on copies of the case's arguments with a time limit, captured output and a labkit tripwire."""
    outcome = Outcome()
    args, kwargs = _snapshot(case.args), _snapshot(case.kwargs)
    originals = _snapshot((args, kwargs))
    tripwire = _tripwire(exercise, outcome)
    # A float of its own in this frame: the grader's audit hook reads it there (never an attribute of an object, whose
    # class a learner cell could give a property that would then run inside the hook).
    limit_s = float(exercise.time_limit_s)
    deadline = Deadline(limit_s)
    previous_profile = sys.getprofile()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        try:
            deadline.start(sys._getframe())
            sys.setprofile(tripwire)
            try:
                outcome.value = _with_own_exception_state(fn, args, kwargs)
            finally:
                sys.setprofile(previous_profile)
                deadline.stop()
        except TimeLimit:
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
                except TimeLimit:
                    continue
    outcome.timed_out = deadline.expired
    outcome.printed = printed.getvalue()
    if not same((args, kwargs), originals):
        outcome.mutated = "your function changed its input in place; work on a copy (or use out-of-place operations)"
    return outcome


def plain(value: Any, depth: int = 0) -> Any:
    """A prediction as plain data, so no behaviour of the learner's objects takes part in judging it: a
    one-number tensor or NumPy scalar becomes its number, a subclass of int, float or str its plain value, a
    tuple or list (two levels deep at most) a tuple of plain items; anything else is left as it is (and is then
    not well-formed).

    >>> class Loud(str):
    ...     def __eq__(self, other): return True
    >>> type(plain(Loud("b"))), plain(torch.tensor(4.0)), plain(["A", "AB"])
    (<class 'str'>, 4.0, ('A', 'AB'))
    """
    try:
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            return plain(value.item(), depth)
        if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "size", 0) == 1:
            return plain(value.item(), depth)
        if isinstance(value, bool):
            return bool(value)
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return float(value)
        if isinstance(value, str):
            return str.__str__(value)
        if isinstance(value, (tuple, list)) and depth < 2:
            return tuple(plain(item, depth + 1) for item in value)
    except Exception:  # noqa: BLE001 - an object that breaks on conversion is simply not well-formed
        return value
    return value
