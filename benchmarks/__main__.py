"""Run every benchmark: ``python -m benchmarks`` (or ``make bench``); ``python -m benchmarks load`` for one."""

import sys

from benchmarks import load_and_notebooks, memory_explorer

SUITES = {"load": load_and_notebooks.main, "memory": memory_explorer.main}


def main(argv: list[str]) -> int:
    chosen = argv or list(SUITES)
    unknown = [name for name in chosen if name not in SUITES]
    if unknown:
        print(f"unknown benchmark {unknown}; choose from {sorted(SUITES)}")
        return 2
    for name in chosen:
        SUITES[name]()
    return 0


sys.exit(main(sys.argv[1:]))
