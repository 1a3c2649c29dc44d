"""labkit.exercises.definitions: what an exercise is and how its verdict reads; a multiple-choice prediction is
one helper, asked the same way in every lab."""

from labkit.exercises.checking import check_function
from labkit.exercises.definitions import choice_prediction, prediction
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
        hint='return one lower-case letter as a string, e.g. "a"; an embedding row is looked up by id, and the id is '
             "all the model ever sees of the text")
    assert PREDICT_TOKENIZER == spelled_out
    assert PREDICT_TOKENIZER.hand_cases[0].label == ('why a tokenizer of the same size can still break a run: one of '
                                                     '"a", "b", "c", "d"')


def test_a_choice_prediction_accepts_only_its_letters():
    quiz = choice_prediction("zz.quiz", "Predict: the even one", "even_choice", lambda: "b",
                             choices={"a": "one", "b": "two"}, question="which is even", hint="halve it")
    assert check_function(quiz, lambda: "b").close is True and check_function(quiz, lambda: "a").close is False
    assert "your answer must be one of 'a', 'b', got 'c'" in str(check_function(quiz, lambda: "c"))
