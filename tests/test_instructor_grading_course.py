"""labkit grade on the course's own notebooks (issue #41): an honest learner's grade can be trusted.

One class, graded through the real wall: every lab's solution notebook handed in unchanged (each earns every
point), lab 00's untouched learner copy (nothing attempted) and the natural first attempts of
tests/honest_corpus.py (each equal to a mistake of the bug zoo: it earns exactly what the notebook's check gives,
and nobody is accused). Then every registered mistake of the fastest labs, written as a learner would, through
the answering step in this process: each fails its own exercise exactly as the notebook's check does (the bug
zoo's tests hold the check to that), and is never accused. The whole corpus through the wall is
``python -m benchmarks grading --corpus``.

Without a working sandbox the class test FAILS unless ``LABKIT_SKIP_SANDBOX_TESTS`` says why.
"""

import csv

import nbformat
import pytest

import honest_corpus
from labkit.core.course import labs as course_labs
from labkit.instructor.authoring import GRADER_SKIPS_TAG
from labkit.instructor.cluster import classroom
from labkit.instructor.grader import judging
from labkit.instructor.grader.settings import GradingSettings
from labkit.instructor.wall import disarming
from labkit.instructor.wall.kernel_limits import Limits
from test_instructor_grading_attacks import SKIP_REASON, require_sandbox

ACCUSATIONS = ("may not", "a copy of", "forbidden")
LABS = [entry.notebook.split("_", 1)[0] for entry in course_labs()]  # the nine labs, the drills (08) included
IN_SUITE_MISTAKES = ("00", "07")  # the labs whose every mistake goes through the answering step here


@pytest.fixture(scope="module")
def course(tmp_path_factory, embedded):
    require_sandbox()
    root = tmp_path_factory.mktemp("course")
    folder, out = root / "class", root / "class-grades"
    folder.mkdir()
    chosen = [s for s in honest_corpus.corpus(with_mistakes=False)
              if not s.name.startswith("learner-copy-") or s.lab == "00"]  # one learner copy: the others cost the same
    for submission in chosen:
        nbformat.write(submission.notebook, folder / f"{submission.name}.ipynb")
    # A loaded machine runs a course cell several times slower than a quiet one: the cell limit is generous here.
    reports = classroom.grade_class(folder, out, GradingSettings(
        jobs=2, cell_timeout_s=600, limits=Limits(wall_seconds=3600), secret=b"course secret"), progress=None)
    with open(out / "gradebook.csv", newline="") as file:
        rows = {row["learner"]: row for row in csv.DictReader(file)}
    return {"expected": {s.name: s.expected for s in chosen}, "reports": {r.learner: r for r in reports},
            "rows": rows}


@pytest.mark.skipif(bool(SKIP_REASON), reason=f"LABKIT_SKIP_SANDBOX_TESTS: {SKIP_REASON}")
def test_every_solution_earns_every_point_through_the_wall(course):
    solutions = {name: report for name, report in course["reports"].items() if name.startswith("solution-")}
    assert len(solutions) == len(LABS)
    for name, report in solutions.items():
        assert report.error is None, (name, report.error)
        points = {result.id: result.points for result in report.exercises}
        assert points == course["expected"][name], (name, [r for r in report.exercises if r.status != "passed"])
        assert report.review == (), (name, report.review)
        # The course's measurements and figures were not run, and the points did not need them.
        tagged = [index for index, cell in enumerate(honest_corpus.solution(name.split("-")[1]).cells)
                  if GRADER_SKIPS_TAG in cell.metadata.get("tags", [])]
        assert list(report.course_cells_not_run) == tagged, name
    assert sum(len(report.course_cells_not_run) for report in solutions.values()) >= 20
    assert sum(report.score for report in solutions.values()) == 77  # the course's points (README's exercise table)


@pytest.mark.skipif(bool(SKIP_REASON), reason=f"LABKIT_SKIP_SANDBOX_TESTS: {SKIP_REASON}")
def test_honest_attempts_earn_what_the_check_gives_and_nobody_is_accused(course):
    others = {name: report for name, report in course["reports"].items() if not name.startswith("solution-")}
    assert len(others) == 1 + len(honest_corpus.NATURAL)
    for name, report in others.items():
        points = {result.id: result.points for result in report.exercises}
        assert points == course["expected"][name], (name, report.exercises)
        details = " ".join(line for result in report.exercises for line in result.details)
        assert not any(word in details for word in ACCUSATIONS), (name, details)
        assert report.review == () and course["rows"][name]["review"] == "", (name, report.review)
    assert [result.status for result in others["learner-copy-00"].exercises] == ["not attempted"] * 3
    assert course["rows"]["natural-argmax_sample"]["total"] == "3"  # 5 but sample_token's 2
    for name in ("natural-sample_bisects_for_ever", "natural-softmax_sleeps", "natural-softmax_reads_an_empty_pipe"):
        told = " ".join(line for result in others[name].exercises for line in result.details)
        assert "no answer within" in told and others[name].score == 3, (name, told)  # only its time ran out


@pytest.mark.parametrize("exercise, index, wrong", list(honest_corpus.mistakes(IN_SUITE_MISTAKES)),
                         ids=lambda value: getattr(value, "id", getattr(value, "__name__", str(value))))
def test_a_known_mistake_written_by_a_learner_fails_its_exercise_as_the_check_does(exercise, index, wrong):
    """The bug zoo's tests hold the notebook's check to failing each mistake; the grader must fail it the same way
    (0 points, the same kind of verdict), with no accusation, although the learner's bytecode may equal labkit's."""
    namespace: dict = {}
    exec(compile(honest_corpus.mistake_source(exercise, wrong), "<learner cell>", "exec"), namespace)  # noqa: S102
    _, plan, drawn = judging.plan(exercise.lab, seed=41 + index)
    answers = disarming.answer_plan(namespace, {"exercises": [item for item in plan if item["id"] == exercise.id]})
    result = judging.judge(exercise, drawn[exercise.id], answers, None)
    assert (result.status, result.points) == ("failed", 0), result
    assert not any(word in " ".join(result.details) for word in ACCUSATIONS), result.details


@pytest.mark.parametrize("lab", LABS)
def test_the_cells_the_grader_skips_feed_nothing_that_is_graded(lab):
    """A course cell tagged for the grader to skip measures or draws for the reader only: no check, prediction or
    exercise is in it, no later cell the grader runs reads a name it binds, and both copies tag the same cells
    (the grader matches a submission's cells to the learner copy's by source). The build tags every such cell
    (``labkit.instructor.grader.course_cells.skippable_cells``); this restates the rule cell by cell."""
    from labkit.exercises import exercises
    from labkit.instructor.grader.course_cells import cell_names, course_cells, skippable_cells

    graded_names = {exercise.function for exercise in exercises(lab)}
    skipped = course_cells(lab, GRADER_SKIPS_TAG)
    for notebook, is_solution in ((honest_corpus.solution(lab), True), (honest_corpus.learner_copy(lab), False)):
        code = [cell for cell in notebook.cells if cell.cell_type == "code"]
        tagged = [GRADER_SKIPS_TAG in cell.metadata.get("tags", []) for cell in code]
        assert {cell.source.strip() for cell, tag in zip(code, tagged) if tag} == skipped
        if is_solution:  # the build tags by the solution's own code; the learner copy inherits its tags
            # `labkit build` tags every cell the rule lets the grader skip, no fewer: no grading minute on them.
            assert tagged == skippable_cells([cell.source for cell in code], graded_names)
        bound_by_skipped: set[str] = set()
        for cell, tag in zip(code, tagged):
            bound, read = cell_names(cell.source)
            if tag:
                assert "check(" not in cell.source and not bound & graded_names, cell.source[:80]
                bound_by_skipped |= bound
            else:
                assert not read & bound_by_skipped, (read & bound_by_skipped, cell.source[:80])
