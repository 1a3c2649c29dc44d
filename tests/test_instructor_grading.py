"""labkit.instructor.grader.grading: a submitted notebook is run headless and every exercise of its lab is scored."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import nbformat
import torch
import pytest

import labkit.exercises
from labkit.exercises import exercises
from labkit.exercises.definitions import Case, Exercise
from labkit.instructor.cluster import classroom
from labkit.instructor.grader import course_cells, gradebook, grading, judging
from labkit.instructor.grader.reports import ExerciseResult, SubmissionReport, format_report, printable
from labkit.instructor.grader.settings import GradingSettings
from labkit.instructor.wall import disarming, worker
from labkit.instructor.wall.kernel_limits import Confinement, Limits

ROOT = Path(__file__).resolve().parent.parent


def grade_here(lab, namespace, seed):
    """The grader's pipeline in this process, without the wall: the cases drawn, the learner's functions answering
    them (as the answering step does, disarmed), the answers judged through JSON. The same data path as
    ``labkit grade``."""
    chosen, plan, drawn = judging.plan(lab, seed)
    answered = json.loads(json.dumps(disarming.answer_plan(namespace, json.loads(json.dumps({"exercises": plan})))))
    return [judging.judge(exercise, drawn.get(exercise.id), answered, None) for exercise in chosen]


def test_a_broken_submission_is_graded_anyway(tmp_path, embedded):
    """A stand-in for lab 00 (the grader is under test here, not the model): a wrong answer, then an error, an
    endless cell and a cell that kills the kernel; graded through the command line."""
    notebook = _submission(
        "import torch\n\ndef softmax_with_temperature(logits, temperature):\n"
        "    return torch.softmax(logits, dim=-1)  # forgot the temperature\n")
    answer = 0
    new = nbformat.v4.new_code_cell
    notebook.cells += [
        new("1 / 0"),                      # an error: the run goes on
        # Never ends: interrupted at the cell time limit. It sleeps rather than spins: the interrupt is the same, and
        # a spinning loop cost 20 s of CPU (the limit twice: the fresh run after the kernel's death runs it again).
        new("import time\nwhile True:\n    time.sleep(0.5)"),
        new("import os\nos._exit(3)"),     # kills the kernel: skipped on a fresh run
    ]
    submission = tmp_path / "00_start_here.ipynb"
    nbformat.write(notebook, submission)

    out = tmp_path / "grades.json"
    result = subprocess.run([sys.executable, "-m", "labkit.instructor.cli", "grade", str(submission), "--json", str(out),
                             "--cell-timeout", "10"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    graded = next(r for r in report["exercises"] if r["id"] == "00.softmax_temperature")
    assert graded["status"] == "failed" and graded["points"] == 0
    assert any("divide the logits by T" in line for line in graded["details"])
    # Which mistake, through the wall: the temperature unused is lab 00's fourth registered one.
    assert graded["mistake_number"] == 4 and graded["mistake"].startswith("the temperature is not used"), graded
    errors = {e["cell"]: e["error"] for e in report["cell_errors"]}
    assert errors[answer + 1].startswith("ZeroDivisionError")
    assert errors[answer + 2].startswith("CellTimeout")
    assert errors[answer + 3] == "the kernel died in this cell: it exited with code 3; it was skipped"
    assert "00.softmax_temperature" in result.stdout and "divide the logits by T" in result.stdout
    assert "without encryption" not in result.stderr + result.stdout  # IPC sockets, not TCP


def test_one_exercise_whose_check_crashes_does_not_stop_the_others(monkeypatch):
    def broken_reference(x):
        raise RuntimeError("reference exploded")

    broken = Exercise(id="00.broken", title="Broken", function="f", reference=broken_reference,
                      hand_cases=(Case((1,)),), random_case=lambda g: Case((1,)), n_random=1)
    real = exercises("00")
    monkeypatch.setattr("labkit.exercises.exercises", lambda lab=None: [broken, *real])
    real_get = labkit.exercises.get
    monkeypatch.setattr("labkit.exercises.get", lambda exercise_id: broken if exercise_id == "00.broken"
                        else real_get(exercise_id))

    def softmax_with_temperature(logits, temperature):
        raise NotImplementedError

    results = grade_here("00", {"f": lambda x: x, "softmax_with_temperature": softmax_with_temperature}, seed=3)
    # labkit's own side broke: reported as an error (no points, no blame), never a crash of the grader.
    assert results[0].status == "error" and results[0].points == 0
    assert any("reference exploded" in line for line in results[0].details)
    assert results[1].status == "not attempted"


def test_grade_refuses_a_missing_file_with_a_clear_message(tmp_path):
    result = subprocess.run([sys.executable, "-m", "labkit.instructor.cli", "grade", str(tmp_path / "nope.ipynb")],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "is not a notebook file" in result.stderr


def test_lab_comes_from_metadata_or_file_name(tmp_path):
    notebook = nbformat.v4.new_notebook()
    assert grading.lab_of(notebook, Path("03_numerics.ipynb")) == "03"
    notebook.metadata["labkit"] = {"lab": "01"}
    assert grading.lab_of(notebook, Path("anything.ipynb")) == "01"
    with pytest.raises(ValueError, match="has no labkit.lab metadata"):
        grading.lab_of(nbformat.v4.new_notebook(), Path("homework.ipynb"))


# --------------------------------------------------------------------------------------------------------------
# A class of submissions, limits, and the same grade twice

# Right on short rows, wrong on long ones: passes every hand case, fails a random case (which one depends on the seed).
FLAKY_ANSWER = (
    "import torch\n\ndef softmax_with_temperature(logits, temperature):\n"
    "    if temperature == 0:\n"
    "        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)\n"
    "    probs = torch.softmax(logits / temperature, dim=-1)\n"
    "    return probs if logits.shape[-1] <= 20 else probs.flip(-1)\n")


WRONG_PREDICTION = "def tokenizer_choice():\n    return 'c'\n"


def test_a_prediction_edited_after_its_answer_was_shown_gains_no_point():
    """The learner checks "c", reads the answer "b" in the verdict, edits and re-runs: the grade is the same."""
    first, edited = {}, {}
    exec(WRONG_PREDICTION, first)
    exec(WRONG_PREDICTION.replace("'c'", "'b'"), edited)
    graded = [{r.id: r for r in grade_here("00", namespace, seed=1)}["00.predict_tokenizer"]
              for namespace in (first, edited)]
    assert [(r.status, r.points, r.close, r.kind) for r in graded] == [
        ("passed", 1, False, "prediction"), ("passed", 1, True, "prediction")]
    _, rows = gradebook.gradebook([SubmissionReport("n.ipynb", "00", 1, 3, (result,), learner=name)
                                   for name, result in zip(("first", "edited"), graded)])
    assert [(row["00.predict_tokenizer"], row["total"], row["predictions close"]) for row in rows] == [
        (1, 1, "0/1"), (1, 1, "1/1")]  # the same points; only the accuracy column tells them apart
    report = SubmissionReport("n.ipynb", "00", 1, 3, tuple(graded[:1]), limits={"processes": "64"})
    assert "00.predict_tokenizer         passed         1/1  (prediction not close)" in format_report(report)


def _submission(*sources: str) -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["labkit"] = {"lab": "00"}
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    return notebook


def test_the_same_seed_gives_the_same_grade_and_the_seed_follows_the_code():
    namespace: dict = {}
    exec(FLAKY_ANSWER, namespace)
    first, again, other = (grade_here("00", namespace, seed=s) for s in (7, 7, 8))
    assert first == again and first[0].status == "failed"
    assert first[0].details != other[0].details  # another seed, other random cases

    notebook = _submission(FLAKY_ANSWER)
    with_outputs = _submission(FLAKY_ANSWER)
    with_outputs.cells[0].outputs = [nbformat.v4.new_output("stream", text="ran it")]
    assert judging.submission_seed(notebook, b"k") == judging.submission_seed(with_outputs, b"k")
    assert judging.submission_seed(notebook, b"k") != judging.submission_seed(_submission(FLAKY_ANSWER + "# edited\n"), b"k")
    # Another instructor secret, other cases: a learner who knows the code cannot know the cases.
    assert judging.submission_seed(notebook, b"k") != judging.submission_seed(notebook, b"other")


def test_the_launcher_limits_memory_and_cpu_time():
    burn = ("try:\n    bytearray(50 * 2**30)\nexcept MemoryError:\n    print('MemoryError', flush=True)\n"
            "while True:\n    pass")
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "labkit.instructor.wall.kernel_limits", "--memory-mb", "512", "--cpu-seconds", "1",
                             "--max-procs", "64", "--", sys.executable, "-c", burn],
                            capture_output=True, text=True, timeout=60)
    assert result.stdout == "MemoryError\n"
    assert result.returncode == -signal.SIGXCPU and time.monotonic() - started < 30
    client = SimpleNamespace(kernel_process=SimpleNamespace(poll=lambda: -signal.SIGXCPU))
    assert worker._death_reason(client) == "the kernel died in this cell: it used up its CPU time limit"


def test_limits_refuse_nonsense_with_the_argument_named():
    with pytest.raises(ValueError, match="memory_mb must be an integer of at least 256, got 10"):
        Limits(memory_mb=10)
    with pytest.raises(ValueError, match="max_procs must be an integer of at least 16, got 2.5"):
        Limits(max_procs=2.5)


def test_root_without_a_pids_cgroup_says_processes_are_not_bounded(monkeypatch):
    monkeypatch.setattr("labkit.instructor.wall.cgroups.make_pids_cgroup", lambda max_procs: None)
    monkeypatch.setattr("labkit.instructor.wall.cgroups.make_memory_cgroup", lambda memory_mb: None)
    monkeypatch.setattr("labkit.instructor.wall.cgroups.make_cpu_cgroup", lambda cpu_percent: None)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with Confinement(Limits()) as confinement:
        assert confinement.describe()["processes"].startswith("not enforced")
        assert confinement.describe()["total memory"].startswith("not enforced")
        assert "--cgroup" not in confinement.launcher()


def _report(learner, lab, points, notebook="n.ipynb"):
    results = tuple(ExerciseResult(f"{lab}.{name}", name, "code", "passed" if p else "failed", p, 1)
                    for name, p in points.items())
    return SubmissionReport(notebook, lab, sum(points.values()), len(points), results, learner=learner)


def test_the_gradebook_covers_every_lab_seen_and_leaves_the_others_empty():
    reports = [
        _report("ann", "01", {"b": 1}), _report("ann", "00", {"a": 1, "z": 0}),
        _report("ben", "00", {"a": 0, "z": 0}, "first.ipynb"), _report("ben", "00", {"a": 1, "z": 1}, "second.ipynb"),
        SubmissionReport("cy.ipynb", None, learner="cy", error="could not be graded: NotJSONError: ..."),
    ]
    columns, rows = gradebook.gradebook(reports)
    assert columns == ["learner", "labs", "00.a", "00.z", "01.b", "total", "max", "predictions close", "review",
                       "notes"]
    assert all(row["predictions close"] == "" for row in rows)  # no prediction among these exercises
    ann, ben, cy = rows
    assert (ann["labs"], ann["00.a"], ann["01.b"], ann["total"], ann["max"]) == ("00 01", 1, 1, 2, 3)
    assert (ben["labs"], ben["total"], ben["max"], "01.b" in ben) == ("00", 2, 2, False)  # the better one counts
    assert "lab 00 handed in twice" in ben["notes"]
    assert (cy["labs"], cy["total"], cy["max"]) == ("", 0, 0) and "NotJSONError" in cy["notes"]


def test_links_are_not_followed_and_are_noted_without_their_target(tmp_path):
    folder = tmp_path / "class"
    (folder / "ana").mkdir(parents=True)
    secret = tmp_path / "solutions" / "00_start_here.ipynb"
    secret.parent.mkdir()
    nbformat.write(_submission("x = 1"), secret)
    nbformat.write(_submission("x = 1"), folder / "ana" / "00_start_here.ipynb")
    (folder / "bo.ipynb").symlink_to(secret)  # hands in the solutions
    (folder / "cy").symlink_to(folder / "ana", target_is_directory=True)  # hands in a classmate's folder
    assert classroom.find_submissions(folder) == [("ana", folder / "ana" / "00_start_here.ipynb")]
    assert [learner for learner, _ in classroom.symlinked_submissions(folder)] == ["bo", "cy"]


def test_learner_text_reaches_neither_the_terminal_nor_a_spreadsheet_as_control_or_formula():
    hostile = "\x1b[2J\x1b]0;owned\x07=cmd|' /C calc'!A0\r"
    report = SubmissionReport("n.ipynb", "00", 0, 1, (ExerciseResult("00.x", "x", "code", "failed", 0, 1, None, (
        hostile,)),), limits={"processes": "64"})
    text = format_report(report)
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text and "=cmd|' /C calc'!A0" in text
    assert gradebook.csv_safe(printable(hostile)) == "'=cmd|' /C calc'!A0"


# --------------------------------------------------------------------------------------------------------------
# The wall, the wire and the review (the attack suite is tests/test_instructor_grading_attacks.py)


def test_without_a_working_wall_the_grader_refuses_unless_told_and_then_says_so(tmp_path, monkeypatch):
    from labkit.instructor.wall import sandbox

    nbformat.write(_submission(FLAKY_ANSWER), tmp_path / "ana.ipynb")
    monkeypatch.setattr(sandbox, "isolation_problem", lambda: "bubblewrap is not installed (apt-get install bubblewrap)")
    with pytest.raises(grading.IsolationUnavailable, match="bubblewrap is not installed.*--no-isolation"):
        grading.grade_notebook(tmp_path / "ana.ipynb", GradingSettings(secret=b"k"))
    with pytest.raises(grading.IsolationUnavailable):
        classroom.grade_class(tmp_path, tmp_path / "out", GradingSettings(secret=b"k"))
    report = grading.grade_notebook(tmp_path / "ana.ipynb", GradingSettings(cell_timeout_s=30, secret=b"k",
                                                                            isolate=False))
    assert report.isolated is False and report.limits["isolation"].startswith("not isolated")
    assert report.exercises[0].status == "failed" and report.exercises[0].details[0].startswith("random")
    assert "not isolated" in format_report(report)
    _, rows = gradebook.gradebook([report.with_learner("ana")])
    assert rows[0]["notes"] == "not isolated"


def test_the_wire_carries_plain_data_only():
    from labkit.instructor.wall import wire

    class Loud(torch.Tensor):
        def __eq__(self, other):
            return True

    value = (torch.tensor([1.5, float("nan")]).as_subclass(Loud), {"k": [1, True, None]}, {1: "a"}, float("inf"))
    back = wire.decode(wire.encode(value))
    assert type(back[0]) is torch.Tensor and back[0][0] == 1.5 and back[0][1].isnan()
    assert back[1:] == ({"k": [1, True, None]}, {1: "a"}, float("inf"))
    for tensor in (torch.tensor(2.5), torch.tensor([[True, False]]), torch.zeros(0, 3), torch.arange(6).view(2, 3).t(),
                   torch.tensor([1.0, -2.0], dtype=torch.bfloat16), torch.tensor([7], dtype=torch.int8)):
        back = wire.decode(wire.encode(tensor))  # 0-d, bool, empty, not contiguous, bfloat16, int8: bit for bit
        assert back.dtype == tensor.dtype and back.shape == tensor.shape and torch.equal(back, tensor)
    assert repr(wire.decode(wire.encode(object()))) == "<a object, not plain data>"
    assert wire.decode(wire.encode(object())) != wire.decode(wire.encode(object()))  # equal to nothing
    for hostile in ('{"__object__": "ScriptedClock", "fields": {}}', '{"__tensor__": "float32", "shape": [4], '
                    '"data": "AAAA"}', '{"__pickle__": 1}', "[" * 5000 + "]" * 5000):
        with pytest.raises(wire.WireError):
            wire.decode(hostile)  # an object only where the grader sends case inputs; bytes must fit the shape


def test_the_review_reads_what_only_a_cheat_needs_and_not_the_course():
    from labkit.instructor.grader.review import review_notebook

    for path in sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb")):
        assert review_notebook(nbformat.read(path, as_version=4), path.name[:2]) == [], path.name
    cheat = _submission("import sys\nx = 1", "def f():\n    getattr(sys, 'settrace')(None)\n    return eval('1')")
    assert [(f.cell, f.line, f.what.split(":")[0]) for f in review_notebook(cheat, "00")] == [
        (1, 3, "eval"), (1, 2, "the string 'settrace' spells settrace")]


def test_grader_only_cases_run_in_the_grade_and_not_in_the_notebook_check():
    from labkit.exercises import get
    from labkit.exercises.checking import draw_cases

    exercise = get("00.softmax_temperature")
    _, plan, drawn = judging.plan("00", seed=5)
    cases, _ = drawn["00.softmax_temperature"]
    assert len(exercise.grader_cases) == 3
    assert len(cases) == len(exercise.hand_cases) + len(exercise.grader_cases) + exercise.n_random
    assert cases[len(exercise.hand_cases)].label == exercise.grader_cases[0].label
    assert len(draw_cases(exercise, 5)) == len(exercise.hand_cases) + exercise.n_random  # the notebook's check
    # A softmax that forgets masked tokens passes every case the notebook shows, and fails the grader's.
    namespace: dict = {}
    exec("import torch\ndef softmax_with_temperature(logits, temperature):\n"
         "    if temperature == 0:\n"
         "        return torch.zeros_like(logits).scatter(-1, logits.argmax(-1, keepdim=True), 1.0)\n"
         "    z = torch.nan_to_num(logits / temperature, neginf=0.0)\n"
         "    return torch.softmax(z, dim=-1)\n", namespace)
    assert labkit.exercises.checking.check_function(exercise, namespace["softmax_with_temperature"], seed=5).status \
        == "passed"
    graded = {r.id: r for r in grade_here("00", namespace, seed=5)}["00.softmax_temperature"]
    assert graded.status == "failed" and "masked tokens" in graded.details[0]


def test_a_course_cell_the_learners_own_function_reads_is_run_though_tagged():
    """The grader skips the course's tagged cells (they feed nothing the solution's answers need), but a learner's
    function may use a name one of them binds (an import the solution did not need): that cell then runs."""
    from labkit.instructor.authoring import GRADER_SKIPS_TAG

    learner = nbformat.read(ROOT / "notebooks" / "05_memory_kv_cache.ipynb", as_version=4)
    tagged = [index for index, cell in enumerate(learner.cells)
              if cell.cell_type == "code" and GRADER_SKIPS_TAG in cell.metadata.get("tags", [])]
    _, not_run = grading._without_measurements(learner, "05")
    assert not_run == tagged and len(tagged) >= 10
    # A tagged cell that binds a name, and a learner's kv-cache function (a graded name) that reads it.
    index, name = next((index, name) for index in tagged
                       for name in sorted(course_cells.cell_names(learner.cells[index].source)[0]) if name.isidentifier())
    function = next(exercise.function for exercise in exercises("05") if exercise.kind == "code")
    learner.cells.append(nbformat.v4.new_code_cell(f"def {function}(*args, **kwargs):\n    return {name}\n"))
    _, not_run = grading._without_measurements(learner, "05")
    assert index not in not_run and set(not_run) < set(tagged), (index, name)
