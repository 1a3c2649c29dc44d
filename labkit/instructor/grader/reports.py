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


NO_KNOWN_MISTAKE = "no known mistake"


@dataclass(frozen=True)
class FailedCase:
    """The first case a code exercise failed on: where it sits among the cases the grader ran, and what it is."""

    number: int  # 1-based, among all the cases run (hand, then hidden, then random)
    kind: str  # "hand" (the notebook's check runs it too), "hidden" (the grader's own) or "random"
    label: str = ""  # the case's label ("temperature 0 is greedy"); random cases have none


@dataclass(frozen=True)
class ExerciseResult:
    """One exercise of a submission: its verdict and points, with the lines that say why.

    A failed code exercise also says which registered mistake the learner's function behaves like (the hint the
    learner's own check shows for it), or :data:`NO_KNOWN_MISTAKE`, and the case it failed first; a well-formed
    prediction keeps the learner's answer, labkit's and how far apart they are.
    """

    id: str
    title: str
    kind: str  # "code" or "prediction"
    status: str  # "passed", "failed", "not attempted" or "error" (labkit's side broke)
    points: int
    max_points: int
    close: bool | None = None  # a prediction: whether it came close (recorded, not scored)
    details: tuple[str, ...] = ()
    mistake: str | None = None  # a failed code exercise: the matched mistake's hint, or NO_KNOWN_MISTAKE
    mistake_number: int | None = None  # its place (1-based) among the exercise's registered mistakes
    failed_case: FailedCase | None = None  # a failed code exercise: the first case it failed on
    answer: Any = None  # a well-formed prediction: the learner's answer (JSON-ready: tuples for sequences)
    truth: Any = None  # ... labkit's answer
    distance: str | None = None  # ... how far apart, in words ("26% too low", "right")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExerciseResult:
        """The result :func:`dataclasses.asdict` wrote (a report's ``exercises`` item, read back from JSON)."""
        values = dict(data)
        values["details"] = tuple(values.get("details", ()))
        if values.get("failed_case") is not None:
            values["failed_case"] = FailedCase(**values["failed_case"])
        for name in ("answer", "truth"):
            values[name] = json_ready(values.get(name))
        return cls(**values)


def json_ready(value: Any) -> Any:
    """``value`` as the plain data a report holds and JSON gives back the same: numbers, strings, booleans, None,
    and tuples of them; anything else its ``repr`` (at most 200 characters).

    >>> json_ready([1, ("a", 2.5)]), json_ready(None), json_ready({"k": 1})
    ((1, ('a', 2.5)), None, "{'k': 1}")
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return printable(value) if isinstance(value, str) else value
    if isinstance(value, (list, tuple)):
        return tuple(json_ready(item) for item in value)
    return printable(repr(value)[:200])


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
            values["exercises"] = tuple(ExerciseResult.from_json(item) for item in values.get("exercises", ()))
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
        if result.mistake is not None:
            number = f" (mistake {result.mistake_number})" if result.mistake_number else ""
            lines.append(f"    which mistake{number}: {result.mistake}")
        if result.distance is not None:
            lines.append(f"    answered {result.answer!r}, labkit's answer {result.truth!r}: {result.distance}")
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
