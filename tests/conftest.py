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
import tempfile
from pathlib import Path

import pytest

# Set before any kernel or subprocess starts, so nbval's kernels inherit them: the workbook must run offline.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Exercise checks run by the tests (and by the notebooks under nbval) save progress here, not in the user's file.
os.environ["LABKIT_PROGRESS"] = str(Path(tempfile.mkdtemp(prefix="labkit-progress-")) / "progress.json")

# Under pytest-xdist every worker is one process on a machine shared with the others: one torch thread each, or
# two workers' thread pools fight over the cores (measured here: one notebook ran 8x slower).
IN_WORKER = "PYTEST_XDIST_WORKER" in os.environ
_INHERITED_THREADS = os.environ.get("OMP_NUM_THREADS")  # the caller's choice, restored for learner notebooks
if IN_WORKER:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


def notebook_threads(path: Path) -> str | None:
    """The OMP_NUM_THREADS a notebook's kernel gets: 1 for solutions, the machine's default for learner copies.

    Solution and learner notebook print the same checked outputs, so running the two twins at different thread
    counts (which changes the order of float reductions, as another CPU does) proves those outputs hold on both.
    """
    return "1" if path.parent.name == "solutions" else _INHERITED_THREADS


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # nbval starts a notebook's kernel while setting up its first cell, with this process's environment.
    if item.path.suffix == ".ipynb":
        threads = notebook_threads(item.path)
        if threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = threads


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
