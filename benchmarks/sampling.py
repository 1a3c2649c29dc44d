"""Sampling filters on a [64, 49152] float32 batch, labkit against transformers' warpers in the same run, and the
sampling explorer's update latency (what one slider move costs in Python).

Two batches: the embedded model's next-token logits at 64 positions of a text (peaked, like real decoding) and
random normal logits (flat: long nuclei). Each row times labkit and transformers in the same loop, one call of each
per run in alternating order, so that a busy machine slows both alike; medians over runs; ratio = labkit time /
transformers time (below 1: labkit is faster). Compare ratios, not times, between machines or runs.
Run: ``python -m benchmarks.sampling``.
"""

from __future__ import annotations

import statistics
import time

import torch

BATCH_SIZE = 64
TEXT = ("The lighthouse keeper climbed the spiral stairs every evening to light the lamp. Ships passing the rocky "
        "coast relied on its beam, and on stormy nights he stayed awake until dawn, watching the waves. In the "
        "morning he wrote the weather in a thick logbook, cleaned the brass and the great lens, and walked down to "
        "the village for bread, fish and the news that the supply boat brought once a week.")


def _median_ms_pair(ours, theirs, runs: int) -> tuple[float, float]:
    """Median ms of each function, timed alternately (ours first on even runs, theirs first on odd runs)."""
    ours(), theirs()  # warm-up
    times = {ours: [], theirs: []}
    for run in range(runs):
        for fn in (ours, theirs) if run % 2 == 0 else (theirs, ours):
            started = time.perf_counter()
            fn()
            times[fn].append(time.perf_counter() - started)
    return statistics.median(times[ours]) * 1e3, statistics.median(times[theirs]) * 1e3


def _model_logits(lm) -> torch.Tensor:
    from labkit.runtime import full_logits

    ids = lm.text_ids(TEXT)[:, :BATCH_SIZE]  # [1, 64]
    assert ids.shape[1] == BATCH_SIZE, f"TEXT has {ids.shape[1]} tokens, fewer than the batch of {BATCH_SIZE}"
    return full_logits(lm, ids)[0].clone()  # [64, vocab]: one next-token row per position


def _filter_rows(logits: torch.Tensor):
    from transformers.generation.logits_process import (
        LogitsProcessorList, MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
    )

    from labkit.core import sampling

    chain = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(50), TopPLogitsWarper(0.9),
                                 MinPLogitsWarper(0.05)])
    return [
        ("temperature 0.7", lambda: sampling.apply_temperature(logits, 0.7),
         lambda: TemperatureLogitsWarper(0.7)(None, logits)),
        ("temperature 1.5", lambda: sampling.apply_temperature(logits, 1.5),
         lambda: TemperatureLogitsWarper(1.5)(None, logits)),
        ("top-k 50", lambda: sampling.top_k_filter(logits, 50), lambda: TopKLogitsWarper(50)(None, logits)),
        ("top-p 0.9", lambda: sampling.top_p_filter(logits, 0.9), lambda: TopPLogitsWarper(0.9)(None, logits)),
        ("min-p 0.05", lambda: sampling.min_p_filter(logits, 0.05), lambda: MinPLogitsWarper(0.05)(None, logits)),
        ("T 0.7, k 50, p 0.9, min-p 0.05",
         lambda: sampling.sampling_logits(logits, 0.7, 50, 0.9, 0.05), lambda: chain(None, logits)),
    ]


def _explorer_latency_ms(lm, moves: int) -> list[float]:
    from labkit.explorers.sampling import sampling_explorer

    explorer = sampling_explorer(lm)
    settings = [(t, k, p, m) for t in (0.0, 0.4, 0.7, 1.0, 1.5) for k in (0, 20) for p in (0.5, 0.9, 1.0)
                for m in (0.0, 0.05)]
    times = []
    for move in range(moves):
        temperature, top_k, top_p, min_p = settings[move % len(settings)]
        explorer.temperature.value, explorer.top_k.value = temperature, top_k
        explorer.top_p.value, explorer.min_p.value = top_p, min_p
        started = time.perf_counter()
        explorer.update()  # what one slider move runs: compute, render, encode
        times.append((time.perf_counter() - started) * 1e3)
    return times


def main(runs: int = 41, moves: int = 200) -> None:
    from labkit.runtime.models import load_model

    lm = load_model(progress=False)
    vocab = lm.spec.vocab
    batches = [("model logits", _model_logits(lm)),
               ("random logits", torch.randn(BATCH_SIZE, vocab, generator=torch.Generator().manual_seed(0)) * 2)]
    print(f"filters on a [{BATCH_SIZE}, {vocab}] float32 batch; torch threads: {torch.get_num_threads()}; "
          f"median of {runs} alternating runs")
    print(f"{'batch':<14} {'filter':<32} {'labkit ms':>10} {'transformers ms':>16} {'ratio':>7} "
          f"{'rows/s (labkit)':>16}")
    for batch_name, logits in batches:
        for name, ours, theirs in _filter_rows(logits):
            ours_ms, theirs_ms = _median_ms_pair(ours, theirs, runs)
            print(f"{batch_name:<14} {name:<32} {ours_ms:>10.2f} {theirs_ms:>16.2f} {ours_ms / theirs_ms:>7.2f} "
                  f"{BATCH_SIZE / ours_ms * 1e3:>16,.0f}")
    print()
    # One [vocab] row is too small to gain from several threads, and on a busy machine waiting for a descheduled
    # worker thread dominates: the explorer's latency is printed with the default thread count and with one.
    default_threads = torch.get_num_threads()
    print(f"sampling explorer update (compute + render + PNG), {moves} slider moves")
    for threads in dict.fromkeys((default_threads, 1)):
        torch.set_num_threads(threads)
        latency = sorted(_explorer_latency_ms(lm, moves))
        p50, p95 = latency[len(latency) // 2], latency[int(len(latency) * 0.95)]
        print(f"  torch threads {threads}: p50 {p50:.1f} ms, p95 {p95:.1f} ms, max {latency[-1]:.1f} ms")
    torch.set_num_threads(default_threads)


if __name__ == "__main__":
    main()
