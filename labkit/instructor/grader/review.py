"""A static read of a submission for what only a cheat needs: the gradebook's "review" column.

The grader's verdicts do not depend on this read (the wall and the trusted comparison do the guarding); it points
the instructor at code worth a look, with the cell and line: reaching into frames, code objects or the checker,
profile and trace hooks, IPython's event hooks, dynamic code, the solution notebooks, labkit's reference functions,
torch's private names, comparisons that lie, patched library functions, processes, signals and sockets. It
reports, it does not guess at intent: an instructor decides. Code it cannot parse is reported too.

    >>> import nbformat
    >>> nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import sys\\nsys.setprofile(None)")])
    >>> review_notebook(nb, "00")
    [Finding(cell=0, line=2, what="sys.setprofile: a profile or trace hook (switches off the checker's tripwire)")]

Layer 5 (instructor tools).
"""

from __future__ import annotations

import ast
import copy
import functools
import re
from typing import Any

from labkit.instructor.grader.course_cells import course_cells, python_of
from labkit.instructor.grader.reports import Finding, printable

_NAMES = {  # an identifier anywhere (a name, an attribute, or a string that spells it) -> why it is listed
    **dict.fromkeys(["_getframe", "currentframe", "f_back", "f_globals", "f_locals", "f_code", "tb_frame", "gi_frame",
                     "cr_frame", "__code__", "co_code", "CodeType", "FunctionType", "__globals__", "__closure__",
                     "getouterframes", "getinnerframes"], "reaches into frames or code objects"),
    **dict.fromkeys(["setprofile", "settrace", "setprofile_all_threads", "settrace_all_threads", "gettrace",
                     "getprofile"], "a profile or trace hook (switches off the checker's tripwire)"),
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
                     "multiprocessing", "socket", "ctypes", "SIG_IGN", "_thread", "threading", "_posixsubprocess",
                     "fork_exec", "posix_spawn", "posix_spawnp", "spawnv", "spawnve", "execv", "execve"],
                    "processes, signals, threads or the network"),
    **dict.fromkeys(["ThreadPoolExecutor", "ProcessPoolExecutor", "InterpreterPoolExecutor", "Executor", "ThreadPool",
                     "Pool", "concurrent", "run_in_executor", "to_thread"],
                    "an executor or pool (runs code on another thread or process, out of the checker's sight)"),
    **dict.fromkeys(["__dict__", "vars"], "reaches a module's or object's attributes by name"),
    **dict.fromkeys(["runpy", "getsource", "getsourcelines", "linecache"],
                    "reads or runs source code at run time (labkit's, edited, is not the learner's own)"),
    "QueueListener": "a thread of the standard library that runs the learner's handlers",
    "callbacks": "a callback the interpreter runs (gc's too), whenever it likes: while the grader answers",
}
_LAB_NAMES = {"02": {"nll_loss": "torch's nll_loss: the second half of F.cross_entropy, which the exercise forbids",
                     "NLLLoss": "torch's NLLLoss: the second half of F.cross_entropy, which the exercise forbids",
                     "CrossEntropyLoss": "torch's ready-made loss (it runs F.cross_entropy, which the exercise "
                                         "forbids)"}}
MAX_CELL_BYTES = 200_000  # a cell larger than this is not read (the review's cost stays bounded); the note says so
MAX_REVIEWED_BYTES = 2_000_000  # nor anything past this much code in all
_MODULE_PREFIXES = {"labkit.exercises.checking": "reaches into labkit's checker",
                    "labkit.exercises.calling": "reaches into labkit's checker",
                    "labkit.exercises.definitions": "reaches into labkit's checker",
                    "labkit.exercises.comparing": "reaches into labkit's checker",
                    "labkit.exercises.deadline": "reaches into labkit's checker",
                    "labkit.instructor": "reaches into labkit's grader", "nbformat": "reads notebooks",
                    "torch._": "a private torch name (a lower-level route to a function)",
                    "torch.ops": "a private torch name (a lower-level route to a function)"}
_STRINGS = {"solutions": "names the solution notebooks", ".ipynb": "names a notebook file",
            "/job": "names the grader's folder inside the wall (where the grader's own files were)"}


def review_notebook(notebook: Any, lab: str) -> list[Finding]:
    """What in the notebook's code cells deserves the instructor's look: a :class:`Finding` each (cell, line, what).

    Names follow the data: an import anywhere in the notebook (a course cell's too, as lab 01's ``sampling``)
    names what its alias stands for in every cell. A cell over :data:`MAX_CELL_BYTES` (or past
    :data:`MAX_REVIEWED_BYTES` of code in all) is not read, and the finding says so.
    """
    references = _reference_names(lab)
    course = course_cells(lab)
    found: list[dict[str, Any]] = []
    trees: list[tuple[int, Any, bool]] = []
    read = 0
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        source = cell.source if isinstance(cell.source, str) else ""
        if len(source) > MAX_CELL_BYTES or read + len(source) > MAX_REVIEWED_BYTES:
            found.append(Finding(index, 1, f"a cell of {len(source):,} characters: not reviewed (the review "
                                 f"reads cells up to {MAX_CELL_BYTES:,} and {MAX_REVIEWED_BYTES:,} in all)"))
            continue
        read += len(source)
        try:
            tree = ast.parse(python_of(source))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            if source.strip() not in course:
                found.append(Finding(index, 1, "code that does not parse as Python"))
            continue
        trees.append((index, tree, source.strip() in course))
    imported: dict[str, str] = {}
    for _, tree, _ in trees:
        imported.update(_imports(tree))
    extra = _LAB_NAMES.get(str(lab), {})
    shapes = _reference_shapes(lab)
    for index, tree, is_course in trees:
        if is_course:
            continue
        seen: set[tuple[int, str]] = set()
        for line, what in [*_findings(tree, references, imported, extra), *_routes(tree, imported),
                           *_resemblances(tree, shapes)]:
            if (line, what) not in seen:
                seen.add((line, what))
                found.append(Finding(index, line, printable(what)))
    return found


def _imports(tree: ast.AST) -> dict[str, str]:
    """local name -> what it stands for: ``import a.b as c`` -> c: a.b; ``from a import b as c`` -> c: a.b."""
    imported: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                imported[(alias.asname or alias.name).split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return imported


def refusals(notebook: Any, refused: Any) -> list[Finding]:
    """What the grader's audit hook refused while the notebook ran (``labkit.instructor.wall.answering``: each with the
    refused line's number and text), as findings: the cell is the first code cell holding that line, or None."""
    found = []
    for item in (refused if isinstance(refused, list) else [])[:20]:
        if not isinstance(item, dict):
            continue
        text, line = str(item.get("text") or "")[:200], item.get("line")
        cell = next((index for index, entry in enumerate(notebook.cells) if entry.cell_type == "code" and text and
                     text in [row.strip() for row in str(entry.source).splitlines()]), None)
        found.append(Finding(cell, line if type(line) is int else 0, printable(
            f"refused while it ran: {str(item.get('what'))[:120]}" + (f" ({text})" if text else ""))))
    return found


def _reference_names(lab: str) -> set[str]:
    """The labkit functions that answer this lab's code exercises (the allowed helpers excepted)."""
    try:
        from labkit.exercises import exercises

        chosen = exercises(lab)
    except Exception:  # noqa: BLE001 - an unknown lab has no references to look for
        return set()
    names, allowed = set(), set()
    for exercise in chosen:
        allowed |= {getattr(item, "__name__", None) for item in exercise.allowed}
        if exercise.kind == "code":
            name = getattr(exercise.reference, "__name__", None)
            if name and getattr(exercise.reference, "__module__", "").startswith("labkit"):
                names.add(name)
    return names - allowed  # a helper another exercise of the lab may call is no one's giveaway


@functools.cache  # the references' source is read once per process, not once per submission
def _reference_shapes(lab: str) -> dict[str, str]:
    """The shape (:func:`_shape`) of each labkit function answering a code exercise of this lab -> its full name.
    Only references: the bug zoo's mistakes are what learners write, and writing one is never a resemblance."""
    import inspect

    try:
        from labkit.exercises import exercises

        chosen = [e.reference for e in exercises(lab) if e.kind == "code" and e.reference.__module__.startswith("labkit")]
        return {_shape(ast.parse(inspect.getsource(reference)).body[0]):
                f"{reference.__module__}.{reference.__qualname__}" for reference in chosen}
    except Exception:  # noqa: BLE001 - an unknown lab, or no source to compare with: no resemblance to report
        return {}


def _shape(definition: ast.AST) -> str:
    """A function's code modulo its names: identifiers and arguments renamed in order of appearance, docstrings,
    decorators and annotations dropped; attribute names (``torch.softmax``) and constants kept."""
    definition, renamed = copy.deepcopy(definition), {}
    for node in ast.walk(definition):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.name, node.returns, node.decorator_list = "f", None, []
            first = node.body[0].value if isinstance(node.body[0], ast.Expr) else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                node.body = node.body[1:] or [ast.Pass()]
        elif isinstance(node, ast.Name):
            node.id = renamed.setdefault(node.id, f"v{len(renamed)}")
        elif isinstance(node, ast.arg):
            node.arg, node.annotation = renamed.setdefault(node.arg, f"v{len(renamed)}"), None
    return ast.dump(definition, annotate_fields=False)


def _resemblances(tree: ast.AST, shapes: dict[str, str]):
    """Functions whose code equals a reference's but for its names: retyping labkit's open-source answer makes a
    correct function, so this is for the instructor's eyes only (the points are what the cases computed)."""
    for node in ast.walk(tree) if shapes else ():
        try:
            matched = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and shapes.get(_shape(node))
        except RecursionError:  # a tree deep enough to parse but not to copy: its other findings still count
            continue
        if matched:
            yield node.lineno, (f"defines {node.name}: its code is {matched}'s (labkit's reference answer) "
                                "but for its names; the points are what the cases computed")


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _findings(tree: ast.AST, references: set[str], imported: dict[str, str], extra: dict[str, str]):
    names = {**_NAMES, **extra}
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
                if alias.name in names or (module or "").split(".")[-1] in names:
                    yield line, f"imports {full}: {names.get(alias.name) or names[(module or '').split('.')[-1]]}"
        elif isinstance(node, (ast.Name, ast.Attribute)):
            identifier = node.id if isinstance(node, ast.Name) else node.attr
            dotted = _dotted(node) or identifier
            if identifier in names:
                yield line, f"{dotted}: {names[identifier]}"
            root = dotted.split(".")[0]
            full = ".".join([imported.get(root, root), *dotted.split(".")[1:]])
            if full.startswith(("torch._", "torch.ops")) and not full.startswith("torch.__") and "." in full:
                yield line, f"{dotted}: {_MODULE_PREFIXES['torch._']}"
            if full.startswith("labkit") and full.rsplit(".", 1)[-1] in references and full.count("."):
                yield line, f"{dotted}: labkit's reference answer to an exercise of this lab"
            elif isinstance(node, ast.Attribute) and identifier in references:
                yield line, f"{dotted}: labkit's reference answer to an exercise of this lab (by its name)"
            if isinstance(node, ast.Attribute) and isinstance(getattr(node, "ctx", None), ast.Store) and \
                    root in imported:
                yield line, f"{dotted} = ...: replaces a library's function or value"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in references:  # getattr(module, "the reference"), importlib's spelling of it
                yield line, f"the string {node.value!r} names labkit's reference answer to an exercise of this lab"
            for needle, what in _STRINGS.items():
                if needle in node.value:
                    yield line, f"the string {node.value[:40]!r}: {what}"
            for word in names:
                if len(word) > 4 and _spelled(node.value, word):
                    yield line, f"the string {node.value[:40]!r} spells {word}: {names[word]}"
        elif isinstance(node, ast.ClassDef) and any(_dotted(base) in ("torch.Tensor", "Tensor") for base in node.bases):
            yield line, f"class {node.name}(torch.Tensor): a tensor type whose comparisons can lie"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
            yield line, f"defines {node.name}: {names[node.name]}"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "setattr":
                yield line, "setattr(...): replaces an attribute by name"
            if node.func.id in ("getattr", "setattr", "delattr", "hasattr") and len(node.args) >= 2 and not (
                    isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
                yield line, f"{node.func.id} with a name built at run time: reaches any attribute, a switch-off too"


_BUILDERS = {"types.FunctionType", "types.CodeType", "types.LambdaType", "types.MethodType"}
_INTROSPECTION = ("inspect.", "dis.", "gc.")
_BUILTIN_TYPES = {"str", "bytes", "int", "float", "tuple", "list", "dict", "set", "frozenset", "bytearray"}
_MEMBER_SEARCHES = {"dir", "vars", "inspect.getmembers", "inspect.getmembers_static"}


def _routes(tree: ast.AST, imported: dict[str, str]):
    """The shapes of the routes around the grader's answering step, whatever they are called: building function or
    code objects (directly, by a type read at run time, through ``__reduce__``), ``inspect``/``dis``/``gc`` on
    labkit's objects, a value of a built-in type whose methods are the learner's, a search over a module's members."""
    def full(node: ast.AST) -> str:
        dotted = _dotted(node) or ""
        root, _, rest = dotted.partition(".")
        return ".".join(filter(None, [imported.get(root, root), rest]))

    def labkit_argument(call: ast.Call) -> str | None:
        for argument in [*call.args, *(keyword.value for keyword in call.keywords)]:
            for inner in ast.walk(argument):
                name = full(inner) if isinstance(inner, (ast.Name, ast.Attribute)) else ""
                if name.startswith("labkit"):
                    return _dotted(inner)
        return None

    for node in ast.walk(tree):
        line = getattr(node, "lineno", 1)
        if isinstance(node, ast.Call):
            called = full(node.func)
            if called in _BUILDERS or (isinstance(node.func, ast.Call) and _dotted(node.func.func) == "type"):
                yield line, "builds a function or code object (a copy of labkit's reference would answer for it)"
            elif isinstance(node.func, ast.Attribute) and node.func.attr == "replace" and any(
                    (keyword.arg or "").startswith("co_") for keyword in node.keywords):
                yield line, "builds a code object from another (code.replace)"
            reached = labkit_argument(node)
            if called.startswith(_INTROSPECTION) and reached:
                yield line, f"{called} on labkit's {reached}: reads labkit's code or objects at run time"
            if called in _MEMBER_SEARCHES and (reached or called.startswith("inspect.")):
                yield line, (f"{called}({reached or '...'}): a search over an object's members, which reaches a "
                             "function without naming it")
        elif isinstance(node, ast.ClassDef):
            methods = [item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]
            if {"__reduce__", "__reduce_ex__", "__setstate__"} & set(methods):
                yield line, (f"class {node.name} defines how copy or pickle rebuilds it: any callable with any "
                             "arguments (a function from a code object)")
            builtin = [_dotted(base) for base in node.bases if _dotted(base) in _BUILTIN_TYPES]
            if builtin and methods:
                yield line, (f"class {node.name}({builtin[0]}) overrides {', '.join(methods[:3])}: a built-in value "
                             "whose methods are the learner's code, run wherever the value goes")


def _spelled(text: str, word: str) -> bool:
    """``word`` stands in ``text`` as an identifier would (not inside a longer word, e.g. 'killed' for 'kill').

    >>> _spelled("os.kill(pid)", "kill"), _spelled("it was killed", "kill")
    (True, False)
    """
    return word in text and re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text) is not None
