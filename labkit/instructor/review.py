"""A static read of a submission for what only a cheat needs: the gradebook's "review" column.

The grader's verdicts do not depend on this read (the wall and the trusted comparison do the guarding); it points
the instructor at code worth a look, with the cell and line: reaching into frames, code objects or the checker,
profile and trace hooks, IPython's event hooks, dynamic code, the solution notebooks, labkit's reference functions,
torch's private names, comparisons that lie, patched library functions, processes, signals and sockets. It
reports, it does not guess at intent: an instructor decides. Code it cannot parse is reported too.

    >>> import nbformat
    >>> nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import sys\\nsys.setprofile(None)")])
    >>> review_notebook(nb, "00")
    [{'cell': 0, 'line': 2, 'what': 'sys.setprofile: a profile or trace hook (switches off the call watcher)'}]

Layer 5 (instructor tools).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

_NAMES = {  # an identifier anywhere (a name, an attribute, or a string that spells it) -> why it is listed
    **dict.fromkeys(["_getframe", "currentframe", "f_back", "f_globals", "f_locals", "f_code", "tb_frame", "gi_frame",
                     "cr_frame", "__code__", "co_code", "CodeType", "FunctionType", "__globals__", "__closure__",
                     "getouterframes", "getinnerframes"], "reaches into frames or code objects"),
    **dict.fromkeys(["setprofile", "settrace", "setprofile_all_threads", "settrace_all_threads", "gettrace",
                     "getprofile"], "a profile or trace hook (switches off the call watcher)"),
    **dict.fromkeys(["pre_run_cell", "post_run_cell", "pre_execute", "post_execute", "input_transformers_post",
                     "input_transformers_cleanup", "ast_transformers", "register_magic_function"],
                    "an IPython hook (runs code around cells, the grader's too)"),
    **dict.fromkeys(["_REGISTRY", "check_function", "_tripwire", "call_safely", "Verdict", "grade_in_kernel",
                     "answer_cases", "_labkit_answer_cases", "_PREDICTION_ANSWERS"], "reaches into labkit's checker"),
    **dict.fromkeys(["exec", "eval", "compile", "__import__", "importlib", "marshal", "pickle", "__builtins__",
                     "builtins", "get_referrers", "get_objects"], "dynamic code or object graph access"),
    **dict.fromkeys(["__eq__", "__ne__", "__bool__", "__torch_function__", "__torch_dispatch__", "__instancecheck__",
                     "__subclasscheck__", "__getattribute__", "__class__"], "a comparison or type that can lie"),
    **dict.fromkeys(["fork", "forkpty", "kill", "killpg", "getppid", "setsid", "system", "popen", "subprocess",
                     "multiprocessing", "socket", "ctypes", "SIG_IGN", "_thread", "threading"],
                    "processes, signals, threads or the network"),
}
_MODULE_PREFIXES = {"labkit.exercises.checking": "reaches into labkit's checker",
                    "labkit.exercises.calling": "reaches into labkit's checker",
                    "labkit.exercises.definitions": "reaches into labkit's checker",
                    "labkit.exercises.comparing": "reaches into labkit's checker",
                    "labkit.exercises.deadline": "reaches into labkit's checker",
                    "labkit.instructor": "reaches into labkit's grader", "nbformat": "reads notebooks",
                    "torch._": "a private torch name (a lower-level route to a function)",
                    "torch.ops": "a private torch name (a lower-level route to a function)"}
_STRINGS = {"solutions": "names the solution notebooks", ".ipynb": "names a notebook file"}


def review_notebook(notebook: Any, lab: str) -> list[dict[str, Any]]:
    """What in the notebook's code cells deserves the instructor's look: ``{"cell", "line", "what"}`` each."""
    references = _reference_names(lab)
    course = _course_cells(lab)
    found: list[dict[str, Any]] = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code" or cell.source.strip() in course:
            continue
        try:
            tree = ast.parse(_python_of(cell.source))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            found.append({"cell": index, "line": 1, "what": "code that does not parse as Python"})
            continue
        seen: set[tuple[int, str]] = set()
        for line, what in _findings(tree, references):
            if (line, what) not in seen:
                seen.add((line, what))
                found.append({"cell": index, "line": line, "what": what})
    return found


def summary_text(findings: list[dict[str, Any]], limit: int = 6) -> str:
    """The gradebook cell: ``cell 4 line 2: sys.setprofile (...)``, the first few, and how many more."""
    parts = [f"cell {f['cell']} line {f['line']}: {f['what']}" for f in findings[:limit]]
    if len(findings) > limit:
        parts.append(f"and {len(findings) - limit} more")
    return "; ".join(parts)


def _python_of(source: str) -> str:
    try:  # IPython's own rules turn magics and shell escapes into Python
        from IPython.core.inputtransformer2 import TransformerManager

        return TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - without IPython, lines starting with % or ! are left out
        return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def _course_cells(lab: str) -> set[str]:
    """The code cells of the course's own learner notebook of ``lab`` (as shipped): not the learner's writing,
    so not read (its setup cell installs packages, some cells import labkit's answers to show them)."""
    import labkit

    cells: set[str] = set()
    for root in labkit.__path__:
        for path in sorted((Path(root).parent / "notebooks").glob(f"{lab}_*.ipynb")):
            try:
                cells |= {cell["source"].strip() if isinstance(cell["source"], str) else "".join(cell["source"]).strip()
                          for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]
                          if cell.get("cell_type") == "code"}
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return cells


def _reference_names(lab: str) -> set[str]:
    """The labkit functions that answer this lab's code exercises (the allowed helpers excepted)."""
    try:
        from labkit.exercises import exercises

        chosen = exercises(lab)
    except Exception:  # noqa: BLE001 - an unknown lab has no references to look for
        return set()
    names = set()
    for exercise in chosen:
        if exercise.kind == "code":
            allowed = {getattr(item, "__name__", None) for item in exercise.allowed}
            name = getattr(exercise.reference, "__name__", None)
            if name and name not in allowed and getattr(exercise.reference, "__module__", "").startswith("labkit"):
                names.add(name)
    return names


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _findings(tree: ast.AST, references: set[str]):
    imported: dict[str, str] = {}  # local name -> module path it came from
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                imported[(alias.asname or alias.name).split(".")[0]] = alias.name.split(".")[0] if not alias.asname \
                    else alias.name
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 1)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            for alias in node.names:
                full = f"{module}.{alias.name}" if module else alias.name
                for prefix, what in _MODULE_PREFIXES.items():
                    if full.startswith(prefix) and not full.startswith("torch.__"):
                        yield line, f"imports {full}: {what}"
                if module and module.startswith("labkit") and alias.name in references:
                    yield line, f"imports {full}: labkit's reference answer to an exercise of this lab"
                if alias.name in _NAMES or (module or "").split(".")[-1] in _NAMES:
                    yield line, f"imports {full}: {_NAMES.get(alias.name) or _NAMES[(module or '').split('.')[-1]]}"
        elif isinstance(node, (ast.Name, ast.Attribute)):
            identifier = node.id if isinstance(node, ast.Name) else node.attr
            dotted = _dotted(node) or identifier
            if identifier in _NAMES:
                yield line, f"{dotted}: {_NAMES[identifier]}"
            root = dotted.split(".")[0]
            full = ".".join([imported.get(root, root), *dotted.split(".")[1:]])
            if isinstance(node, ast.Attribute) and full.startswith(("torch._", "torch.ops")) and \
                    not full.startswith("torch.__"):
                yield line, f"{dotted}: {_MODULE_PREFIXES['torch._']}"
            if isinstance(node, ast.Attribute) and full.startswith("labkit") and identifier in references:
                yield line, f"{dotted}: labkit's reference answer to an exercise of this lab"
            if isinstance(node, ast.Attribute) and isinstance(getattr(node, "ctx", None), ast.Store) and \
                    root in imported:
                yield line, f"{dotted} = ...: replaces a library's function or value"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for needle, what in _STRINGS.items():
                if needle in node.value:
                    yield line, f"the string {node.value[:40]!r}: {what}"
            for word in _NAMES:
                if word in node.value and len(word) > 4 and word.strip("_") == word.strip("_"):
                    if word in node.value.replace(" ", "") and _spelled(node.value, word):
                        yield line, f"the string {node.value[:40]!r} spells {word}: {_NAMES[word]}"
        elif isinstance(node, ast.ClassDef) and any(_dotted(base) in ("torch.Tensor", "Tensor") for base in node.bases):
            yield line, f"class {node.name}(torch.Tensor): a tensor type whose comparisons can lie"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in _NAMES:
            yield line, f"defines {node.name}: {_NAMES[node.name]}"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            yield line, "setattr(...): replaces an attribute by name"


def _spelled(text: str, word: str) -> bool:
    """``word`` stands in ``text`` as an identifier would (not inside a longer word, e.g. 'killed' for 'kill')."""
    start = text.find(word)
    while start != -1:
        before = text[start - 1] if start else " "
        end = start + len(word)
        after = text[end] if end < len(text) else " "
        if not (before.isalnum() or before == "_") and not (after.isalnum() or after == "_"):
            return True
        start = text.find(word, start + 1)
    return False
