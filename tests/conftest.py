"""Shared test set-up: no network for anything the tests start, notebook kernels included."""

import os
import tempfile
from pathlib import Path

import pytest

# Set before any kernel or subprocess starts, so nbval's kernels inherit them: the workbook must run offline.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Exercise checks run by the tests (and by the notebooks under nbval) save progress here, not in the user's file.
os.environ["LABKIT_PROGRESS"] = str(Path(tempfile.mkdtemp(prefix="labkit-progress-")) / "progress.json")


@pytest.fixture(scope="session")
def embedded():
    """The embedded model, loaded once for the whole session (from the user's cache, converting if needed)."""
    from labkit.models import load_model

    return load_model()
