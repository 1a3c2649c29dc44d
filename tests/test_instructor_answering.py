"""The grader's answering step, proven in-process against the real audit hook (tests/answering_harness.py plays the
worker's side of the socket): honest slow functions are told only that they ran out of time, and the routes of
issue #52 around the step's defences earn nothing on their exercise or are flagged with evidence. What needs the
wall itself (limits, the host's files, killed workers) is tests/test_instructor_grading_attacks.py."""

import pytest

from answering_harness import answer
from honest_corpus import PREDICTION, SAMPLE, SOFTMAX


def _slow(before: str) -> str:
    """SOFTMAX with ``before`` run first, inside the function."""
    return SOFTMAX.replace("    if temperature == 0", before + "    if temperature == 0", 1)


def test_an_honest_function_past_its_limit_is_told_only_that_it_ran_out_of_time():
    """A sleep, a loop that swallows every exception and a read on an empty pipe (issue #52): each fails on time
    alone, like the notebook's own check; nothing in the review, and the other exercises keep their points."""
    looping = ("def sample_token(probs, uniform):\n    while True:\n        try:\n            pass\n"
               "        except BaseException:\n            pass\n")
    sleeping = answer([_slow("    import time\n    time.sleep(8)\n"), looping, PREDICTION])
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
