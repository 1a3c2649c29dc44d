"""Where a decode step's time goes: the weight matmuls against everything else, measured by ``torch.profiler``.

A decode step is memory-bound when its time is the bytes of its weights over the memory bandwidth. What is not
reading weights is overhead: the small operations between the matmuls (norms, the rotary embedding, attention
over the cache, casts, residual adds) and the Python that launches them. :func:`profile_decode` runs a few decode
steps under ``torch.profiler`` and splits each step's CPU time into the matmul kernels (whatever the weight
format: ``mm``/``addmm`` for FP32, oneDNN's packed BF16 matmul, the INT8 and INT4 kernels) and the rest.

The profiler's own bookkeeping slows every operation a little, so the parts are shares of a profiled step, not a
timing to quote; the step time itself comes from :mod:`labkit.runtime.timing`. Layer: runtime. Used by lab 06 and
``benchmarks/decode.py``.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from labkit.core import validation
from labkit.runtime.forward import decode_one_token, prefill
from labkit.runtime.timing import held_threads

# The kernels that multiply by a weight matrix, by the name the profiler gives them (every weight format).
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::_weight_int8pack_mm", "aten::_weight_int4pack_mm_for_cpu",
              "mkldnn::_linear_pointwise")


@dataclass(frozen=True)
class OperatorTime:
    """One operator's share of a decode step: calls per step and self CPU seconds per step (means)."""

    name: str
    calls: float
    self_s: float


@dataclass(frozen=True)
class StepProfile:
    """One decode step's CPU time, split: the weight matmuls and everything else (means over the profiled steps),
    and the operators that take the most of it (``top``, largest self time first)."""

    matmul_s: float
    other_s: float
    ops_per_step: int  # operator calls the profiler saw per step (each costs a dispatch)
    steps: int
    threads: int
    top: tuple[OperatorTime, ...] = ()

    @property
    def step_s(self) -> float:
        return self.matmul_s + self.other_s

    @property
    def matmul_share(self) -> float:
        return self.matmul_s / self.step_s


def profile_decode(lm: Any, token_ids: torch.Tensor, steps: int = 6, *, threads: int | None = None,
                   top: int = 8) -> StepProfile:
    """Prefill ``token_ids`` (``[1, prompt_len]``), take two untimed decode steps, then profile ``steps`` more.

    Self CPU time is summed per operator: the matmul kernels of :data:`MATMUL_OPS` on one side, every other
    operator on the other (an operator's self time excludes the operators it calls, so nothing counts twice).
    The ``top`` operators by self time are kept with their calls per step.
    """
    from torch.profiler import ProfilerActivity, profile

    validation.tensor("token_ids", token_ids, kind="int", ndim=2, shape="[1, prompt_len]", nonempty=True)
    steps = validation.integer("steps", steps, min=1)
    top = validation.integer("top", top, min=0)
    with held_threads(threads) as held, torch.inference_mode():
        logits, cache = prefill(lm, token_ids)
        token = logits.argmax(dim=-1, keepdim=True)  # [1, 1]
        for _ in range(2):  # warm-up: the first steps pay for allocations and kernel choice
            logits, cache = decode_one_token(lm, token, cache)
            token = logits.argmax(dim=-1, keepdim=True)
        with _kineto_quiet(), profile(activities=[ProfilerActivity.CPU]) as profiled:
            for _ in range(steps):
                logits, cache = decode_one_token(lm, token, cache)
                token = logits.argmax(dim=-1, keepdim=True)
    events = profiled.key_averages()
    matmul_us = sum(event.self_cpu_time_total for event in events if event.key in MATMUL_OPS)
    total_us = sum(event.self_cpu_time_total for event in events)
    calls = sum(event.count for event in events)
    largest = sorted(events, key=lambda event: event.self_cpu_time_total, reverse=True)[:top]
    return StepProfile(matmul_us / steps / 1e6, (total_us - matmul_us) / steps / 1e6, round(calls / steps), steps,
                       held, tuple(OperatorTime(event.key, event.count / steps, event.self_cpu_time_total / steps / 1e6)
                                   for event in largest))


@contextlib.contextmanager
def _kineto_quiet() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null while the profiler starts and stops: torch 2.13's kineto writes two
    ``USDT ... profiler_start/stop`` lines there with no setting to turn them off (neither KINETO_LOG_LEVEL nor
    TORCH_CPP_LOG_LEVEL does), and a notebook would show them as errors. Python's own ``sys.stderr`` is left alone."""
    import sys

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real descriptor 2 (an embedded interpreter): nothing to silence
        yield
        return
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
