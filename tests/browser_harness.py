"""The workbook in a real browser: JupyterLab on localhost, Debian's Chromium driven by Playwright.

Lives with the tests because ``tests/test_browser.py`` (what must hold) is what it is for; ``python -m benchmarks
browser`` (how fast it feels, ``benchmarks/browser.py``) imports it from here, so the tests never reach into
``benchmarks/``:

- :class:`JupyterLab` starts a server on a free localhost port with its own config, data, runtime and settings
  folders (nothing of the user's is read or written), on a copy of the learner notebooks (autosave never touches
  the repository), kernels at ``OMP_NUM_THREADS=1`` unless told otherwise, and stops it by its own process id;
- :func:`open_notebook` opens one notebook in a fresh workspace, :func:`run_all` runs every cell and waits for
  the kernel to go idle with no cell left queued or running;
- :func:`explorers` finds every explorer on the page (a widget output holding an image), :func:`drive` moves
  each kind of control and records what changed (the picture, the numbers, the picture's text) and how long the
  page took to show the new image; :func:`picture_texts` reads every picture's text alternative (an ``<img
  alt>``, or an explorer's caption, ``labkit.explorers.canvas.CAPTION_CLASS``);
- :func:`layout_problems` lists what a person would see wrong: a readout or slider handle covered, a label cut,
  an image stretched, an explorer wider than the output area, or controls and figure taller than one screen.

Never asserts on time.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cpu_profiles

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("LABKIT_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = ROOT / "build" / "browser"  # screenshots for a person to look at (git ignores build/)
CAPTION = "labkit-alt"  # labkit.explorers.canvas.CAPTION_CLASS, the class the scripts below look for (a test compares)
# At more than one thread a kernel's OpenMP threads sleep when they have no work instead of spinning: beside other
# busy processes (the other test workers, Chromium) spinning threads steal each other's turns. Measured here: lab
# 02's learner copy, two runs at once at two threads each, 90 s a run spinning and 14 s sleeping (14 s at one
# thread). Only the speed changes: the work is split across the same threads, so the sums come out the same.
PASSIVE = "PASSIVE"
VIEWPORTS = {"1280x800, file browser open": (1280, 800, True), "1024x768, file browser closed": (1024, 768, False)}


def missing() -> str | None:
    """Why the browser test cannot run here, or None."""
    if not Path(CHROMIUM).exists():
        return f"Chromium not found at {CHROMIUM}: `apt-get install chromium` (README, set-up) or set LABKIT_CHROMIUM"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed: `make setup` installs labkit[dev]"
    return None


def learner_notebooks() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def saved_explorer_outputs(notebook: Path) -> int:
    """Outputs in the file that are explorers: a widget view with its picture (labkit.explorers.base.Explorer)."""
    cells = json.loads(notebook.read_text())["cells"]
    return sum(1 for cell in cells for output in cell.get("outputs", ())
               if {"application/vnd.jupyter.widget-view+json", "image/png"} <= set(output.get("data", {})))


# ---------------------------------------------------------------------------------------------------------------
# The server


class JupyterLab:
    """JupyterLab on 127.0.0.1 with everything of its own in a temporary folder; a context manager."""

    def __init__(self, notebooks: list[Path], kernel_threads: str | None = "1"):
        self.notebooks = notebooks
        self.kernel_threads = kernel_threads  # the kernels' OMP_NUM_THREADS; None: the machine's default
        self.home = Path(tempfile.mkdtemp(prefix="labkit-browser-"))
        self.token = os.urandom(12).hex()
        self.port = _free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "JupyterLab":
        root = self.home / "notebooks"
        root.mkdir()
        for notebook in self.notebooks:
            shutil.copy(notebook, root / notebook.name)
        folders = {name: self.home / name for name in ("config", "data", "runtime", "settings", "workspaces",
                                                       "ipython")}
        for folder in folders.values():
            folder.mkdir()
        # No news or update checks (no network here), and every cell rendered (no windowing), so outputs far down
        # the notebook exist in the page.
        (folders["config"] / "labconfig").mkdir()
        (folders["config"] / "labconfig" / "page_config.json").write_text(json.dumps({"disabledExtensions": {
            "@jupyterlab/apputils-extension:announcements": True}}))
        tracker = folders["settings"] / "@jupyterlab" / "notebook-extension"
        tracker.mkdir(parents=True)
        (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
        # The learner copies compute natively: under `make test` this process runs as another processor
        # (tests/cpu_profiles.py), and the solution notebooks' nbval run is the foreign half of the proof.
        env = {**cpu_profiles.native_environment(dict(os.environ)), "JUPYTER_CONFIG_DIR": str(folders["config"]), "JUPYTER_DATA_DIR": str(folders["data"]),
               "JUPYTER_RUNTIME_DIR": str(folders["runtime"]), "JUPYTERLAB_SETTINGS_DIR": str(folders["settings"]),
               "JUPYTERLAB_WORKSPACES_DIR": str(folders["workspaces"]), "IPYTHONDIR": str(folders["ipython"]),
               "OMP_NUM_THREADS": self.kernel_threads or "", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "LABKIT_PROGRESS": str(self.home / "progress.json")}
        env.pop("JUPYTER_PATH", None)
        if self.kernel_threads is None:
            env.pop("OMP_NUM_THREADS")
        if self.kernel_threads != "1":
            env.setdefault("OMP_WAIT_POLICY", PASSIVE)
        self.cpu_profile = cpu_profiles.describe(env)  # named when a checked output differs
        command = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={self.port}", "--ip=127.0.0.1",
                   f"--ServerApp.token={self.token}", f"--ServerApp.root_dir={root}",
                   "--LabApp.expose_app_in_browser=True", "--ServerApp.open_browser=False",
                   "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        if os.getuid() == 0:
            command.append("--allow-root")
        self.log = open(self.home / "server.log", "wb")
        self.process = subprocess.Popen(command, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"JupyterLab exited: {(self.home / 'server.log').read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"{self.url}/api/status?token={self.token}", timeout=2)
                return self
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError("JupyterLab did not answer within 90 s")

    def stop(self) -> None:
        """Stop the server and its kernels (its own process group, by the server's pid)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        shutil.rmtree(self.home, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(playwright: Any) -> Any:
    return playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu",
                                                                      "--disable-dev-shm-usage"])


# ---------------------------------------------------------------------------------------------------------------
# Notebooks


@dataclass
class PageLog:
    """Console errors and uncaught page errors seen since the page opened."""

    errors: list[str] = field(default_factory=list)

    def attach(self, page: Any) -> None:
        page.on("console", lambda message: message.type == "error" and self.errors.append(message.text))
        page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error}"))


def open_notebook(browser: Any, lab: JupyterLab, name: str, viewport: tuple[int, int, bool]) -> tuple[Any, PageLog]:
    """A new page on ``name`` in a fresh workspace, with the kernel started and idle."""
    width, height, sidebar = viewport
    page = browser.new_page(viewport={"width": width, "height": height})
    log = PageLog()
    log.attach(page)
    workspace = f"w{os.urandom(4).hex()}"
    # 120 s, not the default 30: on a machine loaded by other jobs JupyterLab's page can take longer to load.
    page.goto(f"{lab.url}/lab/workspaces/{workspace}/tree/{name}?reset&token={lab.token}", timeout=120_000)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                           " && window.jupyterapp.shell.currentWidget.sessionContext", timeout=90_000)
    page.evaluate("""async () => {
        const panel = window.jupyterapp.shell.currentWidget;
        await panel.context.ready; await panel.sessionContext.ready;
    }""")
    _wait_idle(page)
    page.evaluate("(open) => { const shell = window.jupyterapp.shell;"
                  " if (open) { window.jupyterapp.commands.execute('filebrowser:activate'); }"
                  " else { shell.collapseLeft(); } }", sidebar)
    page.wait_for_timeout(300)
    return page, log


def close_notebook(page: Any) -> None:
    """Shut the notebook's kernel down (its model and memory go with it), then close the page."""
    try:
        page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
    finally:
        page.close()


def _wait_idle(page: Any, timeout_ms: int = 120_000) -> None:
    page.wait_for_function("""() => {
        const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session?.kernel;
        return kernel && kernel.status === 'idle';
    }""", timeout=timeout_ms)


def run_all(page: Any, timeout_ms: int = 300_000) -> float:
    """Run every cell; return the seconds until no cell is queued or running and the kernel is idle."""
    started = time.monotonic()
    page.evaluate("() => { window.__labkitRun = window.jupyterapp.commands.execute('notebook:run-all-cells')"
                  ".then(() => { window.__labkitRunDone = true; }); }")
    page.wait_for_function("""() => {
        if (!window.__labkitRunDone) return false;
        const panel = window.jupyterapp.shell.currentWidget;
        const busy = panel.content.widgets.some(c => c.model.type === 'code' && c.promptNode
            && c.promptNode.textContent.includes('*'));
        return !busy && panel.sessionContext.session.kernel.status === 'idle';
    }""", timeout=timeout_ms, polling=250)
    return time.monotonic() - started


def outputs(page: Any) -> list[dict[str, Any]]:
    """Every code cell's outputs as nbformat dicts, with the cell's index."""
    return page.evaluate("""() => {
        const panel = window.jupyterapp.shell.currentWidget;
        const found = [];
        panel.content.widgets.forEach((cell, index) => {
            if (cell.model.type !== 'code') return;
            for (const output of cell.model.outputs.toJSON()) found.push({cell: index, ...output});
        });
        return found;
    }""")


def executed_notebook(notebook: Path, shown: list[dict[str, Any]]) -> dict[str, Any]:
    """``notebook``'s file as a dict with every code cell's outputs replaced by those the page shows (:func:`outputs`):
    the notebook as this Run All left it."""
    executed = json.loads(notebook.read_text(encoding="utf-8"))
    for cell in executed["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"] = []
    for output in shown:
        output = dict(output)
        executed["cells"][output.pop("cell")]["outputs"].append(output)
    return executed


def widget_texts(page: Any) -> dict[int, str]:
    """Cell index -> the text the page shows of that cell's widgets (an explorer's labels, readouts and caption):
    what a learner reads of an explorer, which the file's outputs hold only as a model id."""
    found = page.evaluate("""() => {
        const panel = window.jupyterapp.shell.currentWidget;
        const texts = {};
        panel.content.widgets.forEach((cell, index) => {
            if (cell.model.type !== 'code' || !cell.outputArea) return;
            const widgets = [...cell.outputArea.node.querySelectorAll('.jupyter-widgets')]
                .filter(e => !e.parentElement.closest('.jupyter-widgets'));
            if (widgets.length) texts[index] = widgets.map(e => e.innerText).join('\\n');
        });
        return texts;
    }""")
    return {int(index): text for index, text in found.items()}


def checked_output_differences(notebook: Path, shown: list[dict[str, Any]]) -> list[str]:
    """How the outputs the page shows differ from ``notebook``'s saved ones, in the cells nbval checks.

    The browser's Run All is the learner notebook's nbval run (``make test`` does not execute it a third time):
    the cells nbval would check under ``--nbval-lax`` (tag ``nbval-check-output`` or its comment marker) are
    compared here by nbval's own code (its marker parsing, stream merging, sanitizing with
    ``tests/nbval_sanitize.cfg`` and ``IPyNbCell.compare_outputs``), so the check is the one nbval makes. ``shown``
    is :func:`outputs`. One line per cell that differs, with nbval's own account of the difference.
    """
    import nbformat
    from nbval import plugin

    notebook_node = nbformat.read(notebook, as_version=4)
    patterns = plugin.get_sanitize_patterns((ROOT / "tests" / "nbval_sanitize.cfg").read_text())
    by_cell: dict[int, list[Any]] = {}
    for output in shown:
        output = dict(output)
        index = output.pop("cell")
        for key in ("text",):  # JupyterLab may hand back a list of lines where the file holds one string
            if isinstance(output.get(key), list):
                output[key] = "".join(output[key])
        if isinstance(output.get("data"), dict):
            output["data"] = {mime: "".join(value) if isinstance(value, list) else value
                              for mime, value in output["data"].items()}
        by_cell.setdefault(index, []).append(nbformat.from_dict(output))
    differences = []
    for index, cell in enumerate(notebook_node.cells):
        if cell.cell_type != "code" or cell.execution_count is None:
            continue
        options = dict(plugin.find_metadata_tags(cell.metadata))
        options.update(plugin.find_comment_markers(cell.source))
        if not options.get("check", False):  # --nbval-lax: only the marked cells are compared
            continue
        comparison = _NbvalCell(patterns)
        if not comparison.compare_outputs(plugin.coalesce_streams(by_cell.get(index, [])),
                                          plugin.coalesce_streams(cell.outputs)):
            differences.append(f"cell {index}: " + "\n".join(map(str, comparison.comparison_traceback))[:1500])
    return differences


class _NbvalCell:
    """What nbval's ``IPyNbCell.compare_outputs`` reads of the cell it runs in, around outputs from the browser.

    ``skip_compare`` is ``IPyNbFile``'s own list without ``--nbdime`` (nbval builds it in the constructor of a
    collector that needs a pytest session, so it is restated here; tests/test_browser.py checks it against nbval's).
    """

    from nbval.plugin import IPyNbCell as _Cell, nocolors as colors

    SKIP_COMPARE = ("metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
                    "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg")
    compare_outputs = _Cell.compare_outputs
    format_output_compare = _Cell.format_output_compare
    sanitize = _Cell.sanitize

    def __init__(self, patterns: list[tuple[str, str]]) -> None:
        from collections import OrderedDict
        from types import SimpleNamespace

        self.parent = SimpleNamespace(skip_compare=self.SKIP_COMPARE, sanitize_patterns=OrderedDict(patterns))
        self.ihook = SimpleNamespace(pytest_assertrepr_compare=lambda **kwargs: [])  # nbval's plain diff, then
        self.config = None
        self.comparison_traceback: list[str] = []


# ---------------------------------------------------------------------------------------------------------------
# Explorers


def explorers(page: Any) -> list[Any]:
    """The root element of every explorer on the page: a widget output that holds an image."""
    roots = page.locator(".jp-OutputArea-output > .jupyter-widgets.widget-vbox, "
                         ".jp-OutputArea-output > .jupyter-widgets.widget-box")
    return [roots.nth(i) for i in range(roots.count()) if roots.nth(i).locator("img").count()]


_ARM = """(root) => {
    const img = root.querySelector('img');
    const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
    const state = {t0: null, t1: null, src: img.src, busy: false, idleAt: null};
    const start = () => { if (state.t0 === null) state.t0 = performance.now(); };
    for (const type of ['keydown', 'pointerdown', 'change']) document.addEventListener(type, start, true);
    state.observer = new MutationObserver(() => {
        if (img.src !== state.src && state.t1 === null) { state.t1 = performance.now(); }
    });
    state.observer.observe(img, {attributes: true, attributeFilter: ['src']});
    state.onStatus = (_, status) => {
        if (status === 'busy') { state.busy = true; state.idleAt = null; }
        else if (status === 'idle' && state.busy) { state.idleAt = performance.now(); }
    };
    kernel.statusChanged.connect(state.onStatus);
    state.stop = () => { for (const type of ['keydown', 'pointerdown', 'change'])
        document.removeEventListener(type, start, true);
        state.observer.disconnect(); kernel.statusChanged.disconnect(state.onStatus); };
    window.__labkitMove = state;
}"""

# The numbers an explorer shows: its readouts, labels and HTML blocks, less the picture's caption (its own check).
_NUMBERS = """[...root.querySelectorAll('.widget-html, .widget-readout, .widget-label')]
        .filter(e => !e.querySelector('.labkit-alt')).map(e => e.innerText || e.value || '')"""
_TEXT = f"""(root) => {{
    const texts = {_NUMBERS};
    return texts.join('|');
}}"""
_ALT = """(root) => {
    const caption = root.querySelector('.labkit-alt');
    const img = root.querySelector('img');
    return (caption ? caption.innerText : '') || (img && (img.alt || img.getAttribute('aria-label'))) || '';
}"""

# Done when the kernel has been idle a moment after a busy spell and the explorer shows the change (a new image or
# new numbers), or when it has been idle for QUIET_MS with nothing changed. Waiting for the change, not for the
# first busy -> idle pair, matters: that pair can belong to a message sent before the move (a slider's last
# step), and the move's own update then lands after the check (seen as "the toggle changed nothing").
QUIET_MS = 1500
_MOVED = f"""([root, before, quietMs]) => {{
    const s = window.__labkitMove;
    const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
    if (s.idleAt === null || kernel.status !== 'idle') return false;
    const idleFor = performance.now() - s.idleAt;
    if (idleFor < 80) return false;
    const texts = {_NUMBERS};
    return s.t1 !== null || texts.join('|') !== before || idleFor > quietMs;
}}"""


@dataclass
class Move:
    kind: str  # slider, dropdown, toggle, button
    name: str  # the control's description
    picture_changed: bool
    numbers_changed: bool
    latency_ms: float | None  # event -> the page shows the new image
    alt_changed: bool = False  # the picture's text alternative changed
    alt: str = ""  # the text alternative after the move


def picture_text(root: Any) -> str:
    """An explorer's picture text: its caption (or its image's alt / aria-label)."""
    return root.evaluate(_ALT).strip()


def picture_texts(page: Any) -> list[dict[str, Any]]:
    """Every picture in the notebook's outputs: ``{cell, alt, explorer}``; an explorer's text is its caption."""
    return page.evaluate("""() => {
        const panel = window.jupyterapp.shell.currentWidget;
        const found = [];
        panel.content.widgets.forEach((cell, index) => {
            if (cell.model.type !== 'code') return;
            for (const img of cell.node.querySelectorAll('.jp-OutputArea-output img')) {
                const widget = img.closest('.jupyter-widgets');
                const caption = widget && widget.closest('.jp-OutputArea-output').querySelector('.labkit-alt');
                const alt = widget ? (caption ? caption.innerText : '')
                    : (img.alt || img.getAttribute('aria-label') || '');
                found.push({cell: index, alt: alt.trim(), explorer: Boolean(widget)});
            }
        });
        return found;
    }""")


def _move(page: Any, root: Any, act: Any, kind: str, name: str, timeout_ms: int = 120_000) -> Move:
    # The timeout only catches a control that never answers (the latency is measured, not bounded, here): 10 s, then
    # 30 s, ran out for lab 05's model dropdown while three test workers, the grader's walled kernels and a browser
    # shared two cores (0.03 s in Python; 35 s for that lab's whole browser test alone).
    before_text = root.evaluate(_TEXT)
    before_alt = picture_text(root)
    root.evaluate(_ARM)
    act()
    page.wait_for_function(_MOVED, arg=[root.element_handle(), before_text, QUIET_MS], timeout=timeout_ms,
                           polling=20)
    _settle(page)
    state = page.evaluate("() => { const s = window.__labkitMove; s.stop();"
                          " return {t0: s.t0, t1: s.t1}; }")
    changed_text = root.evaluate(_TEXT) != before_text
    alt = picture_text(root)
    latency = state["t1"] - state["t0"] if state["t1"] is not None and state["t0"] is not None else None
    return Move(kind, name, state["t1"] is not None, changed_text, latency, alt != before_alt, alt)


def _settle(page: Any) -> None:
    """Wait until the kernel has handled everything the last move sent."""
    _wait_idle(page, 60_000)
    page.wait_for_timeout(30)


def _label(control: Any) -> str:
    label = control.locator(".widget-label")
    return label.first.inner_text().strip() if label.count() else "?"


def drive(page: Any, root: Any, slider_moves: int = 24) -> list[Move]:
    """Move every kind of control in the explorer; at least ``slider_moves`` slider moves for the latency."""
    moves: list[Move] = []
    root.scroll_into_view_if_needed()
    sliders = root.locator(".widget-slider")
    handles = [sliders.nth(i).locator(".noUi-handle").first for i in range(sliders.count())]
    names = [_label(sliders.nth(i)) for i in range(sliders.count())]
    # Sliders, by keyboard: a page step (5 steps) away and back, so every move changes the value and the others
    # keep their effect; a slider at its top steps down first.
    n_rounds = max(1, -(-slider_moves // max(1, 2 * len(handles))))
    for round_number in range(n_rounds):
        for handle, name in zip(handles, names):
            at_max = handle.get_attribute("aria-valuenow") == handle.get_attribute("aria-valuemax")
            for key in (("PageDown", "PageUp") if at_max else ("PageUp", "PageDown")):
                handle.focus()
                moves.append(_move(page, root, lambda: page.keyboard.press(key), "slider", name))
    # Leave every slider one page step away from its start, so toggles (e.g. an order of operations) matter.
    for handle in handles:
        at_max = handle.get_attribute("aria-valuenow") == handle.get_attribute("aria-valuemax")
        handle.focus()
        page.keyboard.press("PageDown" if at_max else "PageUp")
        _settle(page)
    # Dropdowns: the next option (and the one after, when two presets happen to show the same numbers).
    selects = root.locator(".widget-dropdown select")
    for i in range(selects.count()):
        select = selects.nth(i)
        options = select.locator("option")
        values = [options.nth(j).get_attribute("value") for j in range(options.count())]
        for step in range(1, min(4, len(values))):
            target = values[(values.index(select.input_value()) + 1) % len(values)]
            move = _move(page, root, lambda: select.select_option(target), "dropdown",
                         _label(root.locator(".widget-dropdown").nth(i)))
            if move.picture_changed or move.numbers_changed:
                break
        moves.append(move)
    # Toggle buttons: a button that is not the active one.
    groups = root.locator(".widget-toggle-buttons")
    for i in range(groups.count()):
        other = groups.nth(i).locator("button:not(.mod-active)").first
        name = _label(groups.nth(i)) or " / ".join(groups.nth(i).locator("button").all_inner_texts())
        moves.append(_move(page, root, lambda: other.click(), "toggle", name))
    # Buttons (not toggles): a new prompt first where there is a text box, so running the model changes things.
    texts = root.locator(".widget-text input[type=text]")
    if texts.count():
        texts.first.fill("Name a colour.")
        page.wait_for_timeout(200)
        _settle(page)
    buttons = root.locator(":scope button.jupyter-button:not(.widget-toggle-button)")
    for i in range(buttons.count()):
        button = buttons.nth(i)
        moves.append(_move(page, root, lambda: button.click(), "button", button.inner_text().strip(), 60_000))
    return moves


_LAYOUT = """([root, oneScreen]) => {
    const problems = [];
    const output = root.closest('.jp-OutputArea-output') || root.parentElement;
    const outRect = output.getBoundingClientRect();
    const describe = (e) => (e.innerText || e.getAttribute('aria-label') || e.className).toString().slice(0, 40);
    // 1. readouts and handles are on top where a person would click or read them
    for (const e of root.querySelectorAll('.widget-readout, .noUi-handle')) {
        e.scrollIntoView({block: 'center'});
        const r = e.getBoundingClientRect();
        const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
        if (!(hit && (hit === e || e.contains(hit) || hit.contains(e) && hit.classList.contains('noUi-touch-area'))))
            problems.push(`covered: ${describe(e)} (under ${hit ? hit.className : 'nothing'})`);
    }
    root.scrollIntoView({block: 'start'});
    // 2. no label, button or readout cut off
    for (const e of root.querySelectorAll('.widget-label, button, .widget-readout, .widget-html-content')) {
        if (e.offsetParent === null) continue;
        if (e.scrollWidth > e.clientWidth + 1) problems.push(`clipped: "${describe(e)}" `
            + `(${e.scrollWidth} px of text in ${e.clientWidth} px)`);
    }
    // 3. images keep their aspect
    for (const img of root.querySelectorAll('img')) {
        const r = img.getBoundingClientRect();
        if (!img.naturalWidth || !r.height) { problems.push('image not loaded'); continue; }
        const ratio = (r.width / r.height) / (img.naturalWidth / img.naturalHeight);
        if (Math.abs(ratio - 1) > 0.05) problems.push(`image stretched: ${img.naturalWidth}x${img.naturalHeight}`
            + ` shown ${Math.round(r.width)}x${Math.round(r.height)}`);
        if (r.width > img.naturalWidth * 1.05)
            problems.push(`image scaled up ${(r.width / img.naturalWidth).toFixed(2)}x`);
    }
    // 4. nothing wider than the output area
    for (const e of [root, ...root.querySelectorAll('*')]) {
        const r = e.getBoundingClientRect();
        if (r.width && r.right > outRect.right + 1) {
            problems.push(`wider than the output (${Math.round(outRect.width)} px): ${describe(e)} ends at `
                + `${Math.round(r.right - outRect.left)} px`);
            break;
        }
    }
    // 5. controls and figure on one screen
    const parts = [...root.querySelectorAll('.widget-slider, .widget-dropdown, .widget-toggle-buttons, img')];
    const top = Math.min(...parts.map(e => e.getBoundingClientRect().top));
    const bottom = Math.max(...parts.map(e => e.getBoundingClientRect().bottom));
    if (bottom - top > oneScreen) problems.push(`controls and figure are ${Math.round(bottom - top)} px tall, `
        + `the notebook shows ${Math.round(oneScreen)} px`);
    return problems;
}"""


def layout_problems(page: Any, root: Any) -> list[str]:
    """What a person would see wrong in this explorer at the page's current size."""
    one_screen = page.evaluate("() => window.jupyterapp.shell.currentWidget.content.node.clientHeight")
    return page.evaluate(_LAYOUT, [root.element_handle(), one_screen])


def screenshot(page: Any, root: Any, name: str) -> Path:
    """The page as a person sees it with the explorer scrolled to the top of the notebook."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    root.evaluate("(e) => e.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(100)
    page.screenshot(path=str(path))
    return path


def resize(page: Any, viewport: tuple[int, int, bool]) -> None:
    """Another window size, with the file browser open or closed."""
    width, height, sidebar = viewport
    page.set_viewport_size({"width": width, "height": height})
    page.evaluate("(open) => open ? window.jupyterapp.commands.execute('filebrowser:activate')"
                  " : window.jupyterapp.shell.collapseLeft()", sidebar)
    page.wait_for_timeout(400)
