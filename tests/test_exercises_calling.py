"""labkit.exercises.calling: a learner's function runs on copies, within a time limit no ``except`` can swallow, its
printing captured, its calls into labkit reported; what it did comes back as an Outcome, never a traceback."""

import faulthandler
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

import labkit.core.memory
import labkit.core.sampling
import zoo
from labkit.exercises.checking import check_function
from labkit.exercises.definitions import Case, Exercise
from zoo import CHOICE, DOUBLE, GUESS, random_vector


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
    assert "calls labkit's own" in str(check_function(DOUBLE, zoo.double))
    assert "calls labkit's own" in str(check_function(DOUBLE, lambda x: zoo.double(x)))  # looked up as it runs


def test_keyboard_interrupt_is_not_swallowed():
    def interrupted(x):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        check_function(DOUBLE, interrupted)


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
    hand_cases=(Case((torch.tensor([1.0, -2.0]),)),), random_case=random_vector, n_random=3,
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


# ----- what the verdict can say about the call: the learner's line, labkit's calls, plain answers -----


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


def test_a_prediction_may_not_ask_labkit_for_the_answer():
    verdict = check_function(GUESS, lambda: labkit.core.memory.to_gib(42 * 2**30))
    assert verdict.status == "failed" and verdict.close is None
    assert "calls labkit's own `labkit.core.memory.to_gib`" in str(verdict)


class _AlwaysEqualString(str):
    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


def test_a_prediction_is_judged_as_plain_data_not_by_the_learners_objects():
    verdict = check_function(CHOICE, lambda: _AlwaysEqualString("a"))  # "a" that claims to equal everything
    assert (verdict.status, verdict.close) == ("passed", False)
    numpy = pytest.importorskip("numpy")
    assert check_function(GUESS, lambda: numpy.float64(41.5)).close is True
