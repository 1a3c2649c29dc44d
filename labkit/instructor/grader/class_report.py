"""The class report: one self-contained HTML page of what the class got wrong, and the same numbers as CSV.

Written beside the gradebook by a class run (``class_report.html``, ``class_report.csv``) and rebuilt from a grades
folder's JSON reports alone by ``labkit report GRADES_FOLDER`` (:func:`rebuild`). The page holds, per code exercise,
passed / failed / not attempted, the known mistakes ranked by how many learners made them with the hint the
learners saw, and the cases failed first (hidden and random ones are cases the learner's check never ran); per
prediction, the class's answers against labkit's (a bar per answer given, or a histogram of numbers); the score
distribution; and every flagged review line in one list. The numbers are
:mod:`labkit.instructor.grader.item_analysis`'s; plots are matplotlib PNGs inlined as base64, each with a text
alternative. Every text a learner could influence is escaped.

Layer 5 (instructor tools).
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

from labkit.instructor.grader.item_analysis import ClassAnalysis, PredictionSummary, analyse, analysis_csv
from labkit.instructor.grader.reports import SubmissionReport
from labkit.instructor.grader.results import write_atomically

PAGE, SHEET = "class_report.html", "class_report.csv"
_STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}table{border-collapse:collapse;"
          "margin:.5em 0 1.5em}td,th{border-bottom:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}"
          "td.n{text-align:right}.bar{background:#c0392b;height:.8em;display:inline-block}h3{margin-bottom:.2em}"
          "img{max-width:100%}")


def _png(figure: Any, alt: str) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, metadata={"Software": None})
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}">'


def _prediction_figure(prediction: PredictionSummary):
    """Bars per answer given (labkit's in green), or for numbers of many values a histogram with labkit's line."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(6, 2.6), layout="constrained")
    axes = figure.subplots()
    values = [answer for answer, _ in prediction.answers]
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if numbers and len(values) > 8:
        axes.hist([a for a, n in prediction.answers for _ in range(n)], bins=12, color="#3b6ea5", edgecolor="white")
        if isinstance(prediction.truth, (int, float)):
            axes.axvline(prediction.truth, color="#4c9a2a", linewidth=2, label="labkit's answer")
            axes.legend(fontsize="small")
    else:
        labels = [str(v) for v in values]
        colours = ["#4c9a2a" if v == prediction.truth else "#3b6ea5" for v in values]
        axes.bar(range(len(values)), [n for _, n in prediction.answers], color=colours)
        axes.set_xticks(range(len(values)), [label if len(label) <= 14 else label[:13] + "…" for label in labels],
                        fontsize="small")
    axes.set_ylabel("learners")
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_title(prediction.id, fontsize="medium")
    return figure


def _prediction_alt(prediction: PredictionSummary) -> str:
    given = ", ".join(f"{answer!r}: {n}" for answer, n in prediction.answers) or "no answers"
    return (f"{prediction.id}: the class's answers against labkit's answer {prediction.truth!r}: {given} "
            f"({prediction.close} close, {prediction.not_answered} not answered in form)")


def report_html(reports: list[SubmissionReport], title: str = "Class report") -> str:
    """The class report page (see the module's docstring)."""
    from labkit.instructor.grader.class_picture import class_figure

    analysis = analyse(reports)
    escape = html.escape
    parts = [f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{escape(title)}</title>"
             f"<style>{_STYLE}</style></head><body><h1>{escape(title)}</h1>",
             f"<p>{analysis.learners} learners; each learner's counted submission of each lab is read.</p>"]
    overview = "; ".join(f"{e.id}: {e.passed} passed, {e.failed} failed, {e.not_attempted} not attempted"
                         for e in analysis.exercises)
    scores = ", ".join(f"{score:.0f}%" for score in sorted(analysis.scores_percent))
    parts.append("<h2>Each exercise, and the scores</h2>" + _png(
        class_figure(reports), f"passed, failed and not attempted per exercise ({overview}); and the distribution "
                               f"of the learners' scores ({scores or 'none'})"))
    parts.append(_exercises_html(analysis))
    parts.append("<h2>Predictions: the class's answers against labkit's</h2>")
    for prediction in analysis.predictions:
        parts.append(f"<h3>{escape(prediction.id)}: {escape(prediction.title)}</h3><p>labkit's answer: "
                     f"<b>{escape(repr(prediction.truth))}</b>; {prediction.close} of "
                     f"{sum(n for _, n in prediction.answers)} answers close; {prediction.not_answered} not answered "
                     f"in the asked form</p>")
        if prediction.answers:
            parts.append(_png(_prediction_figure(prediction), _prediction_alt(prediction)))
    parts.append(_flags_html(analysis))
    timing = (f"grading took {analysis.median_grading_s:.0f} s per submission (median)"
              if analysis.median_grading_s is not None else "no grading time recorded")
    parts.append(f"<h2>Time</h2><p>The time learners spent is not recorded in a submission; {timing}.</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _exercises_html(analysis: ClassAnalysis) -> str:
    escape = html.escape
    parts = ["<h2>What the class got wrong</h2>"]
    for summary in analysis.exercises:
        parts.append(f"<h3>{escape(summary.id)}: {escape(summary.title)}</h3><p>{summary.passed} passed, "
                     f"{summary.failed} failed, {summary.not_attempted} not attempted"
                     + (f", {summary.errors} not checked (labkit's side broke)" if summary.errors else "") + "</p>")
        if not summary.mistakes:
            continue
        widest = max(m.learners for m in summary.mistakes)
        rows = "".join(f"<tr><td class=n>{m.learners}</td><td><span class=bar "
                       f'style="width:{80 * m.learners // widest}px"></span></td>'
                       f"<td>{'' if m.number is None else m.number}</td><td>{escape(m.hint)}</td></tr>"
                       for m in summary.mistakes)
        parts.append(f"<table><tr><th>learners</th><th></th><th>mistake</th><th>hint the learner saw</th></tr>"
                     f"{rows}</table>")
        seen = {"hand": "yes", "hidden": "no (the grader's own)", "random": "no (random, from the secret)"}
        rows = "".join(f"<tr><td class=n>{c.learners}</td><td>{escape(c.kind)}</td><td>{seen.get(c.kind, '')}</td>"
                       f"<td>{escape(c.label or 'any random case')}</td></tr>" for c in summary.first_failed)
        parts.append("<table><tr><th>failed it first</th><th>case</th><th>in the learner's check?</th><th>what the "
                     f"case is</th></tr>{rows}</table>")
    return "\n".join(parts)


def _flags_html(analysis: ClassAnalysis) -> str:
    escape = html.escape
    if not analysis.flags:
        return "<h2>Flagged reviews</h2><p>None: no counted submission holds code only a cheat needs.</p>"
    rows = "".join(f"<tr><td>{escape(flag.learner)}</td><td>{escape(flag.lab)}</td>"
                   f"<td class=n>{'' if flag.finding.cell is None else flag.finding.cell}</td>"
                   f"<td class=n>{flag.finding.line}</td><td>{escape(flag.finding.what)}</td></tr>"
                   for flag in analysis.flags)
    return (f"<h2>Flagged reviews ({len(analysis.flags)})</h2><table><tr><th>learner</th><th>lab</th><th>cell</th>"
            f"<th>line</th><th>what deserves a look</th></tr>{rows}</table>")


def write_class_report(reports: list[SubmissionReport], out: Path, title: str = "Class report") -> tuple[Path, Path]:
    """Write ``class_report.html`` and ``class_report.csv`` into ``out`` (each whole or not at all)."""
    out = Path(out)
    write_atomically(out / PAGE, report_html(reports, title))
    write_atomically(out / SHEET, analysis_csv(analyse(reports)))
    return out / PAGE, out / SHEET


def read_reports(grades: Path) -> list[SubmissionReport]:
    """The reports a class run wrote to ``grades/reports/``, in name order. Raises ``FileNotFoundError`` when there
    are none, ``ValueError`` naming a file that is not a report."""
    folder = Path(grades) / "reports"
    paths = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not paths:
        raise FileNotFoundError(f"GRADES_FOLDER {grades} holds no reports/*.json: give the folder `labkit grade` "
                                "wrote (its --out)")
    reports = []
    for path in paths:
        try:
            reports.append(SubmissionReport.from_json(json.loads(path.read_text(encoding="utf-8"))))
        except (ValueError, AttributeError) as error:
            raise ValueError(f"report {path} is not a submission report: {error}") from None
    return reports


def rebuild(grades: Path) -> tuple[Path, Path]:
    """``labkit report GRADES_FOLDER``: the class report made again from the folder's JSON reports alone."""
    return write_class_report(read_reports(grades), grades, title=f"Class report: {Path(grades).name}")
