"""labkit.exercises.progress: saved atomically, survives a restart, shrugs off a corrupt copy."""

import json
import os
import subprocess
import sys

import pytest

from labkit.exercises import progress
from labkit.exercises import check, summary


@pytest.fixture
def progress_file(tmp_path, monkeypatch):
    path = tmp_path / "progress.json"
    monkeypatch.setenv("LABKIT_PROGRESS", str(path))
    return path


def test_record_keeps_latest_and_best_and_counts_attempts(progress_file):
    progress.record("00.x", "passed", 2, 2)
    progress.record("00.x", "failed", 0, 2)
    saved = progress.load()["00.x"]
    assert (saved["status"], saved["best"], saved["attempts"], saved["points"]) == ("failed", "passed", 2, 0)


def test_bad_status_is_refused(progress_file):
    with pytest.raises(ValueError, match=r"status must be one of \['failed', 'not attempted', 'passed'\], got 'done'"):
        progress.record("00.x", "done", 0, 1)


def test_progress_survives_a_new_process(progress_file):
    # A kernel restart is a new process: check in one, read the summary in another.
    code = ("import torch\nfrom labkit.exercises import check\n"
            "def softmax_with_temperature(logits, temperature):\n"
            "    if temperature == 0:\n"
            "        return torch.zeros_like(logits).scatter(-1, logits.argmax(-1, keepdim=True), 1.0)\n"
            "    return torch.softmax(logits / temperature, -1)\n"
            "check('00.softmax_temperature')\n")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ}, capture_output=True)
    assert "00.softmax_temperature         passed                 2/2" in str(summary("00"))


def test_a_corrupt_file_is_set_aside_and_checking_goes_on(progress_file, capsys):
    progress_file.write_text('{"00.softmax_temperature": {"status": "pass')  # cut off mid-write
    assert progress.load() == {}
    assert "could not be read" in capsys.readouterr().out
    assert [p.name.startswith("progress.json.corrupt-") for p in progress_file.parent.iterdir()] == [True]
    check("00.softmax_temperature", {}, show=False)
    assert progress.load()["00.softmax_temperature"]["status"] == "not attempted"


def test_a_write_that_dies_leaves_the_previous_copy(progress_file, monkeypatch):
    progress.record("00.x", "passed", 1, 1)
    before = progress_file.read_text()

    def die(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(json, "dump", die)
    with pytest.raises(KeyboardInterrupt):
        progress.record("00.y", "failed", 0, 1)
    assert progress_file.read_text() == before
    assert [p.name for p in progress_file.parent.iterdir()] == ["progress.json"]  # no temporary left behind


def test_check_with_an_unknown_id_explains_instead_of_raising(progress_file, capsys):
    assert check("00.nope", {}, show=False) is None
    assert "exercise_id must be one of" in capsys.readouterr().out


def test_check_finds_the_function_in_the_callers_namespace(progress_file):
    def softmax_with_temperature(logits, temperature):
        raise NotImplementedError

    namespace = {"softmax_with_temperature": softmax_with_temperature}
    assert check("00.softmax_temperature", namespace, show=False).status == "not attempted"
    assert check("00.softmax_temperature", {}, show=False).lines[0].startswith("define `softmax_with_temperature`")


def test_a_prediction_is_recorded_with_how_close_it_came(progress_file):
    namespace = {"tokenizer_choice": lambda: "c"}
    check("00.predict_tokenizer", namespace)
    assert progress.load()["00.predict_tokenizer"]["close"] is False
    text = str(summary("00"))
    assert "00.predict_tokenizer           passed, not close      1/1" in text
    assert "predictions close: 0 of 1 (accuracy is shown, not scored)" in text
    namespace["tokenizer_choice"] = lambda: "b"  # edited after the verdict showed "b": the same point
    check("00.predict_tokenizer", namespace)
    assert progress.load()["00.predict_tokenizer"]["points"] == 1
    assert "predictions close: 1 of 1" in str(summary("00"))
