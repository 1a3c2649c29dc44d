"""labkit.instructor.watch's parts that run without a kernel: the answering step's calls, the thread check, the
copy detector. (The audit hook and the signed step run in the learner's kernel: the attack suite,
tests/test_instructor_grading_attacks.py, holds them to their word inside the real wall.)"""

import os
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor

import pytest

import labkit
from labkit.core import sampling
from labkit.instructor import watch


LABKIT_DIR = os.path.dirname(os.path.abspath(labkit.__file__)) + os.sep  # the package, not a checkout named labkit


def _library(filename: str) -> bool:
    return "site-packages" in filename or "/lib/python3" in filename or os.path.abspath(filename).startswith(LABKIT_DIR)


def test_a_thread_or_pool_the_notebook_left_running_is_forbidden_at_the_step():
    import sys

    quiet = set(sys._current_frames())
    stop = threading.Event()
    learner = threading.Thread(target=lambda: stop.wait(10))  # its target: code outside any library
    learner.start()
    try:
        found: list[str] = []
        with pytest.raises(PermissionError):
            watch._check_threads(sys._current_frames(), quiet, _library, found)
        assert "still running" in found[0]
    finally:
        stop.set()
        learner.join()
    with ThreadPoolExecutor(1) as pool:  # idle pool threads run only library code: a pool is named as such
        pool.submit(int).result()
        found = []
        with pytest.raises(PermissionError):
            watch._check_threads(sys._current_frames(), quiet, _library, found)
        assert found and "pool" in found[0]
    time.sleep(0.1)
    watch._check_threads(sys._current_frames(), quiet, _library, [])  # nothing left: the step goes on


def test_a_copy_of_a_labkit_function_is_known_by_its_bytecode_under_any_name():
    copies = watch._labkit_signatures()
    original = sampling.softmax_with_temperature.__code__
    renamed = original.replace(co_filename="mine.py", co_name="mine")
    assert copies[watch._signature(renamed)].endswith("softmax_with_temperature")
    own = types.FunctionType(compile("def f(logits, t):\n    return (logits / t).softmax(-1)\n", "cell", "exec")
                             .co_consts[0], {})
    assert watch._signature(own.__code__) not in copies


def test_a_watched_function_may_not_start_a_thread_nor_call_a_copy_of_labkit():
    """The second watcher on the answering step's thread: a thread started by the graded function (the reference
    run there, out of the watcher's sight) and a call into a renamed copy of a labkit function are forbidden."""
    import sys

    import torch

    def through_a_thread(logits, temperature):
        box = []
        worker = threading.Thread(target=lambda: box.append(sampling.softmax_with_temperature(logits, temperature)))
        worker.start()
        worker.join()
        return box[0]

    copy = types.FunctionType(sampling.softmax_with_temperature.__code__.replace(co_filename="cell.py"),
                              vars(sampling))
    state = {"forbidden": []}
    with pytest.raises(PermissionError, match="may not start a thread"):
        watch._watched(through_a_thread, state, _library, sys.getprofile, sys.setprofile)(torch.zeros(3), 1.0)
    assert state["forbidden"] == ["starts a thread or process (start_new_thread)"]
    state = {"forbidden": []}
    watch._watched(copy, state, _library, sys.getprofile, sys.setprofile)(torch.zeros(3), 1.0)
    assert state["forbidden"][0].startswith("calls a copy of labkit.core.sampling.") and sys.getprofile() is None
    honest = {"forbidden": []}
    probs = watch._watched(lambda logits, t: torch.softmax(logits / t, -1), honest, _library, sys.getprofile,
                           sys.setprofile)(torch.zeros(4), 1.0)
    assert honest["forbidden"] == [] and probs.tolist() == [0.25] * 4


def test_answer_plan_calls_each_function_on_its_cases_and_says_what_is_missing():
    from labkit.instructor import judging

    namespace: dict = {}
    exec("import torch\ndef softmax_with_temperature(logits, temperature):\n"
         "    if temperature == 0:\n"
         "        return torch.zeros_like(logits).scatter(-1, logits.argmax(-1, keepdim=True), 1.0)\n"
         "    return torch.softmax(logits / temperature, dim=-1)\ntokenizer_choice = 'b'\n", namespace)
    chosen, plan, drawn = judging.plan("00", seed=3)
    wrapped = []
    answers = watch.answer_plan(namespace, {"exercises": plan}, lambda f: wrapped.append(f) or f)
    assert answers["00.sample_token"] == {"missing": True}
    assert answers["00.predict_tokenizer"] == {"not_callable": "str"}
    results = {e.id: judging.judge(e, drawn[e.id], answers, None) for e in chosen}
    assert results["00.softmax_temperature"]["status"] == "passed" and wrapped  # every call went through the wrap
    forbidden = judging.judge(chosen[0], drawn[chosen[0].id], answers, None, ["reads __code__ (line 2: x)"])
    assert forbidden["points"] == 0 and "may not" in forbidden["details"][0]
