"""tests/cpu_profiles.py: the foreign profile `make test` computes with, and what it catches.

The last test is the point of it all: a notebook whose checked output holds only on this processor's own kernels
(the bits of a matmul and a softmax, what a quantized perplexity or a narrow interval's word depends on) passes
nbval natively and fails under the foreign profile, with a failure that names the profile.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cpu_profiles

TESTS = Path(__file__).resolve().parent

# The bits of a linear layer's output and of a softmax over a vocabulary-sized row: MKL's and ATen's kernels sum in
# another order on another vector unit (issue 40 measured both change between AVX-512 and AVX2).
FRAGILE = """import hashlib
import torch
generator = torch.Generator().manual_seed(0)
x, w = torch.randn(64, 576, generator=generator), torch.randn(1536, 576, generator=generator)
row = torch.randn(49_152, generator=generator)
bits = torch.nn.functional.linear(x, w).numpy().tobytes() + torch.softmax(row, 0).numpy().tobytes()
print("digest", hashlib.sha256(bits).hexdigest()[:16])"""


def test_the_foreign_profile_is_the_next_processor_down():
    assert cpu_profiles.FOREIGN_PROFILES["AVX512"] == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                                                      "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert cpu_profiles.FOREIGN_PROFILES["AVX2"]["MKL_ENABLE_INSTRUCTIONS"] == "SSE4_2"
    assert cpu_profiles.native_capability("flags : sse2 avx avx2 avx512f avx512vl") == "AVX2"  # no BW/DQ: AVX2 kernels
    assert cpu_profiles.native_capability("processor : 0") == "other"


def test_apply_sets_only_what_the_caller_left_unset_and_native_environment_takes_back_only_that():
    environ = {"LABKIT_CPU_PROFILE": "foreign", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "PATH": "/bin"}
    described = cpu_profiles.apply(environ)
    assert environ["MKL_ENABLE_INSTRUCTIONS"] == "SSE4_2"  # the caller's own choice stands
    added = set(environ["LABKIT_CPU_PROFILE_SET"].split(",")) - {""}
    assert added == set(cpu_profiles.foreign_profile()) - {"MKL_ENABLE_INSTRUCTIONS"}
    assert described.startswith("foreign: ") and "MKL_ENABLE_INSTRUCTIONS=SSE4_2" in described
    assert cpu_profiles.native_environment(environ) == {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "PATH": "/bin"}
    unchanged = {"PATH": "/bin"}
    assert cpu_profiles.apply(unchanged).startswith("native (") and unchanged == {"PATH": "/bin"}


@pytest.mark.skipif(os.environ.get(cpu_profiles.SWITCH) != "foreign",
                    reason="this run computes natively (make test sets LABKIT_CPU_PROFILE=foreign)")
def test_this_run_computes_with_the_foreign_kernels():
    import torch

    capability = cpu_profiles.foreign_profile().get("ATEN_CPU_CAPABILITY")
    if capability is None:
        pytest.skip("this processor's foreign profile leaves torch's own kernels as they are")
    assert torch.backends.cpu.get_cpu_capability() == capability.upper()


def _run(command, environ, cwd):
    return subprocess.run(command, env=environ, cwd=cwd, capture_output=True, text=True, timeout=300)


def _digest(environ, cwd):
    run = _run([sys.executable, "-c", FRAGILE], environ, cwd)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_a_checked_output_that_holds_only_on_native_kernels_fails_under_the_foreign_profile(tmp_path):
    native = {**cpu_profiles.native_environment(dict(os.environ)), "OMP_NUM_THREADS": "1",
              "PYTHONPATH": str(TESTS)}
    foreign = dict(native, LABKIT_CPU_PROFILE="foreign")
    cpu_profiles.apply(foreign)
    # The premise: here, the foreign kernels compute other bits than the native ones.
    assert _digest(native, tmp_path) != _digest(foreign, tmp_path), f"the same bits under {foreign}"

    notebook = tmp_path / "fragile.ipynb"
    notebook.write_text(json.dumps({
        "cells": [{"cell_type": "code", "execution_count": None, "id": "fragile", "outputs": [],
                   "metadata": {"tags": ["nbval-check-output"]}, "source": FRAGILE}],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5}))
    built = _run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", "--inplace",
                  str(notebook)], native, tmp_path)  # saved with the native kernels' output, as a build does
    assert built.returncode == 0, built.stderr
    assert "digest" in json.dumps(json.loads(notebook.read_text())["cells"][0]["outputs"])

    nbval = [sys.executable, "-m", "pytest", "-p", "cpu_profiles", "-p", "no:cacheprovider", "--rootdir",
             str(tmp_path), "-c", os.devnull, "--nbval-lax", "--nbval-current-env", str(notebook)]
    at_home = _run(nbval, native, tmp_path)
    assert at_home.returncode == 0, at_home.stdout[-3000:]
    abroad = _run(nbval, foreign, tmp_path)
    assert abroad.returncode == 1, abroad.stdout[-3000:]
    assert "1 failed" in abroad.stdout and "CPU profile" in abroad.stdout
    named = f"computed with the {cpu_profiles.describe(foreign)} profile"
    assert named in abroad.stdout, abroad.stdout[-3000:]
    assert "ATEN_CPU_CAPABILITY=" in named
