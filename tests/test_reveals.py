"""Predict, then check: nothing a learner can see above a prediction's check cell gives its answer away.

The rule, for every prediction exercise (``kind == "prediction"``) and the learner notebook that checks it:

- **above the check cell, in its section** (from the nearest heading above it): no markdown, no committed
  output (text, HTML, an explorer's text fallback or its widgets' initial text) and none of the exercise's own
  texts (the question it states, the hint a malformed answer shows) contains a rendering of the answer; in the
  sections before, no rendering of four characters or more ("1,015", "4.375": rarely there by chance);
- **between the check and the next heading**: no committed output contains one either (a computed reveal is a
  cell tagged ``reveal``, which the build commits empty in the learner copy); markdown there is fine, the
  learner reads it after answering;
- **an explorer never opens at the setting a prediction asks about**, where the prediction names one.

The answer comes from the exercise definition (labkit computing it), and is rendered the ways a notebook prints
it: an integer with and without thousands separators, a float at 2 to 4 significant digits (a fraction also as
a percentage), a choice in bold, quotes, backticks or parentheses, an order of names joined as a list. Short
renderings (one or two characters, such as ``7``) are looked for only where they read as an answer (``**7**``,
``= 7``, ``: 7``, ``is 7``), since the bare digit is everywhere; a choice counts as given away only where it is
singled out: shown in those forms more often than any other choice.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest

from labkit.exercises import exercises

ROOT = Path(__file__).resolve().parent.parent
LEARNER_NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# The explorer settings a prediction asks about: slider description -> asked value.
ASKED_SETTINGS = {
    "04.predict_outlier_channels": {"layer": 15, "threshold": 6.0},
    "07.predict_optimal_gamma": {"α (accept)": 0.8, "c (cost)": 0.05},
}


# ----- rendering an answer -----

def _number_forms(value: float) -> set[str]:
    forms: set[str] = set()
    if float(value).is_integer():
        n = int(value)
        forms |= {str(n), f"{n:,}"}
        if isinstance(value, float):
            forms.add(f"{value:.1f}")
    else:
        for digits in (2, 3, 4):
            text = f"{value:.{digits}g}"
            forms.add(text)
            if "e" not in text and "." in text:
                forms.add(text.rstrip("0").rstrip("."))
            if 0 < abs(value) < 1:
                percent = f"{value * 100:.{max(digits - 2, 0)}f}"
                forms |= {f"{percent}%", f"{percent} %"}
    return {form for form in forms if form}


def _emphasised(form: str) -> list[str]:
    """Where a short rendering reads as an answer, as regular expressions."""
    f = re.escape(form)
    return [rf"\*\*{f}\*\*", rf"(?<![<>=!])= ?{f}(?![\d.,]?\d)", rf": {f}(?![\d.,]?\d)",
            rf"\b(is|are|gives|takes|near|about) {f}(?![\d.,]?\d)", rf"→ ?{f}(?![\d.,]?\d)"]


def _choice_forms(choice: Any) -> list[str]:
    if isinstance(choice, (int, float)) and not isinstance(choice, bool):
        return [pattern for form in _number_forms(choice) for pattern in _emphasised(form)]
    text = re.escape(str(choice))
    return [rf"\*\*{text}\*\*", rf"\*\*\({text}\)\*\*", rf"[\"“']{text}[\"”']", rf"`{text}`", rf"\({text}\)"]


def answer_patterns(truth: Any) -> list[str]:
    """Regular expressions that find ``truth`` printed the ways a notebook prints it."""
    if hasattr(truth, "truth"):  # an answer type wrapping a plain value (an order within some places)
        truth = truth.truth
    if isinstance(truth, (int, float)) and not isinstance(truth, bool):
        patterns = []
        for form in _number_forms(truth):
            if len(form) <= 2:
                patterns += _emphasised(form)
            else:
                patterns.append(rf"(?<![\w.,]){re.escape(form)}(?![\d.,]?\d)")
        return patterns
    if isinstance(truth, str):
        return _choice_forms(truth)
    if isinstance(truth, (list, tuple)):
        items = [str(item) for item in truth]
        patterns = [re.escape(joiner.join(items)) for joiner in (", ", " < ", " → ", " > ", ",")]
        patterns.append(re.escape(repr(tuple(truth))))
        patterns.append(re.escape(repr(list(truth))))
        for item in truth:  # each string of a tuple of strings, as a choice
            if isinstance(item, str) and len(truth) <= 3:
                patterns += _choice_forms(item)
        return patterns
    return [re.escape(str(truth))]


LONG = 4  # renderings this long ("1,015", "4.375") are looked for in the whole notebook above the check


def given_away(text: str, truth: Any, choices: tuple[Any, ...], long_only: bool = False) -> list[str]:
    """The snippets of ``text`` that give ``truth`` away (empty when none do); ``long_only``: only renderings
    of at least LONG characters count (a number as long as "1,015" is rarely there by chance)."""
    found = []
    if long_only:
        if choices or not isinstance(truth, (int, float)) or isinstance(truth, bool):
            return []
        patterns = [rf"(?<![\w.,]){re.escape(form)}(?![\d.,]?\d)" for form in _number_forms(truth) if len(form) >= LONG]
        return [text[max(0, m.start() - 60): m.end() + 60].replace("\n", " ") for p in patterns
                for m in re.finditer(p, text)]
    if choices:
        def count(choice: Any) -> int:
            patterns = _choice_forms(choice)
            return sum(len(re.findall(p, text)) for p in patterns)

        others = max((count(choice) for choice in choices if choice != truth), default=0)
        if count(truth) <= others:
            return []
        patterns = _choice_forms(truth)
    else:
        patterns = answer_patterns(truth)
    for pattern in patterns:
        for match in re.finditer(pattern, text):
            found.append(text[max(0, match.start() - 60): match.end() + 60].replace("\n", " "))
    return found


# ----- what a learner sees in a committed notebook -----

def _strip_html(text: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", text))


def _output_text(output: dict) -> str:
    if output.get("output_type") == "stream":
        return "".join(output.get("text", ""))
    data = output.get("data", {})
    parts = [("".join(data[key]) if isinstance(data[key], list) else data[key]) for key in
             ("text/plain", "text/markdown") if key in data]
    if "text/html" in data:
        parts.append(_strip_html("".join(data["text/html"])))
    return "\n".join(parts)


def _widget_state(notebook: dict) -> dict[str, dict]:
    return notebook.get("metadata", {}).get("widgets", {}).get(
        "application/vnd.jupyter.widget-state+json", {}).get("state", {})


def _widget_models(notebook: dict, cell: dict) -> list[dict]:
    """Every widget model a cell's outputs show (its views and everything they contain)."""
    state = _widget_state(notebook)
    todo = [output["data"]["application/vnd.jupyter.widget-view+json"]["model_id"] for output in cell.get("outputs", [])
            if "application/vnd.jupyter.widget-view+json" in output.get("data", {})]
    seen: dict[str, dict] = {}
    while todo:
        model_id = todo.pop()
        if model_id in seen or model_id not in state:
            continue
        seen[model_id] = state[model_id]
        todo += re.findall(r"IPY_MODEL_([0-9a-f]+)", json.dumps(state[model_id]["state"]))
    return list(seen.values())


def _widget_text(models: list[dict]) -> str:
    texts = []
    for model in models:
        value = model["state"].get("value")
        if model["model_name"] in ("HTMLModel", "HTMLMathModel", "LabelModel") and isinstance(value, str):
            texts.append(_strip_html(value))
    return "\n".join(texts)


def _cell_text(notebook: dict, cell: dict) -> str:
    source = "".join(cell["source"])
    if cell["cell_type"] == "markdown":
        return source
    if cell["cell_type"] != "code":
        return ""
    return "\n".join([*(_output_text(o) for o in cell.get("outputs", [])),
                      _widget_text(_widget_models(notebook, cell))])


def _check_cell(notebook: dict, exercise_id: str) -> int | None:
    call = re.compile(rf"""check\(\s*["']{re.escape(exercise_id)}["']""")
    return next((i for i, cell in enumerate(notebook["cells"])
                 if cell["cell_type"] == "code" and call.search("".join(cell["source"]))), None)


def _is_heading(cell: dict) -> bool:
    return cell["cell_type"] == "markdown" and "".join(cell["source"]).lstrip().startswith("#")


# ----- the tests -----

PREDICTIONS = [exercise for exercise in exercises() if exercise.kind == "prediction"]


@pytest.fixture(scope="module")
def notebooks() -> dict[str, dict]:
    return {path.name: json.loads(path.read_text(encoding="utf-8")) for path in LEARNER_NOTEBOOKS}


def _home(notebooks: dict[str, dict], exercise_id: str) -> tuple[str, dict, int]:
    homes = [(name, nb, index) for name, nb in notebooks.items()
             if (index := _check_cell(nb, exercise_id)) is not None]
    assert len(homes) == 1, f"{exercise_id} is checked in {len(homes)} learner notebooks, not one"
    return homes[0]


@pytest.mark.parametrize("exercise", PREDICTIONS, ids=[exercise.id for exercise in PREDICTIONS])
def test_no_answer_above_the_check(notebooks, exercise):
    name, notebook, check_at = _home(notebooks, exercise.id)
    truth = exercise.reference()
    section = max((i for i in range(check_at) if _is_heading(notebook["cells"][i])), default=0)
    problems = []
    for index, cell in enumerate(notebook["cells"][:check_at]):
        problems += [f"{name} cell {index}: …{snippet}…" for snippet in
                     given_away(_cell_text(notebook, cell), truth, exercise.choices, long_only=index < section)]
    for index in range(check_at + 1, len(notebook["cells"])):
        cell = notebook["cells"][index]
        if _is_heading(cell) or (cell["cell_type"] == "code" and re.search(r"\bcheck\(", "".join(cell["source"]))):
            break
        if cell["cell_type"] == "code":
            problems += [f"{name} cell {index} (committed output below the check): …{snippet}…" for snippet in
                         given_away(_cell_text(notebook, cell), truth, exercise.choices)]
    for label, text in (("its question", exercise.hand_cases[0].label), ("its hint", " ".join(exercise.hints))):
        problems += [f"{exercise.id}, {label}: …{snippet}…"
                     for snippet in given_away(text, truth, exercise.choices)]
    assert not problems, f"the answer {truth!r} shows before the learner gives theirs:\n" + "\n".join(problems)


@pytest.mark.parametrize("exercise_id", sorted(ASKED_SETTINGS))
def test_explorers_do_not_open_at_the_asked_setting(notebooks, exercise_id):
    name, notebook, _ = _home(notebooks, exercise_id)
    asked = ASKED_SETTINGS[exercise_id]
    explorers = 0
    for index, cell in enumerate(notebook["cells"]):
        models = _widget_models(notebook, cell) if cell["cell_type"] == "code" else []
        values = {m["state"].get("description"): m["state"].get("value") for m in models
                  if m["model_name"].endswith("SliderModel")}
        if not set(asked) <= set(values):
            continue
        explorers += 1
        assert any(values[key] != value for key, value in asked.items()), (
            f"{name} cell {index}: the explorer opens at {asked}, the setting {exercise_id} asks about")
    assert explorers, f"no explorer in {name} has the sliders {sorted(asked)}"


@pytest.mark.parametrize("text, truth, choices, given", [
    ("prefill: 1  decode: 7", 7, (), True),
    ("a lab of 7 cells", 7, (), False),
    ("E2E is 1,015 ms", 1015, (), True),
    ("E2E 1015.5 ms", 1015, (), False),
    ("the cache holds 4.375 GiB", 4.375, (), True),
    ("a 0.25 share", 0.25, (), True),
    ("25% of the heads", 0.25, (), True),
    ('one of "a", "b", "c", "d"', "b", ("a", "b", "c", "d"), False),
    ('one of "a", "b", "c", "d"; the answer is **b**', "b", ("a", "b", "c", "d"), True),
    ("1, 2, 4 or 8 GPUs", 4, (1, 2, 4, 8), False),
    ("it takes **4** GPUs", 4, (1, 2, 4, 8), True),
    ("only 'A' survives", ("A", "AB"), (), True),
])
def test_the_rule_finds_answers_and_leaves_other_numbers(text, truth, choices, given):
    assert bool(given_away(text, truth, choices)) is given


def _informal_predictions(notebook: dict) -> list[int]:
    """Markdown cells that ask for a prediction no exercise checks ("**Predict before you run the next cell:**")."""
    found = []
    cells = notebook["cells"]
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "markdown" or not re.search(r"\*\*(Retrieve and )?[Pp]redict", "".join(cell["source"])):
            continue
        following = []
        for later in cells[index + 1:]:
            if _is_heading(later):
                break
            following.append(later)
        if not any(c["cell_type"] == "code" and re.search(r"\bcheck\(", "".join(c["source"])) for c in following):
            found.append(index)
    return found


@pytest.mark.parametrize("path", LEARNER_NOTEBOOKS, ids=[path.stem for path in LEARNER_NOTEBOOKS])
def test_an_ungraded_prediction_is_answered_by_a_reveal(path):
    """A prediction no exercise checks: the next code cell shows the answer, so it is a reveal (committed empty)."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    cells = notebook["cells"]
    problems = []
    for index in _informal_predictions(notebook):
        answer = next((i for i in range(index + 1, len(cells)) if cells[i]["cell_type"] == "code"), None)
        if answer is None:
            continue
        tags = cells[answer].get("metadata", {}).get("tags", [])
        if "reveal" not in tags or cells[answer].get("outputs"):
            problems.append(f"cell {index} asks for a prediction; cell {answer}, which answers it, is not an empty "
                            "reveal in the learner copy")
    assert not problems, "\n".join(problems)
