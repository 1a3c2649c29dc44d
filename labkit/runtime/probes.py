"""This machine's roofline: micro-benchmarks of its memory read bandwidth and its matmul FLOP/s.

Layer 2 (runtime), lab 06. The probes use ``torch.utils.benchmark.Timer``, which does its own warm-up, holds the
thread count and returns a median, rather than a hand-written loop. The ridge point they imply comes from
``labkit.core.roofline``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.benchmark import Timer

from labkit.core import validation
from labkit.core.roofline import ridge_point
from labkit.runtime.timing import held_threads


@dataclass(frozen=True)
class Probe:
    """One micro-benchmark: what it measured, its median time and spread, and the rate it implies."""

    what: str
    work: float  # bytes read, or FLOPs done, per run of the statement
    median_s: float
    iqr_s: float
    n_measurements: int
    threads: int

    @property
    def rate(self) -> float:
        """Work per second: bytes/s for a bandwidth probe, FLOP/s for a matmul probe."""
        return self.work / self.median_s


def _timed(stmt: str, values: dict[str, Any], threads: int, min_run_time: float) -> Any:
    return Timer(stmt, globals=values, num_threads=threads).blocked_autorange(min_run_time=min_run_time)


def bandwidth_probe(n_bytes: int = 256 * 2**20, *, threads: int | None = None, min_run_time: float = 0.5) -> Probe:
    """Memory read bandwidth: the time to sum a float32 tensor of ``n_bytes`` (larger than any CPU cache).

    A sum reads every byte once and writes nothing, as a decode step reads its weights.
    """
    n_bytes = validation.integer("n_bytes", n_bytes)
    if n_bytes < 4 * 2**20:
        raise validation.fail(ValueError, "n_bytes", "an int >= 4 MiB (4,194,304)", n_bytes)
    min_run_time = validation.real("min_run_time", min_run_time, min=0, min_open=True)
    with held_threads(threads) as held:
        values = torch.ones(n_bytes // 4)
        measured = _timed("values.sum()", {"values": values}, held, min_run_time)
    return Probe(f"sum of {n_bytes / 2**20:,.0f} MiB (float32)", float(values.numel() * 4), measured.median,
                 measured.iqr, len(measured.times), held)


def matmul_probe(size: int = 1024, *, dtype: torch.dtype = torch.float32, threads: int | None = None,
                 min_run_time: float = 0.5) -> Probe:
    """Matmul throughput: 2 x size^3 FLOPs of a square product, as prefill's projections do."""
    size = validation.integer("size", size, min=16)
    min_run_time = validation.real("min_run_time", min_run_time, min=0, min_open=True)
    generator = torch.Generator().manual_seed(0)
    with held_threads(threads) as held:
        left = torch.randn(size, size, generator=generator).to(dtype)
        right = torch.randn(size, size, generator=generator).to(dtype)
        measured = _timed("left @ right", {"left": left, "right": right}, held, min_run_time)
    return Probe(f"{size} x {size} matmul ({str(dtype).replace('torch.', '')})", 2.0 * size**3, measured.median,
                 measured.iqr, len(measured.times), held)


@dataclass(frozen=True)
class MachineRoofline:
    """This machine's two roofs, measured at one thread count."""

    bandwidth: Probe
    matmul: Probe

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth.rate

    @property
    def peak_flops_per_s(self) -> float:
        return self.matmul.rate

    @property
    def ridge(self) -> float:
        """FLOPs per byte where this machine turns from memory-bound to compute-bound."""
        return ridge_point(self.peak_flops_per_s, self.bandwidth_bytes_per_s)


def roofline_probe(*, threads: int | None = None, quick: bool = False) -> MachineRoofline:
    """Bandwidth and matmul probes at one thread count: a few seconds with ``quick``, about ten without."""
    validation.boolean("quick", quick)
    run_time = 0.2 if quick else 1.5
    with held_threads(threads) as held:
        return MachineRoofline(bandwidth_probe(threads=held, min_run_time=run_time),
                               matmul_probe(1024, threads=held, min_run_time=run_time))
