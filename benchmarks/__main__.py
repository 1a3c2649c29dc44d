"""Run every benchmark: ``python -m benchmarks`` (or ``make bench``); ``python -m benchmarks load`` for one."""

import sys

from benchmarks import load_and_notebooks, loss, memory_explorer, sampling, speculative

SUITES = {"load": load_and_notebooks.main, "memory": memory_explorer.main, "loss": loss.main, "sampling": sampling.main,
          "speculative": speculative.main}
SUITES["outliers"] = lambda: __import__("benchmarks.outliers").outliers.main()  # lab 04's visualizer latency
SUITES["browser"] = lambda: __import__("benchmarks.browser").browser.main()  # explorers in Chromium, event -> image
SUITES["exercises"] = lambda: __import__("benchmarks.exercises").exercises.main()  # verdict time per exercise
SUITES["timing"] = lambda: __import__("benchmarks.timing").timing.main()  # lab 06: roofline, decode floor, threads
SUITES["decode"] = lambda: __import__("benchmarks.decode").decode.main()  # #32: labkit's forward per format vs floor
SUITES["grading"] = lambda: __import__("benchmarks.grading").grading.main()  # a class on Dask: overhead, faults


def main(argv: list[str]) -> int:
    chosen = [name for name in argv if not name.startswith("--")] or list(SUITES)  # --corpus: the suite's own
    unknown = [name for name in chosen if name not in SUITES]
    if unknown:
        print(f"unknown benchmark {unknown}; choose from {sorted(SUITES)}")
        return 2
    for name in chosen:
        SUITES[name]()
    return 0


sys.exit(main(sys.argv[1:]))
