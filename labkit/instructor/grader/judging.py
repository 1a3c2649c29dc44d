"""The grader's own side: the instructor's secret, the cases drawn, and the verdicts decided from plain answers.

Nothing here runs the learner's code. :func:`plan` draws each exercise's cases (the notebook's hand cases, the
grader-only ones, random cases from a seed made of the instructor's secret and the submission's code) and says
what the worker inside the wall gets: case inputs as plain data. :func:`judge` turns the worker's plain answers
back into outcomes and decides each verdict with the same code as the notebook's check
(:func:`labkit.exercises.checking.code_verdict`, :func:`~labkit.exercises.checking.prediction_verdict`), so the
messages and hints are the same; labkit's answers are computed here, never inside the wall.

Layer 5 (instructor tools).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
from pathlib import Path
from typing import Any

from labkit.instructor.grader.reports import ExerciseResult, printable

SECRET_ENV = "LABKIT_GRADING_SECRET"
JUDGE = threading.Lock()  # labkit's references (the model among them) are run by one thread at a time


def grading_secret(secret_file: Path | None = None) -> bytes:
    """The instructor's secret: ``secret_file``'s content, else ``$LABKIT_GRADING_SECRET``, else labkit's own,
    made once at random and kept (readable by its owner only) in the user data directory."""
    if secret_file is not None:
        value = Path(secret_file).read_bytes().strip()
        if not value:
            raise ValueError(f"secret_file {secret_file} is empty; it must hold the instructor's secret")
        return value
    if os.environ.get(SECRET_ENV):
        return os.environ[SECRET_ENV].encode()
    from labkit.exercises.progress import progress_path

    kept = progress_path().with_name("grading-secret")
    if not kept.exists():
        kept.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(secrets.token_hex(32))
    return kept.read_bytes().strip()


def submission_seed(notebook: Any, secret: bytes = b"") -> int:
    """The grading seed of a submission: a hash of the secret and its code cells (not outputs or metadata)."""
    code = "\0".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    return int.from_bytes(hashlib.sha256(secret + b"\0" + code.encode()).digest()[:4], "big") >> 1


def _hash_to_seed(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") >> 1  # below 2**31


def plan(lab: str, seed: int) -> tuple[list[Any], list[dict[str, Any]], dict[str, Any]]:
    """The lab's exercises, what the worker gets (per exercise: its seed and the case inputs), and per exercise
    the cases drawn (or the reason labkit could not draw them)."""
    from labkit.exercises import exercises
    from labkit.exercises.checking import draw_cases
    from labkit.instructor.wall import wire

    chosen, plan, drawn = exercises(lab), [], {}
    for exercise in chosen:
        exercise_seed = _hash_to_seed(f"{seed}:{exercise.id}")
        try:
            cases = (list(exercise.hand_cases) if exercise.kind == "prediction"
                     else draw_cases(exercise, exercise_seed, exercise.grader_cases))
        except Exception as error:  # noqa: BLE001 - labkit's side: reported on that exercise
            drawn[exercise.id] = error
            continue
        drawn[exercise.id] = (cases, exercise_seed)
        plan.append({"id": exercise.id, "seed": exercise_seed,
                     "cases": [wire.to_plain((case.args, case.kwargs), objects=True) for case in cases]})
    return chosen, plan, drawn


def judge(exercise: Any, cases: Any, answers: Any, problem: str | None) -> ExerciseResult:
    """One exercise's result, decided here from the worker's plain answers. ``cases`` is (cases, their seed), or
    the error that stopped labkit drawing them; ``problem``: why there are no answers at all (the grader's step
    did not run, or did not hand back signed answers): every exercise fails with it."""
    from labkit.exercises.checking import check_function, code_verdict, labkit_error, prediction_verdict
    from labkit.exercises.definitions import Verdict
    from labkit.instructor.wall.wire import outcome_from_plain

    answer = answers.get(exercise.id) if isinstance(answers, dict) else None
    if isinstance(cases, BaseException):
        verdict = labkit_error(exercise, "labkit could not draw the cases", cases)
    elif cases is None:
        verdict = Verdict(exercise, "failed", ("could not be graded: no cases were drawn",))
    elif problem is not None:
        verdict = Verdict(exercise, "failed", (f"could not be graded: {problem}",))
    elif not isinstance(answer, dict):
        verdict = Verdict(exercise, "failed", ("could not be graded: the notebook's run gave no answer for it",))
    elif answer.get("missing") is True:
        verdict = check_function(exercise, None)
    elif "not_callable" in answer:
        verdict = Verdict(exercise, "failed", (
            f"`{exercise.function}` should be a function, it is a {str(answer['not_callable'])[:60]}",))
    else:
        outcomes = answer.get("outcomes") if isinstance(answer.get("outcomes"), list) else []
        outcome_of = (lambda number, case: outcome_from_plain(outcomes[number] if number < len(outcomes) else None))
        if exercise.kind == "prediction":
            verdict = prediction_verdict(exercise, lambda: outcome_of(0, None))
        else:
            verdict = code_verdict(exercise, cases[0], cases[1], outcome_of)
    return ExerciseResult(id=exercise.id, title=exercise.title, kind=exercise.kind, status=verdict.status,
                          points=verdict.points, max_points=exercise.points, close=verdict.close,
                          details=tuple(printable(list(verdict.lines))))
