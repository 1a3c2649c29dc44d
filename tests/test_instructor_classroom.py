"""labkit.instructor.cluster.classroom: a class graded on a local Dask cluster, its outputs, resuming, interrupts (#34, #36).

The mechanics run with a stand-in grader (tests/grading_standins.py: milliseconds per submission instead of a
walled notebook's seconds); the walled grader through a cluster is tests/test_instructor_cluster.py and the attack
suite.
"""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from grading_standins import standin_grader, standin_notebook
from labkit.instructor.cluster import classroom
from labkit.instructor.grader import gradebook
from labkit.instructor.grader.reports import Finding, SubmissionReport
from labkit.instructor.grader.results import ResultStore
from labkit.instructor.grader.settings import GradingSettings

HERE = Path(__file__).resolve().parent
SECRET = b"classroom secret"


def _write(path: Path, notebook) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, path)


@pytest.fixture(scope="module")
def hostile_names(tmp_path_factory):
    """A class whose file and folder names try to take the outputs' places or fool a terminal or spreadsheet,
    graded twice into one output folder (the second run must grade nothing and write the same files)."""
    root = tmp_path_factory.mktemp("names")
    folder, out, log = root / "class", root / "class-grades", root / "graded.log"
    _write(folder / "gradebook.csv" / "00_start_here.ipynb", standin_notebook("right gb", log=str(log)))
    _write(folder / "ana.ipynb", standin_notebook("right ana", log=str(log)))
    _write(folder / "ana.json" / "00_start_here.ipynb", standin_notebook("wrong anajson", log=str(log)))
    _write(folder / "reports" / "00_start_here.ipynb", standin_notebook("wrong reports", log=str(log)))
    _write(folder / "results.ipynb", standin_notebook("right results", log=str(log)))
    _write(folder / "mo\u202egnp.ipynb", standin_notebook("right bidi", log=str(log)))  # right-to-left override
    _write(folder / "\u00a0=HYPERLINK(1).ipynb", standin_notebook("right formula", log=str(log)))
    _write(folder / "bo.ipynb", standin_notebook("right copied", log=str(log)))
    _write(folder / "cy.ipynb", standin_notebook("right copied", log=str(log)))  # the same bytes as bo's
    (folder / "dee.ipynb").write_text("{ not a notebook")
    _write(folder / "eli.ipynb", standin_notebook("right unknown lab", lab="42", log=str(log)))
    _write(folder / os.fsdecode(b"caf\xe9.ipynb"), standin_notebook("right latin-1 name", log=str(log)))  # not UTF-8
    _write(folder / "ne\nwline 5 points.ipynb", standin_notebook("wrong newline", log=str(log)))  # a row of its own?
    os.mkfifo(folder / "x.ipynb")  # nobody ever writes to it: reading it would wait for ever
    lines = []
    options = dict(settings=GradingSettings(jobs=1, secret=SECRET), grader=standin_grader, progress=lines.append)
    reports = classroom.grade_class(folder, out, **options)
    first = {path.relative_to(out): path.read_bytes() for path in out.rglob("*") if path.is_file()}
    graded_first = log.read_text().splitlines()
    again = classroom.grade_class(folder, out, **options)
    second = {path.relative_to(out): path.read_bytes() for path in out.rglob("*") if path.is_file()}
    with open(out / "gradebook.csv", newline="") as file:
        rows = {row["learner"]: row for row in csv.DictReader(file)}
    return {"folder": folder, "out": out, "reports": reports, "again": again, "first": first, "second": second,
            "graded_first": graded_first, "graded_all": log.read_text().splitlines(), "rows": rows, "lines": lines}


def test_learner_names_never_take_an_outputs_place(hostile_names):
    out, rows = hostile_names["out"], hostile_names["rows"]
    assert (out / "gradebook.csv").is_file() and (out / "class.png").is_file()
    assert rows["gradebook.csv"]["total"] == "2" and rows["ana.json"]["total"] == "0" and rows["ana"]["total"] == "2"
    assert rows["reports"]["total"] == "0" and rows["results"]["total"] == "2"
    reports = {path.name for path in (out / "reports").iterdir()}
    assert {"gradebook.csv%2F00_start_here.json", "ana.json", "ana.json%2F00_start_here.json",
            "reports%2F00_start_here.json", "results.json"} <= reports
    assert len(reports) == 14  # one per submission, none overwritten
    assert not list(out.rglob("*.partial"))


def test_names_reach_neither_terminal_nor_spreadsheet_as_controls(hostile_names):
    text = (hostile_names["out"] / "gradebook.csv").read_text(encoding="utf-8")
    assert "\u202e" not in text and "mognp" in text
    assert "'\u00a0=HYPERLINK(1)" in text  # quoted although a no-break space comes first
    terminal = "\n".join(hostile_names["lines"]) + gradebook.format_class_summary(hostile_names["reports"])
    assert "\u202e" not in terminal and "mognp" in terminal
    assert not any(line.startswith("wline") for line in terminal.splitlines())  # no row spoofed by a newline


def test_bad_files_are_row_notes_and_copies_are_graded_once_and_named(hostile_names):
    rows, graded = hostile_names["rows"], hostile_names["graded_first"]
    assert "could not be graded: NotJSONError" in rows["dee"]["notes"]
    assert "its lab '42' is not one of the course's" in rows["eli"]["notes"]
    assert "right unknown lab" not in graded  # rejected here, never shipped
    assert graded.count("right copied") == 1 and len(graded) == 10
    assert "is not a notebook file" in rows["x"]["notes"]  # the FIFO: a note on its row, and the class finished
    assert rows["caf?"]["total"] == "2" and (hostile_names["out"] / "reports" / "caf%E9.json").is_file()
    assert rows["ne wline 5 points"]["total"] == "0"
    assert rows["bo"]["notes"] == "lab 00: the same code as cy" and rows["cy"]["notes"] == "lab 00: the same code as bo"
    assert rows["bo"]["total"] == rows["cy"]["total"] == "2"


def test_a_rerun_grades_nothing_and_writes_the_same_files(hostile_names):
    assert hostile_names["graded_all"] == hostile_names["graded_first"]
    assert hostile_names["second"] == hostile_names["first"]
    assert [r.exercises for r in hostile_names["again"]] == [r.exercises for r in hostile_names["reports"]]
    assert "graded 0 of 0 submissions sent" in hostile_names["lines"][-1]
    assert "10 already graded by an earlier run" in hostile_names["lines"][-1]


def test_csv_cells_are_escaped_after_leading_whitespace_and_format_characters_go():
    assert [gradebook.csv_safe(v) for v in ("=1", " =1", "\u00a0@A1", "\t-2", "+3", "ana", "a=b")] == [
        "'=1", "' =1", "'\u00a0@A1", "'\t-2", "'+3", "ana", "a=b"]
    assert gradebook.one_line("\u2066ana\u2069\u200b\u202e") == "ana"


def test_report_paths_are_distinct_for_every_submission(tmp_path):
    names = ["ana.ipynb", "ana.json/x.ipynb", "ana%2Fx.ipynb", "ana/x.ipynb", "gradebook.csv/x.ipynb",
             "x" * 240 + ".ipynb", "y/" + "x" * 240 + ".ipynb"]
    paths = [classroom.report_path(tmp_path / "out", tmp_path, tmp_path / name) for name in names]
    assert len(set(paths)) == len(names)
    assert all(path.parent == tmp_path / "out" / "reports" and len(path.name.encode()) < 255 for path in paths)


def test_the_store_keeps_reports_by_key_and_rejects_odd_keys(tmp_path):
    store = ResultStore(tmp_path / "results")
    report = SubmissionReport("n.ipynb", "00", score=1, max_score=2, review=(Finding(1, 2, "x"),))
    store.put("a" * 40, report)
    assert store.get("a" * 40) == report and store.get("b" * 40) is None and store.keys() == {"a" * 40}
    with pytest.raises(ValueError, match="key must be 40 hexadecimal digits, got '../x'"):
        store.path("../x")


INTERRUPTED_RUN = """
import sys
from pathlib import Path
from grading_standins import standin_grader
from labkit.instructor.cluster import classroom
from labkit.instructor.grader.settings import GradingSettings
try:
    classroom.grade_class(Path(sys.argv[1]), Path(sys.argv[2]), GradingSettings(jobs=2, secret=b"k"),
                          grader=standin_grader, progress=lambda line: print(line, flush=True))
except KeyboardInterrupt:
    sys.exit(130)
"""


def test_an_interrupt_ends_the_run_promptly_and_writes_what_was_finished(tmp_path):
    folder, out = tmp_path / "class", tmp_path / "class-grades"
    _write(folder / "ana.ipynb", standin_notebook("right ana"))
    _write(folder / "bo.ipynb", standin_notebook("wrong bo"))
    _write(folder / "stuck.ipynb", standin_notebook("right stuck", hang=True))  # never returns by itself
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-c", INTERRUPTED_RUN, str(folder), str(out)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 300
        while len(list((out / "results").glob("*.json"))) < 2:
            assert process.poll() is None and time.monotonic() < deadline, "the two quick submissions never finished"
            time.sleep(0.5)
        time.sleep(1)
        process.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        assert process.wait(timeout=90) == 130
        seconds = time.monotonic() - interrupted
    finally:
        if process.poll() is None:
            process.kill()
    assert seconds < 60, f"the run took {seconds:.0f} s to end after the interrupt"
    with open(out / "gradebook.csv", newline="") as file:
        rows = {row["learner"]: row for row in csv.DictReader(file)}
    assert (rows["ana"]["total"], rows["bo"]["total"]) == ("2", "0")
    assert rows["stuck"]["notes"] == f"stuck.ipynb {classroom.INTERRUPTED}"
    assert json.loads((out / "reports" / "ana.json").read_text())["score"] == 2
