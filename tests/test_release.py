"""The notebooks' Colab cell installs labkit from the branch the Colab links open them from: that ref exists in the
repository a learner reaches, and labkit installs from it.

Every notebook's first code cell (``labkit.instructor.authoring.colab_cell_source``) runs, in Colab only,
``pip install "labkit @ git+<repository>@<branch>"``. A ref missing from the repository stops every lab at its
first cell in Colab. A tag was tried (issue 48) and was missing: what reaches the repository is the branch's
commits, not tags. So these tests read the ref out of the committed notebooks (not from the function that writes
it), check that it is the branch the Colab links open, ask git for it, and install labkit from a clone at that ref
into a fresh virtual environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from labkit.core.resources import load_json
from labkit.instructor.authoring import colab_url, installed_ref

ROOT = Path(__file__).resolve().parent.parent


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


def named_refs(root: Path) -> dict[str, str]:
    """Notebook (relative path) -> the ref its Colab cell installs labkit at, for every committed notebook."""
    refs = {}
    for path in sorted(root.glob("notebooks/*.ipynb")) + sorted(root.glob("notebooks/solutions/*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        first = next(cell for cell in cells if cell["cell_type"] == "code")
        refs[str(path.relative_to(root))] = installed_ref("".join(first["source"]))
    return refs


def ref_problems(root: Path) -> list[str]:
    """Why the Colab cells of the repository at ``root`` would not install from the branch their links open
    (empty: they would). The branch is found as a local branch or as the clone's ``origin`` one."""
    branch = load_json("course.json")["branch"]
    refs = named_refs(root)
    problems = [f"{name} installs {ref}, not the branch {branch} the Colab links open"
                for name, ref in refs.items() if ref != branch]
    for ref in sorted(set(refs.values())):
        found = [where for where in (f"refs/heads/{ref}", f"refs/remotes/origin/{ref}")
                 if _git(root, "rev-parse", "--verify", "--quiet", f"{where}^{{commit}}").returncode == 0]
        if not found:
            problems.append(f"{ref} is not a branch of the repository")
    return problems


def test_every_colab_cell_installs_the_branch_its_colab_link_opens():
    branch = load_json("course.json")["branch"]
    assert set(named_refs(ROOT).values()) == {branch}
    assert f"/blob/{branch}/notebooks/01_sampling.ipynb" in colab_url("01_sampling.ipynb")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert colab_url("01_sampling.ipynb") in readme
    assert ref_problems(ROOT) == []


def test_a_ref_missing_from_the_repository_is_named(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)], check=True)
    assert ref_problems(clone) == []
    branch = load_json("course.json")["branch"]
    _git(clone, "checkout", "--quiet", "--detach")
    _git(clone, "branch", "--quiet", "-D", branch)
    _git(clone, "update-ref", "-d", f"refs/remotes/origin/{branch}")
    assert ref_problems(clone) == [f"{branch} is not a branch of the repository"]
    # A notebook naming another ref (say a tag from an older build) is named too.
    path = clone / "notebooks" / "01_sampling.ipynb"
    path.write_text(path.read_text(encoding="utf-8").replace(f"labkit@{branch}", "labkit@v0.1.0"), encoding="utf-8")
    assert "notebooks/01_sampling.ipynb installs v0.1.0, not the branch main the Colab links open" in ref_problems(clone)


def test_labkit_installs_from_a_clone_at_the_named_ref(tmp_path):
    """What Colab does, from a local clone: pip clones the repository at the ref, builds labkit and installs it
    (``--no-deps``: the dependencies are Colab's own; ``make colab-check`` installs against those)."""
    import labkit

    [ref] = set(named_refs(ROOT).values())
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)], check=True)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # Colab's pip is recent; the 23.2 that venv brings here rejects a file:// address in a "name @ url" requirement.
    upgrade = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip>=24"],
                             capture_output=True, text=True)
    assert upgrade.returncode == 0, upgrade.stderr[-2000:]
    install = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps",
                              f"labkit @ git+file://{clone}@{ref}"], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-2000:]
    probe = ("import importlib.resources, json, labkit; "
             "course = json.loads(importlib.resources.files('labkit.data').joinpath('course.json').read_text()); "
             "print(labkit.__version__, labkit.__file__, len(course['labs']))")
    shown = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr[-2000:]
    version, where, n_labs = shown.stdout.split()
    # the eight labs and the optional drills (lab 08)
    assert version == labkit.__version__ and Path(where).is_relative_to(venv) and int(n_labs) == 9
