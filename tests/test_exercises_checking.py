"""labkit.exercises.checking: every kind of broken learner code is judged into a verdict, never a traceback; a
prediction earns its point for answering, its closeness recorded apart; labkit's own failures are labkit's."""

import sys

import pytest
import torch

from labkit.exercises.checking import check_function
from labkit.exercises.definitions import Exercise
from zoo import CHOICE, DOUBLE, GUESS, double, random_vector


def test_a_correct_function_passes_and_says_what_was_checked():
    verdict = check_function(DOUBLE, lambda x: x * 2)
    assert verdict.status == "passed" and verdict.points == 3
    assert "1 hand-computed cases and 5 random cases" in str(verdict)


def test_missing_and_stub_functions_are_not_attempted():
    assert check_function(DOUBLE, None).status == "not attempted"

    def stub(x):
        raise NotImplementedError("your code here")

    verdict = check_function(DOUBLE, stub)
    assert verdict.status == "not attempted" and verdict.points == 0
    assert "still raises NotImplementedError" in str(verdict)


def test_a_non_function_is_reported():
    verdict = check_function(DOUBLE, 42)
    assert verdict.status == "failed" and "should be a function, it is a int" in str(verdict)


def test_an_exception_is_reported_with_its_type_and_message():
    verdict = check_function(DOUBLE, lambda x: x / "two")
    assert verdict.status == "failed"
    assert "raised TypeError" in str(verdict) and "hint:     multiply by two" in str(verdict)


@pytest.mark.parametrize("wrong,expected", [
    (lambda x: None, "returned None (is a `return` missing?)"),
    (lambda x: (2 * x).tolist(), "expected a torch.Tensor, got list"),
    (lambda x: (2 * x).unsqueeze(0), "expected shape (2,), got shape (1, 2)"),
    (lambda x: (2 * x).long(), "expected a floating-point tensor, got dtype torch.int64"),
])
def test_wrong_type_or_shape_is_named(wrong, expected):
    verdict = check_function(DOUBLE, wrong)
    assert verdict.status == "failed" and expected in str(verdict)


def test_a_known_mistake_gets_its_hint_and_the_first_failing_case_is_shown():
    verdict = check_function(DOUBLE, lambda x: x + 1)
    text = str(verdict)
    assert "hand case 1 of 1: small numbers" in text
    assert "expected: tensor of shape (2,): [2, -4]" in text and "got:      tensor of shape (2,): [2, -1]" in text
    assert "largest difference at index (1,): expected -4, got -1" in text
    assert "hint:     you added one instead of doubling" in text


def test_a_memorized_answer_fails_onrandom_vectors():
    memorized = torch.tensor([2.0, -4.0])
    verdict = check_function(DOUBLE, lambda x: memorized.clone(), seed=1)
    assert verdict.status == "failed" and "random case 1 of 5 (seed 1)" in str(verdict)


def test_a_failure_replays_with_its_seed():
    first = str(check_function(DOUBLE, lambda x: x * 3, seed=7))
    assert first == str(check_function(DOUBLE, lambda x: x * 3, seed=7))


# ----- a prediction: one guess, no argument; the point is for answering, closeness is recorded apart -----


def test_a_well_formed_guess_earns_the_point_and_says_how_close_it_was():
    for guess, close, distance in ((42, True, "exactly right"), (40.5, True, "4% too low"),
                                   (67, False, "60% too high"), (4, False, "off by 10.5x (too low)")):
        verdict = check_function(GUESS, lambda: guess)
        assert (verdict.status, verdict.points, verdict.close) == ("passed", 2, close), verdict
        text = str(verdict)
        assert text.startswith("[ANSWERED]") and f"your prediction: {guess}" in text and "labkit's answer: 42.0" in text
        assert f"distance:        {distance}; close (within ±2): {'yes' if close else 'no'}" in text
        assert "random cases" not in text and "rtol" not in text


def test_a_choice_is_right_or_not_and_must_be_one_of_the_choices():
    right, wrong = check_function(CHOICE, lambda: "b"), check_function(CHOICE, lambda: "c")
    assert (right.status, right.close, wrong.status, wrong.points, wrong.close) == ("passed", True, "passed", 1, False)
    assert "distance:        right" in str(right) and "distance:        not the answer" in str(wrong)
    malformed = check_function(CHOICE, lambda: "e")
    assert (malformed.status, malformed.points, malformed.close) == ("failed", 0, None)
    assert "your answer must be one of 'a', 'b', 'c', got 'e'" in str(malformed)


class _EqualsEverything:
    def __eq__(self, other):
        return True


@pytest.mark.parametrize("answer, problem", [
    (lambda: "42", "your answer must be a number, got str"),
    (lambda: True, "your answer must be a number, got bool"),
    (lambda: float("nan"), "your answer must be a finite number"),
    (lambda: None, "your answer must be a number, got NoneType"),
    (lambda: _EqualsEverything(), "your answer must be a number, got _EqualsEverything"),
])
def test_a_malformed_guess_fails_without_showing_the_answer(answer, problem):
    verdict = check_function(GUESS, answer)
    assert verdict.status == "failed" and verdict.points == 0 and verdict.close is None
    text = str(verdict)
    assert problem in text and "six times seven (within 2)" in text and "hint:     multiply; it is not 67" in text
    assert "42" not in text  # the learner fixes the form without seeing the answer


def test_editing_a_prediction_after_the_answer_gains_nothing():
    first = check_function(GUESS, lambda: 67)  # the verdict shows 42
    edited = check_function(GUESS, lambda: 42)  # the learner copies it
    assert first.points == edited.points == 2  # the point was earned by answering at all
    assert (first.close, edited.close) == (False, True)  # only the (unscored) accuracy moves


def test_a_one_number_tensor_is_a_number():
    assert check_function(GUESS, lambda: torch.tensor(41.0)).close is True


def test_a_guess_that_raises_is_reported_not_raised():
    verdict = check_function(GUESS, lambda: 1 / 0)
    assert verdict.status == "failed"
    assert "raised ZeroDivisionError: division by zero" in str(verdict) and "multiply; it is not 67" in str(verdict)

    def stub():
        raise NotImplementedError("your code here")

    assert check_function(GUESS, stub).status == "not attempted"


# ----- problems on labkit's side are reported as such, never raised -----


def _broken_reference(x):
    raise RuntimeError("the model file is missing")


def test_an_error_in_the_reference_is_labkits_problem_not_the_learners():
    broken = Exercise(id="zz.broken", title="Broken", function="double", reference=_broken_reference,
                      hand_cases=DOUBLE.hand_cases, random_case=random_vector, n_random=2)
    verdict = check_function(broken, lambda x: 2 * x)
    assert verdict.status == "error" and verdict.points == 0
    assert "labkit's side" in str(verdict) and "RuntimeError: the model file is missing" in str(verdict)
    assert "[LABKIT ERROR]" in str(verdict) and "LABKIT ERROR" in verdict._repr_html_()


def test_an_error_in_therandom_vectors_is_labkits_problem_too():
    def broken_cases(generator):
        raise ValueError("bad draw")

    broken = Exercise(id="zz.broken", title="Broken", function="double", reference=double,
                      hand_cases=DOUBLE.hand_cases, random_case=broken_cases, n_random=2)
    verdict = check_function(broken, lambda x: 2 * x)
    assert verdict.status == "error" and "labkit's side" in str(verdict) and "ValueError: bad draw" in str(verdict)


# ----- verdicts a learner can act on -----


# ----- one lab whose exercises cannot load does not break the others -----


@pytest.fixture
def a_broken_lab(tmp_path, monkeypatch):
    import labkit.exercises

    (tmp_path / "lab98.py").write_text("import a_module_that_does_not_exist\n")
    monkeypatch.setattr(labkit.exercises, "__path__", [*labkit.exercises.__path__, str(tmp_path)])
    yield
    sys.modules.pop("labkit.exercises.lab98", None)


def test_a_lab_that_fails_to_import_is_reported_and_the_others_still_work(a_broken_lab, capsys):
    from labkit.exercises import check, exercises, summary

    def softmax_with_temperature(logits, temperature):
        if temperature == 0:
            return torch.zeros_like(logits).scatter(-1, logits.argmax(-1, keepdim=True), 1.0)
        return torch.softmax(logits / temperature, dim=-1)

    verdict = check("00.softmax_temperature", {"softmax_with_temperature": softmax_with_temperature}, show=False)
    assert verdict.status == "passed"
    assert check("98.anything", {}, show=False) is None
    message = ("labkit could not load the exercises of lab 98: ModuleNotFoundError: "
               "No module named 'a_module_that_does_not_exist'")
    assert message in capsys.readouterr().out
    assert message in str(summary("98"))
    assert exercises("98") == [] and message in capsys.readouterr().out
    assert "00.softmax_temperature" in [ex.id for ex in exercises()]


def test_a_labkit_error_is_saved_as_not_attempted(monkeypatch):
    import labkit.exercises
    from labkit.exercises import progress
    from labkit.exercises import check

    broken = Exercise(id="zz.broken", title="Broken", function="double", reference=_broken_reference,
                      hand_cases=DOUBLE.hand_cases, random_case=random_vector, n_random=2)
    monkeypatch.setitem(labkit.exercises._REGISTRY, "zz.broken", broken)
    verdict = check("zz.broken", {"double": lambda x: 2 * x}, show=False)
    assert verdict.status == "error"
    saved = progress.load()["zz.broken"]
    assert (saved["status"], saved["attempts"], saved["points"]) == ("not attempted", 0, 0)


def test_a_name_that_is_labkits_own_function_says_how_it_got_there():
    """`from labkit.core.sampling import apply_temperature` in a later cell replaces the learner's function of that
    name: the check (and the grader, which shares this verdict) says so and how to import instead, not that the
    learner copied anything."""
    from labkit.core import sampling
    from labkit.exercises import get

    exercise = get("01.apply_temperature")
    verdict = check_function(exercise, sampling.apply_temperature)
    assert verdict.status == "failed"
    assert "  problem:  your function calls labkit's own `labkit.core.sampling.apply_temperature`" in verdict.lines
    assert any(line.startswith("  hint:     ") and "(if a later cell ran `from labkit.core.sampling import "
               "apply_temperature`, that replaced your function: import the module instead" in line
               for line in verdict.lines), verdict.lines
    # A function of another name than labkit's keeps the plain hint.
    from labkit.exercises import lab05

    other = check_function(get("05.largest_batch"), lambda *args, **kwargs: lab05.reference_largest_batch(*args, **kwargs))
    assert any(line.startswith("  problem:  your function calls labkit's own `labkit.exercises.lab05.reference_largest")
               for line in other.lines) and "a later cell" not in str(other), other.lines
