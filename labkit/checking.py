"""Checking a learner's function against labkit's reference, kindly and honestly.

An :class:`Exercise` is registered once: the function name the learner defines, the reference it is compared
with, hand-computed cases (boundaries included), a generator of random cases, tolerances, and the mistakes
learners really make, each with the hint that points at it. :func:`check_function` runs every case and returns
a :class:`Verdict`: passed, failed (first failing case, expected, got, the difference and a hint), or not
attempted (the stub still raises ``NotImplementedError``).

The learner's code never throws a traceback from here. Each call runs on copies of the inputs, with its output
captured and a time limit, and a call into the reference itself is noticed and reported. Random cases draw a
fresh seed every check, so a memorized answer fails; the seed is printed with a failure so it can be replayed.

Layer 4 (exercises): imports the core, never widgets.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import random
import signal
import sys
import threading
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class Exercise:
    """A graded exercise: what the learner writes and how it is checked."""

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
    forbidden: tuple[Callable[..., Any], ...] = ()  # labkit functions the learner may not call (the reference is always)
    time_limit_s: float = 5.0  # per call

    @property
    def lab(self) -> str:
        return self.id.split(".", 1)[0]


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check, printable as plain text (and as HTML in a notebook)."""

    exercise: Exercise
    status: str  # "passed", "failed" or "not attempted"
    lines: tuple[str, ...]  # the explanation, one line each

    @property
    def points(self) -> int:
        return self.exercise.points if self.status == "passed" else 0

    def __str__(self) -> str:
        mark = {"passed": "PASSED", "failed": "FAILED", "not attempted": "NOT ATTEMPTED"}[self.status]
        head = f"[{mark}] {self.exercise.title} ({self.points}/{self.exercise.points} points)"
        return "\n".join([head, *(f"  {line}" for line in self.lines)])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        import html

        colour = {"passed": "#1a7f37", "failed": "#cf222e", "not attempted": "#9a6700"}[self.status]
        body = "<br>".join(html.escape(line) for line in self.lines)
        title = html.escape(f"{self.status.upper()}: {self.exercise.title} ({self.points}/{self.exercise.points})")
        return (f'<div style="border-left:4px solid {colour};padding:4px 10px;font-family:monospace">'
                f'<b style="color:{colour}">{title}</b><br>{body}</div>')


# --------------------------------------------------------------------------------------------------------------
# Running one call of untrusted code


class _TimeLimit(BaseException):
    """Raised inside the learner's code when its time is up (BaseException: a bare ``except`` won't eat it)."""


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


def _call(exercise: Exercise, fn: Callable[..., Any], case: Case) -> _Outcome:
    """Call ``fn`` on copies of the case's arguments with a time limit, captured output and a reference tripwire."""
    outcome = _Outcome()
    args, kwargs = _snapshot(case.args), _snapshot(case.kwargs)
    originals = _snapshot((args, kwargs))
    forbidden = {f.__code__: f"{f.__module__}.{f.__qualname__}" for f in (exercise.reference, *exercise.forbidden)}

    def tripwire(frame, event, arg):  # a profile hook: sees every Python call the learner's code makes
        if event == "call" and frame.f_code in forbidden and outcome.called_forbidden is None:
            outcome.called_forbidden = forbidden[frame.f_code]

    def on_alarm(signum, frame):
        raise _TimeLimit

    # SIGALRM interrupts a runaway loop, but only the main thread can receive it (Jupyter runs cells there).
    use_alarm = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    previous_handler = signal.signal(signal.SIGALRM, on_alarm) if use_alarm else None
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            if use_alarm:
                signal.setitimer(signal.ITIMER_REAL, exercise.time_limit_s)
            sys.setprofile(tripwire)
            try:
                outcome.value = fn(*args, **kwargs)
            finally:
                sys.setprofile(None)
                if use_alarm:
                    signal.setitimer(signal.ITIMER_REAL, 0)
    except _TimeLimit:
        outcome.timed_out = True
    except BaseException as error:  # noqa: BLE001 - anything the learner's code raises becomes a verdict
        if isinstance(error, KeyboardInterrupt):
            raise  # the learner pressed stop: respect it
        outcome.error = error
    finally:
        if use_alarm:
            signal.signal(signal.SIGALRM, previous_handler)
    outcome.printed = printed.getvalue()
    if not _same((args, kwargs), originals):
        outcome.mutated = "your function changed its input in place; work on a copy (or use out-of-place operations)"
    return outcome


# --------------------------------------------------------------------------------------------------------------
# Comparing results


def _describe(value: Any, limit: int = 8) -> str:
    if isinstance(value, torch.Tensor):
        flat = value.detach().flatten()
        shown = ", ".join(f"{x:.6g}" for x in flat[:limit].tolist())
        more = ", ..." if flat.numel() > limit else ""
        return f"tensor of shape {tuple(value.shape)}: [{shown}{more}]"
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def compare(expected: Any, got: Any, rtol: float, atol: float) -> str | None:
    """Why ``got`` does not match ``expected`` (None when it does), within the given tolerances.

    >>> compare(torch.tensor([0.5, 0.5]), torch.tensor([0.5, 0.5]), 1e-5, 1e-6) is None
    True
    >>> compare(torch.tensor([0.5, 0.5]), [0.5, 0.5], 1e-5, 1e-6)
    'expected a torch.Tensor, got list'
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
        worst = int((got64 - expected64).abs().nan_to_num(nan=math.inf).flatten().argmax())
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), expected.shape))
        return (f"largest difference at index {index}: expected {expected64.flatten()[worst].item():.6g}, "
                f"got {got64.flatten()[worst].item():.6g} (tolerance rtol={rtol:g}, atol={atol:g})")
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


def check_function(exercise: Exercise, fn: Any, seed: int | None = None) -> Verdict:
    """Run every hand case, then ``n_random`` random cases, and return the verdict. Never raises."""
    if fn is None:
        return Verdict(exercise, "not attempted", (f"define `{exercise.function}` in the cell above and run it",))
    if not callable(fn):
        return Verdict(exercise, "failed", (f"`{exercise.function}` should be a function, it is a {type(fn).__name__}",))
    seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    generator = torch.Generator().manual_seed(seed)
    hand = list(exercise.hand_cases)
    cases = hand + [exercise.random_case(generator) for _ in range(exercise.n_random)]
    for number, case in enumerate(cases):
        kind = f"hand case {number + 1} of {len(hand)}" if number < len(hand) else (
            f"random case {number - len(hand) + 1} of {exercise.n_random} (seed {seed})")
        outcome = _call(exercise, fn, case)
        if isinstance(outcome.error, NotImplementedError):
            return Verdict(exercise, "not attempted", (f"`{exercise.function}` still raises NotImplementedError: "
                                                       "replace the stub with your code and run that cell",))
        expected = exercise.reference(*copy.deepcopy(case.args), **copy.deepcopy(case.kwargs))
        problem, hint = _judge(exercise, case, outcome, expected)
        if problem is not None:
            lines = [f"{kind}{': ' + case.label if case.label else ''}", f"  input:    {_format_case(case)}"]
            if outcome.error is None and not outcome.timed_out:
                lines += [f"  expected: {_describe(expected)}", f"  got:      {_describe(outcome.value)}"]
            lines.append(f"  problem:  {problem}")
            if hint:
                lines.append(f"  hint:     {hint}")
            return Verdict(exercise, "failed", tuple(lines))
    return Verdict(exercise, "passed", (
        f"{len(hand)} hand-computed cases and {exercise.n_random} random cases agree with labkit's reference "
        f"(rtol={exercise.rtol:g}, atol={exercise.atol:g})",))


def _judge(exercise: Exercise, case: Case, outcome: _Outcome, expected: Any) -> tuple[str | None, str | None]:
    """(problem, hint) for one call, or (None, None) when it is right."""
    if outcome.called_forbidden:
        if outcome.called_forbidden.startswith("torch."):  # e.g. torch's own loss in a loss exercise
            return (f"your function calls the ready-made `{outcome.called_forbidden}`",
                    "the point is to write it yourself from basic tensor operations")
        return (f"your function calls labkit's own `{outcome.called_forbidden}`",
                "the point is to write it yourself; the checker compares against that very function")
    if outcome.timed_out:
        return (f"no answer within {exercise.time_limit_s:g} s", "look for a loop that never ends")
    if outcome.error is not None:
        error = outcome.error
        return (f"your function raised {type(error).__name__}: {error}", _first_line(exercise.hints))
    if len(outcome.printed) > FLOOD_CHARS:
        return (f"your function printed {len(outcome.printed):,} characters",
                "remove the print statements inside the function before checking")
    if outcome.mutated:
        return outcome.mutated, "e.g. `logits = logits / t` makes a new tensor; `logits /= t` overwrites the caller's"
    problem = compare(expected, outcome.value, exercise.rtol, exercise.atol)
    if problem is None:
        return None, None
    return problem, _diagnose(exercise, case, outcome.value) or _first_line(exercise.hints)


def _diagnose(exercise: Exercise, case: Case, got: Any) -> str | None:
    """The hint of the first known mistake that reproduces the learner's output on this case."""
    for mistake in exercise.mistakes:
        try:
            wrong = mistake.wrong(*copy.deepcopy(case.args), **copy.deepcopy(case.kwargs))
        except Exception:  # noqa: BLE001 - a mistake that cannot run on this case does not match it
            continue
        if compare(wrong, got, exercise.rtol, exercise.atol) is None:
            return mistake.hint
    return None


def _first_line(hints: tuple[str, ...]) -> str | None:
    return hints[0] if hints else None
