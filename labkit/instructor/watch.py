"""The grader's watcher and answering step inside the learner's kernel (run by the worker, never trusted outside).

The worker runs one cell of its own before the notebook's first cell: :func:`install`. Before any learner code
runs it binds everything the answering step uses, takes a key from the worker over a socket only this kernel
has, and adds a PEP 578 audit hook. An audit hook cannot be removed; this one is reachable from no name (only the
interpreter holds it), and it blocks, and records, what only a cheat needs when the learner's own code does it
(the innermost frame is notebook code, not a library's): new code or function objects, ``compile``/``exec``,
a function's ``__code__`` or a traceback's frames, ``marshal``, ``gc``'s object graph, ``ctypes``, another audit
hook, ``sys.setprofile``/``sys.settrace`` (the call watcher), and opening labkit's own source or a process's
memory. Each is a zero for the whole notebook, with the line that did it.

The answering step runs inside that hook, when the worker's last cell raises the audit event
:data:`ANSWER_EVENT`: a learner cell cannot replace it, only stop it (then there are no answers, and every
exercise fails with the reason). It first checks that no thread the notebook started is still running (a pool or
thread could answer for the learner's function, out of the watcher's sight), then signs "go" to the worker, and
only then receives the case inputs: nothing the notebook ran before could have seen them. It calls each
exercise's function (:func:`labkit.exercises.calling.call_safely`: copies, time limit, the labkit tripwire) with a
second watcher on the same thread: a call into a copy of a labkit function (the same bytecode under another
file name), or a new thread or process, is forbidden; ``sys.setprofile`` from anything but the checker is too. The
answers go back signed with the key, so nothing a learner cell wrote can pass for them.

Layer 5 (instructor tools).
"""

from __future__ import annotations

from typing import Any, Callable

ANSWER_EVENT = "labkit.answer"
KEY_BYTES = 32
MAX_CASES_BYTES = 256 * 2**20
_ATTRIBUTES = frozenset({"__code__", "__globals__", "__closure__", "tb_frame", "f_code", "gi_frame", "gi_code",
                         "cr_frame", "cr_code", "ag_frame", "ag_code", "f_back", "f_globals", "f_locals"})
_ALWAYS = frozenset({"code.__new__", "function.__new__", "compile", "exec", "marshal.loads", "marshal.load",
                     "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.addaudithook",
                     "sys.setprofile", "sys.settrace", "object.__getattr__", "object.__setattr__",
                     "object.__delattr__", "open", "cpython.run_command"})
_IN_STEP = frozenset({"sys._getframe", "sys._current_frames", "os.fork", "os.forkpty", "os.system", "os.exec",
                      "os.posix_spawn", "os.spawn", "subprocess.Popen", "os.kill", "os.killpg"})
_WHAT = {"code.__new__": "builds a code object", "function.__new__": "builds a function from a code object",
         "compile": "compiles code at run time", "exec": "runs code built at run time",
         "marshal.loads": "loads compiled code", "marshal.load": "loads compiled code",
         "gc.get_objects": "searches the interpreter's objects", "gc.get_referrers": "searches the interpreter's "
         "objects", "gc.get_referents": "searches the interpreter's objects",
         "sys.addaudithook": "adds an audit hook", "sys.setprofile": "switches the call watcher (sys.setprofile)",
         "sys.settrace": "sets a trace function (sys.settrace)", "open": "opens labkit's source or a process's "
         "memory", "sys._getframe": "reaches into the grader's frames", "sys._current_frames": "reaches into the "
         "grader's frames", "cpython.run_command": "runs code built at run time"}


def install(fd: int, lab: str) -> None:
    """Bind the answering step and add the audit hook (the worker's first cell, before any learner code)."""
    import json
    import linecache
    import os
    import sys
    import sysconfig
    import threading

    import labkit
    from labkit.exercises import calling, deadline
    from labkit.instructor import wire

    key = wire.read_frame(fd, KEY_BYTES, timeout_s=60)
    getframe, current_frames, main_thread = sys._getframe, sys._current_frames, threading.main_thread().ident
    labkit_dir = os.path.dirname(os.path.abspath(labkit.__file__))
    library = tuple(os.path.abspath(p) + os.sep for p in {*(sysconfig.get_paths()[k] for k in (
        "stdlib", "platstdlib", "purelib", "platlib")), labkit_dir})
    sensitive_files = (labkit_dir + os.sep,)
    baseline = set(current_frames())
    state: dict[str, Any] = {"busy": False, "step": False, "forbidden": [], "setters": set()}
    known: dict[str, bool] = {}
    shell = _shell()

    def is_library(filename: str) -> bool:
        found = known.get(filename)
        if found is None:
            found = known[filename] = filename.startswith("<frozen ") or os.path.abspath(filename).startswith(library)
        return found

    def where(frame: Any) -> str:
        line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
        return f"line {frame.f_lineno}: {line[:100]}" if line else f"in {frame.f_code.co_name}"

    def forbid(what: str, frame: Any) -> None:
        state["forbidden"].append(f"{what} ({where(frame)})" if frame is not None else what)
        raise PermissionError(f"labkit grade: a graded notebook may not do this: {what}")

    def sensitive_open(path: Any) -> bool:
        text = os.fsdecode(path) if isinstance(path, (str, bytes)) else ""
        return (text.startswith(sensitive_files) and text.endswith((".py", ".pyc"))) or (
            text.startswith("/proc/") and text.rsplit("/", 1)[-1] in ("mem", "environ", "maps", "pagemap"))

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
            if event == "open" and not sensitive_open(args[0] if args else None):
                return
            if event == "sys.setprofile" and state["step"] and frame.f_code not in state["setters"]:
                if state.pop("unset", False) and args == ():
                    return
                forbid(_WHAT[event], frame)
            if event in _IN_STEP:
                if state["step"] and (learner or not event.startswith("sys.")):
                    forbid(_WHAT.get(event, f"starts or signals a process ({event})"), frame)
                return
            if learner:
                what = _WHAT.get(event) or (f"reads {args[1]}" if event.startswith("object.") else
                                            f"uses ctypes ({event})")
                forbid(what, frame)
        finally:
            state["busy"] = False

    def step() -> None:
        state["step"] = True
        try:
            _check_threads(current_frames(), baseline | {main_thread}, is_library, state["forbidden"])
            os.set_blocking(fd, True)  # however a learner cell left it
            wire.send_frame(fd, wire.sign(key, b"go"))
            plan = json.loads(wire.read_frame(fd, MAX_CASES_BYTES, timeout_s=600))
            namespace = shell.user_ns if shell is not None else {}
            answers = answer_plan(namespace, plan, lambda function: _watched(
                function, state, is_library, sys.getprofile, sys.setprofile))
            payload = {"answers": answers}
        except BaseException as error:  # noqa: BLE001 - whatever stopped the step is its error, shown per exercise
            payload = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
        finally:
            state["step"] = False
        payload["forbidden"] = state["forbidden"][:20]
        wire.send_frame(fd, wire.sign(key, json.dumps(payload).encode()))

    state["setters"] = {calling.call_safely.__code__, *(c for c in _watched.__code__.co_consts
                                                         if getattr(c, "co_name", None) == "call")}
    del deadline
    # CPython suspends profiling and tracing inside audit hooks unless the hook says it may be traced: without
    # this the step (which runs inside the hook) would call the learner's functions with no watcher and no
    # tripwire at all. Nothing of the learner's can set a profile (sys.setprofile is forbidden above).
    hook.__cantrace__ = True
    calling.OPAQUE.add(hook.__code__)  # the checker's tripwire does not look inside the grader's own hook
    sys.addaudithook(hook)


def _shell() -> Any:
    try:
        from IPython import get_ipython

        return get_ipython()
    except ImportError:
        return None


def _check_threads(frames: dict[int, Any], ignored: set[int], is_library: Callable[[str], bool],
                   forbidden: list[str]) -> None:
    """A thread the notebook started that still runs its code, or a pool of any kind, is forbidden at the step."""
    for ident, frame in frames.items():
        if ident in ignored:
            continue
        while frame is not None:
            name = frame.f_code.co_filename
            if not is_library(name) or any(part in name for part in ("concurrent/futures", "multiprocessing")):
                forbidden.append(f"a thread or pool the notebook started was still running when the grader's "
                                 f"step began ({frame.f_code.co_name})")
                raise PermissionError("a thread the notebook started is still running")
            frame = frame.f_back


def _signature(code: Any) -> tuple:
    consts = tuple(c for c in code.co_consts if not hasattr(c, "co_code"))
    return code.co_code, code.co_names, repr(consts)


def _labkit_signatures() -> dict[tuple, str]:
    """Bytecode signature -> name of every labkit function (long enough not to be a one-liner anyone writes)."""
    import sys
    import types

    found: dict[tuple, str] = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("labkit.") or name.startswith("labkit.instructor"):
            continue
        for attribute, value in list(vars(module).items()):
            members = [value] + (list(vars(value).values()) if isinstance(value, type) else [])
            for member in members:
                member = getattr(member, "__func__", member)
                if isinstance(member, types.FunctionType) and len(member.__code__.co_code) >= 24:
                    # named where it is defined, not where it was found (a module that imports it holds it too)
                    owner = getattr(member, "__module__", None) or name
                    found[_signature(member.__code__)] = f"{owner}.{getattr(member, '__qualname__', attribute)}"
    return found


def _watched(function: Callable, state: dict, is_library: Callable[[str], bool], getprofile: Callable,
             setprofile: Callable) -> Callable:
    """``function`` called under a second watcher, chained after the checker's tripwire on the same thread."""
    import _thread
    import os

    from labkit.exercises import calling

    copies = state.get("copies")
    if copies is None:  # built once per kernel, at the first watched call
        copies = state["copies"] = _labkit_signatures()
    spawners = {_thread.start_new_thread, os.fork, getattr(os, "forkpty", None), os.system, os.posix_spawn,
                os.posix_spawnp, os.execv, os.execve}
    seen: dict[Any, bool] = {}

    def call(*args: Any, **kwargs: Any) -> Any:
        tripwire = getprofile()

        def both(frame: Any, event: str, arg: Any) -> None:
            if event == "call":
                code = frame.f_code
                if code not in seen:
                    seen[code] = not is_library(code.co_filename) and _signature(code) in copies
                if seen[code]:
                    state["forbidden"].append(f"calls a copy of {copies[_signature(code)]}")
            elif event == "c_call" and arg in spawners:
                state["forbidden"].append(f"starts a thread or process ({getattr(arg, '__name__', arg)})")
                state["unset"] = True  # CPython unsets a profile function that raises: that one is not the learner's
                raise PermissionError("labkit grade: a graded function may not start a thread or process")
            if tripwire is not None:
                tripwire(frame, event, arg)

        setprofile(both)
        try:
            return function(*args, **kwargs)
        finally:
            setprofile(tripwire)

    calling.PASS_THROUGH.add(call.__code__)  # the checker's tripwire looks past this wrapper, at the learner's code
    return call


def answer_plan(namespace: dict[str, Any], plan: dict[str, Any],
                wrap: Callable[[Callable], Callable] = lambda function: function) -> dict[str, Any]:
    """Call each exercise's function from ``namespace`` on its cases; what happened, as plain data.

    An exercise stops at the first call that cannot be right whatever labkit's answer is (it raised, ran out of
    time, called labkit's reference): the grader's verdict stops there too.
    """
    import random

    import torch

    from labkit.exercises import get
    from labkit.exercises.calling import FLOOD_CHARS, call_safely, plain
    from labkit.exercises.definitions import Case
    from labkit.instructor import wire

    answers: dict[str, Any] = {}
    for item in plan["exercises"]:
        try:
            exercise = get(item["id"])
        except ValueError:  # not an exercise this labkit knows: no answer, and the grader says so
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
        outcomes = []
        for encoded in item["cases"]:
            args, kwargs = wire.from_plain(encoded, objects=True)
            outcome = call_safely(exercise, wrap(function), Case(tuple(args), dict(kwargs)))
            value = plain(outcome.value) if exercise.kind == "prediction" else outcome.value
            outcomes.append(wire.outcome_to_plain(outcome, value, FLOOD_CHARS))
            if outcome.error is not None or outcome.timed_out or outcome.called_forbidden:
                break
        answers[exercise.id] = {"outcomes": outcomes}
    return answers
