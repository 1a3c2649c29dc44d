"""The grader's answering step, proven in-process against the real audit hook (tests/answering_harness.py plays the
worker's side of the socket): honest slow functions are told only that they ran out of time, and the routes of
issue #52 around the step's defences earn nothing on their exercise or are flagged with evidence. What needs the
wall itself (limits, the host's files, killed workers) is tests/test_instructor_grading_attacks.py."""

import base64

import pytest

from answering_harness import answer
from honest_corpus import PREDICTION, SAMPLE, SOFTMAX


def _slow(before: str) -> str:
    """SOFTMAX with ``before`` run first, inside the function."""
    return SOFTMAX.replace("    if temperature == 0", before + "    if temperature == 0", 1)


def test_an_honest_function_past_its_limit_is_told_only_that_it_ran_out_of_time():
    """A sleep, a loop that swallows every exception and a read on an empty pipe (issue #52): each fails on time
    alone, like the notebook's own check; nothing in the review (the notebook's own check of them in a cell
    included), and the other exercises keep their points."""
    looping = ("def sample_token(probs, uniform):\n    while True:\n        try:\n            pass\n"
               "        except BaseException:\n            pass\n")
    checked = "from labkit.exercises import check\ncheck('00.softmax_temperature')\ncheck('00.sample_token')\n"
    sleeping = answer([_slow("    import time\n    time.sleep(8)\n"), looping, PREDICTION, checked])
    blocked = answer([_slow("    import os\n    read_end, _ = os.pipe()\n    os.read(read_end, 1)\n"), SAMPLE,
                      PREDICTION])
    for got, slow in ((sleeping, ("00.softmax_temperature", "00.sample_token")), (blocked, ("00.softmax_temperature",))):
        assert got.problem is None, got.output[-2000:]
        for exercise_id in slow:
            assert got.points(exercise_id) == 0
            assert "no answer within" in got.details(exercise_id), got.details(exercise_id)
            assert "may not" not in got.details(exercise_id) and "calls labkit" not in got.details(exercise_id)
        assert got.review == [] and got.refused == []
        assert got.points("00.predict_tokenizer") == 1
    assert blocked.points("00.sample_token") == 2


def test_the_hook_never_runs_a_method_of_the_learners_objects():
    """Route 1: a path that is a str subclass, opened in a cell and while answering. Its overridden methods are
    never called by the hook (the prediction says whether they ran), so no code of the learner's runs while the
    hook is busy, and nothing it would have built there exists."""
    cells = ["import types\nfrom labkit.core import sampling\ncalled = []\n"
             "class Path(str):\n"
             "    def startswith(self, *args):\n"
             "        called.append(types.FunctionType(sampling.softmax_with_temperature.__code__, {}))\n"
             "        return False\n"
             "    def __eq__(self, other):\n        called.append('eq')\n        return False\n"
             "    __hash__ = str.__hash__\n"
             "for path in (Path('/proc/self/mem'), Path('f_code')):\n"
             "    try:\n        open(path)\n    except Exception:\n        pass\n",
             "def softmax_with_temperature(logits, temperature):\n"
             "    try:\n        open(Path('/proc/self/mem'))\n    except Exception:\n        pass\n"
             "    return called[0](logits, temperature)\n",
             SAMPLE, "def tokenizer_choice():\n    return 'a' if called else 'b'\n"]
    got = answer(cells)
    assert got.points("00.predict_tokenizer") == 1, got.details("00.predict_tokenizer")
    assert got.points("00.softmax_temperature") == 0
    assert got.points("00.sample_token") == 2


@pytest.mark.parametrize("start", [
    "pid = _posixsubprocess.fork_exec([exe, b'-c', b'pass'], [exe], True, (), None, None, -1, -1, -1, -1, -1, -1, "
    "*os.pipe(), False, False, -1, None, None, None, -1, None, False)",
    "multiprocessing.get_context('spawn').Process(target=print).start()",
    "multiprocessing.get_context('forkserver').Process(target=print).start()",
    "os.posix_spawn(exe.decode(), [exe.decode()], {})",
], ids=["fork_exec", "spawn", "forkserver", "posix_spawn"])
def test_no_new_process_starts_while_answering(start):
    """Route 2: a fresh interpreter would import labkit unarmed and answer over a pipe. The kernel refuses the
    process (seccomp), however it is started, so the function raises and its exercise earns nothing."""
    cells = ["import os, sys, multiprocessing, _posixsubprocess\nexe = sys.executable.encode()\n",
             "def softmax_with_temperature(logits, temperature):\n"
             f"    {start}\n    return logits\n", SAMPLE, PREDICTION]
    got = answer(cells)
    assert got.points("00.softmax_temperature") == 0
    assert "PermissionError" in got.details("00.softmax_temperature") or \
        "may not do this" in got.details("00.softmax_temperature"), got.details("00.softmax_temperature")
    assert got.points("00.sample_token") == 2 and got.points("00.predict_tokenizer") == 1


def test_a_library_frame_launders_nothing():
    """Route 3: a function built on the reference's code by copy's own frame (``__reduce__``), on the code read
    by dis: refused (the learner's line is on the stack) and named in the review."""
    cells = ["import copy, dis, types\nfrom labkit.core import sampling\n"
             "code = dis.Bytecode(sampling.softmax_with_temperature).codeobj\n"
             "class Maker:\n    def __reduce__(self):\n        return (types.FunctionType, (code, sampling.__dict__))\n"
             "try:\n    twin = copy.copy(Maker())\nexcept PermissionError:\n    twin = None\n"
             "def softmax_with_temperature(logits, temperature):\n    return twin(logits, temperature)\n",
             SAMPLE, PREDICTION]
    got = answer(cells)
    assert got.points("00.softmax_temperature") == 0
    assert any("builds a function from a code object" in finding.what for finding in got.review), got.review
    assert got.points("00.sample_token") == 2


def test_the_function_doing_the_work_is_disarmed_not_only_the_wrapper():
    """Route 4: lab 05's reference is a thin wrapper over BlockAllocator. Driving the allocator itself from a
    thread the checker's tripwire does not watch reaches disarmed code: the exercise earns nothing."""
    cells = ["import threading, queue\nfrom labkit.core import paging\njobs, results = queue.Queue(), queue.Queue()\n"
             "def serve():\n    while True:\n        events, n_blocks, block_size = jobs.get()\n        try:\n"
             "            pool = paging.BlockAllocator(n_blocks, block_size)\n            refused = []\n"
             "            for index, (kind, request, tokens) in enumerate(events):\n"
             "                if kind == 'free':\n                    pool.free(request)\n"
             "                elif not (pool.allocate if kind == 'allocate' else pool.append)(request, tokens):\n"
             "                    refused.append(index)\n"
             "            results.put(paging.BlockReplay(pool.block_tables, pool.free_blocks, pool.wasted_slots, "
             "refused))\n"
             "        except BaseException as error:\n            results.put(error)\n"
             "threading.Thread(target=serve, daemon=True).start()\n"
             "def paged_allocator(events, n_blocks, block_size):\n    jobs.put((events, n_blocks, block_size))\n"
             "    found = results.get(timeout=5)\n    if isinstance(found, BaseException):\n        raise found\n"
             "    return found\n"]
    got = answer(cells, lab="05")
    assert got.points("05.paged_allocator") == 0
    assert "BlockAllocator" in got.details("05.paged_allocator"), got.details("05.paged_allocator")


def test_a_frame_reached_while_answering_yields_neither_the_key_nor_a_signature():
    """A signal handler receives the frame it interrupts, and from there every frame below, the step's too (a
    route found while building #52). The key is in no frame's variables, the signer signs for the step's own
    frame only, and reading the signer's defaults (where the key lives) is refused and named in the review."""
    cells = ["import inspect, signal\nobtained = []\n"
             "def handler(signum, frame):\n"
             "    while frame is not None:\n"
             "        for name, value in list(frame.f_locals.items()):\n"
             "            if isinstance(value, bytes) and len(value) == 32:\n"
             "                obtained.append(name)\n"
             "            if callable(value) and getattr(value, '__name__', '') == 'sign':\n"
             "                for attempt in (lambda: value(b'forged'), lambda: value.__kwdefaults__,\n"
             "                                lambda: inspect.signature(value)):\n"
             "                    try:\n                        obtained.append(repr(attempt())[:20])\n"
             "                    except PermissionError:\n                        pass\n"
             "        frame = frame.f_back\n"
             "signal.signal(signal.SIGUSR1, handler)\n"
             "def tokenizer_choice():\n    signal.raise_signal(signal.SIGUSR1)\n"
             "    return 'b' if not obtained else 'a'\n", SAMPLE]
    got = answer(cells)
    assert got.points("00.predict_tokenizer") == 1, got.details("00.predict_tokenizer")
    assert any("reads the grader's signing key" in finding.what for finding in got.review), got.review
    assert got.points("00.sample_token") == 2


STUBS = ("def softmax_with_temperature(logits, temperature):\n    raise NotImplementedError\n",)
REFERENCE_CALL = ("from labkit.core.sampling import softmax_with_temperature as reference\n"
                  "def softmax_with_temperature(logits, temperature):\n    return reference(logits, temperature)\n")
# The attacks on the answering step that need no wall (issues #24, #36, #41): learner -> the cells of their lab 00.
ATTACKS = {
    "fake_marker": (
        "from IPython import get_ipython\n"
        "def _fake(*args):\n"
        "    print('LABKIT-GRADES [{\"id\": \"00.softmax_temperature\", \"status\": \"passed\", \"points\": 101}]')\n"
        "get_ipython().events.register('pre_run_cell', _fake)\n", *STUBS),
    "patched_checker": (
        "import math, torch\nimport labkit.exercises as ex\nimport labkit.exercises.checking as checking\n"
        "checking.compare = lambda *args, **kwargs: None\nchecking._same = lambda a, b: True\n"
        "torch.isclose = lambda *args, **kwargs: torch.tensor(True)\nmath.isclose = lambda *args, **kwargs: True\n"
        "ex._REGISTRY.clear()\n",
        "def softmax_with_temperature(logits, temperature):\n    return logits\n",
        "def sample_token(probs, uniform):\n    return 0\n"),
    "lying_values": (
        "import torch\n"
        "class Close(torch.Tensor):\n"
        "    def isclose(self, *args, **kwargs):\n        return torch.ones(self.shape, dtype=torch.bool)\n"
        "    def __eq__(self, other):\n        return True\n"
        "class Anything:\n    def __eq__(self, other):\n        return True\n"
        "def softmax_with_temperature(logits, temperature):\n    return torch.zeros_like(logits).as_subclass(Close)\n"
        "def tokenizer_choice():\n    return Anything()\n",),
    "watcher_off": (
        "import sys\n"
        "def softmax_with_temperature(logits, temperature):\n"
        "    sys.setprofile(None)\n"
        "    from labkit.core.sampling import softmax_with_temperature as reference\n"
        "    return reference(logits, temperature)\n",),
    "recompiled": (
        "import types\nfrom labkit.core import sampling\n"
        "_code = sampling.softmax_with_temperature.__code__.replace(co_filename='mine.py')\n"
        "softmax_with_temperature = types.FunctionType(_code, sampling.__dict__)\n",),
    "other_thread": (
        "import threading\nimport labkit.core.sampling as s\n"
        "def softmax_with_temperature(logits, temperature):\n"
        "    box = []\n"
        "    worker = threading.Thread(target=lambda: box.append(s.softmax_with_temperature(logits, temperature)))\n"
        "    worker.start(); worker.join()\n"
        "    return box[0]\n",),
    "stack_peek": (
        "import sys, torch\n"
        "def softmax_with_temperature(logits, temperature):\n"
        "    caller = sys._getframe(1)\n"
        "    return torch.softmax(logits / max(temperature, 1e-9), dim=-1)\n",),
    "lower_level": (
        "import torch\n"
        "def sample_token(probs, uniform):\n"
        "    return int(torch._C._VariableFunctions.multinomial(probs, 1))\n",),
    "socket_forgery": (
        "import json, os, re\nfd = int(re.search(r'install\\((\\d+)', _ih[1]).group(1))\n"
        "payload = json.dumps({'answers': {'00.predict_tokenizer': {'outcomes': [{'value': 'b'}]}},\n"
        "                      'forbidden': []})\n"
        "for message in (b'go', payload.encode(), b'0' * 32 + payload.encode()):\n"
        "    os.write(fd, len(message).to_bytes(8, 'big') + message)\n"
        "os.set_blocking(fd, False)\n"
        "try:\n    stolen = os.read(fd, 1 << 16)\nexcept BlockingIOError:\n    stolen = b''\n"
        "def softmax_with_temperature(logits, temperature):\n    return logits\n"),
    "pool_reference": (
        "from labkit.core import sampling as s\nfrom concurrent.futures import ThreadPoolExecutor\n"
        "def softmax_with_temperature(logits, temperature):\n"
        "    with ThreadPoolExecutor(1) as pool:\n"
        "        return pool.submit(s.softmax_with_temperature, logits, temperature).result()\n",
        SAMPLE, PREDICTION),
    "pool_started_early": (
        "from labkit.core import sampling as s\nfrom concurrent.futures import ThreadPoolExecutor\n"
        "pool = ThreadPoolExecutor(1)\npool.submit(int).result()\n"
        "def softmax_with_temperature(logits, temperature):\n"
        "    return pool.submit(s.softmax_with_temperature, logits, temperature).result()\n",
        SAMPLE, PREDICTION),
    "built_name": ("import sys\n" + REFERENCE_CALL.replace(
        "    return reference", "    getattr(sys, 'set' + 'profile')(None)\n    return reference"),
        SAMPLE, PREDICTION),
    "via_importlib": (
        "import importlib\ndef softmax_with_temperature(logits, temperature):\n"
        "    module = importlib.import_module('labkit.core.' + 'sampling')\n"
        "    return getattr(module, 'softmax_with_' + 'temperature')(logits, temperature)\n",
        SAMPLE, PREDICTION),
    "exec_base64": (f"import base64\nexec(base64.b64decode({base64.b64encode(REFERENCE_CALL.encode()).decode()!r}))\n",
                    SAMPLE, PREDICTION),
    "listener_reference": (
        "import logging, logging.handlers, queue\nfrom labkit.core import sampling as s\n"
        "answers, records = queue.Queue(), queue.Queue()\n"
        "class Handler(logging.Handler):\n"
        "    def emit(self, record):\n"
        "        try:\n            answers.put(s.softmax_with_temperature(*record.msg))\n"
        "        except Exception as error:\n            answers.put(error)\n"
        "listener = logging.handlers.QueueListener(records, Handler())\nlistener.start()\n"
        "def softmax_with_temperature(logits, temperature):\n"
        "    records.put(logging.makeLogRecord({'msg': (logits, temperature)}))\n"
        "    return answers.get(timeout=5)\n", SAMPLE, PREDICTION),
    "gc_callback": (
        "import gc, torch\nfrom labkit.core import sampling as s\npending = []\n"
        "def fill(phase, info):\n"
        "    while pending:\n        out, logits, temperature = pending.pop()\n"
        "        try:\n            out.copy_(s.softmax_with_temperature(logits, temperature))\n"
        "        except Exception:\n            pass\n"
        "gc.callbacks.append(fill)\n"
        "def softmax_with_temperature(logits, temperature):\n"
        "    out = torch.zeros_like(logits)\n    pending.append((out, logits, temperature))\n"
        "    for _ in range(2000):\n        cycle = []\n        cycle.append(cycle)\n"
        "    return out\n", SAMPLE, PREDICTION),
    "getattr_constant": (
        "from labkit.core import sampling\ndef softmax_with_temperature(logits, temperature):\n"
        "    return getattr(sampling, 'softmax_with_temperature')(logits, temperature)\n", SAMPLE, PREDICTION),
    "runpy_copy": (
        "import inspect, pathlib, runpy\nfrom labkit.core import sampling\n"
        "pathlib.Path('/tmp/mine.py').write_text(inspect.getsource(sampling))\n"
        "softmax_with_temperature = runpy.run_path('/tmp/mine.py')['softmax_with_temperature']\n",
        SAMPLE, PREDICTION),
}
# learner -> (the exercise attacked, in its verdict why it earned nothing or None, in the review what flags it,
# whether nothing else of theirs answers). A lower-level torch name cannot be decided a zero: flagged only.
EXPECTED = {
    "fake_marker": ("00.softmax_temperature", None, "pre_run_cell", True),
    "patched_checker": ("00.softmax_temperature", None, "labkit.exercises.checking", True),
    "lying_values": ("00.softmax_temperature", None, "defines __eq__: a comparison or type that can lie", True),
    "watcher_off": ("00.softmax_temperature", "(sys.setprofile)", "setprofile", True),
    "recompiled": ("00.softmax_temperature", None, "refused while it ran: reads __code__", True),
    "other_thread": ("00.softmax_temperature", "calls labkit's own", "threading", True),
    "stack_peek": ("00.softmax_temperature", "grader's frames", "refused while it ran: reaches into the grader's "
                   "frames", True),
    "lower_level": (None, None, "private torch name", False),
    "socket_forgery": ("00.softmax_temperature", None, None, True),
    "pool_reference": ("00.softmax_temperature", "calls labkit's own", "executor", False),
    "pool_started_early": ("00.softmax_temperature", "calls labkit's own", "executor", False),
    "built_name": ("00.softmax_temperature", "(sys.setprofile)", "getattr with a name built at run time", False),
    "via_importlib": ("00.softmax_temperature", "calls labkit's own", "importlib", False),
    "exec_base64": ("00.softmax_temperature", "calls labkit's own", "exec", False),
    "listener_reference": ("00.softmax_temperature", "calls labkit's own", "QueueListener", False),
    "gc_callback": ("00.softmax_temperature", None, "gc.callbacks", False),
    "getattr_constant": ("00.softmax_temperature", "calls labkit's own", "names labkit's reference answer", False),
    "runpy_copy": (None, None, "runpy", False),
}

# The forged frames leave the worker's relay waiting, until its time limit, for bytes that never come: the step's
# answers are lost either way, and how long the relay waits proves nothing (300 s of the suite's time, issue 53).
SHORT_WAIT = {"socket_forgery": 20}


@pytest.mark.parametrize("learner", sorted(ATTACKS))
def test_an_attack_on_the_answering_step_earns_nothing_on_its_exercise_or_is_flagged(learner):
    """Each attack through the real step: its exercise earns 0 (with the reason where there is one), the other
    exercises of a submission that answered them keep their points, and the review names what it did. No fake
    result line is ever read: nothing earns more than lab 00's 5 points."""
    attacked, reason, flag, whole_zero = EXPECTED[learner]
    got = answer(list(ATTACKS[learner]), timeout_s=SHORT_WAIT.get(learner, 300))
    assert got.problem is None or whole_zero, (learner, got.problem)
    total = sum(result.points for result in got.results.values())
    if attacked is not None:
        assert got.points(attacked) == 0, (learner, got.details(attacked))
    if reason is not None:
        assert reason in got.details(attacked), (learner, got.details(attacked))
    if flag is not None:
        assert flag in "; ".join(finding.what for finding in got.review), (learner, got.review)
    assert total == 0 if whole_zero else total <= 5, (learner, total)
    if learner in ("pool_reference", "listener_reference", "getattr_constant", "exec_base64"):
        assert total == 3, (learner, total)  # only its own exercise: the others keep their points


def test_a_function_of_the_step_replaced_in_a_cell_is_put_back_before_it_runs():
    """A cell that replaces the step's own answer_plan (to answer with the reference, never disarmed) changes
    nothing: the step restores its module's functions as install() bound them, and the learner's own answer
    counts."""
    cells = ["import labkit.instructor.wall.answering as step\nfrom labkit.core import sampling\n"
             "from labkit.exercises.calling import Outcome\nfrom labkit.instructor.wall import wire\n"
             "def answer_plan(namespace, plan, kit=None):\n"
             "    outcomes = []\n"
             "    for item in plan['exercises']:\n"
             "        if item['id'] == '00.softmax_temperature':\n"
             "            for encoded in item['cases']:\n"
             "                args, kwargs = wire.from_plain(encoded, objects=True)\n"
             "                done = Outcome()\n"
             "                done.value = sampling.softmax_with_temperature(*args, **kwargs)\n"
             "                outcomes.append(wire.outcome_to_plain(done, done.value, 2000))\n"
             "    return {'00.softmax_temperature': {'outcomes': outcomes}}\n"
             "step.answer_plan = answer_plan\n", SAMPLE, PREDICTION,
             "def softmax_with_temperature(logits, temperature):\n    raise NotImplementedError\n"]
    got = answer(cells)
    assert got.points("00.softmax_temperature") == 0, got.details("00.softmax_temperature")
    assert got.points("00.sample_token") == 2 and got.points("00.predict_tokenizer") == 1


def test_the_disarming_replaced_in_a_cell_changes_nothing_the_step_does():
    """A cell that makes the disarming a no-op (so the reference on a pool's thread, out of the checker's tripwire,
    would answer) changes nothing: the step runs its own copies of the disarming's functions, made at install,
    and the reference reached from the pool is still disarmed."""
    cells = ["import labkit.instructor.wall.disarming as disarming\n"
             "disarming.disarm = disarming.rearm = disarming.find_copies = lambda *args, **kwargs: None\n"
             "disarming.every_function = lambda: []\n", *ATTACKS["pool_reference"]]
    got = answer(cells)
    assert got.points("00.softmax_temperature") == 0, got.details("00.softmax_temperature")
    assert "calls labkit's own" in got.details("00.softmax_temperature")
    assert got.points("00.sample_token") == 2 and got.points("00.predict_tokenizer") == 1


# A cell that would switch the audit hook off, each way the hook once read something a cell could change: its sets
# of events emptied, its test of a library's file answered by a replaced os.path.abspath, its class's __call__
# replaced (the hook was an object then). The search of the interpreter's objects is refused all the same.
UNHOOKING = {
    "its_sets_emptied": ("import labkit.instructor.wall.answering as hook\n"
                         "hook._ALWAYS = hook._IN_STEP = frozenset()\n"),
    "a_learner_frame_passed_for_a_librarys": ("import os.path\n"
                                              "os.path.abspath = lambda path: '/usr/lib/python3/dist-packages/x.py'\n"),
    "its_class_call_replaced": ("import labkit.instructor.wall.answering as hook\n"
                                "for name in dir(hook):\n"
                                "    if name.startswith('_Trace'):\n"
                                "        getattr(hook, name).__call__ = lambda self, event, args: None\n"),
}


@pytest.mark.parametrize("name", sorted(UNHOOKING))
def test_a_cell_cannot_switch_the_audit_hook_off(name):
    probe = ("import gc\ntry:\n    found = len(gc.get_objects())\n    print('SEARCHED', found)\n"
             "except PermissionError:\n    print('REFUSED')\n")
    got = answer([UNHOOKING[name] + probe, SAMPLE, PREDICTION])
    assert "REFUSED" in got.output and "SEARCHED" not in got.output, (name, got.output[-500:])
    assert "searches the interpreter's objects" in "; ".join(finding.what for finding in got.review), name


# What the step reads after a learner cell could have changed it: a module's names, a library module's functions,
# the interpreter's built-ins. Each cell below, if the step read the changed value, would leave the reference
# armed, and the pool's thread (out of the checker's tripwire) would answer with it.
REBOUND = {
    "the_disarming_module_types": (
        "import types as real\nimport labkit.instructor.wall.disarming as disarming\n"
        "class Fake:\n    CodeType = real.CodeType\n    FunctionType = type(None)\n"
        "disarming.types = Fake\n"),
    "gc_finding_nothing": "import gc\ngc.get_objects = lambda *args, **kwargs: []\n",
    "gc_module_swapped": ("import sys, types\nfake = types.ModuleType('gc')\nfake.get_objects = lambda *a, **k: []\n"
                          "sys.modules['gc'] = fake\n"),
    "builtin_type_lies": ("import builtins, types\nreal_type = builtins.type\n"
                          "def lying_type(*args):\n"
                          "    found = real_type(*args)\n"
                          "    return real_type(None) if len(args) == 1 and found is types.FunctionType else found\n"
                          "builtins.type = lying_type\n"),
    # The step's own serialisation, after the exercises' functions are armed again: json's functions replaced
    # in a cell see the cases going in and could rewrite the answers coming out with the reference's.
    "json_rewrites_the_answers": (
        "import json\nfrom labkit.core import sampling\nfrom labkit.instructor.wall import wire\n"
        "real_dumps, real_loads, seen = json.dumps, json.loads, {}\n"
        "def loads(text, *args, **kwargs):\n"
        "    value = real_loads(text, *args, **kwargs)\n"
        "    if isinstance(value, dict) and 'exercises' in value:\n"
        "        seen['plan'] = value\n"
        "    return value\n"
        "def dumps(value, *args, **kwargs):\n"
        "    if isinstance(value, dict) and 'answers' in value and 'plan' in seen:\n"
        "        for item in seen['plan']['exercises']:\n"
        "            if item['id'] == '00.softmax_temperature':\n"
        "                outcomes = []\n"
        "                for encoded in item['cases']:\n"
        "                    args_, kwargs_ = wire.from_plain(encoded, objects=True)\n"
        "                    outcomes.append({'printed': '', 'timed_out': False, 'forbidden': None, 'mutated': None,\n"
        "                                     'value': wire.to_plain(sampling.softmax_with_temperature(*args_, **kwargs_))})\n"
        "                value['answers']['00.softmax_temperature'] = {'outcomes': outcomes}\n"
        "    return real_dumps(value, *args, **kwargs)\n"
        "json.loads, json.dumps = loads, dumps\n"),
}


@pytest.mark.parametrize("name", sorted(REBOUND))
def test_what_the_step_reads_is_what_install_bound(name):
    got = answer([REBOUND[name], *ATTACKS["pool_reference"]])
    assert got.points("00.softmax_temperature") == 0, (name, got.details("00.softmax_temperature"))
    if name != "builtin_type_lies":  # a lying type() breaks the learner's own calls (torch's, labkit's): all fail
        assert got.points("00.sample_token") == 2 and got.points("00.predict_tokenizer") == 1, name


def test_a_property_of_the_checkers_deadline_never_runs_inside_the_hook():
    """The hook once read the checker's deadline's fields while it judged an event, ignoring every other event
    meanwhile: a property a cell put on the Deadline class ran there, free to search the interpreter's objects (and
    find the signing key). The hook now reads a float in the checker's frame and its own clock."""
    cell = ("from labkit.exercises import check\nfrom labkit.exercises.deadline import Deadline\nimport gc\nLOG = []\n"
            "def started(self):\n"
            "    try:\n        gc.get_objects()\n        LOG.append('SEARCHED')\n"
            "    except PermissionError:\n        LOG.append('REFUSED')\n"
            "    return self.__dict__.get('_kept_started', 0.0)\n"
            "def keep_started(self, value):\n    self.__dict__['_kept_started'] = value\n"
            "Deadline._started = property(started, keep_started)\n"
            "check('00.sample_token')\nprint('LOG', LOG)\n")
    got = answer([SAMPLE, cell, PREDICTION])
    assert "LOG" in got.output and "SEARCHED" not in got.output, got.output[-800:]
