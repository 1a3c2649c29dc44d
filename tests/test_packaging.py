"""The set-up promises: pinned installs, data inside the wheel, Colab installs, the lab command serves."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import nbformat
import pytest
import yaml
from packaging.requirements import Requirement

from labkit.course import colab_install_commands, colab_url, lab_table_markdown, labs

ROOT = Path(__file__).resolve().parent.parent


def _normal(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins():
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[_normal(name)] = version
    return pins


def _declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(text) for text in project["dependencies"] + project["optional-dependencies"]["dev"]]


def test_every_declared_dependency_is_pinned_inside_its_range():
    pins = _pins()
    for requirement in _declared():
        assert _normal(requirement.name) in pins, f"{requirement.name} has no pin in constraints.txt"
        assert requirement.specifier.contains(pins[_normal(requirement.name)], prereleases=True), requirement


def test_ranges_admit_what_colab_pins():
    # Colab ships ipywidgets 7.7.1; installing labkit there must not upgrade it.
    ranges = {_normal(r.name): r.specifier for r in _declared()}
    assert ranges["ipywidgets"].contains("7.7.1") and ranges["ipywidgets"].contains("8.1.9")
    assert ranges["ipython"].contains("7.34.0")


def test_environment_yml_matches_pyproject_and_constraints():
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(item["pip"] for item in environment["dependencies"] if isinstance(item, dict))
    listed = {_normal(line.split("==")[0]): line.split("==")[1] for line in pip_section if "==" in line}
    pins = _pins()
    assert set(listed) == {_normal(r.name) for r in _declared()}
    assert all(pins[name] == version for name, version in listed.items())
    assert "-e ." in pip_section


def test_wheel_carries_the_data_and_works_from_another_directory(tmp_path):
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "dist"),
                    str(ROOT)], check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("labkit-*.whl"))
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                    str(wheel)], check=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # Every subpackage of the checkout must be in the wheel too.
    subpackages = sorted(f"labkit.{p.parent.name}" for p in (ROOT / "labkit").glob("*/__init__.py"))
    code = (f"import {', '.join(subpackages) or 'labkit'}; "
            "import labkit, labkit.models as m, labkit.course as c; print(labkit.__file__); "
            "print(sorted(m.known_models())); print(c.labs()[0].notebook)")
    result = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(target)})
    assert result.returncode == 0, result.stderr
    location, models, first_lab = result.stdout.splitlines()
    assert location.startswith(str(target)), "the test imported the checkout, not the wheel"
    assert models == "['pythia-14m', 'smollm2-135m']" and first_lab == "00_start_here.ipynb"


def test_core_modules_import_no_widgets_or_plots():
    core = ["labkit.spec", "labkit.resources", "labkit.models", "labkit.course"]
    core += [f"labkit.{p.stem}" for p in (ROOT / "labkit").glob("*.py")
             if p.stem in {"memory", "budget", "presets", "paging", "sampling", "generation", "texts", "loss", "quantization", "timing", "speculative"}]
    code = f"import sys; import {', '.join(core)}; print([m for m in ('ipywidgets', 'matplotlib') if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_readme_names_the_two_commands_and_lists_the_labs():
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme
    assert lab_table_markdown() in readme, "README's lab table is stale: paste labkit.course.lab_table_markdown()"
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("make test")


def test_every_written_lab_has_a_learner_and_a_solution_notebook():
    for lab in labs():
        written = (ROOT / "notebooks" / lab.notebook).exists()
        assert written == (not lab.planned), lab.notebook
        assert written == (ROOT / "notebooks" / "solutions" / lab.notebook).exists(), lab.notebook
    assert colab_url("00_start_here.ipynb").startswith("https://colab.research.google.com/github/")


def _first_code_cell(path):
    return next(cell.source for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code")


@pytest.mark.parametrize("notebook", sorted(p.relative_to(ROOT) for p in (ROOT / "notebooks").rglob("*.ipynb")
                                             if ".ipynb_checkpoints" not in p.parts))
def test_colab_cell_installs_only_inside_colab(notebook, monkeypatch):
    source = _first_code_cell(ROOT / notebook)
    ran = []
    monkeypatch.setattr(subprocess, "run", lambda command, check=False: ran.append(command))

    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    exec(source, {})
    assert ran == [], "outside Colab the cell must do nothing"

    monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))  # a stand-in module
    exec(source, {})
    assert ran == colab_install_commands()


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_lab_command_serves_the_notebooks_on_localhost():
    port = _free_port()
    args = f"--no-browser --ip=127.0.0.1 --port={port} --IdentityProvider.token= --ServerApp.password="
    server = subprocess.Popen(["make", "--no-print-directory", "lab", f"LAB_ARGS={args}"], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents", timeout=5) as response:
                    listing = response.read().decode()
                break
            except OSError:
                assert server.poll() is None, "make lab exited before serving"
                assert time.monotonic() < deadline, "make lab did not answer within 120 s"
                time.sleep(1)
        assert '"00_start_here.ipynb"' in listing and '"solutions"' in listing
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
