"""A class's gradebook: one row per learner from the submissions' reports, as CSV and as the terminal's summary.

Learner text (names, notes, review findings) reaches neither the terminal nor a spreadsheet as a control: terminal
escapes, control characters and bidirectional or other invisible format characters (U+202E would reverse what
follows it) are stripped, and a CSV cell that would start a formula once leading spaces are ignored (``=``,
``+``, ``-``, ``@``) gets a leading quote.

Layer 5 (instructor tools).
"""

from __future__ import annotations

import csv
import io
import unicodedata
from pathlib import Path
from typing import Any

from labkit.instructor.grader.reports import SubmissionReport, printable, summary_text

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def one_line(value: Any) -> Any:
    """``value`` on one line, without terminal escapes, control characters or format characters (bidi overrides,
    zero-width): a newline in a learner's file name cannot print a row of its own.

    >>> one_line("ana\\u202egnp.exe\\x1b[2J"), one_line("ana\\nbo  5/5")
    ('anagnp.exe', 'ana bo  5/5')
    """
    value = printable(value)
    if isinstance(value, str):
        return "".join(" " if c in "\n\t" else c for c in value if unicodedata.category(c) != "Cf")
    return value


def csv_safe(value: Any) -> Any:
    """A gradebook cell a spreadsheet shows as text: a string that would start a formula, once leading whitespace
    (a no-break space too) is ignored, gets a leading quote.

    >>> csv_safe("=1+1"), csv_safe(" @SUM(A1)"), csv_safe("\\u00a0=1"), csv_safe("-1"), csv_safe("ana"), csv_safe(3)
    ("'=1+1", "' @SUM(A1)", "'\\xa0=1", "'-1", 'ana', 3)
    """
    if isinstance(value, str) and (value.startswith(_FORMULA_START) or value.lstrip().startswith(_FORMULA_START)):
        return "'" + value
    return value


def gradebook(reports: list[SubmissionReport]) -> tuple[list[str], list[dict[str, Any]]]:
    """The gradebook's columns and one row per learner.

    Columns: ``learner``, ``labs`` (the labs graded for that learner), one column per exercise seen in any
    submission (labs in order, each lab's exercises in registration order) holding the points earned, then
    ``total``, ``max`` (the points available in the labs that learner handed in), ``predictions close`` (how
    many of the predictions in those labs came close, "k/n": accuracy, apart from the points), ``review`` (code
    in the counted submissions worth the instructor's look, by cell and line; see :mod:`labkit.instructor.grader.review`)
    and ``notes`` (including "not isolated" when a submission ran without the wall, and who handed in the same
    code). A cell is empty where the learner handed in no submission of that exercise's lab. When a learner
    handed in one lab twice, the better submission counts and the note says so. A submission that could not be
    graded is a note.
    """
    exercise_ids = sorted({(r.lab, i, e.id) for r in reports for i, e in enumerate(r.exercises)})
    columns = ["learner", "labs", *[ex_id for _, _, ex_id in exercise_ids], "total", "max", "predictions close",
               "review", "notes"]
    rows, counted = [], {}
    for learner in dict.fromkeys(r.learner for r in reports):  # first-seen order
        mine = [r for r in reports if r.learner == learner]
        notes = [f"{Path(r.notebook).name} {r.error}" for r in mine if r.error is not None]
        best: dict[str, SubmissionReport] = {}
        for report in (r for r in mine if r.error is None):
            lab = report.lab
            if lab in best:
                notes.append(f"lab {lab} handed in twice; the better submission counts")
            if lab not in best or report.score > best[lab].score:
                best[lab] = report
        counted[learner] = best
        row: dict[str, Any] = {"learner": learner, "labs": " ".join(sorted(best)), "notes": "; ".join(notes)}
        for report in best.values():
            row.update({result.id: result.points for result in report.exercises})
        row["total"] = sum(report.score for report in best.values())
        row["max"] = sum(report.max_score for report in best.values())
        predictions = [result for report in best.values() for result in report.exercises if result.kind == "prediction"]
        row["predictions close"] = (f"{sum(result.close is True for result in predictions)}/{len(predictions)}"
                                    if predictions else "")
        row["review"] = "; ".join(f"lab {lab}: {summary_text(list(report.review))}"
                                  for lab, report in sorted(best.items()) if report.review)
        if any(not report.isolated for report in best.values()):
            row["notes"] = "; ".join(filter(None, [row["notes"], "not isolated"]))
        rows.append(row)
    for row in rows:
        same = _same_code(row["learner"], counted)
        row["notes"] = "; ".join(filter(None, [row["notes"], *same]))
    return columns, rows


def _same_code(learner: str, counted: dict[str, dict[str, SubmissionReport]]) -> list[str]:
    """Notes naming the classmates who handed in the same code as ``learner`` in a lab where it answered something
    (an untouched learner notebook is the same for everyone and says nothing)."""
    notes = []
    for lab, report in sorted(counted[learner].items()):
        code = report.code_sha256
        if not code or all(result.status == "not attempted" for result in report.exercises):
            continue
        others = [other for other, best in counted.items()
                  if other != learner and lab in best and best[lab].code_sha256 == code]
        if others:
            notes.append(f"lab {lab}: the same code as {', '.join(others)}")
    return notes


def csv_text(reports: list[SubmissionReport]) -> str:
    """The gradebook as CSV text (write it with ``newline=""``, or as bytes, to keep it byte for byte)."""
    return table_csv(*gradebook(reports))


def table_csv(columns: list[str], rows: list[dict[str, Any]]) -> str:
    """``rows`` under ``columns`` as CSV text, every cell on one line and never read as a formula by a spreadsheet
    (the gradebook's, and the course platforms' files, :mod:`labkit.instructor.grader.platform_grades`)."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows([{key: csv_safe(one_line(value)) for key, value in row.items()} for row in rows])
    return text.getvalue()


def pass_counts(reports: list[SubmissionReport]) -> dict[str, dict[str, int]]:
    """Per exercise id: how many submissions passed, failed or did not attempt it (and labkit errors)."""
    counts: dict[str, dict[str, int]] = {}
    for report in reports:
        for result in report.exercises:
            tally = counts.setdefault(result.id, {"passed": 0, "failed": 0, "not attempted": 0, "error": 0})
            tally[result.status] = tally.get(result.status, 0) + 1
    return dict(sorted(counts.items()))


def format_class_summary(reports: list[SubmissionReport]) -> str:
    """Per learner their score and notes; per exercise how many submissions passed, failed or did not attempt it."""
    _, rows = gradebook(reports)
    width = max(12, *(len(one_line(row["learner"])) for row in rows))
    lines = [f"{'learner':<{width}} {'labs':<12} {'score':>9}  notes"]
    for row in rows:
        lines.append(f"{one_line(row['learner']):<{width}} {row['labs'] or '-':<12} {row['total']:>4}/{row['max']:<4}  "
                     f"{one_line(row['notes'])}".rstrip())
    counts = pass_counts(reports)
    width = max(28, *(len(ex_id) for ex_id in counts)) if counts else 28
    lines += ["", f"{'exercise':<{width}} {'passed':>7} {'failed':>7} {'not attempted':>14}"]
    for ex_id, tally in counts.items():
        lines.append(f"{ex_id:<{width}} {tally['passed']:>7} {tally['failed']:>7} {tally['not attempted']:>14}")
    return one_line("\n".join(lines))
