"""A class's grades written back in a course platform's import format.

- Canvas's gradebook CSV: ``Student, ID, SIS User ID, SIS Login ID, Section`` then one column per assignment,
  named as the gradebook names it (``Lab 00 (123456)``, :func:`canvas_csv`'s ``column``); Canvas matches rows on
  ``ID``, the user id its submission files are named with.
- Moodle's grading worksheet (Assignment > "Download grading worksheet", uploaded back through "Upload grading
  worksheet"): ``Identifier`` (``Participant 88``, the participant id of its submission files), ``Full name``,
  ``Email address``, ``Status``, ``Grade``, ``Maximum Grade``, ``Grade can be changed``, ``Last modified
  (submission)``, ``Last modified (grade)``, ``Feedback comments``; Moodle matches rows on ``Identifier``.
- Gradescope's autograder ``results.json`` (its "Autograder Specifications"): ``score``, ``output`` and one test
  per exercise (``name``, ``score``, ``max_score``, ``output``, ``visibility``); a Gradescope autograder's
  ``run_autograder`` writes it with ``labkit grade NOTEBOOK --gradescope /autograder/results/results.json``.

A learner's points are the gradebook's (:func:`labkit.instructor.grader.gradebook.gradebook`: the better submission
of a lab handed in twice). Who a learner is on the platform comes from the download's intake
(:mod:`labkit.instructor.grader.platforms`). Every learner text is made one line and formula-safe.

Layer 5 (instructor tools).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from labkit.instructor.grader.gradebook import gradebook, table_csv
from labkit.instructor.grader.platforms import Intake
from labkit.instructor.grader.reports import SubmissionReport, summary_text

CANVAS_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
MOODLE_COLUMNS = ["Identifier", "Full name", "Email address", "Status", "Grade", "Maximum Grade",
                  "Grade can be changed", "Last modified (submission)", "Last modified (grade)", "Feedback comments"]
EXPORTS = ("canvas", "moodle", "gradescope")


def _totals(reports: list[SubmissionReport]) -> dict[str, dict[str, Any]]:
    _, rows = gradebook(reports)
    return {str(row["learner"]): row for row in rows}


def canvas_csv(reports: list[SubmissionReport], intake: Intake, column: str = "labkit") -> str:
    """Canvas's gradebook import: one row per learner of the download, the points in ``column``."""
    if not column.strip():
        raise ValueError(f"column must name the Canvas assignment (e.g. 'Lab 00 (123456)'), got {column!r}")
    totals = _totals(reports)
    rows = [{"Student": learner.name, "ID": learner.learner, "SIS User ID": "", "SIS Login ID": "", "Section": "",
             column: totals.get(learner.learner, {}).get("total", "")} for learner in intake.learners]
    return table_csv([*CANVAS_COLUMNS, column], rows)


def moodle_csv(reports: list[SubmissionReport], intake: Intake) -> str:
    """Moodle's grading worksheet: one row per learner of the download, the notes as feedback comments."""
    totals = _totals(reports)
    rows = []
    for learner in intake.learners:
        row = totals.get(learner.learner, {})
        notes = "; ".join(filter(None, [row.get("notes", ""), "late" if learner.late else ""]))
        rows.append({"Identifier": f"Participant {learner.learner}", "Full name": learner.name, "Email address": "",
                     "Status": "Submitted for grading", "Grade": row.get("total", ""),
                     "Maximum Grade": row.get("max", ""), "Grade can be changed": "Yes",
                     "Last modified (submission)": "", "Last modified (grade)": "", "Feedback comments": notes})
    return table_csv(MOODLE_COLUMNS, rows)


def gradescope_results(report: SubmissionReport) -> dict[str, Any]:
    """One submission's Gradescope ``results.json``: its score, and a test per exercise with its lines."""
    tests = [{"name": f"{result.id}: {result.title}", "score": result.points, "max_score": result.max_points,
              "status": "passed" if result.status == "passed" else "failed",
              "output": "\n".join([result.status, *result.details]), "visibility": "visible"}
             for result in report.exercises]
    output = [f"not graded: {report.error}"] if report.error else []
    output += [f"cell {error.cell}: {error.error}" for error in report.cell_errors]
    if report.review:
        output.append(f"review: {summary_text(list(report.review))}")
    return {"score": report.score, "output": "\n".join(output), "tests": tests, "visibility": "visible"}


def write_grades(reports: list[SubmissionReport], intake: Intake, out: Path, exports: tuple[str, ...],
                 column: str = "labkit") -> list[Path]:
    """Write each of ``exports`` into ``out``: ``canvas_grades.csv``, ``moodle_grading_worksheet.csv``,
    ``gradescope/<learner>/results.json`` (the learner's better submission of each lab, one file per lab)."""
    from labkit.instructor.grader.platforms import safe_name
    from labkit.instructor.grader.results import write_atomically

    unknown = [name for name in exports if name not in EXPORTS]
    if unknown:
        raise ValueError(f"export must be among {', '.join(EXPORTS)}, got {', '.join(map(repr, unknown))}")
    written = []
    if "canvas" in exports:
        written.append(Path(out) / "canvas_grades.csv")
        write_atomically(written[-1], canvas_csv(reports, intake, column))
    if "moodle" in exports:
        written.append(Path(out) / "moodle_grading_worksheet.csv")
        write_atomically(written[-1], moodle_csv(reports, intake))
    if "gradescope" in exports:
        from labkit.instructor.grader.item_analysis import counted

        for report in counted(reports):
            name = f"results-{safe_name(str(report.lab))}.json"
            written.append(Path(out) / "gradescope" / safe_name(str(report.learner)) / name)
            write_atomically(written[-1], json.dumps(gradescope_results(report), indent=2, ensure_ascii=False))
    return written
