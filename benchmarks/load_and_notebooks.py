"""Model load time, cold (converting the GGUF) and warm (from the cache), each in a new process, and each
learner/solution notebook's execution time. Medians over a few runs; the spread is printed too."""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Imports (torch, transformers and the Llama modules) are timed apart: they cost the same on every start, cached
# or not, and would otherwise hide what the cache saves.
LOAD = (
    "import time; started = time.perf_counter(); import torch, transformers; "
    "from transformers import LlamaForCausalLM, AutoTokenizer; imports_s = time.perf_counter() - started; "
    "from labkit.runtime.models import load_model; print(imports_s, load_model(progress=False).load_s)"
)


def _load_in_new_process(cache: str) -> tuple[float, float]:
    """(imports_s, load_model_s) measured in a fresh Python process."""
    env = {"LABKIT_CACHE": cache, "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True, text=True, check=True)
    imports_s, load_s = result.stdout.strip().splitlines()[-1].split()
    return float(imports_s), float(load_s)


def _row(label: str, seconds: list[float]) -> str:
    return f"{label:<44} {statistics.median(seconds):>8.2f} {min(seconds):>8.2f} {max(seconds):>8.2f} {len(seconds):>5}"


def main(runs: int = 3, notebooks: bool = True) -> None:
    print(f"{'load_model() in a new process':<44} {'median s':>8} {'min':>8} {'max':>8} {'runs':>5}")
    imports, cold, warm = [], [], []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as cache:
            imports_s, cold_s = _load_in_new_process(cache)  # empty cache: dequantize and write
            imports.append(imports_s)
            cold.append(cold_s)
            warm.append(_load_in_new_process(cache)[1])  # the cache just written: verify and memory-map
    print(_row("imports (torch, transformers; every start)", imports))
    print(_row("cold load (convert GGUF, write cache)", cold))
    print(_row("warm load (verified cache)", warm))
    print(f"warm / cold: {statistics.median(warm) / statistics.median(cold):.3f}; with imports: "
          f"{(statistics.median(warm) + statistics.median(imports)) / (statistics.median(cold) + statistics.median(imports)):.3f}")
    print()
    if not notebooks:
        return

    from nbclient import NotebookClient
    import nbformat

    print(f"{'notebook execution (warm cache)':<44} {'median s':>8} {'min':>8} {'max':>8} {'runs':>5}")
    for path in sorted((ROOT / "notebooks").rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        seconds = []
        for _ in range(runs):
            notebook = nbformat.read(path, as_version=4)
            started = time.perf_counter()
            NotebookClient(notebook, timeout=900, resources={"metadata": {"path": str(path.parent)}}).execute()
            seconds.append(time.perf_counter() - started)
        print(_row(str(path.relative_to(ROOT)), seconds))
