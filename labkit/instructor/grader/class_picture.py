"""A picture of a graded class, saved beside its gradebook: what an instructor would rather look at than read.

Left: per exercise, how many submissions passed, failed or did not attempt it (stacked bars). Right: the
distribution of the learners' scores, as a percentage of the points of the labs each handed in.

Layer 5 (instructor tools).
"""

from __future__ import annotations

from pathlib import Path

from labkit.instructor.grader.gradebook import gradebook, pass_counts
from labkit.instructor.grader.reports import SubmissionReport

COLOURS = {"passed": "#4c9a2a", "failed": "#c0392b", "not attempted": "#bdbdbd"}


def class_figure(reports: list[SubmissionReport]):
    """The figure (matplotlib, no pyplot state): pass counts per exercise and the score distribution."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    counts = pass_counts(reports)
    _, rows = gradebook(reports)
    scores = [100 * row["total"] / row["max"] for row in rows if row["max"]]
    figure = Figure(figsize=(11, max(3.5, 0.32 * len(counts) + 1.5)), layout="constrained")
    bars, spread = figure.subplots(1, 2, width_ratios=[3, 2])
    names = list(counts)[::-1]  # the first exercise on top
    left = [0] * len(names)
    for status, colour in COLOURS.items():
        values = [counts[name].get(status, 0) for name in names]
        bars.barh(names, values, left=left, color=colour, label=status)
        left = [a + b for a, b in zip(left, values)]
    bars.set_xlabel("submissions")
    bars.set_title("each exercise")
    bars.legend(loc="lower right", fontsize="small")
    spread.hist(scores, bins=[0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100.001], color="#3b6ea5", edgecolor="white")
    spread.set_xlabel("score (% of the points of the labs handed in)")
    spread.set_ylabel("learners")
    spread.set_title(f"{len(scores)} learners graded")
    for axis in (bars.xaxis, spread.yaxis):
        axis.set_major_locator(MaxNLocator(integer=True))
    return figure


def save_class_picture(reports: list[SubmissionReport], path: Path) -> Path:
    """Draw :func:`class_figure` to the PNG ``path`` (written whole or not at all); return the path."""
    import io

    from labkit.instructor.grader.results import write_atomically

    buffer = io.BytesIO()
    class_figure(reports).savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    write_atomically(Path(path), buffer.getvalue())
    return Path(path)
