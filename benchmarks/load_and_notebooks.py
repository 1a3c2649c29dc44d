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
LOAD = "from labkit.models import load_model; print(load_model(progress=False).load_s)"


def _load_in_new_process(cache: str) -> float:
    env = {"LABKIT_CACHE": cache, "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True, text=True, check=True)
    return float(result.stdout.strip().splitlines()[-1])


def _row(label: str, seconds: list[float]) -> str:
    return f"{label:<44} {statistics.median(seconds):>8.2f} {min(seconds):>8.2f} {max(seconds):>8.2f} {len(seconds):>5}"


def main(runs: int = 3) -> None:
    print(f"{'load_model() in a new process':<44} {'median s':>8} {'min':>8} {'max':>8} {'runs':>5}")
    cold, warm = [], []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as cache:
            cold.append(_load_in_new_process(cache))  # empty cache: dequantize and write
            warm.append(_load_in_new_process(cache))  # the cache just written: verify and memory-map
    print(_row("cold (convert GGUF, write cache)", cold))
    print(_row("warm (verified cache)", warm))
    print(f"warm / cold: {statistics.median(warm) / statistics.median(cold):.3f}")
    print()

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
