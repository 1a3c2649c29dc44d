"""Every learner notebook in a real browser, as a learner would use it: JupyterLab on localhost, Chromium.

For each notebook: open it in a fresh workspace, Run All, wait for the kernel to go idle; no error output, no
browser-console error, and every output nbval checks equal to the saved one (compared by nbval's own code: this
Run All is the learner notebook's nbval run under ``make test``, which does not execute it again). For each explorer found on the page: every kind of control (slider by keyboard,
dropdown, toggle, button) changes the picture and the numbers; and at 1280x800 with the file browser open and
at 1024x768 with it closed, every readout and handle is on top, no label is cut, images keep their aspect, the
explorer fits the output area, and its controls and figure fit one screen. Every picture has a text alternative
(an ``<img alt>``, or an explorer's caption) that is not empty, and an explorer's text changes whenever its picture
does. Screenshots: build/browser/.

Run as the second half of ``make test``, or alone with ``make test-browser`` (two notebooks at a time, each
pytest-xdist worker with its own JupyterLab and Chromium; each notebook's kernel is shut down when its test ends);
skipped, saying why, where Chromium or Playwright is missing. The harness is ``tests/browser_harness.py``. The
timings are ``python -m benchmarks browser``'s business, never asserted here.
"""

from __future__ import annotations

import pytest

import browser_harness as browser
from conftest import notebook_threads
from labkit.explorers.canvas import CAPTION_CLASS

pytestmark = pytest.mark.browser

NOTEBOOKS = browser.learner_notebooks()


@pytest.fixture(scope="module")
def lab():
    reason = browser.missing()
    if reason:
        pytest.skip(reason)
    assert browser.CAPTION == CAPTION_CLASS, "the harness looks for another caption class than labkit draws"
    from playwright.sync_api import sync_playwright

    # The learner copies' kernels at the machine's thread count, as under nbval (conftest.notebook_threads): the
    # solution copies run at one thread in the suite, so every checked output is still proven at both.
    threads = notebook_threads(NOTEBOOKS[0])
    with browser.JupyterLab(NOTEBOOKS, kernel_threads=threads) as server, sync_playwright() as playwright:
        chromium = browser.launch(playwright)
        yield server, chromium
        chromium.close()


def _lab_class(notebook):
    """A test class for one notebook: pytest-xdist's ``--dist loadscope`` (``make test``) hands each class to a
    worker of its own choosing, so the notebooks spread over the workers beside the rest of the suite."""

    @pytest.mark.parametrize("notebook", [notebook], ids=[notebook.stem])
    def test_notebook_runs_in_the_browser_and_its_explorers_answer(self, lab, notebook):
        _runs_and_answers(lab, notebook)

    name = f"TestLab{notebook.stem[:2]}"
    return name, type(name, (), {"test_notebook_runs_in_the_browser_and_its_explorers_answer":
                                 test_notebook_runs_in_the_browser_and_its_explorers_answer})


globals().update(_lab_class(notebook) for notebook in NOTEBOOKS)


def _runs_and_answers(lab, notebook):
    server, chromium = lab
    page, log = browser.open_notebook(chromium, server, notebook.name, browser.VIEWPORTS["1280x800, file browser open"])
    try:
        assert not page.evaluate("() => window.jupyterapp.shell.currentWidget.context.model.dirty"), (
            "the notebook shows as modified as soon as it opens (kernelspec or metadata JupyterLab rewrites)")
        shown = page.evaluate("() => [...document.querySelectorAll('.jp-OutputArea-output')].map(e => e.innerText)")
        assert not [text for text in shown if "VBox(children" in text], "a widget's repr instead of its picture"
        browser.run_all(page)
        outputs = browser.outputs(page)
        errors = [f"cell {o['cell']}: {o.get('ename')}: {o.get('evalue')}" for o in outputs
                  if o["output_type"] == "error"]
        assert not errors, errors
        stderr = [f"cell {o['cell']}: {o['text'][:200]!r}" for o in outputs if o.get("name") == "stderr"]
        assert not stderr, f"the learner sees warnings or progress bars: {stderr}"
        differences = browser.checked_output_differences(notebook, outputs)
        assert not differences, "checked outputs differ from the saved notebook:\n" + "\n".join(differences)
        pictures = browser.picture_texts(page)
        silent = [f"cell {p['cell']}" for p in pictures if not p["alt"]]
        assert not silent, f"pictures without a text alternative: {silent}"

        roots = browser.explorers(page)
        saved = browser.saved_explorer_outputs(notebook)
        assert len(roots) == saved, (f"{len(roots)} explorers on the page, {saved} explorer outputs (widget view and "
                                     "its picture) in the file: an explorer displayed without a picture?")
        for number, root in enumerate(roots):
            problems = {}
            for name, viewport in browser.VIEWPORTS.items():
                browser.resize(page, viewport)
                browser.screenshot(page, root, f"{notebook.stem}-{number}-{viewport[0]}")
                problems[name] = browser.layout_problems(page, root)
            assert not any(problems.values()), problems

            browser.resize(page, browser.VIEWPORTS["1280x800, file browser open"])
            moves = browser.drive(page, root, slider_moves=8)
            silent = [m for m in moves if not (m.picture_changed or m.numbers_changed)]
            assert not silent, f"controls that changed nothing: {silent}"
            # The picture's text follows the picture: never empty, and new whenever the picture is.
            stale = [(m.kind, m.name, m.alt[:80]) for m in moves
                     if not m.alt or m.picture_changed and not m.alt_changed]
            assert not stale, f"picture text empty, or unchanged while the picture changed: {stale}"
            for kind in {m.kind for m in moves} - {"button"}:
                assert any(m.picture_changed and m.numbers_changed for m in moves if m.kind == kind), (kind, moves)
            if any(m.kind == "button" for m in moves):
                assert any(m.picture_changed for m in moves if m.kind == "button"), moves
            assert sum(m.kind == "slider" for m in moves) >= 2 * len(root.locator(".widget-slider").all())
        assert not log.errors, f"browser console: {log.errors}"
    finally:
        browser.close_notebook(page)
