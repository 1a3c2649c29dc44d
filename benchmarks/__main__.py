"""The benchmarks' command line: ``python -m benchmarks`` (or ``make bench``) runs every suite, ``python -m benchmarks
load sampling`` the ones named, ``python -m benchmarks --list`` names them, ``--help`` says all of this."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module under benchmarks/, what it prints). Imported only when run: a suite's imports (Playwright, Dask,
# a model load) cost nothing to the others.
SUITES = {
    "load": ("load_and_notebooks", "model load cold and warm, each notebook's execution time (medians)"),
    "memory": ("memory_explorer", "lab 05's KV-cache explorer: compute + render + PNG per control change"),
    "loss": ("loss", "lab 02: tokens/s of perplexity scoring, generation with and without the KV cache"),
    "sampling": ("sampling", "lab 01: the filters against transformers' warpers, the explorer per slider move"),
    "speculative": ("speculative", "lab 07: greedy, prompt lookup (labkit and transformers), self-draft"),
    "outliers": ("outliers", "lab 04's outlier visualizer: compute + render + PNG per slider move"),
    "browser": ("browser", "the explorers in Chromium: event -> new image latency, p50/p95"),
    "exercises": ("exercises", "how long a learner waits for a verdict, per exercise"),
    "timing": ("timing", "lab 06: roofline, decode against its floor, the latency model, threads"),
    "decode": ("decode", "decode per weight format against its memory floor, llama.cpp as anchor"),
    "grading": ("grading", "a class graded on Dask: overhead, faults (--corpus: the honest corpus only)"),
}


def parser() -> argparse.ArgumentParser:
    listing = "\n".join(f"  {name:<12} {text}" for name, (_, text) in SUITES.items())
    command = argparse.ArgumentParser(
        prog="python -m benchmarks", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Print labkit's measurements (medians, and ratios to a reference measured in the same run). "
                    "Nothing here passes or fails on a time.",
        epilog=f"suites (all of them, in this order, when none is named):\n{listing}")
    command.add_argument("suites", nargs="*", metavar="SUITE", help="the suites to run (default: every one)")
    command.add_argument("--list", action="store_true", help="name the suites and exit")
    command.add_argument("--corpus", action="store_true",
                         help="with `grading`: grade the honest corpus through the wall instead of the class")
    return command


def main(argv: list[str]) -> int:
    command = parser()
    args = command.parse_args(argv)
    unknown = [name for name in args.suites if name not in SUITES]
    if unknown:  # argparse's `choices` cannot take an empty list for nargs="*" on Python 3.11: checked here
        command.error(f"argument SUITE: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(SUITES)}")
    if args.corpus and "grading" not in args.suites:
        command.error("argument --corpus: applies to the `grading` suite; name it (python -m benchmarks grading --corpus)")
    if args.list:
        print("\n".join(SUITES))
        return 0
    chosen = args.suites or list(SUITES)
    for name in chosen:
        module = importlib.import_module(f"benchmarks.{SUITES[name][0]}")
        module.main(corpus=args.corpus) if name == "grading" else module.main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
