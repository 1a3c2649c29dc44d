"""Prose never types what a run decides: a verdict on the learner's own measurement is printed by the cell that
measured it, or the prose states both outcomes.

A lab's timings, speedups and spreads come from the machine that runs it, so a sentence under them written from
one run ("in this run the two are indistinguishable") is a coin toss on the next. For every notebook (learner
copy and solution, two runs on different thread counts), this test lists the markdown cells that follow a
*measured* output (a code cell not checked by nbval whose saved output holds a time, a rate, an interval, a
speedup or a spread) and, in each sentence, looks for a verdict word ("faster", "slower", "indistinguishable",
"within", "larger"). The word may stand where

- the code above printed it (since the last heading, in this copy): the cell decided it from its numbers; or
- the sentence states both outcomes, or a rule rather than an outcome ("if", "whether", "where", "when", "either",
  "unless", "depending").

A reveal's output, emptied in the learner copy, is read from the solution copy.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from labkit.instructor.authoring import CHECK_TAG, is_reveal
from test_reveals import _output_text

ROOT = Path(__file__).resolve().parent.parent
LEARNER_NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
VERDICT_WORDS = ("faster", "slower", "indistinguishable", "within", "larger",
                 # the page's own wordings of a run's outcome (issue #48)
                 "little more", "only by noise", "barely moved", "near the ridge", "only just", "moves less",
                 "shows less", "less than their share", "almost nothing")
_VERDICT = re.compile(r"\b(" + "|".join(re.escape(word) for word in VERDICT_WORDS) + r")\b", re.I)
_BOTH_OUTCOMES = re.compile(r"\b(if|whether|where|when|either|unless|depending)\b", re.I)
# A measurement in an output: a time, a rate, an interval, a speedup, a spread.
_MEASURED = re.compile(r"\d\s?(ms|µs|μs|ns|s)\b|tokens/s|GB/s|GFLOP/s|\binterval\b|\bspeedup\b|\bspread\b"
                       r"|\b\d+(\.\d+)?x\b", re.I)


def _outputs(cell: dict) -> str:
    return "\n".join(_output_text(output) for output in cell.get("outputs", []))


def _sentences(markdown: str) -> list[str]:
    flat = " ".join(markdown.split())
    return [s for s in re.split(r"(?<=[.!?:;])\s+(?=[A-Z(*\"“])", flat) if s]


def _is_heading(cell: dict) -> bool:
    return cell["cell_type"] == "markdown" and "".join(cell["source"]).lstrip().startswith("#")


def typed_verdicts(cells: list[dict], printed_by: list[str] | None = None) -> list[str]:
    """The verdict words a markdown cell types under a measured output without the code above having printed them
    (``printed_by[i]``: what code cell ``i`` printed; its saved outputs by default)."""
    printed_by = printed_by or [_outputs(cell) if cell["cell_type"] == "code" else "" for cell in cells]
    problems, section_start, measured_above = [], 0, False
    for index, cell in enumerate(cells):
        if _is_heading(cell):
            section_start, measured_above = index, False
        if cell["cell_type"] == "code":
            checked = CHECK_TAG in cell.get("metadata", {}).get("tags", [])
            measured_above = not checked and bool(_MEASURED.search(printed_by[index]))
            continue
        if cell["cell_type"] != "markdown" or not measured_above:
            continue
        printed = "\n".join(printed_by[section_start:index]).lower()
        for sentence in _sentences("".join(cell["source"])):
            if _BOTH_OUTCOMES.search(sentence):
                continue
            for word in {match.group(1).lower() for match in _VERDICT.finditer(sentence)}:
                if word not in printed:
                    problems.append(f"cell {index}: {word!r} typed, not printed above: {sentence[:200]}")
    return problems


def _printed(notebook: dict, solution: dict) -> list[str]:
    """What each code cell printed in ``notebook``; an emptied reveal's from ``solution``."""
    return [_outputs(solution["cells"][i] if is_reveal(cell) and not cell.get("outputs") else cell)
            if cell["cell_type"] == "code" else "" for i, cell in enumerate(notebook["cells"])]


@pytest.mark.parametrize("path", LEARNER_NOTEBOOKS, ids=[path.stem for path in LEARNER_NOTEBOOKS])
def test_no_verdict_on_a_measurement_is_typed_in_prose(path):
    learner = json.loads(path.read_text(encoding="utf-8"))
    solution = json.loads((ROOT / "notebooks" / "solutions" / path.name).read_text(encoding="utf-8"))
    problems = [f"{copy} copy, {problem}" for copy, notebook in (("learner", learner), ("solution", solution))
                for problem in typed_verdicts(notebook["cells"], _printed(notebook, solution))]
    assert not problems, "\n".join(problems)


def _code(printed: str) -> dict:
    return {"cell_type": "code", "source": ["..."], "metadata": {},
            "outputs": [{"output_type": "stream", "name": "stdout", "text": [printed]}]}


def _markdown(text: str) -> dict:
    return {"cell_type": "markdown", "source": [text], "metadata": {}}


# Lab 06 as it stood (learner copy, cells 47-48): a sentence written from the solution's run under a learner's
# run that measured the opposite.
LAB06_CELL_48_OUTPUT = "fp32 is faster than transformers: speedup 1.12x (95% interval 1.04x to 1.19x)"
LAB06_CELL_48_TEXT = ("(labkit's FP32 forward and transformers' read the same 538 MB, so any gap between them is fixed "
                      "overhead alone; in this run the two are indistinguishable, as the interval above says.)")


def test_lab_06_cell_48_as_it_stood_types_a_verdict_its_run_did_not_print():
    problems = typed_verdicts([_markdown("### Three weight formats"), _code(LAB06_CELL_48_OUTPUT),
                               _markdown(LAB06_CELL_48_TEXT)])
    assert len(problems) == 1 and "'indistinguishable' typed" in problems[0], problems


@pytest.mark.parametrize("text", [
    "(labkit's FP32 forward and transformers' read the same 538 MB, so any gap the verdict above shows between "
    "them is fixed overhead alone.)",
    "If the interval holds 1 the two are indistinguishable; if it lies above 1, fp32 is faster.",
    "fp32 is faster than transformers here, as printed.",  # the run printed "faster"
])
def test_a_printed_verdict_or_both_outcomes_pass(text):
    assert typed_verdicts([_markdown("### Three weight formats"), _code(LAB06_CELL_48_OUTPUT), _markdown(text)]) == []


def test_only_text_under_a_measurement_is_read():
    exact = _code("24 tokens from 24 forward calls")
    measured_elsewhere = [_markdown("### A"), _code("TPOT 70.2 ms"), _markdown("### B"), exact]
    assert typed_verdicts([*measured_elsewhere, _markdown("the second is slower")]) == []
    checked = dict(_code("TPOT 70.2 ms"), metadata={"tags": [CHECK_TAG]})
    assert typed_verdicts([checked, _markdown("the second is slower")]) == []
    assert typed_verdicts([_code("TPOT 70.2 ms"), _markdown("the second is slower")]) != []


# Issue #48's sentences as they stood, each under the measured output above it (lab 06 cells 38, 47, 54, 68; lab 07
# cell 39, whose solution copy's run printed "indistinguishable" where the prose said "slower").
ISSUE_48_SENTENCES = [
    ("prefill 95.1 ms, intensity 21.3 FLOPs/byte", "Prefill at this short prompt sits near the ridge; longer prompts "
     "are compute-bound.", "near the ridge"),
    ("bf16 TPOT 41.0 ms", "The measured TPOT moves less, and the ratio TPOT / floor grows as the bytes shrink.",
     "moves less"),
    ("overhead 21.4 ms, bandwidth 9.8 GB/s", "a tiny model on a CPU spends a large share of each step dispatching "
     "small operations, so fewer bytes buy less than their share, and below the crossover almost nothing.",
     "less than their share"),
    ("batch 8: TPOT 52.0 ms", "a batch step costs little more than one sequence's (compare the two TPOTs printed "
     "above).", "little more"),
    ("measured 2.53x (95% interval 2.26x to 2.72x)", "Prompt lookup accepts most drafts at almost no cost, yet the "
     "stopwatch shows less than the per-step closed form.", "shows less"),
    ("0.98x (95% interval 0.88x to 1.01x)", "On this prompt the two differ only by noise, as the interval between "
     "them shows.", "only by noise"),
    ("early exit: indistinguishable from plain greedy, 0.91x (95% interval 0.12x to 1.06x)",
     "After 4 of its 30 blocks it matched the target in no call, so it is slower than plain decoding.", "slower"),
]


@pytest.mark.parametrize("printed, sentence, word", ISSUE_48_SENTENCES, ids=[w for _, _, w in ISSUE_48_SENTENCES])
def test_the_typed_sentences_of_issue_48_are_found(printed, sentence, word):
    problems = typed_verdicts([_markdown("### A measurement"), _code(printed), _markdown(sentence)])
    assert any(f"{word!r} typed" in problem for problem in problems), problems
