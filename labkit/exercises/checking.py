"""Checking a learner's function against labkit's reference, kindly and honestly.

An :class:`Exercise` is registered once: the function name the learner defines, the reference it is compared
with, hand-computed cases (boundaries included), a generator of random cases, tolerances, the labkit helpers the
learner may call, and the mistakes learners really make, each with the hint that points at it.
:func:`check_function` runs every case and returns a :class:`Verdict`: passed, failed (first failing case,
expected, got, the difference and a hint), not attempted (the stub still raises ``NotImplementedError``), or
error (labkit's own side broke: the reference or the random cases raised; never the learner's fault).

The learner's code never throws a traceback from here. Each call runs on copies of the inputs, with its output
captured and a time limit that no ``except`` or ``finally`` can swallow (``labkit.exercises.deadline`` says how,
and where it stops). While it runs, a profile hook reports any call into labkit (the reference or any other labkit
function, except the helpers the exercise allows) and into torch's ready-made equivalents the exercise forbids.
Random cases draw a fresh seed every check, so a memorized answer fails; the seed is printed with a failure so it
can be replayed.

Layer 4 (exercises): imports the core, never widgets.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import io
import math
import os
import random
import sys
import sysconfig
import traceback
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any, Callable

import torch

from labkit.exercises.deadline import Deadline, TimeLimit, is_checker_code

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
    """The public name a learner would type: ``torch.quantize_per_tensor``, not the private class torch's C
    functions hang on (``torch._VariableFunctionsClass.quantize_per_tensor``)."""
    name = getattr(item, "__name__", None)
    for public in (torch, torch.nn.functional, torch.linalg):
        if name and getattr(public, name, None) is item:
            return f"{public.__name__}.{name}"
    return f"{getattr(item, '__module__', None) or '?'}.{getattr(item, '__qualname__', None) or name}"


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
    kind: str = "code"  # "code": scored on agreeing with the reference; "prediction": see :func:`prediction`
    choices: tuple[Any, ...] = ()  # a prediction's possible answers, when it is a choice (a letter, a GPU count)
    grader_cases: tuple[Case, ...] = ()  # hand cases only ``labkit grade`` runs (the notebook's check does not)

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
    close: bool | None = None  # a prediction's accuracy (not scored); None for other exercises

    @property
    def points(self) -> int:
        return self.exercise.points if self.status == "passed" else 0

    @property
    def mark(self) -> str:
        """PASSED, FAILED, ...; a well-formed prediction is ANSWERED (its point is for answering, right or not)."""
        return "ANSWERED" if self.exercise.kind == "prediction" and self.status == "passed" else _MARKS[self.status]

    def __str__(self) -> str:
        mark = self.mark
        head = f"[{mark}] {self.exercise.title} ({self.points}/{self.exercise.points} points)"
        return "\n".join([head, *(f"  {line}" for line in self.lines)])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        import html

        colour = {"passed": "#1a7f37", "failed": "#cf222e", "not attempted": "#9a6700", "error": "#6e40c9"}[self.status]
        body = "<br>".join(html.escape(line) for line in self.lines)
        title = html.escape(f"{self.mark}: {self.exercise.title} ({self.points}/{self.exercise.points})")
        return (f'<div style="border-left:4px solid {colour};padding:4px 10px;font-family:monospace">'
                f'<b style="color:{colour}">{title}</b><br>{body}</div>')


_MARKS = {"passed": "PASSED", "failed": "FAILED", "not attempted": "NOT ATTEMPTED", "error": "LABKIT ERROR"}


# --------------------------------------------------------------------------------------------------------------
# Where code lives: labkit's (reported when the learner calls it), the checker's own, and the learner's

_CHECKER_FILE = os.path.normcase(os.path.abspath(__file__))
_LABKIT_DIR = os.path.dirname(os.path.dirname(_CHECKER_FILE))  # labkit/, this file being labkit/exercises/checking.py
_TORCH_DIR = os.path.dirname(os.path.normcase(os.path.abspath(torch.__file__)))
_LIBRARY_DIRS = tuple(os.path.normcase(os.path.abspath(path)) for path in {
    sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")})
_LABKIT_NAMES: dict[CodeType, str | None] = {}  # code object -> "labkit.module.qualname", None when not labkit's


def _labkit_name(code: CodeType) -> str | None:
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


def _learner_frame(tb: Any) -> traceback.FrameSummary | None:
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


def _with_own_exception_state(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)`` run inside a generator: a generator has its own "exception being handled" slot, so
    a time limit that fires inside the learner's ``except`` block cannot leave that exception behind as the
    context (``During handling of the above exception ...``) of every later, unrelated error in the process."""
    def run():
        yield fn(*args, **kwargs)

    return next(run())


def _call(exercise: Exercise, fn: Callable[..., Any], case: Case) -> Outcome:
    """Call ``fn`` on copies of the case's arguments with a time limit, captured output and a labkit tripwire."""
    outcome = Outcome()
    args, kwargs = _snapshot(case.args), _snapshot(case.kwargs)
    originals = _snapshot((args, kwargs))
    tripwire = _tripwire(exercise, outcome)
    deadline = Deadline(exercise.time_limit_s)
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
    name = getattr(error, "type_name", None) or type(error).__name__  # a ReportedError names the original type
    return f"{name}: {lines[0]}" if lines else name


class ReportedError(Exception):
    """An error the learner's function raised in another process, known by its type's name and message only."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(message)
        self.type_name = type_name


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
    if exercise.kind == "prediction":
        return prediction_verdict(exercise, lambda: _call(exercise, fn, exercise.hand_cases[0]))
    seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    try:
        cases = draw_cases(exercise, seed)
    except Exception as error:  # noqa: BLE001
        return _labkit_error(exercise, f"labkit could not draw the random cases (seed {seed})", error)
    return code_verdict(exercise, cases, seed, lambda number, case: _call(exercise, fn, case))


def draw_cases(exercise: Exercise, seed: int, extra: tuple[Case, ...] = ()) -> list[Case]:
    """The hand cases, then ``extra`` (a grader's own hand cases), then ``n_random`` random cases drawn from
    ``seed``. May raise (labkit's side)."""
    generator = torch.Generator().manual_seed(seed)
    return [*exercise.hand_cases, *extra, *(exercise.random_case(generator) for _ in range(exercise.n_random))]


def _case_kind(exercise: Exercise, number: int, n_cases: int, seed: int) -> str:
    n_hand = n_cases - exercise.n_random
    if number < n_hand:
        return f"hand case {number + 1} of {n_hand}"
    return f"random case {number - n_hand + 1} of {exercise.n_random} (seed {seed})"


def code_verdict(exercise: Exercise, cases: list[Case], seed: int,
                 outcome_of: Callable[[int, Case], Outcome]) -> Verdict:
    """The verdict of a code exercise over ``cases``: ``outcome_of(number, case)`` is what the learner's function
    did on that case (called here, or answered by a grading worker); the first failing case decides.

    The comparison, the reference's answer and the hints are computed here, never by the learner's code.
    """
    n_hand = len(cases) - exercise.n_random
    for number, case in enumerate(cases):
        kind = _case_kind(exercise, number, len(cases), seed)
        outcome = outcome_of(number, case)
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
    if not exercise.n_random and n_hand == 1:
        return Verdict(exercise, "passed", (f"your answer agrees with labkit's ({tolerance_words(exercise)})",))
    return Verdict(exercise, "passed", (
        f"{n_hand} hand-computed cases and {exercise.n_random} random cases agree with labkit's reference "
        f"(rtol={exercise.rtol:g}, atol={exercise.atol:g})",))


def _judge(exercise: Exercise, case: Case, outcome: Outcome,
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
        where = f"in {frame.name}: {frame.line}" if frame is not None and frame.line else outcome.where
        return f"your function raised {_error_text(error)}", _first_line(exercise.hints), where
    if len(outcome.printed) > FLOOD_CHARS:
        return (f"your function printed {len(outcome.printed):,} characters",
                "remove the print statements inside the function before checking", None)
    if outcome.mutated:
        return (outcome.mutated,
                "e.g. `x = x / 2` makes a new tensor; `x /= 2` (or `x[0] = ...`) overwrites the caller's", None)
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


# --------------------------------------------------------------------------------------------------------------
# A prediction: asked before the notebook computes the answer, scored on the commitment
#
# The point is for a well-formed answer (a number where a number is asked, one of the choices where a choice is);
# the verdict then shows labkit's answer, the distance and a word on it, and how close the prediction came is
# recorded (``Verdict.close``, the progress file, the gradebook's accuracy column) without changing the score. So
# reading the answer and editing gains nothing: the point was already earned by answering at all. A malformed
# answer fails without showing labkit's answer, so a learner can fix the form without seeing it.


def _no_random_case(generator: torch.Generator) -> Case:
    return Case(())


def prediction(id: str, title: str, function: str, answer: Callable[[], Any], *, asked: str, hint: str,
               rtol: float = 0.0, atol: float = 0.0, points: int = 1, choices: tuple[Any, ...] = ()) -> Exercise:
    """A predict-then-check exercise: the learner's ``function()`` takes no argument and returns a prediction.

    It earns its points when it is well-formed (:func:`prediction_problem`); ``answer()`` (labkit computing the
    truth) then decides only whether it was *close*: within rtol/atol for a number, equal otherwise.

    >>> guess = prediction("zz.guess", "Predict: 2 + 2", "predicted_sum", lambda: 4.0, asked="2 + 2", hint="add",
    ...                    atol=0.5)
    >>> guess.kind, guess.n_random, guess.hand_cases[0].label, guess.hints
    ('prediction', 0, '2 + 2', ('add',))
    """
    return Exercise(id=id, title=title, function=function, reference=answer, points=points, n_random=0,
                    rtol=rtol, atol=atol, hand_cases=(Case((), label=asked),), random_case=_no_random_case,
                    hints=(hint,), kind="prediction", choices=tuple(choices))


def single_answer(id: str, title: str, function: str, answer: Callable[[], Any], *, asked: str, hint: str,
                  rtol: float = 0.0, atol: float = 0.0, points: int = 1) -> Exercise:
    """A computed answer (not a prediction): ``function()`` takes no argument and is scored on agreeing with
    ``answer()`` within rtol/atol, like any code exercise."""
    return Exercise(id=id, title=title, function=function, reference=answer, points=points, n_random=0,
                    rtol=rtol, atol=atol, hand_cases=(Case((), label=asked),), random_case=_no_random_case,
                    hints=(hint,))


def _plain(value: Any, depth: int = 0) -> Any:
    """A prediction as plain data, so no behaviour of the learner's objects takes part in judging it: a
    one-number tensor or NumPy scalar becomes its number, a subclass of int, float or str its plain value, a
    tuple or list (two levels deep at most) a tuple of plain items; anything else is left as it is (and is then
    not well-formed).

    >>> class Loud(str):
    ...     def __eq__(self, other): return True
    >>> type(_plain(Loud("b"))), _plain(torch.tensor(4.0)), _plain(["A", "AB"])
    (<class 'str'>, 4.0, ('A', 'AB'))
    """
    try:
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            return _plain(value.item(), depth)
        if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "size", 0) == 1:
            return _plain(value.item(), depth)
        if isinstance(value, bool):
            return bool(value)
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return float(value)
        if isinstance(value, str):
            return str.__str__(value)
        if isinstance(value, (tuple, list)) and depth < 2:
            return tuple(_plain(item, depth + 1) for item in value)
    except Exception:  # noqa: BLE001 - an object that breaks on conversion is simply not well-formed
        return value
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def prediction_problem(truth: Any, value: Any, choices: tuple[Any, ...] = ()) -> str | None:
    """Why ``value`` is not a well-formed prediction of something like ``truth`` (None when it is).

    Never says what the truth is: a learner fixes the form without seeing the answer.

    >>> prediction_problem(7, 7.5), prediction_problem("b", "e", choices=("a", "b", "c", "d"))
    (None, "your answer must be one of 'a', 'b', 'c', 'd', got 'e'")
    >>> prediction_problem(0.25, "0.25")
    'your answer must be a number, got str'
    """
    if hasattr(truth, "prediction_problem"):  # an answer type with its own rule (e.g. an order of names)
        return truth.prediction_problem(value)
    if choices:
        if not any((type(value) is type(choice) or _is_number(value) and _is_number(choice)) and value == choice
                   for choice in choices):
            return f"your answer must be one of {', '.join(map(repr, choices))}, got {_describe(value)}"
        return None
    if _is_number(truth):
        if not _is_number(value):
            return f"your answer must be a number, got {type(value).__name__}"
        return None if math.isfinite(value) else f"your answer must be a finite number, got {value!r}"
    if isinstance(truth, str):
        return None if isinstance(value, str) else f"your answer must be a string, got {type(value).__name__}"
    if isinstance(truth, (tuple, list)):
        if not isinstance(value, (tuple, list)) or len(value) != len(truth):
            return f"your answer must be a tuple or list of {len(truth)} items, got {_describe(value)}"
        for number, (want, got) in enumerate(zip(truth, value)):
            problem = prediction_problem(want, got)
            if problem is not None:
                return f"item {number + 1}: {problem}"
        return None
    if type(value) is type(truth):
        return None
    return f"your answer must be a {type(truth).__name__}, got {type(value).__name__}"


def tolerance_words(exercise: Exercise) -> str:
    """How close counts as close, in words.

    >>> tolerance_words(prediction("zz.x", "X", "x", lambda: 1.0, asked="", hint="", rtol=0.5))
    'within a factor of two'
    """
    rtol, atol = exercise.rtol, exercise.atol
    if rtol == 0.5 and not atol:
        return "within a factor of two"
    parts = ([f"within {rtol:.0%}" if rtol >= 0.01 else f"within a relative {rtol:g}"] if rtol else []) + (
        [f"within ±{atol:.2g}"] if atol else [])
    return " or ".join(parts) if parts else "exactly"


def distance_words(truth: Any, value: Any) -> str:
    """How far a prediction is from the truth, in words.

    >>> distance_words(162, 120), distance_words(4.0, 12.5), distance_words(5, 6), distance_words("b", "b")
    ('26% too low', 'off by 3.1x (too high)', '1 too high', 'right')
    """
    if hasattr(truth, "distance_words"):
        return truth.distance_words(value)
    if not (_is_number(truth) and _is_number(value)):
        return "right" if _same(truth, value) else "not the answer"
    if value == truth:
        return "exactly right"
    direction = "too high" if value > truth else "too low"
    if isinstance(truth, int) and float(value).is_integer() and abs(value - truth) <= 3:
        return f"{abs(int(value) - truth)} {direction}"
    if truth == 0 or value / truth <= 0:
        return f"off by {abs(value - truth):.3g} ({direction})"
    ratio = value / truth
    if ratio >= 2 or ratio <= 0.5:
        return f"off by {max(ratio, 1 / ratio):.1f}x ({direction})"
    return f"{abs(ratio - 1):.0%} {direction}"


_PREDICTION_ANSWERS: dict[Callable[[], Any], Any] = {}


def _prediction_answer(reference: Callable[[], Any]) -> Any:
    """A prediction's answer, computed once per process: it is a fixed fact (some run the model for seconds), and
    a learner checks again and again."""
    if reference not in _PREDICTION_ANSWERS:
        _PREDICTION_ANSWERS[reference] = reference()
    return copy.deepcopy(_PREDICTION_ANSWERS[reference])


def prediction_verdict(exercise: Exercise, outcome_of: Callable[[], Outcome]) -> Verdict:
    """The verdict of a prediction: ``outcome_of()`` is what the learner's function answered (called here, or by
    a grading worker); labkit's answer and the judging are computed here."""
    # labkit's answer first: the learner's call may be stopped at its time limit anywhere, even halfway through a
    # lazy import of labkit's own (when it calls labkit), which must not break the answer computed after it.
    try:
        truth = _prediction_answer(exercise.reference)
    except Exception as error:  # noqa: BLE001
        return _labkit_error(exercise, "labkit could not compute the answer", error)
    outcome = outcome_of()
    if isinstance(outcome.error, NotImplementedError) and not outcome.called_forbidden:
        return Verdict(exercise, "not attempted", (f"`{exercise.function}` still raises NotImplementedError: "
                                                   "replace the stub with your prediction and run that cell",))
    value = _plain(outcome.value)
    if outcome.called_forbidden or outcome.timed_out or outcome.error is not None:
        problem, hint, where = _judge(exercise, exercise.hand_cases[0], outcome, truth)
    else:
        problem, hint, where = prediction_problem(truth, value, exercise.choices), _first_line(exercise.hints), None
    if problem is not None:  # not a prediction yet: say what is accepted, never the answer
        lines = [f"asked:    {exercise.hand_cases[0].label}", f"problem:  {problem}"]
        lines += [f"where:    {where}"] if where else []
        lines += [f"hint:     {hint}"] if hint else []
        return Verdict(exercise, "failed", tuple(lines))
    if _is_number(truth) and _is_number(value):
        close = math.isclose(value, truth, rel_tol=exercise.rtol, abs_tol=exercise.atol)
    else:
        close = compare(truth, value, exercise.rtol, exercise.atol) is None
    tolerance = tolerance_words(exercise)
    return Verdict(exercise, "passed", (
        f"your prediction: {_describe(value)}",
        f"labkit's answer: {_describe(truth)}",
        f"distance:        {distance_words(truth, value)}"
        + ("" if tolerance == "exactly" else f"; close ({tolerance}): {'yes' if close else 'no'}"),
        "the point is for committing to an answer before the reveal; how close it came is recorded as your "
        "prediction accuracy, not scored",
    ), close=close)
