"""The notebooks' Colab cell installs labkit at a git tag: the tag exists here, carries the version it is named for,
and installs.

Every notebook's first code cell (``labkit.instructor.authoring.colab_cell_source``) runs, in Colab only,
``pip install "labkit @ git+<repository>@v<version>"``. A ref missing from the repository stops every lab at its
first cell in Colab, so these tests read the ref out of the committed notebooks (not from the function that writes
it), ask git for it, read the version the tagged commit carries, and install labkit from a clone at that ref into a
fresh virtual environment. ``make release VERSION=...`` (README, "Making a release") makes the tag.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from labkit.instructor.authoring import VERSION_FILE, installed_ref, prepare_release

ROOT = Path(__file__).resolve().parent.parent


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


def _version_in(text: str) -> str:
    [version] = re.findall(r'^__version__ = "([^"]*)"$', text, re.M)
    return version


def named_refs(root: Path) -> dict[str, str]:
    """Notebook (relative path) -> the ref its Colab cell installs labkit at, for every committed notebook."""
    refs = {}
    for path in sorted(root.glob("notebooks/*.ipynb")) + sorted(root.glob("notebooks/solutions/*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        first = next(cell for cell in cells if cell["cell_type"] == "code")
        refs[str(path.relative_to(root))] = installed_ref("".join(first["source"]))
    return refs


def ref_problems(root: Path) -> list[str]:
    """Why the Colab cells of the repository at ``root`` would not install the version it holds (empty: they would)."""
    version = _version_in((root / VERSION_FILE).read_text(encoding="utf-8"))
    refs = named_refs(root)
    problems = [f"{name} installs {ref}, not v{version}" for name, ref in refs.items() if ref != f"v{version}"]
    for ref in sorted(set(refs.values())):
        if _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").returncode != 0:
            problems.append(f"{ref} is not in the repository (make release VERSION={ref.removeprefix('v')})")
            continue
        tagged = _git(root, "show", f"{ref}:{VERSION_FILE.as_posix()}")
        if tagged.returncode != 0 or _version_in(tagged.stdout) != ref.removeprefix("v"):
            problems.append(f"{ref} points at a commit whose labkit is not version {ref.removeprefix('v')}")
    return problems


def test_pyproject_reads_the_version_from_where_the_release_writes_it():
    dynamic = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["dynamic"]
    assert dynamic["version"] == {"attr": "labkit.__version__"} and VERSION_FILE.as_posix() == "labkit/__init__.py"


def test_every_colab_cell_installs_a_ref_in_the_repository_carrying_this_version():
    import labkit

    assert set(named_refs(ROOT).values()) == {f"v{labkit.__version__}"}
    assert ref_problems(ROOT) == []


def test_the_tagged_commit_carries_notebooks_that_install_that_tag():
    import labkit

    ref = f"v{labkit.__version__}"
    for name in named_refs(ROOT):
        shown = _git(ROOT, "show", f"{ref}:{name}")
        assert shown.returncode == 0, f"{name} is not in {ref}"
        first = next(cell for cell in json.loads(shown.stdout)["cells"] if cell["cell_type"] == "code")
        assert installed_ref("".join(first["source"])) == ref, name


def test_a_release_without_its_tag_is_named_and_the_tag_makes_it_whole(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)], check=True)
    written = prepare_release(clone, "9.8.7")
    assert len(written) == 1 + len(named_refs(ROOT)) and _version_in((clone / VERSION_FILE).read_text()) == "9.8.7"
    assert set(named_refs(clone).values()) == {"v9.8.7"}
    assert ref_problems(clone) == ["v9.8.7 is not in the repository (make release VERSION=9.8.7)"]
    # A tag on a commit that still carries the old version is named too.
    _git(clone, "tag", "v9.8.7", "HEAD")
    assert ref_problems(clone) == ["v9.8.7 points at a commit whose labkit is not version 9.8.7"]
    _git(clone, "tag", "-d", "v9.8.7")
    identity = ["-c", "user.name=release test", "-c", "user.email=release@test.invalid"]
    committed = _git(clone, *identity, "commit", "-q", "-m", "release", "--", "labkit/__init__.py", "notebooks")
    assert committed.returncode == 0, committed.stderr
    assert _git(clone, "tag", "v9.8.7").returncode == 0
    assert ref_problems(clone) == []
    with pytest.raises(ValueError, match="three numbers"):
        prepare_release(clone, "v1.0")


def test_labkit_installs_from_a_clone_at_the_named_ref(tmp_path):
    """What Colab does, from a local clone: pip clones the repository at the ref, builds labkit and installs it
    (``--no-deps``: the dependencies are Colab's own; ``make colab-check`` installs against those)."""
    import labkit

    ref = f"v{labkit.__version__}"
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
    assert version == labkit.__version__ and Path(where).is_relative_to(venv) and int(n_labs) == 8


def test_the_notebooks_a_learner_opens_are_the_tagged_ones():
    """Colab opens a notebook from the branch and installs labkit at the tag: a notebook changed since the tag (a new
    import, a new guard) would run against the older labkit. A change to the notebooks is released with them."""
    import labkit

    ref = f"v{labkit.__version__}"
    changed = [name for name in named_refs(ROOT)
               if _git(ROOT, "show", f"{ref}:{name}").stdout != (ROOT / name).read_text(encoding="utf-8")]
    assert not changed, (f"changed since {ref}: {changed}; release them: make release VERSION=<the next version> "
                         "(README, Making a release)")
