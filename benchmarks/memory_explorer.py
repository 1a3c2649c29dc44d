"""The KV-cache explorer's update latency: one control change -> compute + render + PNG, as a learner feels it.

About 200 changes cycle through every control (context, batch, formats, attention, tensor parallelism, model,
GPU). Printed: p50/p95 in ms of the whole update and of compute() alone, and how the update compares with
encoding the same figure once more (the floor set by matplotlib + PNG). Never asserts on time.
"""

from __future__ import annotations

import itertools
import statistics
import time


def _changes(n_changes: int):
    from labkit.core.spec import ATTENTION
    from labkit.explorers.memory import KV_FORMATS, PREFILL, TP_DEGREES, WEIGHT_FORMATS

    cycles = [("log2_seq", range(7, 18)), ("log2_batch", range(0, 11)), ("weight_fmt", WEIGHT_FORMATS),
              ("kv_dtype", KV_FORMATS), ("attention", ATTENTION), ("tp", TP_DEGREES),
              ("prefill_chunk", [value for _, value in PREFILL]),
              ("preset", ["Llama-3-8B", "Llama-3.3-70B", "Mistral-7B", "Qwen3-0.6B", "SmolLM2-135M"]),
              ("gpu_name", ["A100-80GB", "H100-SXM", "T4", "L4", "H200"])]
    streams = {name: itertools.cycle(values) for name, values in cycles}
    names = itertools.cycle(streams)  # one control after another, each stepping through its values
    for _ in range(n_changes):
        name = next(names)
        yield name, next(streams[name])


def main(n_changes: int = 200) -> None:
    from labkit.core.timing import percentile
    from labkit.explorers.memory import compute, memory_explorer

    box = memory_explorer()
    update_ms, compute_ms = [], []
    for name, value in _changes(n_changes):
        control = box.controls[name]
        if control.value == value:
            continue
        started = time.perf_counter()
        control.value = value  # the observer runs compute + render + PNG encoding synchronously
        update_ms.append((time.perf_counter() - started) * 1e3)
        values = {k: c.value for k, c in box.controls.items()}
        batch_size, seq_len = 2 ** values.pop("log2_batch"), 2 ** values.pop("log2_seq")
        started = time.perf_counter()
        compute(batch_size=batch_size, seq_len=seq_len, **values)
        compute_ms.append((time.perf_counter() - started) * 1e3)
    png_ms = []
    for _ in range(30):
        started = time.perf_counter()
        box.figure.canvas.refresh()
        png_ms.append((time.perf_counter() - started) * 1e3)

    print(f"KV-cache explorer, {len(update_ms)} control changes")
    print(f"{'':<34} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
    for label, values in [("one update (compute+render+PNG)", update_ms), ("compute() alone", compute_ms),
                          ("figure -> PNG alone (floor)", png_ms)]:
        print(f"{label:<34} {percentile(values, 50):>8.2f} {percentile(values, 95):>8.2f} {max(values):>8.2f}")
    print(f"update / PNG floor (medians): {statistics.median(update_ms) / statistics.median(png_ms):.2f}")
    print("target: well under 50 ms per change")


if __name__ == "__main__":
    main()
