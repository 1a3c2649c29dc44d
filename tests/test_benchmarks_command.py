"""python -m benchmarks: a real command line (issue #53): --help names every suite, an unknown name is refused
before anything runs, and every suite it names is a module with a main()."""

import importlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*argv):
    return subprocess.run([sys.executable, "-m", "benchmarks", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_help_lists_every_suite_and_runs_none():
    from benchmarks.__main__ import SUITES

    shown = _run("--help")
    assert shown.returncode == 0, shown.stderr
    assert "usage: python -m benchmarks" in shown.stdout
    for name, (module, _) in SUITES.items():
        assert f"  {name} " in shown.stdout
        assert callable(importlib.import_module(f"benchmarks.{module}").main)
    assert set(SUITES) == {path.stem for path in (ROOT / "benchmarks").glob("*.py")} - {"__init__", "__main__"} \
        - {"load_and_notebooks", "memory_explorer"} | {"load", "memory"}


def test_an_unknown_suite_or_flag_is_refused_with_the_choices():
    unknown = _run("lod")
    assert unknown.returncode == 2 and "unknown 'lod'" in unknown.stderr and "choose from load," in unknown.stderr
    flag = _run("--fast")
    assert flag.returncode == 2 and "unrecognized arguments: --fast" in flag.stderr
    stray = _run("--corpus")
    assert stray.returncode == 2 and "argument --corpus" in stray.stderr
    listed = _run("--list")
    assert listed.returncode == 0 and listed.stdout.split()[:2] == ["load", "memory"]
