"""labkit.grading: a submitted notebook is run headless and every exercise of its lab is scored."""

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from labkit import grading
from labkit.checking import Case, Exercise
from labkit.exercises import exercises

ROOT = Path(__file__).resolve().parent.parent


def test_solutions_earn_every_point_and_learner_notebooks_none(embedded):
    for directory, expected in [(ROOT / "notebooks" / "solutions", "passed"), (ROOT / "notebooks", "not attempted")]:
        report = grading.grade_notebook(directory / "00_start_here.ipynb")
        assert [r["status"] for r in report["exercises"]] == [expected] * len(exercises("00"))
        full = sum(ex.points for ex in exercises("00"))
        assert (report["score"], report["max_score"]) == ((full if expected == "passed" else 0), full)
        assert report["cell_errors"] == []


def test_a_broken_submission_is_graded_anyway(tmp_path, embedded):
    notebook = nbformat.read(ROOT / "notebooks" / "00_start_here.ipynb", as_version=4)
    answer = next(i for i, c in enumerate(notebook.cells) if "def softmax_with_temperature" in c.source)
    notebook.cells[answer].source = (
        "import torch\n\ndef softmax_with_temperature(logits, temperature):\n"
        "    return torch.softmax(logits, dim=-1)  # forgot the temperature\n")
    new = nbformat.v4.new_code_cell
    notebook.cells[answer + 1:answer + 1] = [
        new("1 / 0"),                      # an error: the run goes on
        new("while True:\n    pass"),      # never ends: interrupted at the cell time limit
        new("import os\nos._exit(3)"),     # kills the kernel: skipped on a fresh run
    ]
    submission = tmp_path / "00_start_here.ipynb"
    nbformat.write(notebook, submission)

    out = tmp_path / "grades.json"
    result = subprocess.run([sys.executable, "-m", "labkit.cli", "grade", str(submission), "--json", str(out),
                             "--cell-timeout", "20"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    (graded,) = report["exercises"]
    assert graded["status"] == "failed" and graded["points"] == 0
    assert any("divide the logits by T" in line for line in graded["details"])
    errors = {e["cell"]: e["error"] for e in report["cell_errors"]}
    assert errors[answer + 1].startswith("ZeroDivisionError")
    assert errors[answer + 2].startswith("CellTimeout")
    assert errors[answer + 3] == "the kernel died in this cell; it was skipped"
    assert "0/2 points" in result.stdout and "divide the logits by T" in result.stdout


def test_one_exercise_whose_check_crashes_does_not_stop_the_others(monkeypatch):
    def broken_reference(x):
        raise RuntimeError("reference exploded")

    broken = Exercise(id="00.broken", title="Broken", function="f", reference=broken_reference,
                      hand_cases=(Case((1,)),), random_case=lambda g: Case((1,)), n_random=1)
    real = exercises("00")
    monkeypatch.setattr("labkit.exercises.exercises", lambda lab=None: [broken, *real])

    def softmax_with_temperature(logits, temperature):
        raise NotImplementedError

    results = grading.grade_in_kernel("00", {"f": lambda x: x, "softmax_with_temperature": softmax_with_temperature})
    assert results[0]["status"] == "failed" and "reference exploded" in results[0]["details"][0]
    assert results[1]["status"] == "not attempted"


def test_grade_refuses_a_missing_file_with_a_clear_message(tmp_path):
    result = subprocess.run([sys.executable, "-m", "labkit.cli", "grade", str(tmp_path / "nope.ipynb")],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "is not a notebook file" in result.stderr


def test_lab_comes_from_metadata_or_file_name(tmp_path):
    notebook = nbformat.v4.new_notebook()
    assert grading.lab_of(notebook, Path("03_numerics.ipynb")) == "03"
    notebook.metadata["labkit"] = {"lab": "01"}
    assert grading.lab_of(notebook, Path("anything.ipynb")) == "01"
    with pytest.raises(ValueError, match="has no labkit.lab metadata"):
        grading.lab_of(nbformat.v4.new_notebook(), Path("homework.ipynb"))
