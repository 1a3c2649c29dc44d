"""labkit.exercises.checking: the checker reports every kind of broken learner code as a verdict, never a traceback."""

import faulthandler
import math
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

import labkit.core.memory
import labkit.core.sampling
from labkit.exercises.checking import Case, Exercise, Mistake, check_function, compare, prediction


def _double(x):
    return 2 * x


def _random_case(generator):
    return Case((torch.randn(3, generator=generator, dtype=torch.float64),))


DOUBLE = Exercise(
    id="zz.double", title="Double it", function="double", reference=_double, points=3,
    hand_cases=(Case((torch.tensor([1.0, -2.0]),), label="small numbers"),),
    random_case=_random_case, n_random=5, time_limit_s=1.0,
    hints=("multiply by two",),
    mistakes=(Mistake("you added one instead of doubling", lambda x: x + 1),),
)


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


def test_editing_the_input_in_place_fails_even_when_the_result_is_right():
    def in_place(x):
        x *= 2
        return x

    verdict = check_function(DOUBLE, in_place)
    assert verdict.status == "failed" and "changed its input in place" in str(verdict)


def test_a_flood_of_printing_fails_but_a_little_is_fine():
    def chatty(x):
        print("debug", x)
        return 2 * x

    def flood(x):
        print("x" * 5000)
        return 2 * x

    assert check_function(DOUBLE, chatty).status == "passed"
    verdict = check_function(DOUBLE, flood)
    assert verdict.status == "failed" and "printed 5,001 characters" in str(verdict)


def test_a_function_that_never_returns_is_stopped():
    def forever(x):
        while True:
            pass

    verdict = check_function(DOUBLE, forever)
    assert verdict.status == "failed" and "no answer within 1 s" in str(verdict)


def test_a_bare_except_cannot_swallow_the_time_limit():
    def stubborn(x):
        while True:
            try:
                while True:
                    pass
            except Exception:
                pass

    assert "no answer within 1 s" in str(check_function(DOUBLE, stubborn))


def test_calling_the_reference_is_caught_however_it_is_reached():
    this = sys.modules[__name__]  # not `import tests.test_checking`: IPython 7 ships its own `tests` package

    assert "calls labkit's own" in str(check_function(DOUBLE, _double))
    assert "calls labkit's own" in str(check_function(DOUBLE, lambda x: this._double(x)))


def test_a_memorized_answer_fails_on_random_cases():
    memorized = torch.tensor([2.0, -4.0])
    verdict = check_function(DOUBLE, lambda x: memorized.clone(), seed=1)
    assert verdict.status == "failed" and "random case 1 of 5 (seed 1)" in str(verdict)


def test_a_failure_replays_with_its_seed():
    first = str(check_function(DOUBLE, lambda x: x * 3, seed=7))
    assert first == str(check_function(DOUBLE, lambda x: x * 3, seed=7))


def test_keyboard_interrupt_is_not_swallowed():
    def interrupted(x):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        check_function(DOUBLE, interrupted)


def test_compare_reports_nan_where_a_number_was_expected():
    assert "got nan" in compare(torch.tensor([1.0]), torch.tensor([math.nan]), 1e-5, 1e-8)
    assert compare(0.5, 0.5 + 1e-9, 1e-6, 0) is None
    assert compare(0.5, "0.5", 1e-6, 0) == "expected a number, got str"


def test_verdict_renders_as_html_too():
    html = check_function(DOUBLE, lambda x: x + 1)._repr_html_()
    assert "FAILED" in html and "#cf222e" in html


# ----- the time limit holds whatever the learner's code catches -----


@pytest.fixture
def hang_guard():
    """A check that hangs must fail the run, not stall it: dump the stacks and exit after half a minute."""
    faulthandler.dump_traceback_later(30, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def swallows_with_a_bare_except(x):
    total = 0
    while True:
        try:
            total += int(x.sum())
        except:  # noqa: E722 - the learner's code under test
            pass


def swallows_twice(x):
    while True:
        try:
            try:
                while True:
                    pass
            except BaseException:
                pass
        except:  # noqa: E722
            pass


def loops_in_finally(x):
    try:
        while True:
            pass
    finally:
        while True:
            pass


def loops_in_its_handler(x):
    try:
        while True:
            pass
    except BaseException:
        while True:
            pass


def swallows_in_a_helper(x):
    def spin():
        while True:
            pass

    while True:
        try:
            spin()
        except BaseException:
            continue


def turns_the_limit_into_its_own_error(x):
    try:
        while True:
            pass
    except BaseException:
        raise ValueError("interrupted")


def returns_late(x):
    try:
        while True:
            pass
    finally:
        return 2 * x  # noqa: B012 - swallows the limit and answers anyway


STUBBORN = [swallows_with_a_bare_except, swallows_twice, loops_in_finally, loops_in_its_handler,
            swallows_in_a_helper, turns_the_limit_into_its_own_error, returns_late]


@pytest.mark.parametrize("stubborn", STUBBORN, ids=[f.__name__ for f in STUBBORN])
def test_no_except_or_finally_keeps_a_check_past_its_time_limit(stubborn, hang_guard):
    start = time.perf_counter()
    verdict = check_function(DOUBLE, stubborn)
    assert verdict.status == "failed" and "no answer within 1 s" in str(verdict), verdict
    assert time.perf_counter() - start < 3


def test_the_time_limit_holds_off_the_main_thread_too(hang_guard):
    verdicts = []
    worker = threading.Thread(target=lambda: verdicts.append(check_function(DOUBLE, swallows_with_a_bare_except)),
                              daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "the check in a worker thread never returned"
    assert "no answer within 1 s" in str(verdicts[0])


def test_a_time_limit_leaves_the_caller_untouched(hang_guard):
    previous = sys.gettrace(), sys.getprofile()
    check_function(DOUBLE, swallows_twice)
    assert (sys.gettrace(), sys.getprofile()) == previous
    assert check_function(DOUBLE, lambda x: x * 2).status == "passed"  # nothing left pending from the last check


def test_a_time_limit_leaves_no_exception_behind(hang_guard):
    # the limit fires inside the learner's `except` block; afterwards no exception may still count as "being
    # handled", or every later error in the kernel would read "During handling of the above exception (TimeLimit)"
    def sleeps_and_swallows(x):
        while True:
            try:
                time.sleep(0.01)  # the alarm lands in this C call
            except BaseException:
                pass

    check_function(DOUBLE, sleeps_and_swallows)
    assert sys.exc_info() == (None, None, None)
    try:
        raise ValueError("unrelated")
    except ValueError as error:
        assert error.__context__ is None


def test_the_checker_starts_no_process_per_call(monkeypatch):
    # the checker is fast because each call runs in this process (its speed is measured by `make bench`)
    def no_process(*args, **kwargs):
        raise AssertionError("the checker started a process")

    monkeypatch.setattr(os, "fork", no_process)
    monkeypatch.setattr(subprocess.Popen, "__init__", no_process)
    for _ in range(3):
        assert check_function(DOUBLE, lambda x: x * 2).status == "passed"


# ----- any call into labkit is reported, except what the exercise allows -----


def _triple_gib(x):
    return labkit.core.memory.to_gib(3 * 2**30) * x


TRIPLE = Exercise(
    id="zz.triple", title="Triple it", function="triple", reference=lambda x: 3 * x, points=1,
    hand_cases=(Case((torch.tensor([1.0, -2.0]),)),), random_case=_random_case, n_random=3,
    allowed=(labkit.core.memory.to_gib,),
)


def test_a_call_into_any_labkit_module_is_reported_by_name():
    verdict = check_function(DOUBLE, lambda x: labkit.core.sampling.apply_temperature(x, 0.5))
    assert verdict.status == "failed"
    assert "calls labkit's own `labkit.core.sampling.apply_temperature`" in str(verdict)
    verdict = check_function(DOUBLE, lambda x: labkit.core.memory.to_gib(2 * 2**30) * x)
    assert "calls labkit's own `labkit.core.memory.to_gib`" in str(verdict)


def test_an_allowed_labkit_helper_passes_and_says_so():
    assert check_function(TRIPLE, _triple_gib).status == "passed"
    assert "labkit.core.memory.to_gib" in TRIPLE.allowed_text
    assert "calls labkit's own `labkit.core.sampling.apply_temperature`" in str(
        check_function(TRIPLE, lambda x: labkit.core.sampling.apply_temperature(x, 1 / 3)))
    assert DOUBLE.allowed_text.startswith("No labkit function")


# ----- a prediction: one guess, no argument; the point is for answering, closeness is recorded apart -----

GUESS = prediction("zz.guess", "Predict: 6 x 7", "predicted_product", lambda: 42.0, atol=2, points=2,
                   asked="six times seven (within 2)", hint="multiply; it is not 67")
CHOICE = prediction("zz.choice", "Predict: the even one", "even_choice", lambda: "b", choices=("a", "b", "c"),
                    asked='one of "a", "b", "c"', hint="return one letter")


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


def test_a_prediction_may_not_ask_labkit_for_the_answer():
    verdict = check_function(GUESS, lambda: labkit.core.memory.to_gib(42 * 2**30))
    assert verdict.status == "failed" and verdict.close is None
    assert "calls labkit's own `labkit.core.memory.to_gib`" in str(verdict)


# ----- problems on labkit's side are reported as such, never raised -----


def _broken_reference(x):
    raise RuntimeError("the model file is missing")


def test_an_error_in_the_reference_is_labkits_problem_not_the_learners():
    broken = Exercise(id="zz.broken", title="Broken", function="double", reference=_broken_reference,
                      hand_cases=DOUBLE.hand_cases, random_case=_random_case, n_random=2)
    verdict = check_function(broken, lambda x: 2 * x)
    assert verdict.status == "error" and verdict.points == 0
    assert "labkit's side" in str(verdict) and "RuntimeError: the model file is missing" in str(verdict)
    assert "[LABKIT ERROR]" in str(verdict) and "LABKIT ERROR" in verdict._repr_html_()


def test_an_error_in_the_random_cases_is_labkits_problem_too():
    def broken_cases(generator):
        raise ValueError("bad draw")

    broken = Exercise(id="zz.broken", title="Broken", function="double", reference=_double,
                      hand_cases=DOUBLE.hand_cases, random_case=broken_cases, n_random=2)
    verdict = check_function(broken, lambda x: 2 * x)
    assert verdict.status == "error" and "labkit's side" in str(verdict) and "ValueError: bad draw" in str(verdict)


# ----- verdicts a learner can act on -----


def test_a_long_torch_error_shows_its_first_line_and_the_learners_line():
    def bad_sort(x):
        ranked = torch.sort(x, dim="last")
        return ranked

    text = str(check_function(DOUBLE, bad_sort))
    problem = [line for line in text.splitlines() if "problem:" in line]
    assert problem == ["    problem:  your function raised TypeError: sort() received an invalid combination of "
                       "arguments - got (Tensor, dim=str), but expected one of:"], text
    assert 'where:    in bad_sort: ranked = torch.sort(x, dim="last")' in text
    assert "(Tensor input, int dim" not in text  # torch's list of signatures stays out


def test_the_difference_is_found_where_it_really_is_among_infinities():
    inf = math.inf
    expected = torch.tensor([-inf, 2.0, 2.0, -inf, -inf])
    got = torch.tensor([-inf, 2.0, 2.0, 2.0, -inf])
    assert compare(expected, got, 1e-6, 1e-9) == (
        "largest difference at index (3,): expected -inf (removed), got 2 (kept) (tolerance rtol=1e-06, atol=1e-09)")
    assert "expected 2 (kept), got -inf (removed)" in compare(got, expected, 1e-6, 1e-9)
    assert "index (1,): expected 1, got 5" in compare(torch.tensor([inf, 1.0, 0.0]), torch.tensor([inf, 5.0, 0.1]),
                                                      1e-6, 1e-9)
    assert "index (0,): expected inf, got -inf" in compare(torch.tensor([inf]), torch.tensor([-inf]), 1e-6, 1e-9)


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
                      hand_cases=DOUBLE.hand_cases, random_case=_random_case, n_random=2)
    monkeypatch.setitem(labkit.exercises._REGISTRY, "zz.broken", broken)
    verdict = check("zz.broken", {"double": lambda x: 2 * x}, show=False)
    assert verdict.status == "error"
    saved = progress.load()["zz.broken"]
    assert (saved["status"], saved["attempts"], saved["points"]) == ("not attempted", 0, 0)


class _AlwaysEqualString(str):
    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


def test_a_prediction_is_judged_as_plain_data_not_by_the_learners_objects():
    verdict = check_function(CHOICE, lambda: _AlwaysEqualString("a"))  # "a" that claims to equal everything
    assert (verdict.status, verdict.close) == ("passed", False)
    numpy = pytest.importorskip("numpy")
    assert check_function(GUESS, lambda: numpy.float64(41.5)).close is True
