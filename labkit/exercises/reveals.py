"""The guard every reveal cell runs under: what it computes runs only once the learner has answered.

A cell tagged ``reveal`` (``labkit.instructor.authoring``) computes and prints the answer to a question asked above
it. The learner copy is committed with it empty and collapsed, but a learner who presses Run All, or runs it by
hand, would see the answer printed right under a check that says NOT ATTEMPTED. So the cell's body sits under::

    if reveal("06.predict_forward_calls"):
        ...

and runs only once that prediction has a well-formed answer on record (its check said ANSWERED, now or in an
earlier session: the progress file). Until then :func:`reveal` prints one line, ``answer
06.predict_forward_calls first: ...``, and the body does not run at all: the answer is neither printed nor
computed, and none of the names the body defines exists. So a reveal holds only what shows the answer; anything a
later cell reads (an import, a model preset, the text a later section scores) is computed in a cell before it,
quietly. A reveal may read what an earlier reveal of the same question defined: both wait for the same answer.
The grader, which reads no progress file, never runs a reveal's body. For a lab's ungraded explorer tasks,
``if reveal(explorer_answers):`` waits until no answer is still ``...``.

What it leaves out: a prediction asked in prose only ("Predict before you run the next cell") has no answer to wait
for; its cell is a reveal (committed empty) without this guard, unless its output would name a registered
prediction's answer, when it waits for that one.

Layer 4 (exercises).
"""

from __future__ import annotations

from typing import Any

from labkit.exercises import progress


def _unanswered(value: Any) -> bool:
    """Whether an ungraded answer (or any part of it) is still the ``...`` of its template."""
    if value is Ellipsis:
        return True
    if isinstance(value, dict):
        return any(_unanswered(item) for item in value.values())
    if isinstance(value, (tuple, list)):
        return any(_unanswered(item) for item in value)
    return False


def answered(question: str | dict) -> bool:
    """Whether the answer to ``question`` may be shown: the prediction with that id has been answered well-formed
    (the best verdict on record is passed), or the explorer tasks' answers hold no ``...``.

    >>> answered({1: (3, ...), 2: 0.5}), answered({1: (3, 4), 2: 0.5})
    (False, True)
    """
    if isinstance(question, str):
        try:
            record = progress.load().get(question, {})
        except OSError:  # a progress file nobody may read (a walled-off grading run): nothing is on record
            return False
        return record.get("best", record.get("status")) == "passed"
    if isinstance(question, dict):
        return not _unanswered(question)
    raise TypeError(f"question must be a prediction's id (a str) or the explorer answers (a dict), "
                    f"got {type(question).__name__}")


def waiting_message(question: str | dict) -> str:
    """The line a reveal cell prints instead of its answer.

    >>> print(waiting_message("06.predict_forward_calls"))  # doctest: +NORMALIZE_WHITESPACE
    answer 06.predict_forward_calls first: write your prediction above and run check("06.predict_forward_calls");
    then run this cell again
    """
    if isinstance(question, str):
        return (f'answer {question} first: write your prediction above and run check("{question}"); '
                "then run this cell again")
    return ("answer the tasks above first: replace each ... in explorer_answers and run that cell; "
            "then run this cell again")


def reveal(question: str | dict) -> bool:
    """Whether a reveal cell's body may run: True once ``question`` is answered (:func:`answered`); otherwise it
    prints :func:`waiting_message` and returns False, and the body under ``if reveal(...):`` is skipped.

    >>> if reveal({1: ...}):  # doctest: +NORMALIZE_WHITESPACE
    ...     print("the answer is 4")
    answer the tasks above first: replace each ... in explorer_answers and run that cell;
    then run this cell again
    >>> if reveal({1: 5}):
    ...     print("the answer is 4")
    the answer is 4
    """
    if answered(question):
        return True
    print(waiting_message(question))
    return False
