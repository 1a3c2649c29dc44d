"""labkit.checking: the checker reports every kind of broken learner code as a verdict, never a traceback."""

import math

import pytest
import torch

from labkit.checking import Case, Exercise, Mistake, check_function, compare


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
    import tests.test_checking as this

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
