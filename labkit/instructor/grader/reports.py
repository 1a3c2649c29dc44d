"""What grading says, as typed records: one exercise's result, one submission's report, and the report as text.

Judging (:func:`labkit.instructor.grader.judging.judge`) makes an :class:`ExerciseResult`; grading a notebook
(:func:`labkit.instructor.grader.grading.grade_notebook`) makes a :class:`SubmissionReport`; the class run keeps
reports in its result store and writes them as JSON (:meth:`SubmissionReport.to_json`,
:meth:`SubmissionReport.from_json`), and the gradebook, the class picture and :func:`format_report` read them.
Every text a learner can influence (a file name, an error, a review line) is stripped of terminal escapes and
control characters when the report is made (:func:`printable`).

Layer 5 (instructor tools).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

# Terminal escape sequences and control characters (C0 but newline and tab, DEL, C1): a learner's output must not
# move the instructor's cursor, recolour the terminal or rewrite its title.
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b.|[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(value: Any) -> Any:
    """``value`` (a string, or lists and dicts of them) without terminal escapes and control characters.

    A file name's bytes that are not UTF-8 (kept by Python as lone surrogates) become "?".

    >>> printable({"details": ["\\x1b[31mred\\x1b[0m", "bell\\x07 and title \\x1b]0;pwned\\x07", "caf\\udce9"]})
    {'details': ['red', 'bell and title ', 'caf?']}
    """
    if isinstance(value, str):
        return _CONTROL.sub("", value.encode("utf-8", "replace").decode("utf-8"))
    if isinstance(value, (list, tuple)):
        return type(value)(printable(item) for item in value)
    if isinstance(value, dict):
        return {key: printable(item) for key, item in value.items()}
    return value


@dataclass(frozen=True)
class ExerciseResult:
    """One exercise of a submission: its verdict and points, with the lines that say why."""

    id: str
    title: str
    kind: str  # "code" or "prediction"
    status: str  # "passed", "failed", "not attempted" or "error" (labkit's side broke)
    points: int
    max_points: int
    close: bool | None = None  # a prediction: whether it came close (recorded, not scored)
    details: tuple[str, ...] = ()


@dataclass(frozen=True)
class Finding:
    """A line of the review: what in the submission deserves the instructor's look, by cell and line."""

    cell: int | None
    line: int
    what: str


@dataclass(frozen=True)
class CellError:
    cell: int
    error: str


@dataclass(frozen=True)
class SubmissionReport:
    """One submission graded (or why it was not: :attr:`error`)."""

    notebook: str
    lab: str | None
    score: int = 0
    max_score: int = 0
    exercises: tuple[ExerciseResult, ...] = ()
    cell_errors: tuple[CellError, ...] = ()
    course_cells_not_run: tuple[int, ...] = ()  # the course's measuring cells, not run by the grader
    review: tuple[Finding, ...] = ()
    isolated: bool = True
    seed: int | None = None
    limits: Mapping[str, str] = field(default_factory=dict)  # which mechanism held each limit
    stopped: str | None = None  # why the run was stopped, if it was
    output_dropped_bytes: int = 0
    kernel_log: tuple[str, ...] = ()  # the end of what the run printed outside cells
    seconds: float = 0.0
    learner: str | None = None  # set by a class run
    code_sha256: str | None = None  # set by a class run: the submission's code cells, to spot copies
    error: str | None = None  # not graded, and why

    def with_learner(self, learner: str, **changes: Any) -> SubmissionReport:
        return dataclasses.replace(self, learner=learner, **changes)

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (what ``--json`` and a class's ``reports/`` hold)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SubmissionReport:
        """The report :meth:`to_json` wrote. Raises ``ValueError`` on anything else."""
        try:
            known = {f.name for f in dataclasses.fields(cls)}
            values = {key: value for key, value in data.items() if key in known}
            values["exercises"] = tuple(ExerciseResult(**{**item, "details": tuple(item.get("details", ()))})
                                        for item in values.get("exercises", ()))
            values["cell_errors"] = tuple(CellError(**item) for item in values.get("cell_errors", ()))
            values["review"] = tuple(Finding(**item) for item in values.get("review", ()))
            for name in ("course_cells_not_run", "kernel_log"):
                values[name] = tuple(values.get(name, ()))
            return cls(**values)
        except (TypeError, AttributeError) as error:
            raise ValueError(f"not a submission report: {error}") from None


def summary_text(findings: list[Finding], limit: int = 6) -> str:
    """The gradebook cell: ``cell 4 line 2: sys.setprofile (...)``, the first few, and how many more."""
    parts = [f"cell {f.cell} line {f.line}: {f.what}" if f.cell is not None else f.what
             for f in findings[:limit]]
    if len(findings) > limit:
        parts.append(f"and {len(findings) - limit} more")
    return "; ".join(parts)


def format_report(report: SubmissionReport) -> str:
    """The report as a plain-text table."""
    lines = [f"{report.notebook} (lab {report.lab}): {report.score}/{report.max_score} points",
             f"{'exercise':<28} {'status':<14} points"]
    for result in report.exercises:
        closeness = {True: "  (prediction close)", False: "  (prediction not close)"}.get(result.close, "")
        lines.append(f"{result.id:<28} {result.status:<14} {result.points}/{result.max_points}{closeness}")
        if result.status in ("failed", "error"):  # "error": labkit's side broke, the details say what
            lines += [f"    {detail}" for detail in result.details]
    lines += [f"cell {error.cell}: {error.error}" for error in report.cell_errors]
    if report.course_cells_not_run:
        lines.append(f"not run (the course's measurements and figures, which no exercise uses): cells "
                     f"{', '.join(map(str, report.course_cells_not_run))}")
    lines += [f"review: {summary_text([finding])}" for finding in report.review]
    if report.stopped:
        lines.append(f"stopped: {report.stopped}")
    if not report.isolated:
        lines.append("note: not isolated (graded without the wall, --no-isolation)")
    if report.limits.get("processes", "").startswith("not enforced"):
        lines.append(f"note: the number of processes was {report.limits['processes']}")
    if report.error:
        lines.append(f"not graded: {report.error}")
    return printable("\n".join(lines))
