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

import copy
import hashlib
import os
import secrets
import threading
from pathlib import Path
from typing import Any

from labkit.instructor.grader.reports import NO_KNOWN_MISTAKE, ExerciseResult, FailedCase, json_ready, printable

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
    found: dict[str, Any] = {}
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
        asked: list[int] = []

        def recording(number: int, case: Any) -> Any:
            asked.append(number)
            return outcome_of(number, case)

        if exercise.kind == "prediction":
            verdict = prediction_verdict(exercise, lambda: outcome_of(0, None))
            if verdict.status == "passed":
                found = prediction_found(exercise, outcome_of(0, None).value)
        else:
            verdict = code_verdict(exercise, cases[0], cases[1], recording)
            if verdict.status == "failed" and asked:
                # code_verdict stops at the first failing case, so the last case it asked for is that case
                found = which_mistake(exercise, cases[0], asked[-1], outcome_of)
    return ExerciseResult(id=exercise.id, title=exercise.title, kind=exercise.kind, status=verdict.status,
                          points=verdict.points, max_points=exercise.points, close=verdict.close,
                          details=tuple(printable(list(verdict.lines))), **found)


# Which mistake runs here, on the grader's side, from the learner's outputs that came back through the wall, and
# not inside it beside the cases: the learner's outputs already come back (the verdict needs them), and a mistake
# is labkit's code computing what a wrong answer looks like: inside the wall its verdict would be the learner's
# kernel's to forge, and a mistake's output is often one step from labkit's answer, which never enters the wall.
def which_mistake(exercise: Any, cases: list[Any], failing: int, outcome_of: Any) -> dict[str, Any]:
    """The result's fields of a failed code exercise: its first failing case (``cases[failing]``) and the
    registered mistake the learner's function behaves like, by the check's own test
    (:func:`labkit.exercises.checking.matching_mistakes`) on that case; when several mistakes give that output,
    the first that also gives the learner's output on every other case answered."""
    from labkit.exercises.checking import matching_mistakes
    from labkit.exercises.comparing import compare

    n_hand, n_hidden = len(exercise.hand_cases), len(exercise.grader_cases)
    kind = "hand" if failing < n_hand else "hidden" if failing < n_hand + n_hidden else "random"
    case = cases[failing]
    found: dict[str, Any] = {"failed_case": FailedCase(failing + 1, kind, printable(case.label)),
                             "mistake": NO_KNOWN_MISTAKE, "mistake_number": None}
    outcome = outcome_of(failing, case)
    if outcome.error is not None or outcome.timed_out or outcome.called_forbidden or outcome.mutated:
        return found  # no output to match: what went wrong is in the details
    candidates = list(matching_mistakes(exercise, case, outcome.value))
    if len(candidates) > 1:
        others = [(other, outcome_of(number, other)) for number, other in enumerate(cases) if number != failing]
        answered = [(other, said.value) for other, said in others
                    if said.error is None and not said.timed_out and not said.called_forbidden]

        def behaves_like(index: int) -> bool:
            try:
                wrong = exercise.mistakes[index].wrong
                return all(compare(wrong(*copy.deepcopy(other.args), **copy.deepcopy(other.kwargs)), value,
                                   exercise.rtol, exercise.atol) is None for other, value in answered)
            except Exception:  # noqa: BLE001 - a mistake that cannot run on a case does not behave like the learner
                return False

        candidates = [index for index in candidates if behaves_like(index)] or candidates
    if candidates:
        found.update(mistake=printable(exercise.mistakes[candidates[0]].hint), mistake_number=candidates[0] + 1)
    return found


def prediction_found(exercise: Any, value: Any) -> dict[str, Any]:
    """The result's fields of a well-formed prediction: the learner's answer, labkit's and their distance."""
    from labkit.exercises.calling import plain
    from labkit.exercises.checking import _prediction_answer
    from labkit.exercises.comparing import distance_words

    value = plain(value)
    truth = _prediction_answer(exercise.reference)
    return {"answer": json_ready(value), "truth": json_ready(truth),
            "distance": printable(distance_words(truth, value))}
