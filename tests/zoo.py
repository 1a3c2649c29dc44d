"""The bug-zoo assertion every exercise test uses: the solution passes, each known bug fails pointedly."""

from labkit.exercises.checking import check_function


def assert_zoo(exercise, solution, zoo):
    """``zoo`` maps a deliberately wrong implementation to a phrase its verdict must contain."""
    assert check_function(exercise, solution).status == "passed", check_function(exercise, solution, seed=0)
    for wrong, pointer in zoo.items():
        verdict = check_function(exercise, wrong, seed=0)
        assert verdict.status == "failed", wrong.__name__
        assert pointer in str(verdict), f"{wrong.__name__}: {verdict}"
