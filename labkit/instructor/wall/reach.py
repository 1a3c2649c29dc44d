"""What labkit code an exercise's reference reaches: the functions the grader disarms while that exercise answers.

A reference is often a thin wrapper: ``replay_block_events`` does its work in ``BlockAllocator``'s methods, a
prediction's reference in a core function. Disarming the wrapper alone leaves the function that does the work
callable (from a thread the checker's tripwire does not watch, say). So the forbidden set of an exercise is read
from the code, not listed by hand: every labkit function and method its reference (and its ``forbidden`` list)
names, and what those name in turn, less what the exercise allows and what the objects handed to the learner
need (their methods are the learner's to call).

A name is followed where it is bound: a global of the function's module, or an attribute of a labkit module the
same code names (``paging.BlockAllocator``). Code labkit generates at run time (a dataclass's ``__init__``) and
torch's C functions have no labkit file, and are not followed.

Layer 5 (instructor tools).
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any, Iterable

Reached = dict[types.CodeType, str]  # code object -> "labkit.module.qualname"


def _codes_within(code: types.CodeType) -> Iterable[types.CodeType]:
    """``code`` and the code of every function, lambda and comprehension defined inside it."""
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _codes_within(constant)


def _members(klass: type) -> list[Any]:
    """The functions a labkit class defines (and inherits from labkit classes): methods, properties' accessors."""
    found = []
    for owner in klass.__mro__:
        if not owner.__module__.startswith("labkit."):
            continue
        for member in vars(owner).values():
            if isinstance(member, property):
                found += [member.fget, member.fset, member.fdel]
            else:
                found.append(getattr(member, "__func__", member))  # staticmethod, classmethod
    return [member for member in found if member is not None]


def _unwrapped(item: Any) -> Any:
    while True:
        if isinstance(item, functools.partial):
            item = item.func
        elif isinstance(item, (types.MethodType, staticmethod, classmethod)):
            item = item.__func__
        elif hasattr(item, "__wrapped__") and not isinstance(item, type):
            item = inspect.unwrap(item)
            if hasattr(item, "__wrapped__"):
                return item
        else:
            return item


def reached(roots: Iterable[Any]) -> Reached:
    """Every labkit code object reachable from ``roots`` (functions, methods, classes, partials) through the
    names their code uses."""
    from labkit.exercises.calling import labkit_name

    found: Reached = {}
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        item = _unwrapped(todo.pop())
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, type):
            if item.__module__.startswith("labkit."):
                todo += _members(item)
            continue
        if not isinstance(item, types.FunctionType):
            continue
        code = item.__code__
        name = labkit_name(code)
        if name is None:
            continue
        found[code] = name
        space = item.__globals__
        todo += [cell.cell_contents for cell in item.__closure__ or () if _filled(cell)]
        for inner in _codes_within(code):
            found.setdefault(inner, labkit_name(inner) or name)
            names = inner.co_names
            for word in names:
                value = space.get(word)
                if isinstance(value, types.ModuleType):
                    if value.__name__.startswith("labkit."):
                        todo += [getattr(value, other) for other in names if hasattr(value, other)]
                elif value is not None:
                    todo.append(value)
    return found


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def forbidden_codes(exercise: Any) -> Reached:
    """The labkit code ``exercise``'s learner may not reach: what its reference and forbidden list reach, less
    what its allowed helpers and the labkit objects a case hands the learner reach."""
    from labkit.exercises.definitions import dotted_name
    from labkit.instructor.wall.wire import case_classes

    banned = reached([exercise.reference, *exercise.forbidden])
    for item in exercise.forbidden:  # torch's ready-made equivalents written in Python (in C: the tripwire's)
        function = _unwrapped(item)
        if isinstance(function, types.FunctionType):
            banned.setdefault(function.__code__, dotted_name(item))
    free = reached([*exercise.allowed, *case_classes()])
    return {code: name for code, name in banned.items() if code not in free}
