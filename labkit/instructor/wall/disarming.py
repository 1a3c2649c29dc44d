"""The forbidden functions of an exercise, found and disarmed while its answers are computed (inside the kernel).

:class:`Kit` binds, once and before any learner code, each exercise and the labkit code its reference reaches
(:func:`labkit.instructor.wall.reach.forbidden_codes`). At the answering step :func:`find_copies` finds every
function object running that code, or a copy of it (the same code object, or the same file, first line and
qualified name), and :func:`answer_plan` calls the learner's function on each case with all of them
disarmed (:func:`disarm`, then :func:`rearm`): their code swapped in place for a tripwire, so every alias,
``partial``, thread or callback that holds one reaches the tripwire, and the exercise fails naming it. :mod:`labkit.instructor.wall.answering` runs
this inside its audit hook, on copies of these functions over a private copy of this module's names and the
built-ins made before any learner code: what the step reads here, a cell cannot have replaced (the objects it
needs from other modules, ``gc.get_objects`` and the function and code types, are bound as this module loads).

Layer 5 (instructor tools).
"""

from __future__ import annotations

import gc
import types
from typing import Any

# Bound as the module loads (before any learner cell, in the grader's kernel): a cell may later replace
# gc.get_objects or the types module's names, which these keep out of the step.
_get_objects, _FunctionType, _CodeType = gc.get_objects, types.FunctionType, types.CodeType


class Kit:
    """What the answering step uses, bound once: the exercises by id, the labkit code each may not reach, and the
    checker's call (a learner cell that replaces a module's name later changes nothing here). At the step,
    :func:`find_copies` finds every function object running that code, copies included. ``encode``: how the step
    writes an exercise's answers as JSON text while its functions are still disarmed (None: kept as plain data)."""

    def __init__(self, chosen: list[Any]) -> None:
        from labkit.exercises.calling import FLOOD_CHARS, call_safely, plain
        from labkit.exercises.definitions import Case
        from labkit.instructor.wall import wire
        from labkit.instructor.wall.reach import forbidden_codes

        self.exercises = {exercise.id: exercise for exercise in chosen}
        self.forbidden = {exercise.id: forbidden_codes(exercise) for exercise in chosen}
        self.targets: dict[str, list[tuple[types.FunctionType, types.CodeType, str]]] = {
            exercise.id: [] for exercise in chosen}
        self.call_safely, self.plain, self.Case, self.flood_chars = call_safely, plain, Case, FLOOD_CHARS
        self.from_plain, self.outcome_to_plain = wire.from_plain, wire.outcome_to_plain
        self.encode: Any = None


# Functions, not methods: a class's attributes are a learner cell's to replace, these (the step's copies) are not.
def find_copies(kit: Kit, functions: list[types.FunctionType]) -> None:
    """Each exercise's targets among ``functions``: every one whose code is forbidden code, or a copy of it."""
    for exercise_id, codes in kit.forbidden.items():
        kit.targets[exercise_id] = disarm_targets(codes, functions)


def every_function() -> list[types.FunctionType]:
    """Every Python function object the interpreter holds (exact type: no learner subclass's methods run)."""
    return [item for item in _get_objects() if type(item) is _FunctionType]


def _signature(code: types.CodeType) -> tuple[str, int, str]:
    return code.co_filename, code.co_firstlineno, getattr(code, "co_qualname", code.co_name)


def disarm_targets(codes: dict[types.CodeType, str], functions: Any) -> list[tuple[types.FunctionType,
                                                                                  types.CodeType, str]]:
    """(function, its code, the name it is reported by) for each of ``functions`` whose code is one of ``codes``
    or was copied from one (the same file, first line and qualified name): every object that would run it."""
    by_signature = {_signature(code): name for code, name in codes.items()}
    found = []
    for function in functions:
        code = function.__code__
        name = codes.get(code) or by_signature.get(_signature(code))
        if name is not None:
            found.append((function, code, name))
    return found


def disarm(targets: list[tuple[types.FunctionType, types.CodeType, str]], reached: list[str]) -> None:
    """Each target's code becomes a tripwire that appends the target's name to ``reached`` and raises
    ``PermissionError`` (whoever holds the function, in whatever thread), until :func:`rearm`.

    >>> from labkit.core import sampling
    >>> reached, target = [], (sampling.apply_temperature, sampling.apply_temperature.__code__, "apply_temperature")
    >>> disarm([target], reached)
    >>> try:
    ...     sampling.apply_temperature(None, 1.0)
    ... except PermissionError as error:
    ...     print(error)
    labkit grade: apply_temperature may not be used in this exercise, and it is disarmed while it is graded
    >>> rearm([target])
    >>> reached, sampling.apply_temperature(__import__("torch").tensor([2.0]), 2.0).tolist()
    (['apply_temperature'], [1.0])
    """
    for function, code, name in targets:
        function.__code__ = _disarming_code(code, name, reached)


def rearm(targets: list[tuple[types.FunctionType, types.CodeType, str]]) -> None:
    """Each target's own code back."""
    for function, code, _ in targets:
        function.__code__ = code


def _disarming_code(code: types.CodeType, name: str, reached: list[str]) -> types.CodeType:
    """Code that raises at once, whatever the arguments, under ``code``'s names (so tracebacks and the checker's
    tripwire still name the function) and with its free variables (a method that calls ``super()``, a function
    made in a closure: a function's code can only be swapped for code with the same ones). Its one constant is
    the exception class, so no name is looked up in the function's module, which the learner may have changed."""

    class Disarmed(PermissionError):
        def __init__(self) -> None:
            reached.append(name)
            super().__init__(f"labkit grade: {name} may not be used in this exercise, and it is disarmed while it "
                             "is graded")

    # Compiled afresh for every target, never kept: a module-level cache of templates would be a learner cell's to
    # fill with code that does not raise (a compile takes tens of microseconds; an exercise disarms a few dozen).
    free = code.co_freevars
    source = ("def outer():\n" + "".join(f"    {word} = None\n" for word in free) +
              "    def tripwire(*args, **kwargs):\n" + (f"        ({', '.join(free)},)\n" if free else "") +
              "        raise 'LABKIT_DISARMED'\n    return tripwire\n")
    outer = compile(source, "<labkit grade>", "exec").co_consts[0]
    template = next(c for c in outer.co_consts if isinstance(c, _CodeType))
    names = {"co_qualname": code.co_qualname} if hasattr(code, "co_qualname") else {}  # Python 3.11+
    return template.replace(co_consts=tuple(Disarmed if c == "LABKIT_DISARMED" else c for c in template.co_consts),
                            co_name=code.co_name, co_filename=code.co_filename, co_firstlineno=code.co_firstlineno,
                            **names)



def answer_plan(namespace: dict[str, Any], plan: dict[str, Any], kit: Kit | None = None) -> dict[str, Any]:
    """Call each exercise's function from ``namespace`` on its cases, its forbidden functions disarmed; what
    happened, as plain data (as JSON text per exercise when ``kit.encode`` is set). ``kit``: what
    :func:`labkit.instructor.wall.answering.install` bound (by default, the plan's exercises now).

    An exercise stops at the first call that cannot be right whatever labkit's answer is (it raised, ran out of
    time, reached a forbidden function): the grader's verdict stops there too.
    """
    import random

    import torch

    if kit is None:
        from labkit.exercises import exercises

        kit = Kit([exercise for exercise in exercises() if exercise.id in {item["id"] for item in plan["exercises"]}])
        find_copies(kit, every_function())
    answers: dict[str, Any] = {}
    kept = kit.encode or (lambda answer: answer)
    for item in plan["exercises"]:
        exercise = kit.exercises.get(item["id"])
        if exercise is None:  # not an exercise this labkit knows: no answer, and the grader says so
            continue
        function = namespace.get(exercise.function)
        if function is None:
            answers[exercise.id] = kept({"missing": True})
            continue
        if not callable(function):
            answers[exercise.id] = kept({"not_callable": type(function).__name__})
            continue
        random.seed(item["seed"])  # a learner's function that draws random numbers draws the same each grading
        torch.manual_seed(item["seed"])
        outcomes: list[dict[str, Any]] = []
        reached: list[str] = []
        # Disarmed until this exercise's answers are text (kit.encode): nothing the learner's code left behind (a
        # thread, an object whose contents change later) can rewrite them once its functions are armed again.
        disarm(kit.targets[exercise.id], reached)
        try:
            for encoded in item["cases"]:
                args, kwargs = kit.from_plain(encoded, objects=True)
                outcome = kit.call_safely(exercise, function, kit.Case(tuple(args), dict(kwargs)))
                if reached and not outcome.called_forbidden:  # in another thread, or caught: reached all the same
                    outcome.called_forbidden = reached[0]
                value = kit.plain(outcome.value) if exercise.kind == "prediction" else outcome.value
                outcomes.append(kit.outcome_to_plain(outcome, value, kit.flood_chars))
                if outcome.error is not None or outcome.timed_out or outcome.called_forbidden:
                    break
            answers[exercise.id] = kept({"outcomes": outcomes})
        finally:
            rearm(kit.targets[exercise.id])
    return answers
