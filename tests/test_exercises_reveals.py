"""The reveal guard (``labkit.exercises.reveals``) and the check's "Why:": an answer shows, and is computed, only
once answered."""

from __future__ import annotations

import pytest

from labkit.exercises import check, exercises, progress
from labkit.exercises.checking import check_function
from labkit.exercises.definitions import Prediction
from labkit.exercises.reveals import answered, reveal, waiting_message

PREDICTIONS = [exercise for exercise in exercises() if isinstance(exercise, Prediction)]


@pytest.fixture
def fresh_progress(tmp_path, monkeypatch):
    path = tmp_path / "progress.json"
    monkeypatch.setenv("LABKIT_PROGRESS", str(path))
    return path


def _reveal_cell(question, computed: list) -> dict:
    """A reveal cell run as a notebook runs it: its body appends to ``computed`` (a side effect a test can see)
    and binds ``decode_calls``; returns the namespace it ran in."""
    namespace = {"reveal": reveal, "question": question, "computed": computed}
    exec('if reveal(question):\n'
         '    computed.append("decode")\n'
         '    decode_calls = 8 - 1\n'
         '    print(f"decode: {decode_calls}")\n', namespace)
    return namespace


def test_a_reveal_body_does_not_run_until_its_prediction_is_answered(fresh_progress, capsys):
    question = "06.predict_forward_calls"
    computed: list[str] = []
    namespace = _reveal_cell(question, computed)
    assert computed == [] and "decode_calls" not in namespace  # the body did not run: nothing computed or bound
    assert capsys.readouterr().out == waiting_message(question) + "\n"

    def forward_calls_after_prefill():
        raise NotImplementedError("your code here")

    check(question, {"forward_calls_after_prefill": forward_calls_after_prefill})  # not attempted
    capsys.readouterr()
    namespace = _reveal_cell(question, computed)
    assert computed == [] and "decode_calls" not in namespace
    assert "decode: 7" not in capsys.readouterr().out

    check(question, {"forward_calls_after_prefill": lambda: "several"})  # malformed: no answer yet
    capsys.readouterr()
    assert not answered(question)
    assert _reveal_cell(question, computed) and computed == []
    capsys.readouterr()

    check(question, {"forward_calls_after_prefill": lambda: 3})  # well-formed, and wrong: answered all the same
    capsys.readouterr()
    namespace = _reveal_cell(question, computed)
    assert computed == ["decode"] and namespace["decode_calls"] == 7
    assert capsys.readouterr().out == "decode: 7\n"


def test_reveal_returns_whether_the_body_may_run(fresh_progress, capsys):
    assert reveal("06.predict_forward_calls") is False
    assert capsys.readouterr().out == waiting_message("06.predict_forward_calls") + "\n"
    progress.record("06.predict_forward_calls", "passed", 1, 1)
    assert reveal("06.predict_forward_calls") is True and capsys.readouterr().out == ""
    with pytest.raises(TypeError):  # the old form, `with reveal(...):`, fails at once rather than running the body
        with reveal("06.predict_forward_calls"):
            pass


def test_a_stub_put_back_after_answering_keeps_the_answer_shown(fresh_progress):
    progress.record("05.predict_h100_count", "passed", 1, 1)
    progress.record("05.predict_h100_count", "not attempted", 0, 1)
    assert answered("05.predict_h100_count") and not answered("05.predict_qwen3_kv_gib")


def test_explorer_tasks_wait_until_no_answer_is_left_as_ellipsis(capsys):
    computed = []
    if reveal({1: (12, ...), 2: 0.5}):
        computed.append(1)
        print("1. 40 tokens")
    assert computed == [] and capsys.readouterr().out == waiting_message({}) + "\n"
    if reveal({1: (12, 30), 2: 0.5}):
        computed.append(1)
        print("1. 40 tokens")
    assert computed == [1] and capsys.readouterr().out == "1. 40 tokens\n"
    with pytest.raises(TypeError, match="question must be"):
        answered(6.1)


def test_an_error_in_a_body_is_raised_once_answered_and_never_reached_before(fresh_progress):
    if reveal("06.predict_forward_calls"):
        1 / 0
    progress.record("06.predict_forward_calls", "passed", 1, 1)
    with pytest.raises(ZeroDivisionError):
        if reveal("06.predict_forward_calls"):
            1 / 0


def _malformed(exercise):
    """An answer of the wrong form for ``exercise``: a word where a number or a choice is asked, a number where
    words are."""
    return 3.5 if isinstance(exercise.reference(), str) else "soon"


@pytest.mark.parametrize("exercise", PREDICTIONS, ids=[exercise.id for exercise in PREDICTIONS])
def test_the_check_explains_only_a_well_formed_answer(exercise):
    for not_yet in (None, lambda: _malformed(exercise)):
        verdict = check_function(exercise, not_yet)
        assert verdict.status in ("not attempted", "failed") and not verdict.reveal, verdict
        assert "Why:" not in str(verdict) and "Why:" not in verdict._repr_html_()
    answer = exercise.reference()
    answer = getattr(answer, "truth", answer)
    verdict = check_function(exercise, lambda: answer)
    assert verdict.status == "passed" and "Why:" in str(verdict) and verdict.reveal == exercise.reveal


def _words(text: str) -> list[str]:
    import re

    text = text.lower().replace("×", "x").replace("−", "-").replace("*", "")
    return re.findall(r"[\w.()+-]+", text)


def shared_runs(hint: str, reveal_text: str, length: int = 3) -> set[str]:
    """The runs of ``length`` words a hint shares with the reveal it must not anticipate."""
    def runs(words: list[str]) -> set[str]:
        return {" ".join(words[i:i + length]) for i in range(len(words) - length + 1)}

    return runs(_words(hint)) & runs(_words(reveal_text))


@pytest.mark.parametrize("hint, reveal_text, shared", [
    # 06.4's and 02.5's hints as they stood: the reveal's formula, the reveal's reason
    ("E2E = TTFT + (n - 1) x TPOT; nothing about the speed changed",
     "E2E = TTFT + (n - 1) × TPOT: 700 + 9 × 35 = 1,015 ms", True),
    ("return a number such as 0.8; the model was trained to minimise exactly this loss at one temperature",
     "the model was trained to minimise cross-entropy at T = 1", True),
    ("return a number of milliseconds, such as 900", "E2E = TTFT + (n - 1) × TPOT: 700 + 9 × 35 = 1,015 ms", False),
])
def test_a_hint_sharing_the_reveals_words_is_found(hint, reveal_text, shared):
    assert bool(shared_runs(hint, reveal_text)) is shared


@pytest.mark.parametrize("exercise", PREDICTIONS, ids=[exercise.id for exercise in PREDICTIONS])
def test_a_malformed_answers_hint_says_the_form_not_the_reasoning_of_the_reveal(exercise):
    hint = " ".join(exercise.hints)
    assert not shared_runs(hint, exercise.reveal), (exercise.id, shared_runs(hint, exercise.reveal))


def test_an_unreadable_progress_file_counts_as_unanswered(monkeypatch):
    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(progress, "load", refused)
    assert answered("06.predict_forward_calls") is False
