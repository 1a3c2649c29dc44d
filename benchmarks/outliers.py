"""The outlier visualizer's update latency: one slider move -> compute + render + PNG, as a learner feels it.

About 120 moves cycle through the layer, the tensor shown, the threshold and SmoothQuant's alpha on the embedded
model's activations (captured once). Printed: p50/p95 in ms per control and for compute() alone. Never asserts
on time.
"""

from __future__ import annotations

import itertools
import time


def main(n_moves: int = 120) -> None:
    from labkit.core.timing import percentile
    from labkit.explorers.outliers import compute, outlier_explorer
    from labkit.runtime.activations import SOURCES

    explorer = outlier_explorer()
    streams = {"layer": itertools.cycle([3, 11, 20, 27, 15, 0]), "source": itertools.cycle(list(SOURCES)[1:] + [list(SOURCES)[0]]),
               "threshold": itertools.cycle([2.0, 6.0, 20.0, 6.5, 45.0]), "alpha": itertools.cycle([0.2, 0.5, 0.8, 0.65]),
               "massive": itertools.cycle([True, False])}
    names = itertools.cycle(streams)
    per_control: dict[str, list[float]] = {name: [] for name in streams}
    compute_ms = []
    for _ in range(n_moves):
        name = next(names)
        value = next(streams[name])
        control = explorer.controls[name]
        if control.value == value:
            continue
        started = time.perf_counter()
        control.value = value  # the observer runs compute + render (when the figure changes) + PNG
        per_control[name].append((time.perf_counter() - started) * 1e3)
        started = time.perf_counter()
        compute(explorer.data, explorer.layer.value, explorer.source.value, explorer.threshold.value,
                explorer.alpha.value)
        compute_ms.append((time.perf_counter() - started) * 1e3)
    every = [v for values in per_control.values() for v in values]
    print(f"outlier visualizer, {len(every)} slider moves, prompt of {len(explorer.data.token_texts)} tokens")
    print(f"{'':<28} {'p50 ms':>8} {'p95 ms':>8}")
    rows = [(f"move: {name}", values) for name, values in per_control.items()]
    for label, values in [("any move", every), *rows, ("compute() alone", compute_ms)]:
        print(f"{label:<28} {percentile(values, 50):>8.1f} {percentile(values, 95):>8.1f}")


if __name__ == "__main__":
    main()
