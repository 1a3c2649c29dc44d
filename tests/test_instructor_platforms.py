"""labkit.instructor.grader.platforms and platform_grades: a synthetic bulk download per platform, named as the
platform documents it (learners whose names hold spaces, accents and late markers), placed learner by learner, and
the grades written back in the platform's import format and read again."""

import csv
import io
import json
import zipfile

import nbformat
import pytest

from labkit.instructor.cli import main
from labkit.instructor.grader.platform_grades import canvas_csv, gradescope_results, moodle_csv, write_grades
from labkit.instructor.grader.platforms import Intake, Learner, load_intake, place, read_download, save_intake
from labkit.instructor.grader.reports import ExerciseResult, SubmissionReport
from synthetic_class import planted_class

NOTEBOOK = nbformat.writes(nbformat.v4.new_notebook(metadata={"labkit": {"lab": "00"}})).encode()
DOWNLOADS = {  # platform -> the files of its download, then (learner id, name, late) of each learner placed
    "canvas": (["núñezjosé_LATE_1234_900001_00_start_here.ipynb", "doe jane_5678_900002_00_start_here.ipynb",
                "doe jane_5678_900003_00_start_here-1.ipynb", "smithbo_91_900004_notes.pdf", "README.txt"],
               [("1234", "núñezjosé", True), ("5678", "doe jane", False)]),
    "moodle": (["José Núñez_88_assignsubmission_file_00_start_here.ipynb",
                "Jane Mary Doe_89_assignsubmission_file_/00_start_here.ipynb",
                "Bo Smith_90_onlinetext_/onlinetext.html"],
               [("88", "José Núñez", False), ("89", "Jane Mary Doe", False)]),
    "blackboard": (["Lab 00_jnunez_attempt_2026-01-30-15-30-10_00_start_here.ipynb",
                    "Lab 00_jnunez_attempt_2026-01-30-15-30-10.txt",
                    "Lab 00_jane.doe_attempt_2026-01-29-09-00-00_00_start_here.ipynb",
                    "Lab 00_jane.doe_attempt_2026-01-31-09-00-00_00_start_here.ipynb", "stray.ipynb"],
                   [("jane.doe", "", False), ("jnunez", "", False)]),
    "folder": (["José Núñez.ipynb", "jane doe/00_start_here.ipynb", ".ipynb_checkpoints/x.ipynb", "notes.txt"],
               [("José Núñez", "", False), ("jane doe", "", False)]),
}


def _download(tmp_path, files, as_zip):
    if as_zip:
        path = tmp_path / "download.zip"
        with zipfile.ZipFile(path, "w") as archive:
            for name in files:
                archive.writestr(name, NOTEBOOK if name.endswith(".ipynb") else b"x")
        return path
    folder = tmp_path / "download"
    for name in files:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(NOTEBOOK if name.endswith(".ipynb") else b"x")
    return folder


@pytest.mark.parametrize("as_zip", [False, True], ids=["folder", "zip"])
@pytest.mark.parametrize("platform", list(DOWNLOADS))
def test_a_download_is_placed_learner_by_learner_and_the_rest_is_named(platform, as_zip, tmp_path):
    files, learners = DOWNLOADS[platform]
    intake = read_download(_download(tmp_path, files, as_zip), platform, tmp_path / "stage")
    assert sorted((l.learner, l.name, l.late) for l in intake.learners) == sorted(learners)
    placed = {path.relative_to(tmp_path / "stage").as_posix() for path in (tmp_path / "stage").rglob("*.ipynb")}
    expected_files = {"José Núñez": "José Núñez/José Núñez.ipynb"}
    assert placed == {expected_files.get(learner, f"{learner}/00_start_here.ipynb") for learner, _, _ in learners}
    unplaced = {"canvas": {"smithbo_91_900004_notes.pdf", "README.txt"},
                "moodle": {"Bo Smith_90_onlinetext_/onlinetext.html"},
                "blackboard": {"Lab 00_jnunez_attempt_2026-01-30-15-30-10.txt", "stray.ipynb"},
                "folder": {"notes.txt"}}[platform]
    assert set(intake.not_placed) == unplaced, intake.not_placed
    save_intake(intake, tmp_path)
    assert load_intake(tmp_path) == intake


def test_a_file_handed_in_again_keeps_the_last():
    # Canvas's second upload is 00_start_here-1.ipynb; Blackboard's attempts sort by their time
    assert place("doe jane_5678_900003_00_start_here-1.ipynb", "canvas")["file"] == "00_start_here-1.ipynb"
    assert place("Lab_00_jane.doe_attempt_2026-01-31-09-00-00_x.ipynb", "blackboard")["learner"] == "jane.doe"


def test_bad_platform_pattern_or_download_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="must be one of folder, canvas, moodle, blackboard, got 'gradescope'"):
        read_download(tmp_path, "gradescope", tmp_path / "stage")
    with pytest.raises(ValueError, match="named groups learner and file"):
        place("a_b.ipynb", "canvas", pattern=r"(?P<who>\w+)_(?P<file>.+)")
    (tmp_path / "x.txt").write_text("x")
    with pytest.raises(ValueError, match="neither a folder nor a zip"):
        read_download(tmp_path / "x.txt", "canvas", tmp_path / "stage")
    with pytest.raises(ValueError, match="holds no notebook named as canvas names them"):
        read_download(tmp_path, "canvas", tmp_path / "stage")
    own = read_download(_download(tmp_path, ["ana-00.ipynb"], False), "canvas", tmp_path / "s",
                        pattern=r"(?P<learner>\w+)-(?P<file>.+)")
    assert own.learners[0].learner == "ana"


@pytest.fixture(scope="module")
def graded():
    """Two learners' reports (planted from the bug zoo) under their platform ids, and who they are."""
    reports = planted_class({"1234": {"00.softmax_temperature": 4, "00.sample_token": "right"},
                             "5678": {"00.softmax_temperature": "right", "00.sample_token": "right"}})
    intake = Intake("canvas", (Learner("1234", "núñezjosé", True), Learner("5678", "=doe jane"),
                               Learner("9999", "no submission")))
    return reports, intake


def test_canvas_gradebook_csv_round_trip(graded):
    reports, intake = graded
    rows = list(csv.DictReader(io.StringIO(canvas_csv(reports, intake, "Lab 00 (123456)"))))
    assert [row["ID"] for row in rows] == ["1234", "5678", "9999"]
    assert [row["Lab 00 (123456)"] for row in rows] == ["2", "4", ""]
    assert rows[0]["Student"] == "núñezjosé" and rows[1]["Student"] == "'=doe jane"  # never a formula
    assert list(rows[0])[:5] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
    with pytest.raises(ValueError, match="column must name the Canvas assignment"):
        canvas_csv(reports, intake, " ")


def test_moodle_grading_worksheet_round_trip(graded):
    reports, intake = graded
    rows = list(csv.DictReader(io.StringIO(moodle_csv(reports, intake))))
    assert [(row["Identifier"], row["Grade"], row["Maximum Grade"]) for row in rows] == [
        ("Participant 1234", "2", "4"), ("Participant 5678", "4", "4"), ("Participant 9999", "", "")]
    assert rows[0]["Full name"] == "núñezjosé" and rows[0]["Feedback comments"] == "late"


def test_gradescope_results_json_round_trip(graded, tmp_path):
    reports, intake = graded
    results = gradescope_results(reports[0])
    assert results["score"] == sum(test["score"] for test in results["tests"]) == 2
    assert [(t["name"].split(":")[0], t["score"], t["max_score"]) for t in results["tests"]] == [
        ("00.softmax_temperature", 0, 2), ("00.sample_token", 2, 2)]
    assert "failed" in results["tests"][0]["output"] and results["tests"][0]["status"] == "failed"
    written = write_grades(reports, intake, tmp_path, ("gradescope", "canvas", "moodle"))
    assert {path.name for path in written} == {"results-00.json", "canvas_grades.csv", "moodle_grading_worksheet.csv"}
    assert json.loads((tmp_path / "gradescope" / "1234" / "results-00.json").read_text()) == results
    with pytest.raises(ValueError, match="export must be among canvas, moodle, gradescope, got 'blackboard'"):
        write_grades(reports, intake, tmp_path, ("blackboard",))


def test_the_command_refuses_a_bad_export_before_grading(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["grade", str(tmp_path), "--export", "canvas,excel"])
    assert "--export must be a comma-separated list among canvas, moodle, gradescope, got 'canvas,excel'" in (
        capsys.readouterr().err)
    with pytest.raises(SystemExit):
        main(["grade", str(tmp_path / "a.ipynb"), "--platform", "canvas"])
    assert "are for a class" in capsys.readouterr().err


def test_a_prediction_result_is_a_gradescope_test_too():
    report = SubmissionReport("x.ipynb", "00", score=1, max_score=1, exercises=(
        ExerciseResult("00.predict_tokenizer", "Predict", "prediction", "passed", 1, 1, close=False),))
    assert gradescope_results(report)["tests"][0]["status"] == "passed"


def test_the_command_stages_a_canvas_zip_grades_its_folder_and_writes_the_grades_back(graded, tmp_path, monkeypatch,
                                                                                      capsys):
    """The command's glue, with the class run replaced (grading through the wall is the classroom tests'): the
    zip's notebooks staged under their learner ids, the unplaced files printed, the exports written."""
    from labkit.instructor.cluster import classroom

    reports, _ = graded
    seen = {}

    def fake_grade_class(folder, out, settings):
        seen["learners"] = sorted(path.name for path in folder.iterdir())
        return reports

    monkeypatch.setattr(classroom, "grade_class", fake_grade_class)
    monkeypatch.setenv("LABKIT_GRADING_SECRET", "test secret")
    files = ["núñezjosé_LATE_1234_900001_00_start_here.ipynb", "doe jane_5678_900002_00_start_here.ipynb",
             "README.txt"]
    download = _download(tmp_path, files, as_zip=True)
    out = tmp_path / "grades"
    assert main(["grade", str(download), "--platform", "canvas", "--out", str(out), "--export", "canvas,moodle",
                 "--canvas-column", "Lab 00 (42)", "--no-isolation"]) == 0
    printed = capsys.readouterr().out
    assert seen["learners"] == ["1234", "5678"]
    assert "not placed: README.txt: its name does not follow canvas's naming" in printed
    rows = list(csv.DictReader(io.StringIO((out / "canvas_grades.csv").read_text(encoding="utf-8"))))
    assert sorted((row["ID"], row["Student"], row["Lab 00 (42)"]) for row in rows) == [("1234", "núñezjosé", "2"),
                                                                                       ("5678", "doe jane", "4")]
    assert load_intake(out).by_learner()["1234"].late is True and (out / "moodle_grading_worksheet.csv").is_file()


def test_every_limit_is_an_option_with_its_default_and_a_bad_one_is_named(tmp_path, capsys):
    from dataclasses import fields

    from labkit.instructor.wall.kernel_limits import Limits

    with pytest.raises(SystemExit):
        main(["grade", "--help"])
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps the help at the terminal's width
    for item in fields(Limits):
        assert f"--{item.name.replace('_', '-')} " in shown and f"(default {item.default})" in shown, item.name
    assert "--cpu-percent CPU_PERCENT share of one CPU for everything one notebook runs" in shown
    with pytest.raises(SystemExit):
        main(["grade", str(tmp_path), "--cpu-percent", "5"])
    assert "--cpu-percent must be an integer of at least 10, got 5" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["grade", str(tmp_path), "--cluster", "condor"])
    assert "argument --cluster: invalid choice: 'condor' (choose from 'local', 'slurm', 'pbs', 'sge', 'lsf')" in (
        capsys.readouterr().err)
