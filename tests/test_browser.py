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
from test_reveals_run_all import run_all_problems

pytestmark = pytest.mark.browser

NOTEBOOKS = browser.learner_notebooks()


@pytest.fixture(scope="module")
def chromium():
    """One Chromium per worker process: Playwright's sync API runs once per process, so every test of this module
    (a notebook's, the layout check's) shares it."""
    reason = browser.missing()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = browser.launch(playwright)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def lab(chromium):
    assert browser.CAPTION == CAPTION_CLASS, "the harness looks for another caption class than labkit draws"
    # The learner copies' kernels at the machine's thread count, as under nbval (conftest.notebook_threads): the
    # solution copies run at one thread in the suite, so every checked output is still proven at both.
    threads = notebook_threads(NOTEBOOKS[0])
    with browser.JupyterLab(NOTEBOOKS, kernel_threads=threads) as server:
        yield server, chromium


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
        assert not differences, (f"checked outputs differ from the saved notebook, computed with the "
                                 f"{server.cpu_profile} profile:\n" + "\n".join(differences))
        # This Run All is also the learner's first one with every stub untouched (test_reveals_run_all.py skips its
        # own run of this notebook when this test runs in the session): no prediction's answer on the page.
        reveals = run_all_problems(notebook.name, browser.executed_notebook(notebook, outputs),
                                   browser.widget_texts(page))
        assert not reveals, "\n".join(reveals)
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
                problems[name] = browser.layout_problems(page, root) + labels_cut_at_an_edge(root)
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
        assert not (hidden := reveal_sources_shown(page, notebook)), (
            f"reveal cells whose source the learner sees before running them: {hidden}")
    finally:
        browser.close_notebook(page)


# ----- what the harness's layout check adds to: a label cut at its left edge, and a reveal's hidden source -----

# The harness's check compares a label's scroll width with its client width, which sees text cut at the right
# only: text that overflows to the left (content pushed to the end of its box) is counted by no scroll width, and
# the label loses its first letters, as the memory explorer's did at 1024x768 ("eights" for "weights"). This
# compares the box of the laid-out text with the element's own box and with the output area's, on both sides.
_CUT_AT_AN_EDGE = """(root) => {
    const cut = [];
    const output = root.closest('.jp-OutputArea-output') || root.parentElement;
    const area = output.getBoundingClientRect();
    for (const e of root.querySelectorAll('.widget-label, button, .widget-readout')) {
        if (e.offsetParent === null || !e.innerText.trim()) continue;
        const range = document.createRange();
        range.selectNodeContents(e);
        const text = range.getBoundingClientRect();
        if (!text.width) continue;
        const name = e.innerText.trim().slice(0, 40);
        for (const [where, box] of [['its box', e.getBoundingClientRect()], ['the output area', area]]) {
            if (text.left < box.left - 1 || text.right > box.right + 1) {
                cut.push(`cut: "${name}" (its text runs from ${Math.round(text.left - box.left)} to `
                    + `${Math.round(text.right - box.left)} px in ${where}, ${Math.round(box.width)} px wide)`);
                break;
            }
        }
    }
    return cut;
}"""


def labels_cut_at_an_edge(root) -> list[str]:
    """Labels, buttons and readouts of an explorer whose text runs past either edge of their box or of the output
    area that shows the explorer."""
    return root.evaluate(_CUT_AT_AN_EDGE)


def reveal_sources_shown(page, notebook) -> list[int]:
    """Cells tagged ``reveal`` whose source JupyterLab shows (the learner copy collapses them)."""
    return page.evaluate("""() => {
        const shown = [];
        const cells = window.jupyterapp.shell.currentWidget.content.widgets;
        cells.forEach((cell, index) => {
            const tags = cell.model.getMetadata('tags') || [];
            if (tags.includes('reveal') && !cell.inputHidden) shown.push(index);
        });
        return shown;
    }""")


class TestLayoutCheck:
    def test_a_label_cut_at_either_edge_is_seen_and_the_scroll_width_misses_the_left(self, chromium):
        page = chromium.new_page()
        try:
            style = "width:40px;overflow:hidden;white-space:nowrap"
            page.set_content(
                '<div class="jp-OutputArea-output" style="margin-left:60px;width:300px;overflow:hidden"><div id="root">'
                f'<div class="widget-label" style="{style};display:flex;justify-content:flex-end"><span>weights</span>'
                '</div>'  # cut at its own left edge
                f'<div class="widget-label" style="{style};display:block">attention</div>'  # at its right edge
                '<div class="widget-label" style="width:80px;margin-left:-4px">prefill</div>'  # by the output area
                '<div class="widget-label" style="width:80px">GPUs (TP)</div></div></div>')  # whole
            root = page.locator("#root")
            cut = labels_cut_at_an_edge(root)
            assert [problem.split('"')[1] for problem in cut] == ["weights", "attention", "prefill"], cut
            assert "in the output area" in cut[2] and "in its box" in cut[0]
            widths = root.evaluate("(r) => [...r.children].map(e => [e.scrollWidth, e.clientWidth])")
            assert widths[0][0] <= widths[0][1] + 1, "the left cut is invisible to a scroll width"
            assert widths[2][0] <= widths[2][1] + 1
            assert widths[1][0] > widths[1][1] + 1
        finally:
            page.close()
