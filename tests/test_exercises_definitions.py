"""labkit.exercises.definitions: what an exercise is and how its verdict reads; a multiple-choice prediction is
one helper, asked the same way in every lab."""

import pytest

from labkit.exercises.checking import check_function
from labkit.exercises.definitions import Case, choice_prediction, prediction
from labkit.exercises.lab00 import PREDICT_TOKENIZER, TOKENIZER_CHOICES, tokenizer_answer
from zoo import DOUBLE


def test_verdict_renders_as_html_too():
    html = check_function(DOUBLE, lambda x: x + 1)._repr_html_()
    assert "FAILED" in html and "#cf222e" in html


def test_a_choice_prediction_is_the_prediction_a_lab_spelled_out_before():
    spelled_out = prediction(
        "00.predict_tokenizer", "Predict: why a different tokenizer breaks a run whose dimensions match",
        "tokenizer_choice", tokenizer_answer, choices=tuple(TOKENIZER_CHOICES),
        asked="why a tokenizer of the same size can still break a run: one of "
              + ", ".join(f'"{key}"' for key in TOKENIZER_CHOICES),
        hint='return one lower-case letter as a string, e.g. "a"; the letter of the one choice you think explains it',
        reveal=PREDICT_TOKENIZER.reveal,
        giveaways=PREDICT_TOKENIZER.giveaways, choice_texts=tuple(TOKENIZER_CHOICES.values()))
    assert PREDICT_TOKENIZER == spelled_out
    assert PREDICT_TOKENIZER.hand_cases[0].label == ('why a tokenizer of the same size can still break a run: one of '
                                                     '"a", "b", "c", "d"')


def test_a_choice_prediction_accepts_only_its_letters():
    quiz = choice_prediction("zz.quiz", "Predict: the even one", "even_choice", lambda: "b",
                             choices={"a": "one", "b": "two"}, question="which is even", hint="halve it")
    assert check_function(quiz, lambda: "b").close is True and check_function(quiz, lambda: "a").close is False
    assert "your answer must be one of 'a', 'b', got 'c'" in str(check_function(quiz, lambda: "c"))


def test_a_prediction_shows_its_reveal_once_answered_in_text_and_html():
    quiz = choice_prediction("zz.quiz", "Predict: the even one", "even_choice", lambda: "b",
                             choices={"a": "one", "b": "two"}, question="which is even", hint="halve it",
                             reveal="**b**: two halves\n    evenly.\n\nThen `2 % 2 == 0`.", giveaways=("halves evenly",))
    answered = check_function(quiz, lambda: "a")
    assert str(answered).endswith("Why:\n  **b**: two halves evenly.\n  Then `2 % 2 == 0`.")
    assert "<b>b</b>: two halves evenly." in answered._repr_html_()
    assert "<code>2 % 2 == 0</code>" in answered._repr_html_()
    for unanswered in (check_function(quiz, lambda: "c"), check_function(quiz, None)):
        assert "Why" not in str(unanswered) and "halves" not in unanswered._repr_html_()
    plain = choice_prediction("zz.plain", "Predict: the even one", "even_choice", lambda: "b",
                              choices={"a": "one", "b": "two"}, question="which is even", hint="halve it")
    assert "Why" not in str(check_function(plain, lambda: "a"))  # a verdict without a reveal reads as before


def test_every_exercise_is_a_code_exercise_or_a_prediction_of_its_kind():
    from labkit.exercises import exercises
    from labkit.exercises.definitions import CodeExercise, Prediction

    registered = exercises()
    kinds = {type(exercise).__name__: set() for exercise in registered}
    for exercise in registered:
        kinds[type(exercise).__name__].add(exercise.kind)
    assert kinds == {"CodeExercise": {"code"}, "Prediction": {"prediction"}}
    letters = [e for e in registered if isinstance(e, Prediction) and all(isinstance(c, str) for c in e.choices)
               and e.choices]
    assert letters and all(len(e.choice_texts) == len(e.choices) for e in letters)
    assert PREDICT_TOKENIZER.answer_text("b") == TOKENIZER_CHOICES["b"]


def test_a_type_refuses_the_other_kind():
    from labkit.exercises.definitions import CodeExercise, Prediction

    with pytest.raises(ValueError, match="kind must be 'prediction'"):
        Prediction("zz.x", "X", "x", abs, (), lambda g: Case(()), kind="code")
    with pytest.raises(ValueError, match="kind must be 'code'"):
        CodeExercise("zz.x", "X", "x", abs, (), lambda g: Case(()), kind="prediction")
    with pytest.raises(ValueError, match="one text per choice"):
        Prediction("zz.x", "X", "x", abs, (), lambda g: Case(()), choices=("a", "b"), choice_texts=("one",))
