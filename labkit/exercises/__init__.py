"""The graded exercises of every lab, and the calls a notebook makes: ``check`` and ``summary``.

Each lab registers its exercises in ``labkit/exercises/labNN.py``. A notebook's check cell is one line::

    check("00.softmax_temperature")

which finds the learner's function by name in the notebook, runs :func:`labkit.exercises.checking.check_function`, shows
the verdict, and saves it to the progress file. ``summary("00")`` lists a lab's exercises and their status; ``if reveal("00.predict_tokenizer"):`` lets a reveal
cell's body run only once that prediction is answered (``labkit.exercises.reveals``).

A lab whose exercise module fails to import is recorded, not raised: the other labs keep working, and the
learner reads which lab could not be loaded and why (a problem on labkit's side, never in their code).
"""

from __future__ import annotations

import contextlib
import io
import sys
from typing import Any

from labkit.exercises import progress
from labkit.exercises.checking import check_function
from labkit.exercises.definitions import Exercise, Verdict
from labkit.exercises.reveals import reveal  # noqa: F401 - a notebook imports it from here, beside check

_REGISTRY: dict[str, Exercise] = {}
_LOAD_ERRORS: dict[str, str] = {}  # lab -> "ImportError: ..." for a lab module that could not be imported


def register(exercise: Exercise) -> Exercise:
    if exercise.id in _REGISTRY and _REGISTRY[exercise.id] is not exercise:
        raise ValueError(f"exercise id {exercise.id!r} is registered twice")
    _REGISTRY[exercise.id] = exercise
    return exercise


def _load_labs(only: str | None = None) -> None:
    """Import the ``labNN`` modules of this package (only lab ``only`` when it names one); importing one
    registers its lab's exercises. A check imports its own lab only: the other labs' modules may pull in more."""
    import importlib
    import pkgutil

    names = [module.name for module in pkgutil.iter_modules(__path__) if module.name.startswith("lab")]
    if only is not None and f"lab{only}" in names:
        names = [f"lab{only}"]
    for module_name in names:
        lab = module_name[len("lab"):]
        try:
            importlib.import_module(f"{__name__}.{module_name}")
        except Exception as error:  # noqa: BLE001 - one broken lab must not break the others
            lines = str(error).strip().splitlines()
            _LOAD_ERRORS[lab] = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
        else:
            _LOAD_ERRORS.pop(lab, None)


def load_problem(lab: str) -> str | None:
    """Why a lab's exercises could not be loaded, in words for the learner (None when they loaded)."""
    if lab not in _LOAD_ERRORS:
        return None
    return (f"labkit could not load the exercises of lab {lab}: {_LOAD_ERRORS[lab]}. This is a problem on "
            "labkit's side, not in your code; restarting the kernel or reinstalling labkit may help.")


def exercises(lab: str | None = None) -> list[Exercise]:
    """Registered exercises, in registration order, optionally of one lab ("00", "01", ...).

    A lab that could not be loaded is reported (printed) and contributes no exercises.
    """
    _load_labs(lab)
    for failed in sorted(_LOAD_ERRORS) if lab is None else [lab]:
        if load_problem(failed):
            print(load_problem(failed))
    chosen = [ex for ex in _REGISTRY.values() if lab is None or ex.lab == lab]
    if lab is not None and not chosen and lab not in _LOAD_ERRORS:
        _load_labs()
        labs = sorted({ex.lab for ex in _REGISTRY.values()} | set(_LOAD_ERRORS))
        raise ValueError(f"lab must be one of {labs}, got {lab!r}")
    return chosen


def get(exercise_id: str) -> Exercise:
    _load_labs(str(exercise_id).split(".", 1)[0])
    if exercise_id not in _REGISTRY:
        _load_labs()  # to name every exercise in the error
        problem = load_problem(str(exercise_id).split(".", 1)[0])
        raise ValueError(problem or f"exercise_id must be one of {sorted(_REGISTRY)}, got {exercise_id!r}")
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
    An exercise that cannot be found or loaded prints why and returns None.
    """
    if namespace is None:
        namespace = sys._getframe(1).f_globals
    try:
        return _check(exercise_id, namespace, show)
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # noqa: BLE001 - the promise: no traceback from a check cell
        print(f"labkit could not check {exercise_id!r}: {type(error).__name__}: {error}. This is a problem on "
              "labkit's side, not in your code.")
        return None


def _check(exercise_id: str, namespace: dict[str, Any], show: bool) -> Verdict | None:
    try:
        exercise = get(exercise_id)
    except ValueError as error:
        message = str(error)
        print(message if message.startswith("labkit") else f"labkit: {message}")
        return None
    verdict = check_function(exercise, namespace.get(exercise.function))
    # labkit's own error judged nothing: the progress file keeps it as not attempted (no attempt spent)
    status = "not attempted" if verdict.status == "error" else verdict.status
    progress.record(exercise.id, status, verdict.points, exercise.points, close=verdict.close)
    if show:
        _show(verdict)
        return None
    return verdict


class Summary:
    """A lab's exercises with their saved status, as a text table (and HTML in a notebook)."""

    def __init__(self, rows: list[tuple[str, str, str, int, int]], notes: tuple[str, ...] = ()):
        self.rows = rows  # (id, title, status, points, max_points); a prediction's status says if it was close
        self.notes = notes  # e.g. why a lab's exercises could not be loaded, the prediction accuracy

    def __str__(self) -> str:
        earned, possible = sum(r[3] for r in self.rows), sum(r[4] for r in self.rows)
        lines = [f"{'exercise':<30} {'status':<22} points", *(
            f"{r[0]:<30} {r[2]:<22} {r[3]}/{r[4]}" for r in self.rows), f"{'total':<53} {earned}/{possible}",
            *self.notes]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        import html

        body = "".join(f"<tr><td>{html.escape(r[0])}</td><td>{html.escape(r[1])}</td><td>{r[2]}</td>"
                       f"<td>{r[3]}/{r[4]}</td></tr>" for r in self.rows)
        total = f"{sum(r[3] for r in self.rows)}/{sum(r[4] for r in self.rows)}"
        notes = "".join(f"<p>{html.escape(note)}</p>" for note in self.notes)
        return (f"<table><tr><th>exercise</th><th>title</th><th>status</th><th>points</th></tr>{body}"
                f"<tr><td colspan=3><b>total</b></td><td><b>{total}</b></td></tr></table>{notes}")


def summary(lab: str) -> Summary:
    """The lab's exercises and their status, read from the progress file (it survives kernel restarts).

    A prediction's status says whether its answer was close (not scored), and a note counts the close ones.
    """
    records = progress.load()
    rows = []
    with contextlib.redirect_stdout(io.StringIO()):  # the summary states a load problem itself
        chosen = exercises(lab)
    closeness = []
    for exercise in chosen:
        saved = records.get(exercise.id, {})
        status = saved.get("status", "not attempted")
        if exercise.kind == "prediction" and status == "passed" and "close" in saved:
            closeness.append(bool(saved["close"]))
            status = "passed, close" if saved["close"] else "passed, not close"
        rows.append((exercise.id, exercise.title, status, saved.get("points", 0), exercise.points))
    notes = [problem] if (problem := load_problem(lab)) else []
    n_predictions = sum(exercise.kind == "prediction" for exercise in chosen)
    if n_predictions:
        notes.append(f"predictions close: {sum(closeness)} of {n_predictions} (accuracy is shown, not scored)")
    return Summary(rows, tuple(notes))
