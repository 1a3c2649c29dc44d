"""The graded exercises of every lab, and the calls a notebook makes: ``check`` and ``summary``.

Each lab registers its exercises in ``labkit/exercises/labNN.py``. A notebook's check cell is one line::

    check("00.softmax_temperature")

which finds the learner's function by name in the notebook, runs :func:`labkit.checking.check_function`, shows
the verdict, and saves it to the progress file. ``summary("00")`` lists a lab's exercises and their status.
"""

from __future__ import annotations

import sys
from typing import Any

from labkit import progress
from labkit.checking import Exercise, Verdict, check_function

_REGISTRY: dict[str, Exercise] = {}


def register(exercise: Exercise) -> Exercise:
    if exercise.id in _REGISTRY and _REGISTRY[exercise.id] is not exercise:
        raise ValueError(f"exercise id {exercise.id!r} is registered twice")
    _REGISTRY[exercise.id] = exercise
    return exercise


def _load_labs() -> None:
    """Import every ``labNN`` module of this package; importing one registers its lab's exercises."""
    import importlib
    import pkgutil

    for module in pkgutil.iter_modules(__path__):
        if module.name.startswith("lab"):
            importlib.import_module(f"{__name__}.{module.name}")


def exercises(lab: str | None = None) -> list[Exercise]:
    """Registered exercises, in registration order, optionally of one lab ("00", "01", ...)."""
    _load_labs()
    chosen = [ex for ex in _REGISTRY.values() if lab is None or ex.lab == lab]
    if lab is not None and not chosen:
        labs = sorted({ex.lab for ex in _REGISTRY.values()})
        raise ValueError(f"lab must be one of {labs}, got {lab!r}")
    return chosen


def get(exercise_id: str) -> Exercise:
    _load_labs()
    if exercise_id not in _REGISTRY:
        raise ValueError(f"exercise_id must be one of {sorted(_REGISTRY)}, got {exercise_id!r}")
    return _REGISTRY[exercise_id]


def _show(value: Any) -> None:
    try:
        from IPython import get_ipython
        from IPython.display import display

        if get_ipython() is not None:
            display(value)
            return
    except ImportError:
        pass
    print(value)


def check(exercise_id: str, namespace: dict[str, Any] | None = None, *, show: bool = True) -> Verdict | None:
    """Check the learner's function for an exercise, show the verdict and save it. Never raises.

    The function is looked up by its name in ``namespace`` (default: the caller's globals, i.e. the notebook).
    Returns the verdict when ``show`` is False (for scripts and the grader); in a notebook it only displays it.
    """
    try:
        exercise = get(exercise_id)
    except ValueError as error:
        print(f"labkit: {error}")
        return None
    if namespace is None:
        namespace = sys._getframe(1).f_globals
    verdict = check_function(exercise, namespace.get(exercise.function))
    progress.record(exercise.id, verdict.status, verdict.points, exercise.points)
    if show:
        _show(verdict)
        return None
    return verdict


class Summary:
    """A lab's exercises with their saved status, as a text table (and HTML in a notebook)."""

    def __init__(self, rows: list[tuple[str, str, str, int, int]]):
        self.rows = rows  # (id, title, status, points, max_points)

    def __str__(self) -> str:
        earned, possible = sum(r[3] for r in self.rows), sum(r[4] for r in self.rows)
        lines = [f"{'exercise':<26} {'status':<14} points", *(
            f"{r[0]:<26} {r[2]:<14} {r[3]}/{r[4]}" for r in self.rows), f"{'total':<41} {earned}/{possible}"]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        import html

        body = "".join(f"<tr><td>{html.escape(r[0])}</td><td>{html.escape(r[1])}</td><td>{r[2]}</td>"
                       f"<td>{r[3]}/{r[4]}</td></tr>" for r in self.rows)
        total = f"{sum(r[3] for r in self.rows)}/{sum(r[4] for r in self.rows)}"
        return (f"<table><tr><th>exercise</th><th>title</th><th>status</th><th>points</th></tr>{body}"
                f"<tr><td colspan=3><b>total</b></td><td><b>{total}</b></td></tr></table>")


def summary(lab: str) -> Summary:
    """The lab's exercises and their status, read from the progress file (it survives kernel restarts)."""
    records = progress.load()
    rows = []
    for exercise in exercises(lab):
        saved = records.get(exercise.id, {})
        rows.append((exercise.id, exercise.title, saved.get("status", "not attempted"), saved.get("points", 0),
                     exercise.points))
    return Summary(rows)
