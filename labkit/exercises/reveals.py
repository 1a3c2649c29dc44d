"""The guard every reveal cell runs under: its output exists only once the learner has answered.

A cell tagged ``reveal`` (``labkit.instructor.authoring``) computes and prints the answer to a question asked above
it. The learner copy is committed with it empty and collapsed, but a learner who presses Run All, or runs it by
hand, would see the answer printed right under a check that says NOT ATTEMPTED. So the cell's body runs inside::

    with reveal("06.predict_forward_calls"):
        ...

which shows what the body prints or displays only once that prediction has a well-formed answer on record (its
check said ANSWERED, now or in an earlier session: the progress file), and otherwise prints one line, ``answer
06.predict_forward_calls first: ...``, and discards everything else the body prints, displays or draws. The body
still runs, so every name it defines exists for the cells below (a later cell, or the grader, may use them) and a
Run All goes on to the end. For a lab's ungraded explorer tasks, ``reveal(explorer_answers)`` waits until no answer
is still ``...``.

What it leaves out: a prediction asked in prose only ("Predict before you run the next cell") has no answer to wait
for; its cell is a reveal (committed empty) without this guard, unless its output would name a registered
prediction's answer, when it waits for that one.

Layer 4 (exercises).
"""

from __future__ import annotations

import contextlib
import io
import sys
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


class _Discarded:
    """Everything a body prints (stdout, stderr), displays (IPython's display) or draws (pyplot) goes nowhere."""

    def __enter__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        self._stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
        try:
            from IPython import get_ipython
            from IPython.utils.capture import capture_output
        except ImportError:
            pass
        else:
            if get_ipython() is not None:
                self._stack.enter_context(capture_output(stdout=False, stderr=False, display=True))
        pyplot = sys.modules.get("matplotlib.pyplot")
        self._figures = set(pyplot.get_fignums()) if pyplot is not None else None

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None:  # the inline backend would show a figure the body opened at the cell's end
            for number in set(pyplot.get_fignums()) - (self._figures or set()):
                pyplot.close(number)


@contextlib.contextmanager
def reveal(question: str | dict):
    """Run a reveal cell's body, showing its output only once ``question`` is answered (:func:`answered`).

    Yields whether the answer is shown. An error in the body is raised either way (it is labkit's to fix).

    >>> with reveal({1: ...}):  # doctest: +NORMALIZE_WHITESPACE
    ...     print("the answer is 4")
    answer the tasks above first: replace each ... in explorer_answers and run that cell;
    then run this cell again
    >>> with reveal({1: 5}):
    ...     print("the answer is 4")
    the answer is 4
    """
    if answered(question):
        yield True
        return
    print(waiting_message(question))
    with _Discarded():
        yield False
