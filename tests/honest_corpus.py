"""The honest corpus (issue #41): submissions an honest learner could hand in, each with what the notebook's own
check gives it, exercise by exercise. The grader's regression set against false rejections.

- every registered mistake of every exercise, written as a learner would: the mistake's own source and the private
  helpers of its lab module that it uses, pasted in the notebook (not imported), its ``def`` renamed to the
  exercise's function, in place of that function in the lab's solution notebook (:func:`mistake_source`,
  :func:`with_function`);
- every lab's solution notebook, and the untouched learner copies;
- the natural first attempts of :data:`NATURAL` (each equal to a mistake of the bug zoo).

Used by tests/test_instructor_grading_course.py (the solutions, a learner copy and the natural attempts through the
wall; every mistake through the answering step) and ``python -m benchmarks grading --corpus`` (everything through
the wall).
"""

from __future__ import annotations

import ast
import dis
import inspect
import json
import re
import sys
import textwrap
import types
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
# Lab 00 answered honestly, cell by cell (the grader's tests build their submissions from these).
SOFTMAX = ("import torch\n\ndef softmax_with_temperature(logits, temperature):\n"
           "    if temperature == 0:\n"
           "        return torch.zeros_like(logits).scatter(-1, logits.argmax(-1, keepdim=True), 1.0)\n"
           "    return torch.softmax(logits / temperature, dim=-1)\n")
SAMPLE = ("def sample_token(probs, uniform):\n    cumulative = probs.double().cumsum(0)\n"
          "    return int((cumulative <= uniform * cumulative[-1]).sum())\n")
PREDICTION = "def tokenizer_choice():\n    return 'b'\n"
NATURAL = {  # name -> (exercise, the learner's function): first attempts an honest learner writes
    "argmax_sample": ("00.sample_token", "def sample_token(probs, uniform):\n    return int(probs.argmax())\n"),
    "softmax_divides_by_zero": ("00.softmax_temperature", "import torch\n\n\ndef softmax_with_temperature(logits, "
                                "temperature):\n    return torch.softmax(logits / temperature, dim=-1)\n"),
    "softmax_multiplies": ("00.softmax_temperature", "import torch\n\n\ndef softmax_with_temperature(logits, "
                           "temperature):\n    return torch.softmax(logits * temperature, dim=-1)\n"),
    # Honest and slow (issue #52): each is told only that it gave no answer in time, and nothing is reviewed.
    "sample_bisects_for_ever": ("00.sample_token", "def sample_token(probs, uniform):\n"
                                "    cumulative = probs.double().cumsum(0)\n    low, high = 0, len(probs) - 1\n"
                                "    while low < high:\n        middle = (low + high) // 2\n"
                                "        if cumulative[middle] <= uniform * cumulative[-1]:\n"
                                "            low = middle  # one short of middle + 1: stuck once high == low + 1\n"
                                "        else:\n            high = middle\n    return low\n"),
    "softmax_sleeps": ("00.softmax_temperature", "import time\nimport torch\n\n\ndef softmax_with_temperature("
                       "logits, temperature):\n    time.sleep(8)  # waiting for a plot to refresh\n"
                       "    return torch.softmax(logits / temperature, dim=-1)\n"),
    "softmax_reads_an_empty_pipe": ("00.softmax_temperature", "import os\nimport torch\n\nread_end, write_end = "
                                    "os.pipe()\n\n\ndef softmax_with_temperature(logits, temperature):\n"
                                    "    os.read(read_end, 1)  # a message that never comes\n"
                                    "    return torch.softmax(logits / temperature, dim=-1)\n"),
}


@dataclass
class Submission:
    name: str  # a file name in the class folder, without .ipynb
    lab: str
    notebook: nbformat.NotebookNode
    expected: dict[str, int] = field(default_factory=dict)  # exercise id -> points the notebook's check gives


def solution(lab: str) -> nbformat.NotebookNode:
    return nbformat.read(next((ROOT / "notebooks" / "solutions").glob(f"{lab}_*.ipynb")), as_version=4)


def learner_copy(lab: str) -> nbformat.NotebookNode:
    return nbformat.read(next((ROOT / "notebooks").glob(f"{lab}_*.ipynb")), as_version=4)


def _globals_used(function: types.FunctionType) -> set[str]:
    """The global names ``function`` reads: in its code (nested code too), its defaults and its annotations."""
    names, codes = set(), [function.__code__]
    while codes:
        code = codes.pop()
        names |= {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
        codes += [const for const in code.co_consts if isinstance(const, types.CodeType)]
    definition = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    for part in filter(None, (definition.args, definition.returns)):  # defaults and annotations
        names |= {node.id for node in ast.walk(part) if isinstance(node, ast.Name)}
    return names


def mistake_source(exercise, wrong) -> str:
    """``wrong`` (a mistake function of a lab module) as a learner's cell: imports, the module's own helpers it
    uses (their source, pasted), then its source with the ``def`` named ``exercise.function``."""
    from labkit.exercises import exercises

    module = sys.modules[wrong.__module__]
    # A labkit function named like another exercise's function (lab 01's apply_temperature inside nucleus_probs)
    # is imported under another name, as the solutions do (`sampling.apply_temperature`): imported as itself, it
    # would replace the learner's own function of that exercise for the rest of the notebook.
    others = {e.function for e in exercises(exercise.lab)} - {exercise.function}
    renamed: dict[str, str] = {}
    imports, helpers, seen, todo = [], [], set(), [wrong]
    while todo:
        function = todo.pop()
        for name in sorted(_globals_used(function) - seen):
            seen.add(name)
            value = getattr(module, name, None)
            if value is None:
                continue  # a builtin
            if isinstance(value, types.ModuleType):
                imports.append(f"import {value.__name__}" + (f" as {name}" if value.__name__ != name else ""))
            elif isinstance(value, types.FunctionType) and value.__module__ == module.__name__:
                helpers.append(inspect.getsource(value))
                todo.append(value)
            else:  # a labkit function or a constant of the lab module: imported, as a learner's cell would
                owner = getattr(value, "__module__", None) if callable(value) else module.__name__
                if name in others:
                    renamed[name] = f"labkit_{name}"
                imports.append(f"from {owner} import {name}" + (f" as labkit_{name}" if name in others else ""))
    own = re.sub(r"^def \w+\(", f"def {exercise.function}(", inspect.getsource(wrong), count=1)
    body = "\n\n".join([*helpers, own])
    for name, alias in renamed.items():
        body = re.sub(rf"(?<![\w.]){name}\(", f"{alias}(", body)
    return "\n".join(sorted(set(imports))) + "\n\n\n" + body


def with_function(notebook: nbformat.NotebookNode, function: str, source: str) -> nbformat.NotebookNode:
    """A copy of ``notebook`` whose top-level ``def function(`` block is replaced by ``source``."""
    copy = nbformat.from_dict(json.loads(json.dumps(notebook)))
    for cell in copy.cells:
        lines = cell.source.splitlines() if cell.cell_type == "code" else []
        start = next((i for i, line in enumerate(lines) if line.startswith(f"def {function}(")), None)
        if start is None:
            continue
        end = next((i for i in range(start + 1, len(lines)) if lines[i][:1] not in ("", " ", "\t", ")", "#")),
                   len(lines))
        cell.source = "\n".join([*lines[:start], source.rstrip("\n"), *lines[end:]])
        return copy
    raise ValueError(f"no cell of the notebook defines {function}")


def instant_points(exercise, source: str) -> int:
    """What the notebook's own check gives ``source``'s function."""
    from labkit.exercises.checking import check_function

    namespace: dict = {}
    exec(compile(source, f"<{exercise.function}>", "exec"), namespace)  # noqa: S102 - the corpus's own code
    return check_function(exercise, namespace[exercise.function]).points


def full_points(lab: str) -> dict[str, int]:
    from labkit.exercises import exercises

    return {exercise.id: exercise.points for exercise in exercises(lab)}


def mistakes(labs=None):
    """(exercise, index, mistake function) of every registered mistake of ``labs`` (default: all)."""
    from labkit.exercises import exercises

    for exercise in exercises():
        if labs is None or exercise.lab in labs:
            for index, mistake in enumerate(exercise.mistakes):
                yield exercise, index, mistake.wrong


def corpus(labs=None, *, with_mistakes: bool = True) -> list[Submission]:
    """The corpus's submissions (their expected points computed by the notebook's check, here)."""
    from labkit.core.course import labs as course_labs
    from labkit.exercises import get

    chosen = [entry.notebook.split("_", 1)[0] for entry in course_labs()]
    chosen = [lab for lab in chosen if labs is None or lab in labs]
    found = []
    for lab in chosen:
        full = full_points(lab)
        found.append(Submission(f"solution-{lab}", lab, solution(lab), dict(full)))
        found.append(Submission(f"learner-copy-{lab}", lab, learner_copy(lab), dict.fromkeys(full, 0)))
    for name, (exercise_id, source) in NATURAL.items():
        exercise = get(exercise_id)
        if exercise.lab in chosen:
            found.append(Submission(f"natural-{name}", exercise.lab,
                                    with_function(solution(exercise.lab), exercise.function, source),
                                    {**full_points(exercise.lab), exercise_id: instant_points(exercise, source)}))
    if with_mistakes:
        for exercise, index, wrong in mistakes(chosen):
            source = mistake_source(exercise, wrong)
            found.append(Submission(f"mistake-{exercise.id}-{index}-{wrong.__name__.strip('_')}", exercise.lab,
                                    with_function(solution(exercise.lab), exercise.function, source),
                                    {**full_points(exercise.lab), exercise.id: instant_points(exercise, source)}))
    return found
