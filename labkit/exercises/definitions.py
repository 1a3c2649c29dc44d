"""What an exercise is: its cases, the mistakes it knows, how it is scored, and the verdict a check returns.

An exercise is registered once, as one of two types built on :class:`Exercise` (the fields the checker and the
grader read): a :class:`CodeExercise` is the function name the learner defines, the reference it is compared
with, hand-computed cases (boundaries included), a generator of random cases, tolerances, the labkit helpers the
learner may call, and the mistakes learners really make, each with the hint that points at it; a
:class:`Prediction` is the learner's guess, asked before the notebook computes the answer (:func:`prediction`, and
:func:`choice_prediction` for a multiple-choice one): its answer, closeness rule, reveal and giveaways. A
:class:`Verdict` is what a check says: passed, failed, not attempted or error. Calling the learner's function is
``labkit.exercises.calling``'s; comparing an answer with labkit's is ``labkit.exercises.comparing``'s; drawing the
cases and judging the answers is ``labkit.exercises.checking``'s.

Layer 4 (exercises): imports the core, never widgets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class Case:
    """One call of the learner's function: positional and keyword arguments, and what the case is about."""

    args: tuple
    kwargs: dict = field(default_factory=dict)
    label: str = ""  # shown when the case fails, e.g. "temperature 0 is greedy"


@dataclass(frozen=True)
class Mistake:
    """A mistake learners make, recognised from the output it produces on a failing case."""

    hint: str  # what to look at, shown when the mistake is recognised
    wrong: Callable[..., Any]  # a deliberately wrong implementation with the exercise's signature


def dotted_name(item: Any) -> str:
    """The public name a learner would type: ``torch.quantize_per_tensor``, not the private class torch's C
    functions hang on (``torch._VariableFunctionsClass.quantize_per_tensor``)."""
    name = getattr(item, "__name__", None)
    for public in (torch, torch.nn.functional, torch.linalg):
        if name and getattr(public, name, None) is item:
            return f"{public.__name__}.{name}"
    return f"{getattr(item, '__module__', None) or '?'}.{getattr(item, '__qualname__', None) or name}"


@dataclass(frozen=True)
class Exercise:
    """A graded exercise: what the learner writes and how it is checked.

    Any call into labkit from the learner's function is reported (labkit holds the answers), except ``allowed``:
    functions, or classes whose methods and properties may all be used (e.g. the ``ModelSpec`` passed in).
    ``forbidden`` adds torch's ready-made equivalents (``torch.nn.functional.cross_entropy`` in a loss exercise).
    """

    id: str  # "<lab>.<name>", e.g. "00.softmax_temperature"
    title: str
    function: str  # the name the learner's notebook defines
    reference: Callable[..., Any]  # labkit's implementation, the source of truth
    hand_cases: tuple[Case, ...]  # computed by hand, boundaries included
    random_case: Callable[[torch.Generator], Case]  # draws one random case
    points: int = 1
    n_random: int = 25
    rtol: float = 1e-5  # tolerances, also stated in the notebook's task text
    atol: float = 1e-6
    hints: tuple[str, ...] = ()  # general hints when no known mistake matches
    mistakes: tuple[Mistake, ...] = ()
    allowed: tuple[Any, ...] = ()  # labkit functions (or classes) the learner may call; any other labkit call fails
    forbidden: tuple[Callable[..., Any], ...] = ()  # torch's ready-made equivalents the learner may not call
    time_limit_s: float = 5.0  # per call
    kind: str = "code"  # "code": scored on agreeing with the reference; "prediction": see :func:`prediction`
    choices: tuple[Any, ...] = ()  # a prediction's possible answers, when it is a choice (a letter, a GPU count)
    grader_cases: tuple[Case, ...] = ()  # hand cases only ``labkit grade`` runs (the notebook's check does not)
    # A prediction's explanation, shown by its check once the learner has committed an answer (never above it),
    # and the words and numbers that would state its answer anywhere a learner reads before answering
    # (``tests/test_giveaways.py`` looks for them in the learner notebook).
    reveal: str = ""
    giveaways: tuple[str, ...] = ()

    @property
    def lab(self) -> str:
        return self.id.split(".", 1)[0]

    @property
    def allowed_text(self) -> str:
        """One sentence for the task text: which labkit helpers the learner may call, and what is reported.

        >>> Exercise("zz.x", "X", "x", abs, (), lambda g: Case(())).allowed_text
        'No labkit function may be called inside your function: the check reports any call into labkit.'
        """
        names = [f"`{dotted_name(item)}`" + (" (its methods and properties)" if isinstance(item, type) else "")
                 for item in self.allowed]
        torch_names = [f"`{dotted_name(item)}`" for item in self.forbidden if dotted_name(item).startswith("torch")]
        ready_made = f"torch's ready-made {_join(torch_names)}" if torch_names else ""
        if names:
            also = f", and {ready_made}," if ready_made else ""
            return f"You may call {_join(names)}; any other labkit function{also} is reported by the check."
        if ready_made:
            return (f"Neither labkit's functions nor {ready_made} may be called inside your function: the check "
                    "reports any such call.")
        return "No labkit function may be called inside your function: the check reports any call into labkit."


@dataclass(frozen=True)
class CodeExercise(Exercise):
    """A function the learner writes (or a single computed answer), scored on agreeing with ``reference`` on every
    case within the tolerances. Every field is :class:`Exercise`'s, ``kind`` is ``"code"``."""

    def __post_init__(self) -> None:
        if self.kind != "code":
            raise ValueError(f"kind must be 'code' for a CodeExercise, got {self.kind!r}")


@dataclass(frozen=True)
class Prediction(Exercise):
    """The learner's guess before the notebook computes the answer (:func:`prediction`, :func:`choice_prediction`):
    ``function()`` takes no argument; ``reference()`` computes the answer, ``choices`` are its possible answers when
    it is a choice (``choice_texts`` what each means, as the notebook lists them), ``rtol``/``atol`` the closeness
    rule, ``reveal`` the explanation its check shows once answered, ``giveaways`` the words that state the answer,
    ``hints`` the hint a malformed answer shows (its form, never the answer). ``kind`` is ``"prediction"``."""

    kind: str = "prediction"
    choice_texts: tuple[str, ...] = ()  # the text of each choice, in the order of ``choices`` (empty for a number)

    def __post_init__(self) -> None:
        if self.kind != "prediction":
            raise ValueError(f"kind must be 'prediction' for a Prediction, got {self.kind!r}")
        if self.choice_texts and len(self.choice_texts) != len(self.choices):
            raise ValueError(f"choice_texts must give one text per choice ({len(self.choices)}), "
                             f"got {len(self.choice_texts)}")

    @property
    def asked(self) -> str:
        """The question as the check states it."""
        return self.hand_cases[0].label

    def answer(self) -> Any:
        """labkit's answer (computed: some run the model)."""
        return self.reference()

    def answer_text(self, answer: Any) -> str | None:
        """The text of the choice ``answer`` names, when the choices have texts."""
        return dict(zip(self.choices, self.choice_texts)).get(answer) if self.choice_texts else None


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check, printable as plain text (and as HTML in a notebook)."""

    exercise: Exercise
    status: str  # "passed", "failed", "not attempted", or "error" (labkit's side could not check the answer)
    lines: tuple[str, ...]  # the explanation, one line each
    close: bool | None = None  # a prediction's accuracy (not scored); None for other exercises
    reveal: str = ""  # a committed prediction's explanation (``Exercise.reveal``), shown below the lines

    @property
    def reveal_paragraphs(self) -> list[str]:
        """The reveal's paragraphs (separated by blank lines), each on one line."""
        return [" ".join(part.split()) for part in self.reveal.split("\n\n") if part.strip()]

    @property
    def points(self) -> int:
        return self.exercise.points if self.status == "passed" else 0

    @property
    def mark(self) -> str:
        """PASSED, FAILED, ...; a well-formed prediction is ANSWERED (its point is for answering, right or not)."""
        return "ANSWERED" if self.exercise.kind == "prediction" and self.status == "passed" else _MARKS[self.status]

    def __str__(self) -> str:
        mark = self.mark
        head = f"[{mark}] {self.exercise.title} ({self.points}/{self.exercise.points} points)"
        reveal = ["", "Why:", *(f"  {paragraph}" for paragraph in self.reveal_paragraphs)] if self.reveal else []
        return "\n".join([head, *(f"  {line}" for line in self.lines), *reveal])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        import html

        colour = {"passed": "#1a7f37", "failed": "#cf222e", "not attempted": "#9a6700", "error": "#6e40c9"}[self.status]
        body = "<br>".join(html.escape(line) for line in self.lines)
        title = html.escape(f"{self.mark}: {self.exercise.title} ({self.points}/{self.exercise.points})")
        verdict = f'<b style="color:{colour}">{title}</b><br>{body}'
        if not self.reveal:
            return f'<div style="border-left:4px solid {colour};padding:4px 10px;font-family:monospace">{verdict}</div>'
        reveal = "".join(f'<p style="margin:6px 0 0 0">{_inline_html(paragraph)}</p>'
                         for paragraph in self.reveal_paragraphs)
        return (f'<div style="border-left:4px solid {colour};padding:4px 10px"><div style="font-family:monospace">'
                f'{verdict}</div><div style="font-family:var(--jp-content-font-family, sans-serif);margin-top:6px">'
                f"<b>Why:</b>{reveal}</div></div>")


def _inline_html(text: str) -> str:
    """A reveal paragraph as HTML: escaped, with ``**bold**`` and ```code``` marked up.

    >>> _inline_html("answer **b**: `x < 1`")
    'answer <b>b</b>: <code>x &lt; 1</code>'
    """
    import html
    import re

    escaped = html.escape(text, quote=False)
    escaped = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", escaped)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", escaped)


_MARKS = {"passed": "PASSED", "failed": "FAILED", "not attempted": "NOT ATTEMPTED", "error": "LABKIT ERROR"}


# --------------------------------------------------------------------------------------------------------------
# A prediction: asked before the notebook computes the answer, scored on the commitment
#
# The point is for a well-formed answer (a number where a number is asked, one of the choices where a choice is);
# the verdict then shows labkit's answer, the distance and a word on it, and how close the prediction came is
# recorded (``Verdict.close``, the progress file, the gradebook's accuracy column) without changing the score. So
# reading the answer and editing gains nothing: the point was already earned by answering at all. A malformed
# answer fails without showing labkit's answer, so a learner can fix the form without seeing it.


def _no_random_case(generator: torch.Generator) -> Case:
    return Case(())


def prediction(id: str, title: str, function: str, answer: Callable[[], Any], *, asked: str, hint: str,
               rtol: float = 0.0, atol: float = 0.0, points: int = 1, choices: tuple[Any, ...] = (),
               reveal: str = "", giveaways: tuple[str, ...] = (), choice_texts: tuple[str, ...] = ()) -> Prediction:
    """A predict-then-check exercise: the learner's ``function()`` takes no argument and returns a prediction.

    It earns its points when it is well-formed (:func:`labkit.exercises.checking.prediction_problem`);
    ``answer()`` (labkit computing the truth) then decides only whether it was *close*: within rtol/atol for a
    number, equal otherwise. ``reveal`` is the explanation the check shows after a well-formed answer (the words
    that would give the answer away if a notebook printed them above or just below the check); ``giveaways`` are
    the words and numbers that state the answer, which nothing a learner reads before answering may contain.

    >>> guess = prediction("zz.guess", "Predict: 2 + 2", "predicted_sum", lambda: 4.0, asked="2 + 2", hint="add",
    ...                    atol=0.5)
    >>> type(guess).__name__, guess.kind, guess.n_random, guess.asked, guess.hints
    ('Prediction', 'prediction', 0, '2 + 2', ('add',))
    """
    return Prediction(id=id, title=title, function=function, reference=answer, points=points, n_random=0,
                      rtol=rtol, atol=atol, hand_cases=(Case((), label=asked),), random_case=_no_random_case,
                      hints=(hint,), choices=tuple(choices), reveal=reveal, giveaways=tuple(giveaways),
                      choice_texts=tuple(choice_texts))


def choice_prediction(id: str, title: str, function: str, answer: Callable[[], str], *, choices: dict[str, str],
                      question: str, hint: str, reveal: str = "", giveaways: tuple[str, ...] = ()) -> Prediction:
    """A multiple-choice prediction: ``function()`` returns one lower-case letter, a key of ``choices`` (the
    letters and their texts, as the notebook shows them). ``hint`` goes on after the hint on the answer's form.

    >>> quiz = choice_prediction("zz.quiz", "Predict: the even one", "even_choice", lambda: "b",
    ...                          choices={"a": "one", "b": "two"}, question="which is even", hint="halve it")
    >>> quiz.choices, quiz.hand_cases[0].label, quiz.answer_text("b")
    (('a', 'b'), 'which is even: one of "a", "b"', 'two')
    >>> quiz.hints
    ('return one lower-case letter as a string, e.g. "a"; halve it',)
    """
    return prediction(id, title, function, answer, choices=tuple(choices),
                      asked=f"{question}: one of " + ", ".join(f'"{key}"' for key in choices),
                      hint='return one lower-case letter as a string, e.g. "a"; ' + hint, reveal=reveal,
                      giveaways=giveaways, choice_texts=tuple(choices.values()))


def single_answer(id: str, title: str, function: str, answer: Callable[[], Any], *, asked: str, hint: str,
                  rtol: float = 0.0, atol: float = 0.0, points: int = 1) -> CodeExercise:
    """A computed answer (not a prediction): ``function()`` takes no argument and is scored on agreeing with
    ``answer()`` within rtol/atol, like any code exercise."""
    return CodeExercise(id=id, title=title, function=function, reference=answer, points=points, n_random=0,
                    rtol=rtol, atol=atol, hand_cases=(Case((), label=asked),), random_case=_no_random_case,
                    hints=(hint,))
