"""The notebooks a change touches, for ``make quick``: printed one per line, learner copy and solution together.

A change touches a lab's notebooks when it edits one of them, that lab's exercises (``labkit/exercises/labNN.py``)
or a labkit module a solution notebook names (``labkit.core.sampling``, ``from labkit.core import sampling``).
The change is everything that differs from the branch point with ``main`` (``origin/main`` when there is no local
``main``), committed or not, plus new files. ``LABS="01 04"`` in the environment names the labs instead.

This is a quick loop's guess, not a proof: a change to a module the notebooks reach only through another module is
not followed. ``make test`` runs every notebook.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> list[str]:
    result = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return result.stdout.split() if result.returncode == 0 else []


def changed_paths() -> list[str]:
    """Paths that differ from where this branch left main (or from HEAD, without a main), and new files."""
    base = next((found[0] for ref in ("main", "origin/main") if (found := _git("merge-base", "HEAD", ref))), "HEAD")
    return sorted(set(_git("diff", "--name-only", base)) | set(_git("ls-files", "--others", "--exclude-standard")))


def labs_touched(paths: list[str], solutions: dict[str, str]) -> list[str]:
    """The labs ("02") whose notebooks ``paths`` touch; ``solutions`` maps a lab to its solution notebook's text.

    >>> labs_touched(["notebooks/02_loss_perplexity.ipynb", "labkit/exercises/lab05.py", "labkit/core/paging.py"],
    ...              {"03": "from labkit.core import paging, numerics", "07": "import labkit.core.speedup"})
    ['02', '03', '05']
    """
    labs = set()
    for path in paths:
        if match := re.fullmatch(r"notebooks/(?:solutions/)?(\d\d)_[^/]+\.ipynb", path):
            labs.add(match.group(1))
        elif match := re.fullmatch(r"labkit/exercises/lab(\d\d)\.py", path):
            labs.add(match.group(1))
        elif match := re.fullmatch(r"labkit/(\w+)/(\w+)\.py", path):
            layer, module = match.groups()
            named = re.compile(rf"labkit\.{layer}\.{module}\b|from labkit\.{layer} import [^\n]*\b{module}\b")
            labs |= {lab for lab, text in solutions.items() if named.search(text)}
    return sorted(labs)


def main() -> None:
    solutions = {path.name[:2]: path.read_text() for path in sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))}
    wanted = os.environ.get("LABS", "").replace(",", " ").split()
    labs = sorted(wanted) if wanted else labs_touched(changed_paths(), solutions)
    for lab in labs:
        for path in sorted((ROOT / "notebooks" / "solutions").glob(f"{lab}_*.ipynb")):
            print(path.relative_to(ROOT))
            print((ROOT / "notebooks" / path.name).relative_to(ROOT))
    if labs:
        print(f"notebooks of lab(s) {', '.join(labs)}", file=sys.stderr)


if __name__ == "__main__":
    main()
