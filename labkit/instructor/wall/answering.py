"""The grader's answering step inside the learner's kernel (run by the worker, never trusted outside).

The worker runs one cell of its own before the notebook's first cell: :func:`install`. Before any learner code
runs it binds everything the answering step uses (the lab's exercises, the checker's call, the labkit code each
exercise may not reach: :mod:`labkit.instructor.wall.reach`), takes a key from the worker over a socket only this
kernel has (:mod:`labkit.instructor.wall.protocol`) and puts it where no learner frame reaches it (a signer's
keyword default, read by nobody; the signer signs for the step's own frames only), and adds a PEP 578 audit hook.
An audit hook cannot be removed; this one is reachable from no name (only the interpreter holds it).

The answering step runs inside that hook, when the worker's last cell raises the audit event
:data:`ANSWER_EVENT`: a learner cell cannot replace it, only stop it (then there are no answers, and every
exercise fails with the reason). Before it signs "go" it

- loads a seccomp filter (libseccomp's, :mod:`labkit.instructor.wall.seccomp_filter`): from then on the kernel
  itself refuses every thread of this process a new process or program (``fork``, ``clone`` of a process,
  ``execve``), whatever starts it (``subprocess``, ``_posixsubprocess``, ``multiprocessing``, ``os.posix_spawn``,
  C code);
- finds every function object of the interpreter running code an exercise may not reach, or a copy of it (the
  same code object, or the same file, first line and qualified name).

Then it receives the case inputs (nothing the notebook ran before could have seen them) and calls each
exercise's function (:func:`labkit.exercises.calling.call_safely`: copies, time limit, the checker's tripwire on
calls into labkit) with all of that exercise's functions **disarmed** (:mod:`labkit.instructor.wall.disarming`):
their code swapped in place for a tripwire for the duration, so every alias, copy, ``partial``, thread, pool,
listener or callback that holds them reaches the tripwire, and that exercise fails, naming the function. Nothing
is guessed: the answers go back signed, so nothing a learner cell wrote can pass for them. The hook and the step
read only what this first cell bound (:func:`install`): a cell that rebinds a module's name, a library's function
or a built-in changes nothing they do.

The hook refuses (a ``PermissionError`` where the learner's code did it) what would reach around the disarming or
into the step, and records each refusal with its line for the instructor's review. Whose doing an event is: the
learner's when the frame that raised it is the learner's; for building a function or code object on labkit's code
(or swapping a labkit function's code) and for ``gc``'s object graph, also when a learner's frame is anywhere
below a library's (``copy``'s ``__reduce__``, ``dis``, ``inspect`` launder nothing). Refused: new code or function
objects and a function's ``__code__``, ``marshal``, ``gc``'s object graph, ``ctypes`` and a process's memory,
another audit hook, ``sys.setprofile``/``sys.settrace`` (the checker's tripwire), the signer's key; while
answering, every thread's frames and any process signal. Only exact built-in types are read in the hook, so no
method of a learner's object ever runs in it; and the hook runs untraced except for the answering event itself, so
the checker's tripwire never sees the grader's code. An honest function past its time limit is told only that:
when the interpreter drops the time limit's trace after it raised (the learner's frame on top), the hook refuses
it silently (the limit stays armed) and records nothing. A refusal costs only what the refused line computed.

Layer 5 (instructor tools).
"""

from __future__ import annotations

import types
from typing import Any, Callable

from labkit.instructor.wall import disarming, protocol, seccomp_filter
from labkit.instructor.wall.disarming import Kit, answer_plan, every_function, find_copies
from labkit.instructor.wall.protocol import kernel_end, kernel_step, take_key
from labkit.instructor.wall.seccomp_filter import no_new_processes

ANSWER_EVENT = "labkit.answer"
PREPARE_EVENT = "labkit.answer.next"  # the next event is the answering one: the hook may be traced for it
# The worker's last cell: it starts the step.
ANSWER_CELL = f"import sys as _sys\n_sys.audit({PREPARE_EVENT!r})\n_sys.audit({ANSWER_EVENT!r})"
_ATTRIBUTES = frozenset({"__code__", "__globals__", "__closure__", "tb_frame", "f_code", "gi_frame", "gi_code",
                         "cr_frame", "cr_code", "ag_frame", "ag_code", "f_back", "f_globals", "f_locals",
                         "__defaults__", "__kwdefaults__"})
_DEFAULTS = ("__defaults__", "__kwdefaults__")  # read only to reach the signing key: judged for the signer alone
_ALWAYS = frozenset({"code.__new__", "function.__new__", "marshal.loads", "marshal.load", "gc.get_objects",
                     "gc.get_referrers", "gc.get_referents", "sys.addaudithook", "sys.setprofile", "sys.settrace",
                     "object.__getattr__", "object.__setattr__", "object.__delattr__", "open"})
# Building on labkit's code is judged on the whole stack at any time (a library's frame launders nothing). Not
# marshal: every import loads compiled code under the importing cell's frame; a copy it could load is found at
# the step by its file, first line and name.
_BUILDS = frozenset({"code.__new__", "function.__new__", "object.__setattr__", "object.__delattr__"})
_TRACE_EVENTS = frozenset({"sys.setprofile", "sys.settrace"})
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


def prologue(fd: int, lab: str) -> str:
    """The worker's first cell: :func:`install` on the kernel's end of the socket ``fd``, for ``lab``."""
    return (f"import labkit.instructor.wall.answering as _labkit_answering\n"
            f"_labkit_answering.install({fd}, {lab!r})\ndel _labkit_answering")


def install(fd: int, lab: str) -> None:
    """Bind the answering step and add the audit hook (the worker's first cell, before any learner code).

    Both run on copies of this module's, the disarming's, the protocol's and the seccomp filter's functions over
    private copies of their modules' names and of the built-ins, made here (:func:`private_functions`): whatever a
    learner cell replaces later (a module's name, a built-in such as ``type``, a set such as the events the hook
    judges, a library's function such as ``gc.get_objects``, bound here too), the hook and the step read what was
    bound now. A cell that emptied the hook's set of events once read the signing key; one that replaced
    ``json.dumps``, the answers.
    """
    private_functions([globals(), vars(disarming), vars(protocol), vars(seccomp_filter)])[_install](fd, lab)


def private_functions(namespaces: list[dict[str, Any]]) -> dict[types.FunctionType, types.FunctionType]:
    """Each function defined in one of ``namespaces`` (modules' globals) -> its copy, running the same code over a
    private copy of its module's names, in which every such function is its copy and the built-ins are a private
    copy too. What a copy reads, nothing else holds: a learner cell that replaces a module's name or a built-in
    later changes the module, not the copy. (Functions nested in a copy share its names; a class's methods do not,
    so the step calls no method of a class of ours.)"""
    import builtins

    own_builtins = dict(vars(builtins))
    copies = [{**names, "__builtins__": own_builtins} for names in namespaces]
    twins: dict[types.FunctionType, types.FunctionType] = {}
    for names, copy in zip(namespaces, copies):
        for value in names.values():
            if type(value) is types.FunctionType and value.__globals__ is names:
                twin = types.FunctionType(value.__code__, copy, value.__name__, value.__defaults__, value.__closure__)
                twin.__kwdefaults__ = value.__kwdefaults__
                twins[value] = twin
    for copy in copies:
        for name, value in list(copy.items()):
            if type(value) is types.FunctionType and value in twins:
                copy[name] = twins[value]
    return twins


def _install(fd: int, lab: str) -> None:
    import linecache
    import os
    import sys
    import sysconfig
    import threading
    import time

    import labkit
    from labkit.exercises import calling, exercises
    from labkit.exercises.deadline import Deadline

    key: bytes | None = take_key(fd)
    end = kernel_end(fd)  # the step's way in and out, bound now
    getframe, monotonic, get_ident = sys._getframe, time.monotonic, threading.get_ident
    # Library functions the hook calls are C functions bound now; its Python helpers (os.path.abspath, linecache's
    # functions) would run a module's names a cell can rebind, inside the hook, with every event ignored meanwhile.
    abspath, gettrace, getprofile = os.path.abspath, sys.gettrace, sys.getprofile
    lines_of = linecache.cache if type(linecache.cache) is dict else {}  # IPython files each cell's source there
    code_type, function_type = types.CodeType, types.FunctionType
    library = tuple(abspath(p) + os.sep for p in {*(sysconfig.get_paths()[k] for k in (
        "stdlib", "platstdlib", "purelib", "platlib")), os.path.dirname(abspath(labkit.__file__))})
    # "call": (when the learner's function's time limit started, by the hook's clock, and the limit, a float read from
    # the checker's own frame) when it switches its tripwire on; "bottom": the step's frame, below which nothing is
    # the learner's.
    state: dict[str, Any] = {"busy": False, "step": False, "refused": [], "call": None, "bottom": None}
    known: dict[str, bool] = {}
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    kit = Kit(exercises(lab))  # the exercises and their functions to disarm, bound before any learner code
    kit.encode = end[2]  # each exercise's answers become text while its functions are still disarmed
    setters = (calling.call_safely.__code__,)  # compared by identity: hashing a code runs its names' __hash__
    deadline_code = (Deadline._on_alarm.__code__, Deadline.arm_trace.__code__, Deadline.stop.__code__)
    load_filter = no_new_processes()  # built now (libseccomp is found by running ldconfig), loaded at the step
    main_thread = get_ident()
    labkit_files = os.path.dirname(abspath(labkit.__file__)) + os.sep

    def is_library(filename: Any) -> bool:
        if type(filename) is not str:
            return False
        found = known.get(filename)
        if found is None:
            # as the file name stands: an imported module's is absolute and normalized (sys.path's entries are)
            found = known[filename] = filename.startswith(("<frozen ", *library))
        return found

    def is_labkit_file(filename: Any) -> bool:
        return type(filename) is str and filename.startswith(labkit_files)

    def one_of(code: Any, codes: tuple) -> bool:
        return any(code is known_code for known_code in codes)

    def learner_below(frame: Any) -> Any:
        """The first frame of the learner's on the stack from ``frame`` down (to the step's own frame while the
        step runs): a library frame that does what the learner asked is the learner's doing."""
        bottom = state["bottom"]
        while frame is not None and frame is not bottom:
            if not is_library(frame.f_code.co_filename):
                return frame
            frame = frame.f_back
        return None

    def builds_labkit_code(event: str, args: tuple) -> bool:
        """Whether the event builds a function or code object on labkit's code, or swaps a labkit function's code:
        a copy of labkit's own code, whoever's frame does the building."""
        if event == "function.__new__":
            code = args[0] if args else None
            return type(code) is code_type and is_labkit_file(code.co_filename)
        if event == "code.__new__":
            return len(args) > 1 and is_labkit_file(args[1])
        if len(args) > 2 and args[1] == "__code__":  # object.__setattr__ / __delattr__ on a function's code
            target, value = args[0], args[2]
            return ((type(target) is function_type and is_labkit_file(target.__code__.co_filename)) or
                    (type(value) is code_type and is_labkit_file(value.co_filename)))
        return False

    def refuse(what: str, frame: Any, record: bool = True) -> None:
        filename = frame.f_code.co_filename if frame is not None else None
        entry = lines_of.get(filename) if type(filename) is str else None  # (size, time, lines, name)
        lines = entry[2] if type(entry) is tuple and len(entry) > 2 and type(entry[2]) is list else []
        line = lines[frame.f_lineno - 1] if 0 < frame.f_lineno <= len(lines) else ""
        text = line.strip() if type(line) is str else ""
        if record and len(state["refused"]) < 20:
            state["refused"].append({"what": what, "line": getattr(frame, "f_lineno", 0), "text": text[:200]})
        raise PermissionError(f"labkit grade: a graded notebook may not do this: {what}")

    def past_its_limit() -> bool:
        """Whether the learner's function now answering has run past its time limit, from when its time limit
        started (the hook's clock, not the learner's: read before the learner's code ran; the limit's own timer
        starts a few microseconds earlier, which the 50 ms of slack covers)."""
        call = state["call"]  # (its start, its limit)
        return call is not None and monotonic() - call[0] >= call[1] - 0.05

    def hook(event: str, args: tuple) -> None:
        if event == PREPARE_EVENT:  # honoured only where the worker raises it: the main thread, nothing tracing
            hook.__cantrace__ = get_ident() == main_thread and gettrace() is None and getprofile() is None
            return
        hook.__cantrace__ = False
        if event == ANSWER_EVENT:
            if not state["step"]:
                step()
            return
        if state["busy"] or not (event in _ALWAYS or event in _IN_STEP or event.startswith("ctypes.")):
            return
        state["busy"] = True  # nothing below calls a method of a learner's object: only exact types are read
        try:
            judge(event, args, getframe(1))  # the frame that raised the event
        finally:
            state["busy"] = False

    def judge(event: str, args: tuple, frame: Any) -> None:
        """Refuse (and record) the event if the learner is behind it; return otherwise.

        Whose doing an event is: the learner's when the frame that raised it is the learner's. For building on
        labkit's code, searching the object graph (``gc``) and, while answering, reaching every thread's frames,
        also when a learner's frame is anywhere below a library's (copy's ``__reduce__``, dis, inspect launder
        nothing). Otherwise a library is trusted to build and read what it needs (an import, loading a model,
        transformers reading a signature, logging finding its caller)."""
        if event.startswith("object.") and (len(args) < 2 or type(args[1]) is not str or args[1] not in _ATTRIBUTES):
            return
        if event.startswith("object.") and args[1] in _DEFAULTS:
            if args[0] is sign:
                refuse("reads the grader's signing key", learner_below(frame) or frame)
            return
        if event == "open" and not _process_memory(args[0] if args else None):
            return
        code = frame.f_code
        culprit = frame if not is_library(code.co_filename) else None
        if event in _TRACE_EVENTS:
            if one_of(code, setters):  # the checker switching its tripwire: on as a function starts, off as it ends
                # (the step's calls, and the notebook's own check in a cell): its limit is the checker's own, a float
                # in its frame (an exact one: nothing of a learner's class is read here)
                limit = frame.f_locals.get("limit_s")
                state["call"] = None if state["call"] or type(limit) is not float else (monotonic(), limit)
                return
            if one_of(code, deadline_code):
                return  # the time limit arming or ending its own trace
            culprit = culprit or learner_below(frame)  # pdb or bdb started by the learner's line
            if culprit is not None:
                # A function past its limit: the interpreter dropping the time limit's trace after it raised (the
                # learner's frame on top). Refused, so the limit stays armed, but it accuses nobody (a learner who
                # marks the deadline expired only silences the record of a refusal, which still holds).
                refuse(_WHAT[event], culprit, record=not past_its_limit())
            return
        if (event.startswith("gc.") or (state["step"] and event == "sys._current_frames") or
                (event in _BUILDS and builds_labkit_code(event, args))):
            culprit = learner_below(frame)
        if event in _IN_STEP:
            if state["step"] and (culprit is not None or not event.startswith("sys.")):
                refuse(_WHAT.get(event, f"starts or signals a process ({event})"), culprit or frame)
            return
        if culprit is not None:
            refuse(_WHAT.get(event) or (f"reads {args[1]}" if event.startswith("object.") else
                                        f"uses ctypes ({event})"), culprit)

    def step() -> None:
        state["step"], state["bottom"] = True, getframe(0)
        namespace = shell.user_ns if shell is not None else {}

        def prepare() -> None:
            load_filter()  # from here on the kernel itself refuses a new process or program
            state["busy"] = True  # the grader's own search: nothing in it is the learner's
            try:
                find_copies(kit, every_function())
            finally:
                state["busy"] = False

        try:
            kernel_step(end, sign, prepare, lambda cases: answer_plan(namespace, cases, kit),
                        lambda: list(state["refused"]))
        finally:
            state["step"] = False

    # The key lives only in the signer's keyword default, a read the hook refuses to anyone; the signer signs only
    # for the step's own frame. So a frame a learner reaches (a signal handler gets one) yields neither.
    sign = _signer(key, (kernel_step.__code__, step.__code__), getframe)
    key = None

    # CPython runs audit hooks untraced unless the hook says it may be traced (``__cantrace__``, read at every
    # event). The step runs inside the hook and must be traced (the checker's time limit and tripwire), so the
    # hook is traceable only for the event after the worker's PREPARE_EVENT, its answering event; every other
    # event, the step's own included, runs untraced: the checker's tripwire never sees the grader's code. The hook
    # is this function itself, not an object of a class of ours, whose methods a cell could replace.
    hook.__cantrace__ = False
    sys.addaudithook(hook)


def _signer(key: bytes, callers: tuple[types.CodeType, types.CodeType],
            getframe: Callable[[int], Any]) -> Callable[[bytes], bytes]:
    """``sign(payload)``: the payload signed with ``key``, only for the step's own messages: its caller runs
    ``callers[0]`` (the protocol's kernel end), called by a frame running ``callers[1]`` (the step). The key is the
    function's keyword default (its closure holds no secret); the audit hook refuses every read of it. The HMAC is
    OpenSSL's, bound now: the key never passes through Python code a learner cell could replace (``hmac``'s)."""
    from _hashlib import hmac_digest

    def sign(payload: bytes, *, _key: bytes = b"") -> bytes:
        caller = getframe(1)
        if caller.f_code is not callers[0] or caller.f_back is None or caller.f_back.f_code is not callers[1]:
            raise PermissionError("labkit grade: only the grader's answering step signs")
        return hmac_digest(_key, payload, "sha256") + payload

    sign.__kwdefaults__ = {"_key": key}
    return sign


def _process_memory(path: Any) -> bool:
    text = path.decode(errors="replace") if type(path) is bytes else path if type(path) is str else ""
    return text.startswith("/proc/") and text.rsplit("/", 1)[-1] in ("mem", "environ", "maps", "pagemap")


