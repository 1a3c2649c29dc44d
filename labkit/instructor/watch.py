"""The grader's answering step inside the learner's kernel (run by the worker, never trusted outside).

The worker runs one cell of its own before the notebook's first cell: :func:`install`. Before any learner code
runs it binds everything the answering step uses (the lab's exercises, the checker's call, the functions to
disarm and their code), takes a key from the worker over a socket only this kernel has, and adds a PEP 578 audit
hook. An audit hook cannot be removed; this one is reachable from no name (only the interpreter holds it).

The answering step runs inside that hook, when the worker's last cell raises the audit event
:data:`ANSWER_EVENT`: a learner cell cannot replace it, only stop it (then there are no answers, and every
exercise fails with the reason). It signs "go" to the worker, and only then receives the case inputs: nothing the
notebook ran before could have seen them. It calls each exercise's function
(:func:`labkit.exercises.calling.call_safely`: copies, time limit, the checker's tripwire on calls into labkit)
with the labkit functions that exercise may not use **disarmed**: for the duration of that exercise's calls their
code is swapped in place for a tripwire (:func:`disarmed`), so every alias, ``partial``, thread, pool, listener or
callback that holds them reaches the tripwire, and that exercise fails, naming the function. Nothing is guessed:
the answers go back signed with the key, so nothing a learner cell wrote can pass for them.

The hook refuses (a ``PermissionError`` where the learner's code did it) what would reach around the disarming or
into the step itself, and records each refusal, with its line, for the instructor's review: new code or function
objects and a function's ``__code__`` (a copy of a reference that disarming would miss), ``marshal``, ``gc``'s
object graph, ``ctypes`` and a process's memory, another audit hook, ``sys.setprofile``/``sys.settrace`` (the
checker's tripwire); while answering, the grader's frames and any new process (a fresh interpreter would import
labkit armed). A refusal costs only what the refused line computed.

Layer 5 (instructor tools).
"""

from __future__ import annotations

import contextlib
import types
from typing import Any, Callable, Iterator

ANSWER_EVENT = "labkit.answer"
KEY_BYTES = 32
MAX_CASES_BYTES = 256 * 2**20
_ATTRIBUTES = frozenset({"__code__", "__globals__", "__closure__", "tb_frame", "f_code", "gi_frame", "gi_code",
                         "cr_frame", "cr_code", "ag_frame", "ag_code", "f_back", "f_globals", "f_locals"})
_ALWAYS = frozenset({"code.__new__", "function.__new__", "marshal.loads", "marshal.load", "gc.get_objects",
                     "gc.get_referrers", "gc.get_referents", "sys.addaudithook", "sys.setprofile", "sys.settrace",
                     "object.__getattr__", "object.__setattr__", "object.__delattr__", "open"})
_IN_STEP = frozenset({"sys._getframe", "sys._current_frames", "os.fork", "os.forkpty", "os.system", "os.exec",
                      "os.posix_spawn", "os.spawn", "subprocess.Popen", "os.kill", "os.killpg"})
_WHAT = {"code.__new__": "builds a code object", "function.__new__": "builds a function from a code object",
         "marshal.loads": "loads compiled code", "marshal.load": "loads compiled code",
         "gc.get_objects": "searches the interpreter's objects", "gc.get_referrers": "searches the interpreter's "
         "objects", "gc.get_referents": "searches the interpreter's objects",
         "sys.addaudithook": "adds an audit hook", "sys.setprofile": "switches the checker's tripwire "
         "(sys.setprofile)", "sys.settrace": "sets a trace function (sys.settrace)", "open": "opens a process's "
         "memory", "sys._getframe": "reaches into the grader's frames", "sys._current_frames": "reaches into the "
         "grader's frames"}
_TRIPWIRE = compile("def tripwire(*args, **kwargs):\n    raise 'LABKIT_DISARMED'\n", "<labkit grade>",
                    "exec").co_consts[0]


def install(fd: int, lab: str) -> None:
    """Bind the answering step and add the audit hook (the worker's first cell, before any learner code)."""
    import json
    import linecache
    import os
    import sys
    import sysconfig

    import labkit
    from labkit.exercises import calling, exercises
    from labkit.instructor import wire

    key = wire.read_frame(fd, KEY_BYTES, timeout_s=60)
    getframe = sys._getframe
    library = tuple(os.path.abspath(p) + os.sep for p in {*(sysconfig.get_paths()[k] for k in (
        "stdlib", "platstdlib", "purelib", "platlib")), os.path.dirname(os.path.abspath(labkit.__file__))})
    state: dict[str, Any] = {"busy": False, "step": False, "refused": []}
    known: dict[str, bool] = {}
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    kit = Kit(exercises(lab))  # the exercises and their functions to disarm, bound before any learner code
    setters = {calling.call_safely.__code__}

    def is_library(filename: str) -> bool:
        found = known.get(filename)
        if found is None:
            found = known[filename] = filename.startswith("<frozen ") or os.path.abspath(filename).startswith(library)
        return found

    def refuse(what: str, frame: Any) -> None:
        text = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip() if frame is not None else ""
        if len(state["refused"]) < 20:
            state["refused"].append({"what": what, "line": getattr(frame, "f_lineno", 0), "text": text[:200]})
        raise PermissionError(f"labkit grade: a graded notebook may not do this: {what}")

    def hook(event: str, args: tuple) -> None:
        if event == ANSWER_EVENT:
            if not state["step"]:
                step()
            return
        if state["busy"] or not (event in _ALWAYS or event in _IN_STEP or event.startswith("ctypes.")):
            return
        state["busy"] = True
        try:
            frame = getframe(1)
            learner = not is_library(frame.f_code.co_filename)
            if event.startswith("object.") and (len(args) < 2 or args[1] not in _ATTRIBUTES):
                return
            if event == "open" and not _process_memory(args[0] if args else None):
                return
            if event == "sys.setprofile" and state["step"] and frame.f_code not in setters:
                refuse(_WHAT[event], frame)  # also through a library (cProfile) while the checker's tripwire runs
            if event in _IN_STEP:
                if state["step"] and (learner or not event.startswith("sys.")):
                    refuse(_WHAT.get(event, f"starts or signals a process ({event})"), frame)
                return
            if learner:
                refuse(_WHAT.get(event) or (f"reads {args[1]}" if event.startswith("object.") else
                                            f"uses ctypes ({event})"), frame)
        finally:
            state["busy"] = False

    def step() -> None:
        state["step"] = True
        try:
            os.set_blocking(fd, True)  # however a learner cell left it
            wire.send_frame(fd, wire.sign(key, b"go"))
            plan = json.loads(wire.read_frame(fd, MAX_CASES_BYTES, timeout_s=600))
            payload = {"answers": answer_plan(shell.user_ns if shell is not None else {}, plan, kit)}
        except BaseException as error:  # noqa: BLE001 - whatever stopped the step is its error, shown per exercise
            payload = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
        finally:
            state["step"] = False
        payload["refused"] = state["refused"]
        wire.send_frame(fd, wire.sign(key, json.dumps(payload).encode()))

    # CPython suspends profiling and tracing inside audit hooks unless the hook says it may be traced: without
    # this the step (which runs inside the hook) would call the learner's functions without the checker's
    # tripwire or time limit.
    hook.__cantrace__ = True
    calling.OPAQUE.add(hook.__code__)  # the checker's tripwire does not look inside the grader's own hook
    sys.addaudithook(hook)


def _process_memory(path: Any) -> bool:
    text = path.decode(errors="replace") if isinstance(path, bytes) else path if isinstance(path, str) else ""
    return text.startswith("/proc/") and text.rsplit("/", 1)[-1] in ("mem", "environ", "maps", "pagemap")


class Kit:
    """What the answering step uses, bound once: the exercises by id, each one's functions to disarm with their
    own code, and the checker's call (a learner cell that replaces a module's name later changes nothing here)."""

    def __init__(self, chosen: list[Any]) -> None:
        from labkit.exercises.calling import FLOOD_CHARS, call_safely, plain
        from labkit.exercises.definitions import Case
        from labkit.instructor import wire

        self.exercises = {exercise.id: exercise for exercise in chosen}
        self.targets = {exercise.id: disarm_targets(exercise) for exercise in chosen}
        self.call_safely, self.plain, self.Case, self.flood_chars = call_safely, plain, Case, FLOOD_CHARS
        self.from_plain, self.outcome_to_plain = wire.from_plain, wire.outcome_to_plain


def disarm_targets(exercise: Any) -> list[tuple[types.FunctionType, types.CodeType, str]]:
    """(function, its code, its name) of each Python function ``exercise`` may not use: its reference and its
    forbidden list, less anything it allows (torch's functions written in C have no code to swap: the checker's
    tripwire sees direct calls to them)."""
    import inspect

    from labkit.exercises.definitions import dotted_name

    allowed = {getattr(item, "__func__", item) for item in exercise.allowed}
    found = []
    for item in (exercise.reference, *exercise.forbidden):
        function = getattr(inspect.unwrap(item), "__func__", inspect.unwrap(item))
        if isinstance(function, types.FunctionType) and function not in allowed and not function.__closure__:
            found.append((function, function.__code__, dotted_name(item)))
    return found


@contextlib.contextmanager
def disarmed(targets: list[tuple[types.FunctionType, types.CodeType, str]], reached: list[str]) -> Iterator[None]:
    """For the duration: each target's code is a tripwire that appends the target's name to ``reached`` and raises
    ``PermissionError`` (whoever holds the function, in whatever thread); then the original code is back.

    >>> from labkit.core import sampling
    >>> reached = []
    >>> with disarmed([(sampling.apply_temperature, sampling.apply_temperature.__code__, "apply_temperature")], reached):
    ...     try:
    ...         sampling.apply_temperature(None, 1.0)
    ...     except PermissionError as error:
    ...         print(error)
    labkit grade: apply_temperature may not be used in this exercise, and it is disarmed while it is graded
    >>> reached, sampling.apply_temperature(__import__("torch").tensor([2.0]), 2.0).tolist()
    (['apply_temperature'], [1.0])
    """
    try:
        for function, code, name in targets:
            function.__code__ = _tripwire(code, name, reached)
        yield
    finally:
        for function, code, _ in targets:
            function.__code__ = code


def _tripwire(code: types.CodeType, name: str, reached: list[str]) -> types.CodeType:
    """Code that raises at once, whatever the arguments, under ``code``'s names (so tracebacks and the checker's
    tripwire still name the function). Its one constant is the exception class, so no name is looked up in the
    function's module, which the learner may have changed."""

    class Disarmed(PermissionError):
        def __init__(self) -> None:
            reached.append(name)
            super().__init__(f"labkit grade: {name} may not be used in this exercise, and it is disarmed while it "
                             "is graded")

    names = {"co_qualname": code.co_qualname} if hasattr(code, "co_qualname") else {}  # Python 3.11+
    return _TRIPWIRE.replace(co_consts=tuple(Disarmed if c == "LABKIT_DISARMED" else c for c in _TRIPWIRE.co_consts),
                             co_name=code.co_name, co_filename=code.co_filename, co_firstlineno=code.co_firstlineno,
                             **names)


def answer_plan(namespace: dict[str, Any], plan: dict[str, Any], kit: Kit | None = None) -> dict[str, Any]:
    """Call each exercise's function from ``namespace`` on its cases, its forbidden functions disarmed; what
    happened, as plain data. ``kit``: what :func:`install` bound (by default, the plan's exercises now).

    An exercise stops at the first call that cannot be right whatever labkit's answer is (it raised, ran out of
    time, reached a forbidden function): the grader's verdict stops there too.
    """
    import random

    import torch

    if kit is None:
        from labkit.exercises import exercises

        kit = Kit([exercise for exercise in exercises() if exercise.id in {item["id"] for item in plan["exercises"]}])
    answers: dict[str, Any] = {}
    for item in plan["exercises"]:
        exercise = kit.exercises.get(item["id"])
        if exercise is None:  # not an exercise this labkit knows: no answer, and the grader says so
            continue
        function = namespace.get(exercise.function)
        if function is None:
            answers[exercise.id] = {"missing": True}
            continue
        if not callable(function):
            answers[exercise.id] = {"not_callable": type(function).__name__}
            continue
        random.seed(item["seed"])  # a learner's function that draws random numbers draws the same each grading
        torch.manual_seed(item["seed"])
        outcomes: list[dict[str, Any]] = []
        reached: list[str] = []
        with disarmed(kit.targets[exercise.id], reached):  # until the last answer is plain data
            for encoded in item["cases"]:
                args, kwargs = kit.from_plain(encoded, objects=True)
                outcome = kit.call_safely(exercise, function, kit.Case(tuple(args), dict(kwargs)))
                if reached and not outcome.called_forbidden:  # in another thread, or caught: reached all the same
                    outcome.called_forbidden = reached[0]
                value = kit.plain(outcome.value) if exercise.kind == "prediction" else outcome.value
                outcomes.append(kit.outcome_to_plain(outcome, value, kit.flood_chars))
                if outcome.error is not None or outcome.timed_out or outcome.called_forbidden:
                    break
        answers[exercise.id] = {"outcomes": outcomes}
    return answers

