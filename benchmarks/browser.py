"""How fast the explorers feel in a real browser: event -> new image in the page, p50/p95 over every control move.

``python -m benchmarks browser``. The browser machinery (JupyterLab on localhost, Chromium through Playwright,
finding and driving explorers) is the browser test's harness, ``tests/browser_harness.py``: the test is what it
exists for, so it lives with the tests and this benchmark borrows it (never the other way round).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the harness beside the tests

import browser_harness as harness  # noqa: E402


def main(slider_moves: int = 30) -> None:
    reason = harness.missing()
    if reason:
        print(f"browser benchmark skipped: {reason}")
        return
    from playwright.sync_api import sync_playwright

    from labkit.core.timing import percentile

    notebooks = [n for n in harness.learner_notebooks() if harness.saved_explorer_outputs(n)]
    print("Explorers in Chromium (JupyterLab, 1280x800): slider/toggle/dropdown event -> new image in the page")
    print(f"{'notebook':<32} {'explorer':>8} {'moves':>6} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
    with harness.JupyterLab(notebooks) as lab, sync_playwright() as playwright:
        browser = harness.launch(playwright)
        for notebook in notebooks:
            page, _ = harness.open_notebook(browser, lab, notebook.name,
                                            harness.VIEWPORTS["1280x800, file browser open"])
            harness.run_all(page)
            for number, root in enumerate(harness.explorers(page)):
                moves = harness.drive(page, root, slider_moves)
                latencies = [m.latency_ms for m in moves if m.kind != "button" and m.latency_ms is not None]
                print(f"{notebook.name:<32} {number:>8} {len(latencies):>6} {statistics.median(latencies):>8.0f}"
                      f" {percentile(latencies, 95):>8.0f} {max(latencies):>8.0f}")
            harness.close_notebook(page)
        browser.close()
    print("goal: p95 under 150 ms")


if __name__ == "__main__":
    main()
