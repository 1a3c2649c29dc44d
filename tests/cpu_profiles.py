"""The kernels a test run computes with: this processor's own ("native") and a second set, chosen by measurement.

torch (ATen), MKL and oneDNN pick their kernels by the processor's vector units, and each choice can be forced
lower by an environment variable read when the library first computes. A result that holds only on the kernels of
the machine a notebook was built on (a last digit of a reduction, a quantized value one grid step away, a word
decided by a narrow interval) changes under another processor's kernels. So `make test`
(``LABKIT_CPU_PROFILE=foreign``) runs the suite, and the solution notebooks' kernels under nbval, with a second
kernel set, while the browser test's JupyterLab runs the learner copies natively: every checked output is proven on
two kernel sets and two thread counts in every run, on whatever machine runs it.

**The second set is chosen, not assumed** (issue #53). Which variable changes which kernel's bits depends on the
processor: on an AMD EPYC, MKL ignores ``MKL_ENABLE_INSTRUCTIONS`` (its sgemm computes the same bits under AVX2 and
SSE4.2) and only ``MKL_CBWR=COMPATIBLE`` moves it; on an AVX2-only processor ATen has no lower vector unit than its
unvectorized ``default``. So, per library (a *family*), :data:`CANDIDATES` lists the settings a processor could run,
the next vector unit down first, and :func:`choose` runs :data:`PROBE` (each family's own operators: ATen's softmax,
layer norm and sum; MKL's float32 ``F.linear``; oneDNN's packed float32 linear and its bfloat16 matmul) natively and
under each candidate, in fresh processes, and keeps for each family the first candidate that computes other bits.
The choice is kept in the virtual environment (keyed by the processor's flags, torch's version and this file), so
it is measured once per machine.

**Dear settings only where they are affordable.** Two candidates cost far more than the kernels they replace:
ATen's ``default`` (the INT4 and INT8 matmul kernels 100 times slower: one test of the INT4 decoder, 566 s against
about 5; five of the eight solution notebooks had not finished 40 % of their cells after 14 minutes) and MKL's
compatible path (2.6 times as long for lab 04's perplexity cell). A family moved only by a dear candidate keeps its
native kernels in the suite's processes and the heavy labs' solution kernels, and computes with the dear one in the
light labs' solution kernels (:data:`LIGHT_LABS`, measured: 13 % longer there); the header says which family stays
native where. The suite's own tests compare within stated tolerances; checked outputs live in the notebooks.

**Another processor class, here.** ``LABKIT_CPU_HOST=AVX2`` makes an AVX-512 machine compute as an AVX2-only one
(its "native" kernels are then ATen, MKL and oneDNN at AVX2, and the browser's learner copies run on those), and the
second set is chosen against that host, as on a real AVX2 laptop: ``LABKIT_CPU_HOST=AVX2 make test``.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

PROFILE_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")
SWITCH = "LABKIT_CPU_PROFILE"  # "foreign": this run computes with the second set (make test sets it)
HOST = "LABKIT_CPU_HOST"  # "AVX2": an AVX-512 machine computes as an AVX2-only one, its native kernels included
STATE = "LABKIT_CPU_PROFILE_STATE"  # JSON of what apply() chose, inherited by the workers and their kernels
CLASSES = ("other", "AVX2", "AVX512")  # torch's x86 kernel classes, lowest first
# What makes a machine of a higher class compute as one of a lower class (its "native" kernels then).
HOST_VARIABLES = {"AVX2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                           "ONEDNN_MAX_CPU_ISA": "AVX2"}}


@dataclass(frozen=True)
class Candidate:
    family: str  # "ATen", "MKL" or "oneDNN": whose kernels the variable moves
    variables: tuple[tuple[str, str], ...]
    dear: bool = False  # too slow for the suite and the heavy labs: the light labs' solution kernels only


# host class -> candidates, per family the next processor down first, then a dear one if any (costs measured in the
# module docstring).
CANDIDATES = {
    "AVX512": (Candidate("ATen", (("ATEN_CPU_CAPABILITY", "avx2"),)),
               Candidate("ATen", (("ATEN_CPU_CAPABILITY", "default"),), dear=True),
               Candidate("MKL", (("MKL_ENABLE_INSTRUCTIONS", "AVX2"),)),
               Candidate("MKL", (("MKL_CBWR", "COMPATIBLE"),), dear=True),
               Candidate("oneDNN", (("ONEDNN_MAX_CPU_ISA", "AVX2"),))),
    "AVX2": (Candidate("ATen", (("ATEN_CPU_CAPABILITY", "default"),), dear=True),
             Candidate("MKL", (("MKL_ENABLE_INSTRUCTIONS", "SSE4_2"),)),
             Candidate("MKL", (("MKL_CBWR", "COMPATIBLE"),), dear=True),
             Candidate("oneDNN", (("ONEDNN_MAX_CPU_ISA", "SSE41"),))),
    "other": (Candidate("ATen", (("ATEN_CPU_CAPABILITY", "default"),), dear=True),),
}
# The labs whose solution notebook affords the dear settings: under ATen's `default` kernels labs 00, 03 and 05 ran
# in 61 s together against 54 s (three workers, an AMD EPYC computing as AVX2), while the other five had not
# finished 40 % of their cells after 14 minutes; under MKL's compatible path lab 04's perplexity cell took 219 s
# against 85 s and lab 01's continuation cell 86 s.
LIGHT_LABS = ("00", "03", "05")
FAMILIES = ("ATen", "MKL", "oneDNN")

# Each family's own operators, their bits digested: a linear layer's product (MKL's sgemm, one row and a batch), a
# softmax over a vocabulary-sized row, a layer norm and a sum (ATen's vectorized loops), oneDNN's packed float32
# linear (labkit's PackedLinear) and its bfloat16 matmul. Prints one JSON object: family -> digest.
PROBE = """import hashlib, json, torch
generator = torch.Generator().manual_seed(0)
x, w = torch.randn(64, 576, generator=generator), torch.randn(1536, 576, generator=generator)
row = torch.randn(49_152, generator=generator)
def digest(*tensors):
    return hashlib.sha256(b"".join(t.float().contiguous().numpy().tobytes() for t in tensors)).hexdigest()[:16]
families = {"ATen": digest(torch.softmax(row, 0), torch.nn.functional.layer_norm(x, (576,)), row.sum()),
            "MKL": digest(torch.nn.functional.linear(x, w), torch.nn.functional.linear(x[:1], w))}
try:
    packed = torch.ops.mkldnn._reorder_linear_weight(w, 1)
    onednn = [torch.ops.mkldnn._linear_pointwise(x[:1], packed, None, "none", [], "")]
except (AttributeError, RuntimeError):  # a torch without oneDNN's private ops
    onednn = []
families["oneDNN"] = digest(*onednn, torch.nn.functional.linear(x.bfloat16(), w.bfloat16()))
print(json.dumps(families))"""


def native_capability(cpuinfo: str | None = None) -> str:
    """The vector unit torch's kernels would use here: "AVX512", "AVX2" or "other", from the processor's flags.

    Read from /proc/cpuinfo rather than from torch, so that asking does not start torch (which would fix its kernels
    before the profile is set). torch takes AVX-512 kernels with AVX-512 F, BW, VL and DQ.

    >>> native_capability("flags : sse4_2 avx2 fma"), native_capability("flags : avx2 avx512f avx512bw avx512vl avx512dq")
    ('AVX2', 'AVX512')
    """
    if cpuinfo is None:
        cpuinfo = _cpuinfo()
    flags = _flags(cpuinfo)
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "AVX512"
    return "AVX2" if "avx2" in flags else "other"


def _cpuinfo() -> str:
    if platform.machine() not in ("x86_64", "AMD64"):
        return ""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _flags(cpuinfo: str) -> set[str]:
    return set(next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), []))


def host_class(environ: dict[str, str] = os.environ, cpuinfo: str | None = None) -> str:
    """The class this run computes as: the processor's own, or the lower one ``LABKIT_CPU_HOST`` asks for.

    >>> host_class({}, "flags : avx2 avx512f avx512bw avx512vl avx512dq"), host_class({"LABKIT_CPU_HOST": "AVX2"},
    ...     "flags : avx2 avx512f avx512bw avx512vl avx512dq")
    ('AVX512', 'AVX2')
    """
    native = native_capability(cpuinfo)
    asked = environ.get(HOST, "").strip()
    if not asked:
        return native
    if asked not in HOST_VARIABLES:
        raise ValueError(f"{HOST}={asked!r}: a simulated host is one of {sorted(HOST_VARIABLES)}")
    if CLASSES.index(asked) > CLASSES.index(native):
        raise ValueError(f"{HOST}={asked!r}: this processor's own kernels are {native}; it can compute as a lower "
                         "class only")
    return asked


def host_label(cpuinfo: str | None = None) -> str:
    """This processor as a person names its class: "AVX-512 with BF16/AMX", "AVX-512", "AVX2 only", or "other"."""
    cpuinfo = _cpuinfo() if cpuinfo is None else cpuinfo
    flags, native = _flags(cpuinfo), native_capability(cpuinfo)
    if native == "AVX512":
        return "AVX-512 with BF16/AMX" if flags & {"avx512_bf16", "amx_bf16"} else "AVX-512"
    return {"AVX2": "AVX2 only", "other": f"other ({platform.machine()})"}[native]


def digests(environ: dict[str, str]) -> dict[str, str]:
    """family -> the digest of its operators' bits, computed by :data:`PROBE` in a fresh process with ``environ``
    (one thread)."""
    run = subprocess.run([sys.executable, "-c", PROBE], env={**environ, "OMP_NUM_THREADS": "1"},
                         capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        raise RuntimeError(f"the kernel probe failed under {describe_variables(environ)}: {run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def choose(host: str, native: dict[str, str]) -> dict:
    """The second kernel set for a run on ``host`` whose native environment is ``native``: per family, the first
    candidate of :data:`CANDIDATES` whose operators compute other bits than the native ones.

    Returns ``{"suite": {variable: value}, "light": {...}, "unchanged": [family], "unchanged_light": [family]}``:
    the cheap choices (for the suite's processes and every solution notebook's kernel), the cheap and dear ones
    (for the light labs' solution kernels, :data:`LIGHT_LABS`), and the families each set leaves as they were.
    """
    candidates = CANDIDATES[host]
    environs = [native, *({**native, **dict(candidate.variables)} for candidate in candidates)]
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:  # a process each, the cores shared
        at_home, *measured = pool.map(digests, environs)
    suite: dict[str, str] = {}
    light: dict[str, str] = {}
    for family in FAMILIES:
        moved = [c for c, bits in zip(candidates, measured) if c.family == family and bits[family] != at_home[family]]
        if moved:
            light.update(moved[0].variables)
            if not moved[0].dear:
                suite.update(moved[0].variables)
    # One family's variable can move another's operators (ATen's `default` takes float32 matmuls off MKL): what each
    # whole set leaves as it was is measured, not inferred.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        abroad, abroad_light = pool.map(lambda extra: digests({**native, **extra}) if extra else at_home, (suite, light))
    return {"suite": suite, "light": light,
            "unchanged": [family for family in FAMILIES if abroad[family] == at_home[family]],
            "unchanged_light": [family for family in FAMILIES if abroad_light[family] == at_home[family]]}


def _choice_file(host: str, native: dict[str, str]) -> Path:
    """Where a choice is kept: the virtual environment (it is measured once per machine, torch and this file)."""
    import importlib.metadata

    variables = {name: native[name] for name in PROFILE_VARIABLES if name in native}
    key = json.dumps([sorted(_flags(_cpuinfo())), platform.machine(), host, variables,
                      importlib.metadata.version("torch"), hashlib.sha256(Path(__file__).read_bytes()).hexdigest()])
    return Path(sys.prefix) / "labkit-cpu-profiles" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def chosen(host: str, native: dict[str, str]) -> dict:
    """:func:`choose`'s answer, measured once per virtual environment and kept there."""
    path = _choice_file(host, native)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    answer = choose(host, native)
    try:
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(answer))
    except OSError:  # a read-only environment measures again next time
        pass
    return answer


def apply(environ: dict[str, str] = os.environ) -> str:
    """Put the host ``LABKIT_CPU_HOST`` asks for and the second set ``LABKIT_CPU_PROFILE=foreign`` asks for into
    ``environ`` (before torch computes) and say which. Returns :func:`describe`'s line.

    Variables the caller already set are left as they are, and neither chosen nor taken back later. The choice is
    kept in ``LABKIT_CPU_PROFILE_STATE``, so the workers and kernels this process starts inherit it unmeasured.
    """
    if STATE not in environ:
        caller = sorted(name for name in PROFILE_VARIABLES if name in environ)
        host = host_class(environ)
        native = {name: value for name, value in HOST_VARIABLES.get(host, {}).items()
                  if host != native_capability() and name not in caller}
        environ.update(native)
        second = {"suite": {}, "light": {}, "unchanged": list(FAMILIES), "unchanged_light": list(FAMILIES)}
        if environ.get(SWITCH, "native") == "foreign":
            base = {name: value for name, value in environ.items() if name not in (SWITCH, STATE)}
            second = chosen(host, base)
            second = {**second, **{part: {name: value for name, value in second[part].items() if name not in caller}
                                   for part in ("suite", "light")}}
        environ.update(second["suite"])
        environ[STATE] = json.dumps({"host": host, "native": native, "caller": caller, **second})
    return describe(environ)


def _state(environ: dict[str, str]) -> dict | None:
    return json.loads(environ[STATE]) if STATE in environ else None


def native_environment(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` without the second kernel set: what a process started from a foreign run gets to compute natively
    (the browser test's JupyterLab). The simulated host's variables and those the caller set themselves are kept."""
    state = _state(environ)
    plain = {name: value for name, value in environ.items() if name not in (SWITCH, STATE)}
    if state is None:
        return plain
    for name in {*state["suite"], *state["light"]}:
        plain.pop(name, None)
    return {**plain, **state["native"]}


def notebook_environment(environ: dict[str, str], notebook: Path) -> dict[str, str]:
    """The variables a solution notebook's kernel computes with beyond the suite's: the dear part of the set, for a
    light lab's (:data:`LIGHT_LABS`); none for another notebook."""
    state = _state(environ)
    if state is None or notebook.parent.name != "solutions" or not notebook.name.startswith(LIGHT_LABS):
        return {}
    return {name: value for name, value in state["light"].items() if environ.get(name) != value}


def describe_variables(environ: dict[str, str]) -> str:
    return " ".join(f"{name}={environ[name]}" for name in PROFILE_VARIABLES if name in environ) or "no variable"


def describe(environ: dict[str, str] = os.environ) -> str:
    """One line naming the kernels this process computes with: native, or foreign and its variables."""
    state = _state(environ)
    host = state["host"] if state else host_class(environ)
    native = native_environment(environ)
    own = f"this processor: {host_label()}" + (f", computing as {host} ({describe_variables(native)})"
                                               if host != native_capability() else "")
    differing = {name: value for name, value in environ.items() if name in PROFILE_VARIABLES
                 and native.get(name) != value}
    if not differing:
        return f"native ({own})"
    return f"foreign: {' '.join(f'{name}={value}' for name, value in differing.items())} ({own})"


def pytest_report_header(config) -> list[str]:
    state = _state(os.environ)
    lines = [f"CPU profile of the tests and the solution notebooks' kernels: {describe()}"]
    if state is not None and os.environ.get(SWITCH) == "foreign":
        if state["light"] != state["suite"]:
            light = ", ".join(LIGHT_LABS)
            lines.append(f"CPU profile of labs {light}' solution kernels: {describe({**os.environ, **state['light']})}")
        lines.append(f"CPU profile of the browser test's JupyterLab (learner notebooks): "
                     f"{describe(native_environment(dict(os.environ)))}")
        if state["unchanged"]:
            lines.append(f"{' and '.join(state['unchanged'])}: the same bits in the suite's set as natively on this "
                         "processor" + (f" (moved in labs {', '.join(LIGHT_LABS)}' kernels only)"
                                        if set(state["unchanged"]) - set(state["unchanged_light"]) else ""))
    return lines


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and item.path.suffix == ".ipynb":  # a notebook cell under nbval: which kernels computed it
        kernels = {**os.environ, **notebook_environment(dict(os.environ), item.path)}
        report.sections.append(("CPU profile", f"this notebook's kernel computed with the {describe(kernels)} "
                                               f"profile at OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'default')}"))
