"""labkit.instructor.grader.judging: which registered mistake a failing function behaves like, the case it failed
first, and a prediction's answer against labkit's; each kept in the report's JSON."""

import json

import pytest
import torch

from labkit.exercises import get
from labkit.instructor.grader.reports import NO_KNOWN_MISTAKE, FailedCase, SubmissionReport
from synthetic_class import RIGHT, STUB, graded

SOFTMAX, SAMPLE = get("00.softmax_temperature"), get("00.sample_token")


@pytest.mark.parametrize("exercise", [SOFTMAX, SAMPLE], ids=lambda e: e.id)
def test_each_known_mistake_is_named_by_the_hint_the_check_shows(exercise):
    for index, mistake in enumerate(exercise.mistakes):
        result = graded(exercise.id, index)
        assert (result.status, result.points) == ("failed", 0)
        assert (result.mistake_number, result.mistake) == (index + 1, mistake.hint), result
        assert f"  hint:     {mistake.hint}" in result.details  # the learner's check showed the same words


def test_the_first_failing_case_is_recorded_with_its_kind_and_label():
    # multiplying by T (mistake 5) agrees with dividing at T = 1: the worked example passes, T = 2 fails first
    result = graded(SOFTMAX.id, 4)
    assert result.failed_case.kind == "hand"
    failing = SOFTMAX.hand_cases[result.failed_case.number - 1]
    assert result.failed_case.label == failing.label and failing.args[1] != 1.0
    assert result.failed_case.number > 1


def test_a_function_no_mistake_explains_is_said_so():
    result = graded(SOFTMAX.id, lambda logits, temperature: torch.zeros_like(logits))
    assert result.status == "failed" and result.mistake == NO_KNOWN_MISTAKE and result.mistake_number is None
    assert result.failed_case == FailedCase(1, "hand", SOFTMAX.hand_cases[0].label)
    raising = graded(SOFTMAX.id, lambda logits, temperature: 1 / 0)  # no output to match
    assert raising.mistake == NO_KNOWN_MISTAKE and "ZeroDivisionError" in " ".join(raising.details)


def test_right_and_stub_record_no_mistake():
    assert graded(SOFTMAX.id, RIGHT).mistake is None and graded(SOFTMAX.id, RIGHT).status == "passed"
    assert graded(SOFTMAX.id, STUB).status == "not attempted" and graded(SOFTMAX.id, STUB).failed_case is None


def test_a_prediction_keeps_the_answer_labkits_and_the_distance():
    result = graded("05.predict_qwen3_kv_gib", 3.5)
    assert (result.answer, result.truth, result.distance) == (3.5, 4.375, "20% too low")
    choice = graded("00.predict_tokenizer", "c")
    assert (choice.answer, choice.truth, choice.distance) == ("c", "b", "not the answer")
    assert graded("00.predict_tokenizer", 7).answer is None  # not a well-formed answer: nothing to compare


def test_the_report_json_round_trip_keeps_mistake_case_and_answer():
    results = (graded(SOFTMAX.id, 4), graded("00.predict_tokenizer", "b"), graded("01.predict_order", ("A", "AB")))
    report = SubmissionReport(notebook="ana.ipynb", lab="00", exercises=results)
    again = SubmissionReport.from_json(json.loads(json.dumps(report.to_json())))
    assert again == report
    assert again.exercises[2].answer == ("A", "AB") and again.exercises[0].failed_case.kind == "hand"


@pytest.mark.parametrize("name, mistake_function", [("softmax_multiplies", "_multiplied"),
                                                    ("softmax_divides_by_zero", "_zero_divides"),
                                                    ("argmax_sample", "_sample_argmax")])
def test_a_natural_attempt_answered_by_the_real_answering_step_is_named(name, mistake_function):
    """A first attempt as a learner writes it (tests/honest_corpus.py), answered by the answering step the worker
    runs in the learner's kernel (here without the wall), its answers through the wire's encoding, then judged."""
    from honest_corpus import NATURAL

    from labkit.instructor.grader import judging
    from labkit.instructor.wall import disarming, wire

    exercise_id, source = NATURAL[name]
    exercise = get(exercise_id)
    namespace: dict = {}
    exec(compile(source, "<learner cell>", "exec"), namespace)  # noqa: S102
    _, plan, drawn = judging.plan(exercise.lab, seed=11)
    answers = disarming.answer_plan(namespace, {"exercises": [item for item in plan if item["id"] == exercise_id]})
    result = judging.judge(exercise, drawn[exercise_id], wire.decode(wire.encode(answers)), None)
    assert result.status == "failed"
    index = [m.wrong.__name__ for m in exercise.mistakes].index(mistake_function)
    assert (result.mistake_number, result.mistake) == (index + 1, exercise.mistakes[index].hint)
    assert result.failed_case is not None and result.failed_case.kind in ("hand", "hidden", "random")
