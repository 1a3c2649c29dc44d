"""labkit.instructor.wall.answering's parts that run without a kernel: the answering step's calls with the exercise's
forbidden functions disarmed. (The audit hook and the signed step run in the learner's kernel: the attack suite,
tests/test_instructor_grading_attacks.py, holds them to their word inside the real wall.)"""

import functools
import logging
import logging.handlers
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import nbformat
import torch

from labkit.core import sampling
from labkit.exercises import exercises, get
from labkit.exercises.checking import check_function
from labkit.instructor.grader import judging, review
from labkit.instructor.grader.reports import Finding, summary_text
from labkit.instructor.wall import disarming, reach

SOFTMAX = sampling.softmax_with_temperature
ORIGINAL = SOFTMAX.__code__


def _graded(namespace, lab="00", seed=3):
    chosen, plan, drawn = judging.plan(lab, seed)
    answers = disarming.answer_plan(namespace, {"exercises": plan})
    return {e.id: judging.judge(e, drawn[e.id], answers, None) for e in chosen}


def _honest_sample(probs, uniform):
    cumulative = probs.double().cumsum(0)
    return int((cumulative <= uniform * cumulative[-1]).sum())


def _through_a_listener(logits, temperature):
    """The reference called by a standard-library thread (a logging QueueListener) while this function waits."""
    box: queue.Queue = queue.Queue()

    class Handler(logging.Handler):
        def emit(self, record):
            try:
                box.put(reference(*record.msg))
            except BaseException as error:  # noqa: BLE001 - the tripwire's error, swallowed: still reached
                box.put(torch.zeros_like(record.msg[0]))

    reference = functools.partial(SOFTMAX)
    records: queue.Queue = queue.Queue()
    listener = logging.handlers.QueueListener(records, Handler())
    listener.start()
    records.put(logging.makeLogRecord({"msg": (logits, temperature)}))
    answer = box.get(timeout=5)
    listener.stop()
    return answer


def _through_a_pool(logits, temperature):
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(SOFTMAX, logits, temperature).result()


def _through_a_thread(logits, temperature):
    box = []

    def run():
        try:
            box.append(SOFTMAX(logits, temperature))
        except PermissionError:  # the tripwire's error, swallowed: reached all the same
            pass

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    return box[0] if box else torch.zeros_like(logits)


def test_a_disarmed_reference_fails_its_exercise_by_any_route_and_nothing_else():
    for route in (_through_a_listener, _through_a_pool, _through_a_thread, functools.partial(SOFTMAX)):
        results = _graded({"softmax_with_temperature": route, "sample_token": _honest_sample,
                           "tokenizer_choice": lambda: "b"})
        softmax = results["00.softmax_temperature"]
        assert softmax.points == 0 and "calls labkit's own `labkit.core.sampling.softmax_with_temperature`" in \
            " ".join(softmax.details), (route, softmax)
        assert (results["00.sample_token"].points, results["00.predict_tokenizer"].points) == (2, 1), route
        assert SOFTMAX.__code__ is ORIGINAL  # armed again after the exercise
    assert SOFTMAX(torch.tensor([0.0, 0.0]), 1.0).tolist() == [0.5, 0.5]


def test_the_reference_of_another_exercise_stays_armed():
    """Lab 07's speculative round may call draw_with_uniform, which is lab 00's reference: not disarmed there."""
    names = {name for exercise_id in ("07.speculative_round", "07.prompt_lookup")
             for name in reach.forbidden_codes(get(exercise_id)).values()}
    assert "labkit.core.speculative.speculative_round" in names
    assert "labkit.core.speculative.draw_with_uniform" not in names
    # torch's ready-made loss written in Python is disarmed too; one written in C is left to the checker's tripwire
    assert {"labkit.core.loss.cross_entropy", "torch.nn.functional.cross_entropy"} <= set(
        reach.forbidden_codes(get("02.cross_entropy")).values())
    assert set(reach.forbidden_codes(get("00.sample_token")).values()) == {"labkit.core.speculative.draw_with_uniform"}


def test_the_forbidden_set_is_what_the_reference_reaches_less_what_the_learner_may_call():
    """A thin wrapper's worker is disarmed with it (lab 05's allocator, lab 07's prompt lookup), what the exercise
    allows is not (lab 00's apply_temperature is its own exercise in lab 01, allowed nowhere in lab 00), and the
    methods of an object a case hands the learner stay callable (lab 07's ScoringModel, lab 06's StepCounter)."""
    allocator = set(reach.forbidden_codes(get("05.paged_allocator")).values())
    assert {"labkit.core.paging.replay_block_events", "labkit.core.paging.BlockAllocator.allocate",
            "labkit.core.paging.BlockAllocator.__init__"} <= allocator
    lookup = set(reach.forbidden_codes(get("07.prompt_lookup")).values())
    assert "labkit.runtime.drafters.PromptLookup.propose" in lookup
    softmax = set(reach.forbidden_codes(get("00.softmax_temperature")).values())
    assert "labkit.core.sampling.apply_temperature" in softmax  # allowed=(): it does half the exercise
    greedy = set(reach.forbidden_codes(get("06.greedy_loop")).values())
    assert not any(name.startswith("labkit.runtime.step_counter.StepCounter") for name in greedy)
    for exercise in exercises():
        allowed = reach.reached(exercise.allowed)
        assert not set(reach.forbidden_codes(exercise)) & set(allowed), exercise.id


def test_every_copy_of_a_forbidden_function_is_disarmed_not_only_the_original():
    """A function made on the reference's code, or on a copy of it with the same file, first line and name, is
    found among the interpreter's functions and disarmed with the original."""
    import types

    twin = types.FunctionType(ORIGINAL, SOFTMAX.__globals__)
    copied = types.FunctionType(ORIGINAL.replace(co_consts=ORIGINAL.co_consts), SOFTMAX.__globals__)
    codes = reach.forbidden_codes(get("00.softmax_temperature"))
    found = {id(function) for function, _, _ in disarming.disarm_targets(codes, [SOFTMAX, twin, copied, _honest_sample])}
    assert found == {id(SOFTMAX), id(twin), id(copied)}
    results = _graded({"softmax_with_temperature": lambda logits, temperature: copied(logits, temperature),
                       "sample_token": _honest_sample, "tokenizer_choice": lambda: "b"})
    assert results["00.softmax_temperature"].points == 0
    assert "softmax_with_temperature" in " ".join(results["00.softmax_temperature"].details)
    assert copied(torch.tensor([0.0, 0.0]), 1.0).tolist() == [0.5, 0.5]  # armed again afterwards


def test_an_honest_wrong_answer_equal_to_a_known_mistake_earns_what_the_check_gives():
    """The natural first attempt `int(probs.argmax())` is lab 00's _sample_argmax mistake, byte for byte: it fails
    sample_token with the mistake's hint, and the other exercises keep their points (3 of 5)."""
    namespace: dict = {}
    exec("import torch\ndef softmax_with_temperature(logits, temperature):\n"
         "    if temperature == 0:\n"
         "        return torch.zeros_like(logits).scatter(-1, logits.argmax(-1, keepdim=True), 1.0)\n"
         "    return torch.softmax(logits / temperature, dim=-1)\n"
         "def sample_token(probs, uniform):\n    return int(probs.argmax())\n"
         "def tokenizer_choice():\n    return 'b'\n", namespace)
    results = _graded(namespace)
    assert [r.points for r in results.values()] == [2, 0, 1]
    assert "argmax is greedy decoding" in " ".join(results["00.sample_token"].details)
    assert check_function(get("00.sample_token"), namespace["sample_token"]).status == "failed"
    assert not any("may not" in line for r in results.values() for line in r.details)


def test_answer_plan_calls_each_function_on_its_cases_and_says_what_is_missing():
    namespace: dict = {}
    exec("import torch\ndef softmax_with_temperature(logits, temperature):\n"
         "    if temperature == 0:\n"
         "        return torch.zeros_like(logits).scatter(-1, logits.argmax(-1, keepdim=True), 1.0)\n"
         "    return torch.softmax(logits / temperature, dim=-1)\ntokenizer_choice = 'b'\n", namespace)
    chosen, plan, drawn = judging.plan("00", seed=3)
    answers = disarming.answer_plan(namespace, {"exercises": plan})
    assert answers["00.sample_token"] == {"missing": True}
    assert answers["00.predict_tokenizer"] == {"not_callable": "str"}
    results = {e.id: judging.judge(e, drawn[e.id], answers, None) for e in chosen}
    assert results["00.softmax_temperature"].status == "passed"
    assert results["00.sample_token"].status == "not attempted"
    stopped = judging.judge(chosen[0], drawn[chosen[0].id], None, "the grader's answering step failed: x")
    assert stopped.points == 0 and "answering step failed" in stopped.details[0]


def test_what_the_hook_refused_is_a_review_finding_in_its_cell():
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell(
        "import gc\ndef f():\n    return gc.get_objects()")])
    refused = [{"what": "searches the interpreter's objects", "line": 3, "text": "return gc.get_objects()"},
               {"what": "reads __code__", "line": 1, "text": "not in the notebook"}, "malformed"]
    assert review.refusals(notebook, refused) == [
        Finding(1, 3, "refused while it ran: searches the interpreter's objects (return gc.get_objects())"),
        Finding(None, 1, "refused while it ran: reads __code__ (not in the notebook)")]
    assert summary_text(review.refusals(notebook, refused)).endswith(
        "; refused while it ran: reads __code__ (not in the notebook)")
