"""A class of synthetic submissions built from the bug zoo, graded by the grader's own judging in this process.

Each learner's function is one of an exercise's registered mistakes (or labkit's reference: a right answer), called
here on the cases the grader draws; its outputs cross the wire's encoding as a worker's answers would, and
:func:`labkit.instructor.grader.judging.judge` decides each result, which mistake included. No notebook, no wall,
no kernel: the class report's tests (tests/test_instructor_class_report.py) and the judging's
(tests/test_instructor_judging.py) plant a known number of learners per mistake and read the counts back.
"""

import copy

from labkit.exercises import get
from labkit.exercises.calling import FLOOD_CHARS, Outcome, plain
from labkit.instructor.grader import judging
from labkit.instructor.grader.reports import SubmissionReport
from labkit.instructor.wall import wire

RIGHT = "right"  # a learner whose function is labkit's reference
STUB = "stub"  # a learner who left the stub


def _stub(*args, **kwargs):
    raise NotImplementedError("replace this with your code")


def answers_of(exercise, drawn, function):
    """The worker's answer for ``exercise``: ``function`` called on every drawn case, as plain data."""
    cases, _ = drawn
    outcomes = []
    for case in cases:
        outcome = Outcome()
        try:
            outcome.value = function(*copy.deepcopy(case.args), **copy.deepcopy(case.kwargs))
        except Exception as error:  # noqa: BLE001 - what the learner's function raised is its answer
            outcome.error = error
        value = plain(outcome.value) if exercise.kind == "prediction" else outcome.value
        outcomes.append(wire.decode(wire.encode(wire.outcome_to_plain(outcome, value, FLOOD_CHARS))))
    return {"outcomes": outcomes}


def function_for(exercise, chosen):
    """The learner's function: ``RIGHT``, ``STUB``, a mistake's index (0-based), a prediction's answer, or the
    function itself."""
    if callable(chosen):
        return chosen
    if chosen == RIGHT:
        return exercise.reference
    if chosen == STUB:
        return _stub
    if exercise.kind == "prediction":
        return lambda: chosen
    return exercise.mistakes[chosen].wrong


def graded(exercise_id, chosen, seed=5):
    """The grader's result for one learner's ``chosen`` function of ``exercise_id``."""
    exercise = get(exercise_id)
    _, _, drawn = judging.plan(exercise.lab, seed)
    answers = {exercise.id: answers_of(exercise, drawn[exercise.id], function_for(exercise, chosen))}
    return judging.judge(exercise, drawn[exercise.id], answers, None)


def planted_class(learners):
    """One report per learner: ``learners`` maps a learner's name to ``{exercise id: what they handed in}``
    (every exercise of one lab)."""
    reports, plans = [], {}
    for name, handed_in in learners.items():
        lab = get(next(iter(handed_in))).lab
        if lab not in plans:
            plans[lab] = judging.plan(lab, 5)
        _, _, drawn = plans[lab]
        results = []
        for exercise_id, chosen in handed_in.items():
            exercise = get(exercise_id)
            answers = {exercise_id: answers_of(exercise, drawn[exercise_id], function_for(exercise, chosen))}
            results.append(judging.judge(exercise, drawn[exercise_id], answers, None))
        reports.append(SubmissionReport(
            notebook=f"{name}/{lab}.ipynb", lab=lab, score=sum(r.points for r in results),
            max_score=sum(r.max_points for r in results), exercises=tuple(results), learner=name, seconds=12.0))
    return reports
