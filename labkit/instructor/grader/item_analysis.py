"""What the class got wrong, counted: per exercise passed / failed / not attempted, the known mistakes and the
cases failed first; per prediction, the class's answers against labkit's; the scores and the flagged reviews.

Everything is read from the submissions' reports alone (:class:`~labkit.instructor.grader.reports.SubmissionReport`,
as a class run writes them), so a class report can be rebuilt from a grades folder without grading again. Only
each learner's counted submission of a lab is read (the better one when a lab was handed in twice, as the
gradebook counts it); a submission that could not be graded counts nowhere. The page and the spreadsheet made of
these numbers are :mod:`labkit.instructor.grader.class_report`'s.

Layer 5 (instructor tools).
"""

from __future__ import annotations

import csv
import io
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any

from labkit.instructor.grader.gradebook import csv_safe, gradebook, one_line
from labkit.instructor.grader.reports import NO_KNOWN_MISTAKE, Finding, SubmissionReport


@dataclass(frozen=True)
class MistakeCount:
    """A known mistake (or :data:`~labkit.instructor.grader.reports.NO_KNOWN_MISTAKE`) and who made it."""

    hint: str  # the hint the learner's check shows for it
    number: int | None  # its place among the exercise's registered mistakes; None for "no known mistake"
    learners: int


@dataclass(frozen=True)
class CaseCount:
    """A case that was the first to fail, and for how many learners."""

    kind: str  # "hand" (the learner's check runs it too), "hidden" (the grader's own) or "random"
    label: str  # empty for a random case: random cases are counted together
    learners: int


@dataclass(frozen=True)
class ExerciseSummary:
    """One code exercise across the class."""

    id: str
    title: str
    passed: int
    failed: int
    not_attempted: int
    errors: int  # labkit's side broke: never a learner's fault
    mistakes: tuple[MistakeCount, ...]  # most learners first
    first_failed: tuple[CaseCount, ...]  # most learners first


@dataclass(frozen=True)
class PredictionSummary:
    """One prediction across the class: the well-formed answers, counted, against labkit's answer."""

    id: str
    title: str
    truth: Any  # None when nobody answered in form
    answers: tuple[tuple[Any, int], ...]  # (answer, learners), in the answers' order
    close: int  # how many answers came close
    not_answered: int  # not attempted, or not in the asked form


@dataclass(frozen=True)
class ReviewFlag:
    """A line of a counted submission's review, with whose it is."""

    learner: str
    lab: str
    finding: Finding


@dataclass(frozen=True)
class ClassAnalysis:
    """The numbers of a class report."""

    exercises: tuple[ExerciseSummary, ...]
    predictions: tuple[PredictionSummary, ...]
    scores_percent: tuple[float, ...]  # per learner, of the points of the labs each handed in
    flags: tuple[ReviewFlag, ...]
    learners: int
    median_grading_s: float | None  # how long grading one submission took (learners' own time is not recorded)


def counted(reports: list[SubmissionReport]) -> list[SubmissionReport]:
    """Each learner's counted submission of each lab (the better when handed in twice), graded ones only."""
    best: dict[tuple[Any, Any], SubmissionReport] = {}
    for report in reports:
        key = (report.learner, report.lab)
        if report.error is None and (key not in best or report.score > best[key].score):
            best[key] = report
    return list(best.values())


def _ranked(counter: Counter) -> list[tuple[Any, int]]:
    return sorted(counter.items(), key=lambda item: (-item[1], str(item[0])))


def analyse(reports: list[SubmissionReport]) -> ClassAnalysis:
    """The class's numbers, from its reports (see the module's docstring for which count)."""
    chosen = counted(reports)
    order = sorted({(r.lab or "", i, e.id) for r in chosen for i, e in enumerate(r.exercises)})
    results: dict[str, list[Any]] = {}
    for report in chosen:
        for result in report.exercises:
            results.setdefault(result.id, []).append(result)
    exercises, predictions = [], []
    for _, _, exercise_id in dict.fromkeys(order):
        found = results[exercise_id]
        if found[0].kind == "prediction":
            predictions.append(_prediction(found))
        else:
            exercises.append(_exercise(found))
    _, rows = gradebook(chosen)
    seconds = [r.seconds for r in chosen if r.seconds]
    flags = [ReviewFlag(one_line(str(r.learner)), str(r.lab), finding) for r in chosen for finding in r.review]
    return ClassAnalysis(
        exercises=tuple(exercises), predictions=tuple(predictions),
        scores_percent=tuple(100 * row["total"] / row["max"] for row in rows if row["max"]),
        flags=tuple(flags), learners=len(rows), median_grading_s=statistics.median(seconds) if seconds else None)


def _exercise(found: list[Any]) -> ExerciseSummary:
    status = Counter(result.status for result in found)
    failed = [result for result in found if result.status == "failed"]
    mistakes = Counter((result.mistake or NO_KNOWN_MISTAKE, result.mistake_number) for result in failed)
    cases = Counter((result.failed_case.kind, result.failed_case.label if result.failed_case.kind != "random" else "")
                    for result in failed if result.failed_case is not None)
    return ExerciseSummary(
        id=found[0].id, title=found[0].title, passed=status["passed"], failed=status["failed"],
        not_attempted=status["not attempted"], errors=status["error"],
        mistakes=tuple(MistakeCount(hint, number, n) for (hint, number), n in _ranked(mistakes)),
        first_failed=tuple(CaseCount(kind, label, n) for (kind, label), n in _ranked(cases)))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _prediction(found: list[Any]) -> PredictionSummary:
    answered = [result for result in found if result.distance is not None]
    answers = Counter(result.answer for result in answered)
    return PredictionSummary(
        id=found[0].id, title=found[0].title, truth=answered[0].truth if answered else None,
        answers=tuple(sorted(answers.items(), key=lambda item: (0, item[0], "") if _number(item[0])
                             else (1, 0, str(item[0])))),
        close=sum(result.close is True for result in answered), not_answered=len(found) - len(answered))


CSV_COLUMNS = ["exercise", "title", "passed", "failed", "not attempted", "mistake number", "mistake", "learners"]


def analysis_csv(analysis: ClassAnalysis) -> str:
    """The numbers as CSV: one row per code exercise and mistake (an exercise nobody failed: one row, the mistake
    empty), then one row per prediction and answer given (``mistake`` holds "answered X", ``title`` labkit's
    answer)."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=CSV_COLUMNS)
    writer.writeheader()
    for summary in analysis.exercises:
        base = {"exercise": summary.id, "title": summary.title, "passed": summary.passed, "failed": summary.failed,
                "not attempted": summary.not_attempted}
        for mistake in summary.mistakes or (MistakeCount("", None, 0),):
            writer.writerow({key: csv_safe(one_line(value)) for key, value in {
                **base, "mistake number": "" if mistake.number is None else mistake.number,
                "mistake": mistake.hint, "learners": mistake.learners}.items()})
    for prediction in analysis.predictions:
        for answer, learners in prediction.answers:
            writer.writerow({key: csv_safe(one_line(value)) for key, value in {
                "exercise": prediction.id, "title": f"prediction (labkit's answer {prediction.truth!r})",
                "mistake": f"answered {answer!r}", "learners": learners}.items()})
    return text.getvalue()
