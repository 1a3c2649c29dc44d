"""Grading a class: a folder of submissions graded in parallel, one JSON report each, and a CSV gradebook.

A notebook directly inside the folder belongs to the learner named by its file's stem, a notebook in a subfolder
to the learner named by the subfolder. :func:`grade_class` grades ``jobs`` submissions at a time, each walled
off on its own (:func:`labkit.instructor.grading.grade_notebook`): one that crashes, hangs or floods is that
submission's report, never its neighbours'. Only after every run has ended does this process write one JSON
report per submission and the CSV gradebook, one row per learner (see :func:`gradebook`), each file whole or not
at all (written aside, then renamed). A file that cannot be graded at all is a note on its learner's row and
never stops the class.

    labkit grade submissions/ [--out submissions-grades] [--jobs 2]
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

from labkit.instructor.grading import grade_notebook, printable
from labkit.instructor.kernel_limits import Limits
from labkit.instructor.review import summary_text

def find_submissions(folder: Path) -> list[tuple[str, Path]]:
    """(learner, notebook) for every submission in ``folder``, in path order.

    A notebook directly in the folder belongs to the learner named by its file's stem; one in a subfolder belongs
    to the learner named by that subfolder. Hidden folders (``.ipynb_checkpoints``) are passed over, and so is
    anything reached through a symbolic link (see :func:`symlinked_submissions`): a link could hand in another
    learner's notebook, or read a file outside the folder.
    """
    found = []
    for path in sorted(Path(folder).rglob("*.ipynb")):
        relative = path.relative_to(folder)
        if any(part.startswith(".") for part in relative.parts) or _through_link(folder, relative):
            continue
        found.append((relative.parts[0] if len(relative.parts) > 1 else path.stem, path))
    return found


def _through_link(folder: Path, relative: Path) -> bool:
    return any((Path(folder) / Path(*relative.parts[: depth + 1])).is_symlink() for depth in range(len(relative.parts)))


def symlinked_submissions(folder: Path) -> list[tuple[str, Path]]:
    """(learner, path) of every ``.ipynb`` link in ``folder`` (not graded; the gradebook notes it, never its target)."""
    links = []
    for path in sorted(Path(folder).iterdir()):
        if path.is_symlink() and not path.name.startswith("."):
            links.append((path.stem if path.suffix == ".ipynb" else path.name, path))
        elif path.is_dir() and not path.name.startswith("."):
            links += [(path.name, inner) for inner in sorted(path.iterdir())
                      if inner.is_symlink() and inner.name.endswith(".ipynb")]
    return links


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_safe(value: Any) -> Any:
    """A gradebook cell a spreadsheet shows as text: a string that would start a formula gets a leading quote.

    >>> csv_safe("=1+1"), csv_safe("-1"), csv_safe("ana"), csv_safe(3)
    ("'=1+1", "'-1", 'ana', 3)
    """
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def _grade_or_explain(path: Path, cell_timeout_s: int, limits: Limits, secret: bytes, isolate: bool) -> dict[str, Any]:
    """grade_notebook, or a report that says why the submission could not be graded at all."""
    try:
        return grade_notebook(path, cell_timeout_s, limits, secret=secret, isolate=isolate)
    except Exception as error:  # noqa: BLE001 - one broken submission never stops the class
        return _unreadable(path, error)


def write_atomically(path: Path, text: str) -> None:
    """``path`` holds ``text`` whole, or keeps what it held: written to a file beside it, then renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with open(aside, "w", encoding="utf-8", newline="") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(aside, path)


def _unreadable(path: Path, error: BaseException) -> dict[str, Any]:
    first_line = printable((str(error).splitlines() or [""])[0])
    return {"notebook": str(path), "lab": None, "score": 0, "max_score": 0, "exercises": [], "cell_errors": [],
            "error": f"could not be graded: {type(error).__name__}: {first_line}"}


def grade_class(folder: Path, out: Path, jobs: int = 1, cell_timeout_s: int = 120, limits: Limits = Limits(),
                progress: Any = print, *, secret: bytes | None = None, isolate: bool = True) -> list[dict[str, Any]]:
    """Grade every submission in ``folder``, ``jobs`` at a time; write their JSON reports and the gradebook to ``out``.

    Each report gains a ``learner`` field and is written to ``out`` under the submission's relative path with the
    suffix ``.json``; the gradebook is ``out/gradebook.csv``. Returns the reports in path order.
    """
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from labkit.instructor.grading import require_isolation
    from labkit.instructor.judging import grading_secret
    from labkit.instructor.sandbox import stop_all

    folder, out = Path(folder), Path(out)
    if not folder.is_dir():
        raise FileNotFoundError(f"path {folder} is not a folder")
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer, got {jobs!r}")
    submissions = find_submissions(folder)
    if not submissions:
        raise ValueError(f"folder {folder} holds no .ipynb submissions")
    if isolate:
        require_isolation()
    secret = grading_secret() if secret is None else secret
    reports: dict[Path, dict[str, Any]] = {}
    # Threads suffice here: each submission runs in its own walled-off process tree, and this process only
    # prepares cases and judges answers (one thread at a time, see judging.JUDGE).
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(_grade_or_explain, path, cell_timeout_s, limits, secret, isolate): (learner, path)
                   for learner, path in submissions}
        try:
            for future in as_completed(futures):
                learner, path = futures[future]
                try:
                    report = future.result()
                except Exception as error:  # noqa: BLE001 - one submission's failure is its own report
                    report = _unreadable(path, error)
                report["learner"] = learner
                reports[path] = report
                outcome = report.get("error") or f"lab {report['lab']}: {report['score']}/{report['max_score']}"
                progress(printable(f"graded {learner} ({path.name}): {outcome}"))
        except KeyboardInterrupt:  # the instructor stopped the class: end every run now, write nothing
            pool.shutdown(wait=False, cancel_futures=True)
            stop_all()
            raise
    # Every run has ended (each was killed at its end, with everything it started): now the files are written.
    ordered = [reports[path] for _, path in submissions]
    for (_, path), report in zip(submissions, ordered):
        write_atomically(out / path.relative_to(folder).with_suffix(".json"), json.dumps(report, indent=2))
    for learner, link in symlinked_submissions(folder):
        ordered.append({"learner": learner, "notebook": link.name, "lab": None, "score": 0, "max_score": 0,
                        "exercises": [], "cell_errors": [],
                        "error": "not graded: a symbolic link, not a notebook handed in"})
    columns, rows = gradebook(ordered)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows([{key: csv_safe(printable(value)) for key, value in row.items()} for row in rows])
    write_atomically(out / "gradebook.csv", text.getvalue())
    return ordered


def gradebook(reports: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """The gradebook's columns and one row per learner.

    Columns: ``learner``, ``labs`` (the labs graded for that learner), one column per exercise seen in any
    submission (labs in order, each lab's exercises in registration order) holding the points earned, then
    ``total``, ``max`` (the points available in the labs that learner handed in), ``predictions close`` (how
    many of the predictions in those labs came close, "k/n": accuracy, apart from the points), ``review`` (code
    in the counted submissions worth the instructor's look, by cell and line; see :mod:`labkit.instructor.review`)
    and ``notes`` (including "not isolated" when a submission ran without the wall). A
    cell is empty where the learner handed in no submission of that exercise's lab. When a learner handed in one
    lab twice, the better submission counts and the note says so. A submission that could not be graded is a note.
    """
    exercise_ids = sorted({(r["lab"], i, e["id"]) for r in reports for i, e in enumerate(r["exercises"])})
    columns = ["learner", "labs", *[ex_id for _, _, ex_id in exercise_ids], "total", "max", "predictions close",
               "review", "notes"]
    rows = []
    for learner in dict.fromkeys(r["learner"] for r in reports):  # first-seen order
        mine = [r for r in reports if r["learner"] == learner]
        notes = [f"{Path(r['notebook']).name} {r['error']}" for r in mine if "error" in r]
        best: dict[str, dict[str, Any]] = {}
        for report in (r for r in mine if "error" not in r):
            lab = report["lab"]
            if lab in best:
                notes.append(f"lab {lab} handed in twice; the better submission counts")
            if lab not in best or report["score"] > best[lab]["score"]:
                best[lab] = report
        row: dict[str, Any] = {"learner": learner, "labs": " ".join(sorted(best)), "notes": "; ".join(notes)}
        for report in best.values():
            row.update({result["id"]: result["points"] for result in report["exercises"]})
        row["total"] = sum(report["score"] for report in best.values())
        row["max"] = sum(report["max_score"] for report in best.values())
        predictions = [result for report in best.values() for result in report["exercises"]
                       if result.get("kind") == "prediction"]
        row["predictions close"] = (f"{sum(result.get('close') is True for result in predictions)}/{len(predictions)}"
                                    if predictions else "")
        row["review"] = "; ".join(f"lab {lab}: {summary_text(report['review'])}" for lab, report in sorted(best.items())
                                  if report.get("review"))
        if any(report.get("isolated") is False for report in best.values()):
            row["notes"] = "; ".join(filter(None, [row["notes"], "not isolated"]))
        rows.append(row)
    return columns, rows


def format_class_summary(reports: list[dict[str, Any]]) -> str:
    """Per learner their score and notes; per exercise how many submissions passed, failed or did not attempt it."""
    _, rows = gradebook(reports)
    width = max(12, *(len(row["learner"]) for row in rows))
    lines = [f"{'learner':<{width}} {'labs':<12} {'score':>9}  notes"]
    for row in rows:
        lines.append(f"{row['learner']:<{width}} {row['labs'] or '-':<12} {row['total']:>4}/{row['max']:<4}  "
                     f"{row['notes']}".rstrip())
    counts: dict[str, dict[str, int]] = {}
    for report in reports:
        for result in report["exercises"]:
            tally = counts.setdefault(result["id"], {"passed": 0, "failed": 0, "not attempted": 0, "error": 0})
            tally[result["status"]] += 1
    width = max(28, *(len(ex_id) for ex_id in counts)) if counts else 28
    lines += ["", f"{'exercise':<{width}} {'passed':>7} {'failed':>7} {'not attempted':>14}"]
    for ex_id, tally in sorted(counts.items()):
        lines.append(f"{ex_id:<{width}} {tally['passed']:>7} {tally['failed']:>7} {tally['not attempted']:>14}")
    return printable("\n".join(lines))
