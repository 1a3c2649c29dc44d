"""Colab's pinned stack (tests/colab-pins.txt) and the check that installing labkit left it alone.

``python tests/colab_stack.py check`` (run by ``make colab-check`` inside .venv-colab) compares ``pip freeze``
with the pins and exits 1, naming each package, when one was upgraded, downgraded or removed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

PINS_FILE = Path(__file__).resolve().parent / "colab-pins.txt"


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path = PINS_FILE) -> dict[str, str]:
    """Package -> version, from a requirements file of ``name==version`` lines."""
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            found[normal(name)] = version
    return found


def installed() -> dict[str, str]:
    """What ``pip freeze`` reports in this interpreter's environment (local version labels dropped)."""
    frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--all"], capture_output=True, text=True,
                            check=True).stdout
    versions = {}
    for line in frozen.splitlines():
        if "==" in line:
            name, version = line.split("==")
            versions[normal(name)] = version.split("+")[0]
    return versions


def changed(expected: dict[str, str], actual: dict[str, str]) -> list[str]:
    """One line per pin that is not installed at its version.

    >>> changed({"ipywidgets": "7.7.1", "numpy": "2.0.2"}, {"ipywidgets": "8.1.9", "numpy": "2.0.2"})
    ['ipywidgets: Colab has 7.7.1, now 8.1.9']
    """
    return [f"{name}: Colab has {version}, now {actual.get(name, 'not installed')}"
            for name, version in expected.items() if actual.get(name) != version]


def main(argv: list[str]) -> int:
    if argv != ["check"]:
        print("usage: python tests/colab_stack.py check")
        return 2
    problems = changed(pins(), installed())
    for line in problems:
        print(f"Colab pin changed: {line}")
    if not problems:
        print(f"every Colab pin unchanged ({len(pins())} packages)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
