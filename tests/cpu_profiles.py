"""The kernels a test run computes with: this processor's own ("native") and another processor's ("foreign").

torch, MKL and oneDNN pick their kernels by the processor's vector units, and each choice can be forced lower by an
environment variable read when the library first computes. A result that holds only on the kernels of the machine
a notebook was built on (a last digit of a reduction, a quantized value one grid step away, a word decided by a
narrow interval) changes under another processor's kernels. So `make test` (``LABKIT_CPU_PROFILE=foreign``) runs
the suite, and the solution notebooks' kernels under nbval, as another processor would, while the browser test's
JupyterLab runs the learner copies natively: every checked output is then proven on two kernel sets and two thread
counts in every run, on whatever machine runs it.

The foreign profile is the next vector unit down from the native one, which real machines run:

* native AVX-512 (recent Xeons and EPYCs): an AVX2 machine (Intel's 12th-14th generation consumer chips, AMD
  before Zen 4): ``ATEN_CPU_CAPABILITY=avx2``, ``MKL_ENABLE_INSTRUCTIONS=AVX2``, ``ONEDNN_MAX_CPU_ISA=AVX2``;
* native AVX2: MKL and oneDNN on SSE4 (``MKL_ENABLE_INSTRUCTIONS=SSE4_2``, ``ONEDNN_MAX_CPU_ISA=SSE41``);
* anything else (ARM): none, and the header says the run is native.

torch's own kernels are never put on ``default`` (unvectorized): the INT4 and INT8 matmul kernels then take 100
times as long (measured on an AMD EPYC: one test of the INT4 decoder, 566 s against about 5). What that leaves
unproven: seeded ``torch.randn`` draws the same bits under ``avx2`` as under AVX-512 (both use the AVX2 normal
sampler), but other bits under ``default``, the sampler an ARM processor (Apple's chips) runs. Every solution
notebook passed nbval under ``default`` once, by hand (2026-12-06); ``LABKIT_CPU_PROFILE=foreign
ATEN_CPU_CAPABILITY=default make test-suite`` repeats it (a variable the caller sets stands).

``MKL_CBWR=COMPATIBLE`` would change MKL's kernel too, but it is not what any processor runs by default, and it
doubled the time of a 64 x 576 by 576 x 1536 matmul here (3.5 ms against 1.7); ``MKL_ENABLE_INSTRUCTIONS`` is the
kernel an AVX2 machine really runs. Loaded by tests/conftest.py; also a pytest plugin (``-p cpu_profiles``) for a
run outside the repository's tests (tests/test_cpu_profiles.py runs nbval on a notebook in a temporary folder).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest

PROFILE_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")
FOREIGN_PROFILES = {
    "AVX512": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "AVX2": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
    "other": {},
}
SWITCH = "LABKIT_CPU_PROFILE"  # "foreign": this run computes as another processor (make test sets it)
CHOSEN = "LABKIT_CPU_PROFILE_SET"  # the variables apply() set, comma-separated: what native_environment takes back


def native_capability(cpuinfo: str | None = None) -> str:
    """The vector unit torch's kernels would use here: "AVX512", "AVX2" or "other", from the processor's flags.

    Read from /proc/cpuinfo rather than from torch, so that asking does not start torch (which would fix its kernels
    before the profile is set). torch takes AVX-512 kernels with AVX-512 F, BW, VL and DQ.

    >>> native_capability("flags : sse4_2 avx2 fma"), native_capability("flags : avx2 avx512f avx512bw avx512vl avx512dq")
    ('AVX2', 'AVX512')
    """
    if cpuinfo is None:
        if platform.machine() not in ("x86_64", "AMD64"):
            return "other"
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "other"
    flags = set(next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), []))
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "AVX512"
    return "AVX2" if "avx2" in flags else "other"


def foreign_profile() -> dict[str, str]:
    """The environment variables that make this machine compute as the next processor down from its own."""
    return dict(FOREIGN_PROFILES[native_capability()])


def native_environment(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` without the foreign profile: what a process started from a foreign run gets to compute natively
    (the browser test's JupyterLab). Variables the caller set themselves, before the run, are kept."""
    chosen = {name for name in environ.get(CHOSEN, "").split(",") if name}
    chosen |= {SWITCH, CHOSEN}
    return {name: value for name, value in environ.items() if name not in chosen}


def apply(environ: dict[str, str] = os.environ) -> str:
    """Put the profile ``LABKIT_CPU_PROFILE`` asks for into ``environ`` (before torch computes) and say which.

    Returns the description :func:`describe` gives. Variables the caller already set are left as they are.
    """
    if environ.get(SWITCH, "native") == "foreign" and CHOSEN not in environ:
        chosen = {name: value for name, value in foreign_profile().items() if name not in environ}
        environ.update(chosen)
        environ[CHOSEN] = ",".join(chosen)
    return describe(environ)


def describe(environ: dict[str, str] = os.environ) -> str:
    """One line naming the kernels this process computes with: native, or foreign and its variables."""
    native = native_capability()
    forced = " ".join(f"{name}={environ[name]}" for name in PROFILE_VARIABLES if name in environ)
    if not forced:
        return f"native ({native} kernels of this processor)"
    return f"foreign: {forced} (this processor's own kernels: {native})"


def pytest_report_header(config) -> list[str]:
    foreign = os.environ.get(SWITCH) == "foreign"
    lines = [f"CPU profile of the tests and the solution notebooks' kernels: {describe()}"]
    if foreign:
        lines.append(f"CPU profile of the browser test's JupyterLab (learner notebooks): "
                     f"{describe(native_environment(dict(os.environ)))}")
    return lines


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and item.path.suffix == ".ipynb":  # a notebook cell under nbval: which kernels computed it
        report.sections.append(("CPU profile", f"this notebook's kernel computed with the {describe()} profile "
                                               f"at OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'default')}"))
