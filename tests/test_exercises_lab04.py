"""Lab 04's prediction: the input channels LLM.int8() would keep in float at layer 15."""

from labkit.exercises import exercises, get
from labkit.exercises.checking import check_function

PREDICT = get("04.predict_outlier_channels")


def test_prediction_within_a_factor_of_two(embedded):
    truth = PREDICT.reference()
    assert 1 <= truth <= 3  # the q/k/v_proj input at layer 15: channel 247 (the residual stream: over 500)
    assert check_function(PREDICT, lambda: truth * 0.6).close is True
    assert check_function(PREDICT, lambda: 5).close is False


def test_the_prediction_says_what_may_be_called():
    assert PREDICT.n_random == 0
    assert PREDICT.allowed_text == ("No labkit function may be called inside your function: the check reports any "
                                    "call into labkit.")


def test_lab04_registers_its_exercises_in_notebook_order():
    assert [ex.id for ex in exercises("04")] == ["04.predict_outlier_channels"]
