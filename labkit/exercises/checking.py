"""Judging a learner's answers against labkit's reference, kindly and honestly.

:func:`check_function` draws every case of an exercise (``labkit.exercises.definitions``, :func:`draw_cases`), calls
the learner's function on each through ``labkit.exercises.calling``, compares each answer with labkit's through
``labkit.exercises.comparing``, and returns a verdict: passed, failed (first failing case, expected, got, the
difference and a hint), not attempted (the stub still raises ``NotImplementedError``), or error (labkit's own side
broke: the reference or the random cases raised; never the learner's fault). Random cases draw a fresh seed every
check, so a memorized answer fails; the seed is printed with a failure so it can be replayed. The grader judges
the answers its worker sent with the same :func:`code_verdict` and :func:`prediction_verdict`.

Layer 4 (exercises): imports the core, never widgets.
"""

from __future__ import annotations

import copy
import math
import random
from typing import Any, Callable, Iterator

import torch

from labkit.exercises.calling import FLOOD_CHARS, Outcome, call_safely, learner_frame, plain
from labkit.exercises.comparing import compare, distance_words, is_number, tolerance_words
from labkit.exercises.definitions import Case, Exercise, Verdict


# --------------------------------------------------------------------------------------------------------------
# A case, shown


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


def labkit_error(exercise: Exercise, what: str, error: BaseException) -> Verdict:
    """The verdict when labkit's own side broke (``what`` failed with ``error``): never the learner's fault."""
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
        return labkit_error(exercise, "labkit's checker failed", error)


def draw_cases(exercise: Exercise, seed: int, extra: tuple[Case, ...] = ()) -> list[Case]:
    """The hand cases, then ``extra`` (a grader's own hand cases), then ``n_random`` random cases drawn from
    ``seed``. May raise (labkit's side)."""
    generator = torch.Generator().manual_seed(seed)
    return [*exercise.hand_cases, *extra, *(exercise.random_case(generator) for _ in range(exercise.n_random))]


def _check(exercise: Exercise, fn: Any, seed: int | None) -> Verdict:
    if fn is None:
        return Verdict(exercise, "not attempted", (f"define `{exercise.function}` in the cell above and run it",))
    if not callable(fn):
        return Verdict(exercise, "failed", (f"`{exercise.function}` should be a function, it is a {type(fn).__name__}",))
    if exercise.kind == "prediction":
        return prediction_verdict(exercise, lambda: call_safely(exercise, fn, exercise.hand_cases[0]))
    seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    try:
        cases = draw_cases(exercise, seed)
    except Exception as error:  # noqa: BLE001
        return labkit_error(exercise, f"labkit could not draw the random cases (seed {seed})", error)
    return code_verdict(exercise, cases, seed, lambda number, case: call_safely(exercise, fn, case))


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
            return labkit_error(exercise, f"labkit's reference answer failed on {kind}", error)
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
        hint = "the point is to write it yourself; " + exercise.allowed_text[0].lower() + exercise.allowed_text[1:]
        module, _, name = outcome.called_forbidden.rpartition(".")
        if module and name == exercise.function:  # the learner's name itself may have become labkit's function
            hint += (f" (if a later cell ran `from {module} import {name}`, that replaced your function: import the "
                     f"module instead, `import {module} as lib`, then `lib.{name}(...)`, and run your cell again)")
        return f"your function calls labkit's own `{outcome.called_forbidden}`", hint, None
    if outcome.timed_out:
        return (f"no answer within {exercise.time_limit_s:g} s", "look for a loop that never ends", None)
    if outcome.error is not None:
        error = outcome.error
        frame = learner_frame(error.__traceback__)
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
    index = next(matching_mistakes(exercise, case, got), None)
    return None if index is None else exercise.mistakes[index].hint


def matching_mistakes(exercise: Exercise, case: Case, got: Any) -> Iterator[int]:
    """The indices in ``exercise.mistakes`` of the known mistakes whose output on ``case`` is ``got`` (within the
    exercise's tolerances), in registration order, each tried only when asked for. The check's hint and the
    grader's "which mistake" (``labkit.instructor.grader.judging``) are this one test."""
    for index, mistake in enumerate(exercise.mistakes):
        try:
            wrong = mistake.wrong(*copy.deepcopy(case.args), **copy.deepcopy(case.kwargs))
            matched = compare(wrong, got, exercise.rtol, exercise.atol) is None
        except Exception:  # noqa: BLE001 - a mistake that cannot run on this case does not match it
            continue
        if matched:
            yield index


def _first_line(hints: tuple[str, ...]) -> str | None:
    return hints[0] if hints else None


# --------------------------------------------------------------------------------------------------------------
# A prediction: judged on its form; how close it came is recorded, not scored (``definitions`` says why)


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
        if not any((type(value) is type(choice) or is_number(value) and is_number(choice)) and value == choice
                   for choice in choices):
            return f"your answer must be one of {', '.join(map(repr, choices))}, got {_describe(value)}"
        return None
    if is_number(truth):
        if not is_number(value):
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
        return labkit_error(exercise, "labkit could not compute the answer", error)
    outcome = outcome_of()
    if isinstance(outcome.error, NotImplementedError) and not outcome.called_forbidden:
        return Verdict(exercise, "not attempted", (f"`{exercise.function}` still raises NotImplementedError: "
                                                   "replace the stub with your prediction and run that cell",))
    value = plain(outcome.value)
    if outcome.called_forbidden or outcome.timed_out or outcome.error is not None:
        problem, hint, where = _judge(exercise, exercise.hand_cases[0], outcome, truth)
    else:
        problem, hint, where = prediction_problem(truth, value, exercise.choices), _first_line(exercise.hints), None
    if problem is not None:  # not a prediction yet: say what is accepted, never the answer
        lines = [f"asked:    {exercise.hand_cases[0].label}", f"problem:  {problem}"]
        lines += [f"where:    {where}"] if where else []
        lines += [f"hint:     {hint}"] if hint else []
        return Verdict(exercise, "failed", tuple(lines))
    if is_number(truth) and is_number(value):
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
    ), close=close, reveal=exercise.reveal)
