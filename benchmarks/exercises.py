"""How long a learner waits for a verdict: the median time of ``check_function`` per exercise, with the solution
notebooks' own answers (the target of issue #23: at most 2 s each on the course's 2-core machine).

Each lab's solution notebook gives its set-up cell (the first code cell after Colab's install cell: imports, the
model, the lab's small helpers) and the cells that hold a solution (``### BEGIN SOLUTION``); they run in a fresh
namespace, then every registered exercise of the lab is checked ``runs`` times with a fixed random seed after a
first check, shown apart: it pays the model's load and the answers computed once per process.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 2.0


def _solution_namespace(notebook_path: Path) -> tuple[dict, list[str]]:
    """Run a solution notebook's set-up cell and solution cells; return the namespace and what failed."""
    import nbformat

    notebook = nbformat.read(notebook_path, as_version=4)
    namespace: dict = {"__name__": "__main__"}
    problems = []
    code = [(number, cell) for number, cell in enumerate(notebook.cells) if cell.cell_type == "code"
            and "google.colab" not in cell.source]
    for position, (number, cell) in enumerate(code):
        if position > 0 and "### BEGIN SOLUTION" not in cell.source:
            continue
        try:
            exec(compile(cell.source, f"<{notebook_path.name} cell {number}>", "exec"), namespace)  # noqa: S102
        except Exception as error:  # noqa: BLE001 - one cell that needs earlier state is reported, not fatal
            problems.append(f"cell {number}: {type(error).__name__}: {error}")
    return namespace, problems


def main(runs: int = 3) -> None:
    import contextlib
    import io

    from labkit.core.course import labs
    from labkit.exercises import exercises
    from labkit.exercises.checking import check_function

    print(f"== exercises: median verdict time over {runs} checks (target <= {TARGET_S:.0f} s) ==")
    print(f"{'exercise':40} {'kind':10} {'points':>6} {'verdict':>14} {'first s':>8} {'median s':>9} {'max s':>7}")
    slow, total_points = [], 0
    for lab in labs():
        number = lab.notebook.split("_", 1)[0]
        with contextlib.redirect_stdout(io.StringIO()):
            namespace, problems = _solution_namespace(ROOT / "notebooks" / "solutions" / lab.notebook)
        try:
            registered = exercises(number)
        except ValueError as error:  # the lab's module did not load (labkit printed why)
            print(f"  (lab {number}: {error})")
            continue
        for exercise in registered:
            total_points += exercise.points
            function = namespace.get(exercise.function)
            if function is None:  # its solution cell needs state from earlier cells: say which cells failed
                print(f"  ({exercise.id}: no solution found in {lab.notebook}; {'; '.join(problems) or 'no cell'})")
            started = time.perf_counter()
            check_function(exercise, function, seed=0)  # the first check: model loads, lazy imports, caches
            first = time.perf_counter() - started
            seconds, verdict = [], None
            for _ in range(runs):
                started = time.perf_counter()
                verdict = check_function(exercise, function, seed=0)
                seconds.append(time.perf_counter() - started)
            median = statistics.median(seconds)
            if median > TARGET_S:
                slow.append(exercise.id)
            print(f"{exercise.id:40} {exercise.kind:10} {exercise.points:6} {verdict.status:>14} {first:8.3f} "
                  f"{median:9.3f} {max(seconds):7.3f}")
    print(f"total points: {total_points}; over {TARGET_S:.0f} s: {', '.join(slow) if slow else 'none'}")


if __name__ == "__main__":
    main()
