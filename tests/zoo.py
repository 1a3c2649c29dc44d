"""The bug-zoo assertion every exercise test uses: the solution passes, each known bug fails pointedly. And the toy
exercises the checker's own tests share (tests/test_exercises_definitions.py, _calling.py, _checking.py)."""

import torch

from labkit.exercises.checking import check_function
from labkit.exercises.definitions import Case, Exercise, Mistake, prediction


def assert_zoo(exercise, solution, zoo):
    """``zoo`` maps a deliberately wrong implementation to a phrase its verdict must contain."""
    assert check_function(exercise, solution).status == "passed", check_function(exercise, solution, seed=0)
    for wrong, pointer in zoo.items():
        verdict = check_function(exercise, wrong, seed=0)
        assert verdict.status == "failed", wrong.__name__
        assert pointer in str(verdict), f"{wrong.__name__}: {verdict}"


# ----- toy exercises -----


def double(x):
    return 2 * x


def random_vector(generator):
    return Case((torch.randn(3, generator=generator, dtype=torch.float64),))


DOUBLE = Exercise(
    id="zz.double", title="Double it", function="double", reference=double, points=3,
    hand_cases=(Case((torch.tensor([1.0, -2.0]),), label="small numbers"),),
    random_case=random_vector, n_random=5, time_limit_s=1.0,
    hints=("multiply by two",),
    mistakes=(Mistake("you added one instead of doubling", lambda x: x + 1),),
)

GUESS = prediction("zz.guess", "Predict: 6 x 7", "predicted_product", lambda: 42.0, atol=2, points=2,
                   asked="six times seven (within 2)", hint="multiply; it is not 67")
CHOICE = prediction("zz.choice", "Predict: the even one", "even_choice", lambda: "b", choices=("a", "b", "c"),
                    asked='one of "a", "b", "c"', hint="return one letter")
