"""tests/cpu_profiles.py: the second kernel set `make test` computes with, how it is chosen, and what it catches.

The last test is the point of it all: a notebook whose checked output holds only on this processor's own kernels
(the bits of a matmul, a softmax, a layer norm) passes nbval natively and fails under the second set, with a failure
that names the profile. Its premise (the second set computes other bits) is what :func:`cpu_profiles.choose`
measures, so it holds on every processor class where some variable moves some library's kernels, and the test says
so in one line where none does.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cpu_profiles

TESTS = Path(__file__).resolve().parent
AVX512_FLAGS = "flags : sse4_2 avx2 fma avx512f avx512bw avx512vl avx512dq"


def test_each_class_first_tries_the_next_processor_down_and_keeps_the_slow_settings_from_the_suite():
    first = {host: {family: next(c for c in candidates if c.family == family)
                    for family in {c.family for c in candidates}}
             for host, candidates in cpu_profiles.CANDIDATES.items()}
    assert first["AVX512"]["ATen"].variables == (("ATEN_CPU_CAPABILITY", "avx2"),)
    assert first["AVX512"]["MKL"].variables == (("MKL_ENABLE_INSTRUCTIONS", "AVX2"),)
    assert first["AVX512"]["oneDNN"].variables == (("ONEDNN_MAX_CPU_ISA", "AVX2"),)
    assert first["AVX2"]["ATen"].variables == (("ATEN_CPU_CAPABILITY", "default"),)  # nothing lower but unvectorized
    assert first["AVX2"]["oneDNN"].variables == (("ONEDNN_MAX_CPU_ISA", "SSE41"),)
    dear = {(c.family, dict(c.variables).popitem()[1]) for cs in cpu_profiles.CANDIDATES.values() for c in cs if c.dear}
    assert dear == {("ATen", "default"), ("MKL", "COMPATIBLE")}
    assert cpu_profiles.native_capability("flags : sse2 avx avx2 avx512f avx512vl") == "AVX2"  # no BW/DQ: AVX2 kernels
    assert cpu_profiles.native_capability("processor : 0") == "other"
    assert cpu_profiles.host_label(AVX512_FLAGS + " avx512_bf16") == "AVX-512 with BF16/AMX"
    assert cpu_profiles.host_label("flags : avx2") == "AVX2 only"


def test_a_simulated_host_is_a_lower_class_and_anything_else_is_refused():
    assert cpu_profiles.host_class({"LABKIT_CPU_HOST": "AVX2"}, AVX512_FLAGS) == "AVX2"
    with pytest.raises(ValueError, match=r"LABKIT_CPU_HOST='AVX2': this processor's own kernels are other"):
        cpu_profiles.host_class({"LABKIT_CPU_HOST": "AVX2"}, "flags : sse2")
    with pytest.raises(ValueError, match=r"LABKIT_CPU_HOST='avx512': a simulated host is one of \['AVX2'\]"):
        cpu_profiles.host_class({"LABKIT_CPU_HOST": "avx512"}, AVX512_FLAGS)


def test_apply_sets_only_what_the_caller_left_unset_and_native_environment_takes_back_only_that(monkeypatch):
    measured = {"suite": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
                "light": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "MKL_CBWR": "COMPATIBLE"},
                "unchanged": ["oneDNN"], "unchanged_light": ["oneDNN"]}
    monkeypatch.setattr(cpu_profiles, "chosen", lambda host, native: measured)
    environ = {"LABKIT_CPU_PROFILE": "foreign", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "PATH": "/bin"}
    described = cpu_profiles.apply(environ)
    assert environ["MKL_ENABLE_INSTRUCTIONS"] == "SSE4_2" and environ["ATEN_CPU_CAPABILITY"] == "avx2"
    assert "MKL_CBWR" not in environ  # dear: the light labs' solution kernels only
    light, heavy = Path("notebooks/solutions/03_number_formats.ipynb"), Path("notebooks/solutions/04_outliers_quantization.ipynb")
    assert cpu_profiles.notebook_environment(environ, light) == {"MKL_CBWR": "COMPATIBLE"}
    assert cpu_profiles.notebook_environment(environ, heavy) == {}
    assert cpu_profiles.notebook_environment(environ, Path("notebooks/03_number_formats.ipynb")) == {}  # learner copy
    assert described.startswith("foreign: ATEN_CPU_CAPABILITY=avx2 (")  # the caller's own choice is not the profile's
    assert cpu_profiles.native_environment(environ) == {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "PATH": "/bin"}
    assert cpu_profiles.apply(environ) == described  # applied once: a worker inherits the state, measures nothing
    unchanged = {"PATH": "/bin"}
    assert cpu_profiles.apply(unchanged).startswith("native (")
    assert cpu_profiles.native_environment(unchanged) == {"PATH": "/bin"}


@pytest.mark.skipif(cpu_profiles.native_capability() != "AVX512", reason="a lower class is simulated on AVX-512 only")
def test_a_simulated_avx2_host_keeps_its_kernels_for_the_browser_and_gets_its_own_second_set(monkeypatch):
    seen = {}
    monkeypatch.setattr(cpu_profiles, "chosen", lambda host, native: seen.update(host=host, native=dict(native)) or
                        {"suite": {"ONEDNN_MAX_CPU_ISA": "SSE41"}, "light": {"ATEN_CPU_CAPABILITY": "default",
                                                                             "ONEDNN_MAX_CPU_ISA": "SSE41"},
                         "unchanged": ["ATen"], "unchanged_light": []})
    environ = {"LABKIT_CPU_PROFILE": "foreign", "LABKIT_CPU_HOST": "AVX2"}
    cpu_profiles.apply(environ)
    assert seen["host"] == "AVX2" and seen["native"]["ATEN_CPU_CAPABILITY"] == "avx2"  # measured against the host
    assert environ["ONEDNN_MAX_CPU_ISA"] == "SSE41" and environ["ATEN_CPU_CAPABILITY"] == "avx2"
    native = cpu_profiles.native_environment(environ)
    assert {name: native[name] for name in cpu_profiles.HOST_VARIABLES["AVX2"]} == cpu_profiles.HOST_VARIABLES["AVX2"]
    assert "computing as AVX2" in cpu_profiles.describe(native) and cpu_profiles.describe(native).startswith("native")


@pytest.mark.skipif(os.environ.get(cpu_profiles.SWITCH) != "foreign",
                    reason="this run computes natively (make test sets LABKIT_CPU_PROFILE=foreign)")
def test_this_run_computes_with_the_second_set():
    import torch

    state = json.loads(os.environ[cpu_profiles.STATE])
    capability = {**state["native"], **state["suite"]}.get("ATEN_CPU_CAPABILITY")
    if capability is None:
        pytest.skip("on this processor the suite's second set leaves torch's own kernels as they are (the light labs' "
                    f"solution kernels: {state['light'].get('ATEN_CPU_CAPABILITY', 'native')})")
    assert torch.backends.cpu.get_cpu_capability() == capability.upper()


def test_the_choice_moves_every_family_it_names_and_an_avx2_host_gets_one_too():
    """The premise, measured on this processor: each family the choice names computes other bits under it. On an
    AVX-512 machine the same holds for the AVX2 host it simulates (where ATen has only its unvectorized kernels)."""
    hosts = [cpu_profiles.native_capability()] + (["AVX2"] if cpu_profiles.native_capability() == "AVX512" else [])
    for host in hosts:
        native = {**cpu_profiles.native_environment(dict(os.environ)), **cpu_profiles.HOST_VARIABLES.get(host, {})}
        if host == cpu_profiles.native_capability():
            native = {name: value for name, value in native.items() if name not in cpu_profiles.PROFILE_VARIABLES}
        choice = cpu_profiles.chosen(host, native)  # measured by cpu_profiles.choose, once per machine
        if host == "other" and len(choice["unchanged_light"]) == len(cpu_profiles.FAMILIES):
            pytest.skip("no kernel variable moves any library's kernels on this processor: its runs are native")
        at_home = cpu_profiles.digests(native)
        for part, unchanged in (("suite", "unchanged"), ("light", "unchanged_light")):
            abroad = cpu_profiles.digests({**native, **choice[part]})
            for family in cpu_profiles.FAMILIES:
                assert (abroad[family] != at_home[family]) == (family not in choice[unchanged]), (host, part, choice)
        assert choice["unchanged_light"] == [], (host, choice)  # on x86 every family moves in the light labs
        if host == "AVX2":
            assert choice["light"]["ATEN_CPU_CAPABILITY"] == "default"
            assert "ATEN_CPU_CAPABILITY" not in choice["suite"]  # dear: not for the suite's own processes


def _run(command, environ, cwd):
    return subprocess.run(command, env=environ, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_a_checked_output_that_holds_only_on_native_kernels_fails_under_the_second_set(tmp_path):
    native = {**cpu_profiles.native_environment(dict(os.environ)), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(TESTS)}
    native.pop("LABKIT_CPU_HOST", None)
    foreign = dict(native, LABKIT_CPU_PROFILE="foreign")
    cpu_profiles.apply(foreign)
    # What a light lab's solution kernel computes with: the whole second set.
    foreign.update(cpu_profiles.notebook_environment(foreign, Path("solutions") / f"{cpu_profiles.LIGHT_LABS[0]}.ipynb"))
    state = json.loads(foreign[cpu_profiles.STATE])
    if len(state["unchanged_light"]) == len(cpu_profiles.FAMILIES):
        pytest.skip(f"no kernel variable moves any library's kernels on this processor ({cpu_profiles.host_label()})")

    notebook = tmp_path / "fragile.ipynb"
    notebook.write_text(json.dumps({
        "cells": [{"cell_type": "code", "execution_count": None, "id": "fragile", "outputs": [],
                   "metadata": {"tags": ["nbval-check-output"]}, "source": cpu_profiles.PROBE}],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5}))
    built = _run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", "--inplace",
                  str(notebook)], native, tmp_path)  # saved with the native kernels' output, as a build does
    assert built.returncode == 0, built.stderr
    assert "oneDNN" in json.dumps(json.loads(notebook.read_text())["cells"][0]["outputs"])

    nbval = [sys.executable, "-m", "pytest", "-p", "cpu_profiles", "-p", "no:cacheprovider", "--rootdir",
             str(tmp_path), "-c", os.devnull, "--nbval-lax", "--nbval-current-env", str(notebook)]
    at_home = _run(nbval, native, tmp_path)
    assert at_home.returncode == 0, at_home.stdout[-3000:]
    abroad = _run(nbval, foreign, tmp_path)
    assert abroad.returncode == 1, abroad.stdout[-3000:]
    assert "1 failed" in abroad.stdout and "CPU profile" in abroad.stdout
    named = f"computed with the {cpu_profiles.describe(foreign)} profile"
    assert named in abroad.stdout, abroad.stdout[-3000:]
    assert named.startswith("computed with the foreign: ")
