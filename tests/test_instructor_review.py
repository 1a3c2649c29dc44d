"""labkit.instructor.grader.review: the static read follows names through the notebook and stays bounded."""

import time

import nbformat

from labkit.instructor.grader.reports import Finding
from labkit.instructor.grader.review import MAX_CELL_BYTES, review_notebook


def _notebook(*sources: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])


def _whats(notebook, lab="00") -> list[str]:
    return [f"{f.cell}:{f.what}" for f in review_notebook(notebook, lab)]


def test_names_follow_the_data_across_cells_aliases_and_built_names():
    found = _whats(_notebook(
        "from labkit.core import sampling as s\nfrom concurrent.futures import ThreadPoolExecutor as Pool",
        "import sys\ndef softmax_with_temperature(logits, t):\n    getattr(sys, 'set' + 'profile')(None)\n"
        "    return s.softmax_with_temperature(logits, t)",
        "open('/job/out/answers.json', 'w')\nvars(s)"))
    assert any(line.startswith("1:s.softmax_with_temperature: labkit's reference") for line in found)
    assert any("executor or pool" in line for line in found)
    assert any(line.startswith("1:getattr with a name built at run time") for line in found)
    assert any(line.startswith("2:") and "grader's folder" in line for line in found)
    assert any(line.startswith("2:vars") for line in found)


def test_a_name_a_course_cell_put_in_scope_reaches_the_reference():
    # Lab 01's course cell imports `sampling`; the learner's cell only uses it.
    found = _whats(_notebook("from labkit.core import sampling",
                             "def top_k_filter(logits, top_k):\n    return sampling.top_k_filter(logits, top_k)"), "01")
    assert found == ["1:sampling.top_k_filter: labkit's reference answer to an exercise of this lab"]
    assert any("nll_loss" in line for line in _whats(_notebook("import torch.nn.functional as F\nF.nll_loss"), "02"))


def test_a_huge_cell_is_noted_not_read_and_costs_little():
    started = time.monotonic()
    found = review_notebook(_notebook("x = 1\n" * (4 * MAX_CELL_BYTES), "import sys\nsys.settrace(None)"), "00")
    assert time.monotonic() - started < 10
    assert found[0].cell == 0 and "not reviewed" in found[0].what
    assert found[1].cell == 1 and "settrace" in found[1].what


def test_a_retyped_reference_is_named_with_its_line_and_costs_nothing():
    import inspect

    from labkit.core import sampling

    retyped = inspect.getsource(sampling.softmax_with_temperature).replace("logits", "scores").replace(
        "def softmax_with_temperature", "def my_softmax")
    found = review_notebook(_notebook("import torch", "x = 1\n" + retyped), "00")
    assert found == [Finding(1, 2, "defines my_softmax: its code is labkit.core.sampling.softmax_with_temperature's "
                             "(labkit's reference answer) but for its names; the points are what the cases computed")]
    # One change beyond the names (a different call) is the learner's own code.
    assert review_notebook(_notebook(retyped.replace("softmax(", "log_softmax(")), "00") == []


def test_no_known_mistake_and_no_solution_resembles_a_reference():
    """The bug zoo's mistakes are what learners write: never a resemblance (nor the course's own solutions)."""
    import honest_corpus

    for exercise, _, wrong in honest_corpus.mistakes():
        found = review_notebook(_notebook(honest_corpus.mistake_source(exercise, wrong)), exercise.lab)
        resembles = any("reference answer) but for its names" in f.what for f in found)
        # A mistake built on the reference (01's ties broken the other way...) pastes the reference as its helper.
        reference = exercise.reference
        assert resembles == (reference.__module__ == wrong.__module__ and
                             reference.__name__ in honest_corpus._globals_used(wrong)), (exercise.id, found)
    for lab in ("00", "01", "02", "03", "04", "05", "06", "07"):
        assert review_notebook(honest_corpus.solution(lab), lab) == [], lab


def test_a_function_too_deep_to_compare_is_still_reviewed():
    deep = "def f(x):\n    return " + "-" * 400 + "x\nimport sys\nsys.settrace(None)\n"  # parses; copying recurses
    assert [f.what.split(":")[0] for f in review_notebook(_notebook(deep), "00")] == ["sys.settrace"]


def test_the_routes_around_the_answering_step_are_flagged_by_their_shape_not_their_names():
    """Issue #52's routes, each spelled without the names the review knew: building a function (by a type read
    at run time, through copy's ``__reduce__``), dis on labkit's reference, a str subclass with its own methods,
    _posixsubprocess, a prefix search over a module's members."""
    found = _whats(_notebook(
        "import copy, dis, inspect as look\nfrom labkit.core import sampling as lib\n"
        "twin = type(lib.softmax_with_temperature)(dis.Bytecode(lib.softmax_with_temperature).codeobj, {})\n"
        "class Box:\n    def __reduce__(self):\n        return (print, ())\n"
        "class Path(str):\n    def startswith(self, prefix):\n        return False\n"
        "import _posixsubprocess as p\n"
        "found = [f for n, f in look.getmembers(lib) if n.startswith('softmax_w')]\n"))
    whats = "\n".join(found)
    for expected in ("0:builds a function or code object", "0:dis.Bytecode on labkit's lib.softmax_with_temperature",
                     "0:class Box defines how copy or pickle rebuilds it", "0:class Path(str) overrides startswith",
                     "_posixsubprocess", "0:inspect.getmembers(lib): a search over an object's members"):
        assert expected in whats, (expected, found)


def test_a_cell_reads_what_its_functions_read_from_the_globals_and_not_their_parameters_or_locals():
    """What decides which course cells the grader may skip: a parameter or local named like a course variable keeps
    no cell run, a global a function reads when it runs does, and so do a class body's and a comprehension's."""
    from labkit.instructor.grader.course_cells import cell_names, skippable_cells

    assert cell_names("def gptq(weight, inputs):\n    scale = inputs.abs()\n    return torch.round(weight / scale)\n") \
        == ({"gptq"}, {"torch"})
    class_cell = "class Table:\n    rows = 3\n    def width(self):\n        return rows\n"
    assert cell_names(class_cell) == ({"Table"}, {"rows"})
    assert cell_names("kept = [t for t in tokens if t > limit]\nscale = lambda x: x * factor\n") == (
        {"kept", "scale"}, {"tokens", "limit", "factor"})
    assert cell_names("def reset():\n    global counter\n    counter = 0\n") == ({"reset", "counter"}, set())
    assert cell_names("import numpy.linalg, torch as t\nfrom labkit.core import *\n")[0] == {"numpy", "t", "*"}
    assert cell_names("def broken(:\n") == ({"*"}, {"*"})
    course = ["# set-up", "import torch\nfrom labkit.exercises import check",
              "inputs = torch.randn(4, 4)  # a measurement for the reader", "limit = 2.0",
              "def clip(inputs):\n    return inputs.clamp(-limit, limit)", "check('xx.clip')"]
    assert skippable_cells(course, {"clip"}) == [False, False, True, False, False, False]
