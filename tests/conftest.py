"""Shared test set-up: no network for anything the tests start, and a thread count per notebook kernel.

The rule for every comparison of floating-point results (in tests, in labkit's own asserts, in checked notebook
outputs): bitwise equality (``torch.equal``, ``==`` on floats) only for the same operation on the same buffers,
or for arithmetic that is exact in any order (elementwise ops, maxima, dyadic values). Two model paths — a copy of
the weights, another layout, batch shape, cache, device or thread count — are compared within a tolerance stated
from float32's epsilon and the model's depth (``alignment.logits_atol``), or on discrete results (argmax, tokens,
counts) after checking that every compared greedy step is decided by a margin far above that tolerance
(``labkit.runtime.generation.greedy_margins``). MKL may pick another kernel for a differently aligned buffer, so
"equal here" is not "equal on the next machine": a test comparing two model paths runs one of them on
``alignment.misaligned_model`` / ``misaligned_cache``, so that a test leaning on alignment fails everywhere.
"""

import os
import re
import tempfile
from pathlib import Path

import hypothesis
import pytest

import cpu_profiles

# Set before any kernel or subprocess starts, so nbval's kernels inherit them: the workbook must run offline.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Idle OpenMP threads wait asleep, not spinning: `make test` runs three workers, notebook kernels, JupyterLab and
# Chromium on two cores at once, where a thread spinning at a barrier while its partner waits for a core burns what
# the others need (measured beside two busy processes: a two-thread scoring pass took 10.5 s of CPU spinning, 5.9 s
# asleep, and less time). It changes how idle threads wait, not how many there are or what they compute.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Exercise checks run by the tests (and by the notebooks under nbval) save progress here, not in the user's file.
os.environ["LABKIT_PROGRESS"] = str(Path(tempfile.mkdtemp(prefix="labkit-progress-")) / "progress.json")

# `make test` computes as another processor (LABKIT_CPU_PROFILE=foreign, tests/cpu_profiles.py): set here, before
# xdist starts its workers and before torch computes, so every worker and every kernel they start inherits it.
cpu_profiles.apply()

# Under pytest-xdist every worker is one process on a machine shared with the others: one torch thread each, or
# two workers' thread pools fight over the cores (measured here: one notebook ran 8x slower).
IN_WORKER = "PYTEST_XDIST_WORKER" in os.environ
_INHERITED_THREADS = os.environ.get("OMP_NUM_THREADS")  # the caller's choice, restored for learner notebooks
if IN_WORKER:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)

# Hypothesis: `make test` (and so CI) loads the "ci" profile: the same examples every run (derandomize), so a red run
# is red again on the next machine, and a failure prints the blob that replays it; `make quick` and a plain pytest
# draw new examples each run ("dev"). Every counterexample ever found stays in its test as an @example.
hypothesis.settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
hypothesis.settings.register_profile("dev", print_blob=True)
hypothesis.settings.load_profile("dev")


def pytest_configure(config):
    # A plugin, not this conftest's hooks: a conftest's hooks reach only the items below its folder, and the notebook
    # cells (notebooks/) must name their profile when they fail too.
    # lab 08 (the optional drills) is registered here beside pyproject.toml's lab00 .. lab07: a change to
    # pyproject.toml would make every contributor's next `make` reinstall the environment.
    config.addinivalue_line("markers", "lab08: belongs to lab 08, the drills")
    if not config.pluginmanager.is_registered(cpu_profiles):
        config.pluginmanager.register(cpu_profiles, "cpu_profiles")


def notebook_threads(path: Path) -> str | None:
    """The OMP_NUM_THREADS a notebook's kernel gets: 1 for solutions, the machine's default for learner copies.

    Solution and learner notebook print the same checked outputs, so running the two twins at different thread
    counts (which changes the order of float reductions, as another CPU does) proves those outputs hold on both.
    """
    return "1" if path.parent.name == "solutions" else _INHERITED_THREADS


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    # nbval starts a notebook's kernel while setting up its first cell, with this process's environment.
    dear = {}
    if item.path.suffix == ".ipynb":
        threads = notebook_threads(item.path)
        if threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = threads
        if threads != "1" and IN_WORKER:  # beside the other workers, idle OpenMP threads sleep (browser_harness)
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        # A light lab's solution kernel computes with the dear part of the second kernel set too (too slow for the
        # suite's processes and the heavy labs: tests/cpu_profiles.py); in this process's environment only while
        # the kernel starts.
        dear = cpu_profiles.notebook_environment(dict(os.environ), item.path)
    saved = {name: os.environ.get(name) for name in dear}
    os.environ.update(dear)
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)


@pytest.fixture(scope="session")
def embedded():
    """The embedded model, loaded once for the whole session (from the user's cache, converting if needed)."""
    from labkit.runtime.models import load_model

    return load_model()


@pytest.fixture(scope="module")
def tiny():
    """The tiny random Llama of tests/toys.py (no model file: it also runs on older transformers)."""
    pytest.importorskip("transformers")
    from toys import tiny_llama

    return tiny_llama()


@pytest.fixture(params=["tiny", "embedded"])
def lm(request):
    """Each model-level property once on the tiny Llama and once on the embedded model (runtime tests)."""
    return request.getfixturevalue(request.param)


# ---------------------------------------------------------------------------------------------------------------
# Markers and order. Every item gets a lab marker when it belongs to one lab (lab00 .. lab08: its notebooks, its
# exercises, its explorer, a notebook-parametrized check), `notebook` when it is a notebook cell under nbval, and
# `slow` when its file is one of SLOW (measured above ~10 s of CPU alone). `make quick` runs -m "not slow and not
# browser" plus the notebooks a change touches. Under xdist (--dist loadscope --no-loadscope-reorder) the scopes
# are handed out in collection order, so the longest ones go first: two workers then end together instead of one
# finishing a 3-minute file alone at the end.

EXPLORER_LABS = {"sampling": "01", "loss": "02", "numerics": "03", "outliers": "04", "memory": "05", "timing": "06",
                 "speculative": "07"}
SLOW = ("tests/test_instructor_grading_attacks.py", "tests/test_instructor_grading_course.py",
        "tests/test_instructor_answering.py",
        "tests/test_instructor_grading.py", "tests/test_reveals.py", "tests/test_reveals_run_all.py",
        "tests/test_instructor_classroom.py", "tests/test_instructor_cluster.py", "tests/test_instructor_sandbox.py",
        "tests/test_instructor_slurm.py", "tests/test_release.py::test_labkit_installs_from_a_clone_at_the_named_ref",
        "tests/test_packaging.py::test_wheel_carries_the_data_and_works_from_another_directory",
        "tests/test_packaging.py::test_lab_command_serves_the_notebooks_on_localhost", "tests/test_browser.py",
        "tests/test_runtime_quantize_perplexity.py", "tests/test_cpu_profiles.py",
        # over ten seconds each in `make quick` (2026-12-07, a 2-core AMD EPYC): 13 to 15 s
        "tests/test_runtime_llama.py::test_each_format_stays_within_its_stated_distance_of_fp32",
        "tests/test_runtime_llama.py::test_greedy_tokens_equal_transformers_generate_on_the_course_prompts",
        # issue #49's population sweep: 196 architectures, 182 s alone on a 2-core AMD EPYC (451 s at load 5)
        "tests/test_runtime_population.py")
# Longest first: the course's notebooks graded as a class and the attack suite's class (minutes each), the browser
# test's notebooks (a scope each, under `make test`), then lab 02's notebooks and the other long files.
FIRST = ("tests/test_instructor_grading_course.py", "tests/test_instructor_grading_attacks.py",
         "tests/test_runtime_population.py::TestSweepFirstHalf", "tests/test_runtime_population.py::TestSweepSecondHalf",
         *(f"tests/test_browser.py::TestLab{lab}" for lab in (
    "01", "04", "06", "07", "02", "05", "00", "03", "08")), "notebooks/solutions/02_", "notebooks/02_",
         "tests/test_instructor_grading.py", "tests/test_reveals_run_all.py", "tests/test_reveals.py",
         "notebooks/solutions/04_", "notebooks/04_",
         "notebooks/solutions/06_", "notebooks/06_", "notebooks/solutions/01_", "notebooks/01_",
         "notebooks/solutions/05_", "notebooks/05_", "notebooks/solutions/07_", "notebooks/07_",
         "tests/test_instructor_classroom.py", "tests/test_instructor_cluster.py", "tests/test_instructor_slurm.py",
         "tests/test_instructor_sandbox.py", "notebooks/solutions/", "notebooks/", "tests/test_packaging.py",
         # a real AVX2-only Zen 1 (2026-12-07): 191 s and 67 s, collected late, they were the run's last minute alone
         "tests/test_runtime_llama.py", "tests/test_runtime_load_any_model.py")


def lab_of(nodeid: str) -> str | None:
    """The lab ("02") an item belongs to, from its node id, or None for a cross-cutting one.

    >>> [lab_of(n) for n in ("notebooks/solutions/02_loss_perplexity.ipynb::Cell 3", "tests/test_exercises_lab05.py::t",
    ...                      "tests/test_explorer_timing_figures.py::t", "tests/test_reveals.py::t[01.nucleus_order]",
    ...                      "tests/test_figures.py::t[solutions/04_outliers_quantization.ipynb]", "tests/test_core_loss.py::t")]
    ['02', '05', '06', '01', '04', None]
    """
    path, _, rest = nodeid.partition("::")
    if match := re.search(r"(?:^|/)(0[0-8])_\w+\.ipynb$", path) or re.search(r"test_exercises_lab(0[0-8])\.py$", path):
        return match.group(1)
    if match := re.search(r"test_explorer_([a-z]+)", path):
        return EXPLORER_LABS.get(match.group(1))
    match = re.search(r"\[(?:[^\]]*/)?(0[0-8])[._]", rest)
    return match.group(1) if match else None


def _rank(nodeid: str) -> int:
    return next((rank for rank, prefix in enumerate(FIRST) if nodeid.startswith(prefix)), len(FIRST))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if (lab := lab_of(item.nodeid)) is not None:
            item.add_marker(getattr(pytest.mark, f"lab{lab}"))
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.notebook)
        if item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
    _run_all_once(items)
    items.sort(key=lambda item: _rank(item.nodeid))  # stable: the order inside a scope is kept


def _run_all_once(items) -> None:
    """A learner notebook's Run All with the stubs untouched is made once per session: where the browser test runs
    a notebook (Chromium and Playwright here), its Run All is also checked for shown answers, and
    test_reveals_run_all.py's own run of that notebook is skipped, saying so (about 4 minutes of CPU, issue 53)."""
    import browser_harness

    in_browser = {item.callspec.params["notebook"].name for item in items
                  if item.nodeid.startswith("tests/test_browser.py::TestLab") and hasattr(item, "callspec")}
    if not in_browser or browser_harness.missing() is not None:
        return
    for item in items:
        if (item.nodeid.startswith("tests/test_reveals_run_all.py::test_run_all_with_the_stubs_untouched")
                and item.callspec.params["path"].name in in_browser):
            item.add_marker(pytest.mark.skip(reason="the browser test's Run All of this notebook checks it "
                                                    "(tests/test_browser.py)"))


@pytest.fixture(autouse=True)
def _shared_model_left_as_loaded():
    """Every test leaves the session's embedded model as it was loaded: load_model() hands every later test on the
    worker the same object, and one left cast, hooked, in training mode or with replaced Linears silently moves
    them onto transformers' forward (seen in the full suite). A test that alters it works on a copy or restores it."""
    yield
    from labkit.runtime import llama, models

    for key, loaded in list(models._loaded.items()):
        if type(loaded.model).__name__ == "LlamaForCausalLM" and not llama._is_plain_llama(loaded.model):
            models._loaded.pop(key)  # the next test gets a fresh one; this one fails and is named
            pytest.fail(f"this test left the shared embedded model {key[0]!r} altered (cast, hooked, in training "
                        "mode or with replaced Linears): work on a copy or restore it", pytrace=False)
