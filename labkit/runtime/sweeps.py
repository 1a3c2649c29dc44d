"""Sweeps on this machine (threads, prompt lengths, batch sizes, cached contexts) and a latency model fitted to them.

Layer 2 (runtime), lab 06. Each point is timed with :mod:`labkit.runtime.timing` (warm-up, repeats, medians, a
held thread count); :func:`calibrate` fits ``labkit.core.latency_model``'s LatencyModel to the points measured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from labkit.core import validation
from labkit.core.latency_model import LatencyFit, fit_latency
from labkit.core.timing import spread
from labkit.runtime import copy_cache, crop, decode_one_token, forward, prefill, synchronize
from labkit.runtime.forward import rollback_cache
from labkit.runtime.forward import model_device
from labkit.runtime.generation import generate
from labkit.runtime.probes import bandwidth_probe
from labkit.runtime.timing import RepeatedRuns, held_threads, measure_generation


@dataclass(frozen=True)
class ThreadPoint:
    threads: int
    prefill_s: float  # median prefill of the prompt
    decode_step_s: float  # median decode step
    bandwidth_bytes_per_s: float  # the bandwidth probe at this thread count


def thread_sweep(lm: Any, token_ids: torch.Tensor, thread_counts: Sequence[int], *, max_new_tokens: int = 8,
                 repeats: int = 2, quick: bool = True) -> tuple[ThreadPoint, ...]:
    """Prefill, decode step and read bandwidth at each thread count (decode follows bandwidth, prefill FLOPs)."""
    points = []
    for threads in thread_counts:
        runs = measure_generation(lm, token_ids, max_new_tokens, repeats=repeats, threads=threads)
        decode = [s for run in runs.runs for s in run.decode_step_s]
        probe = bandwidth_probe(threads=threads, min_run_time=0.2 if quick else 1.0)
        points.append(ThreadPoint(runs.threads, runs.prefill_s.median, spread(decode).median, probe.rate))
    return tuple(points)


@dataclass(frozen=True)
class BatchPoint:
    """One batch size: each request's latency and the batch's throughput, and whether outputs stayed the same."""

    batch_size: int
    ttft_s: float  # median over repeats
    tpot_s: float | None
    e2e_s: float
    tokens_per_s: float  # output tokens of the whole batch / E2E
    same_as_alone: bool  # every row's greedy tokens equal that prompt run alone
    runs: RepeatedRuns


def same_length_prompts(lm: Any, texts: Sequence[str]) -> torch.Tensor:
    """Plain-text prompts cut to the shortest one's token count: ``[len(texts), prompt_len]``, no padding needed."""
    rows = [lm.text_ids(text) for text in texts]
    if not rows:
        raise validation.fail(ValueError, "texts", "a non-empty sequence of strings", texts)
    shortest = min(row.shape[1] for row in rows)
    return torch.cat([row[:, :shortest] for row in rows])


def batching_sweep(lm: Any, prompts: torch.Tensor, batch_sizes: Sequence[int], max_new_tokens: int, *,
                   repeats: int = 2, threads: int | None = None) -> tuple[BatchPoint, ...]:
    """Time batches of the first b prompts (``prompts``: ``[n, prompt_len]``, one length, no padding needed).

    Each prompt is also generated alone, and every row of every batch is compared with its solo output.
    """
    validation.tensor("prompts", prompts, kind="int", ndim=2, shape="[n_prompts, prompt_len]", nonempty=True)
    largest = max(validation.integer("batch_size", b, min=1, max=prompts.shape[0],
                                     note=f"there are {prompts.shape[0]} prompts") for b in batch_sizes)
    with held_threads(threads) as held:
        alone = [generate(lm, prompts[i:i + 1], max_new_tokens).new_token_ids for i in range(largest)]
        points = []
        for batch_size in batch_sizes:
            runs = measure_generation(lm, prompts[:batch_size], max_new_tokens, repeats=repeats, threads=held)
            rows = runs.runs[0].new_token_ids
            same = all(torch.equal(rows[i:i + 1], alone[i]) for i in range(batch_size))
            e2e = runs.e2e_s.median
            tpot = runs.tpot_s
            points.append(BatchPoint(batch_size, runs.ttft_s.median, None if tpot is None else tpot.median, e2e,
                                     batch_size * max_new_tokens / e2e, same, runs))
    return tuple(points)


def prefill_sweep(lm: Any, token_ids: torch.Tensor, prompt_lens: Sequence[int], *, repeats: int = 3,
                  threads: int | None = None) -> tuple[tuple[int, float], ...]:
    """(prompt_len, median prefill seconds) for prefixes of ``token_ids`` (``[1, n]``), one token generated."""
    out = []
    with held_threads(threads) as held:
        for length in prompt_lens:
            validation.integer("prompt_len", length, min=1, max=token_ids.shape[1])
            runs = measure_generation(lm, token_ids[:, :length], 1, repeats=repeats, threads=held)
            out.append((length, runs.prefill_s.median))
    return tuple(out)


@dataclass(frozen=True)
class DecodePoint:
    """Decode steps timed at one batch size after a given number of cached tokens per sequence."""

    batch_size: int
    context_len: int  # tokens cached per sequence when the point starts (warm-up steps come first)
    step_contexts: tuple[int, ...]  # tokens cached per sequence before each timed step
    step_s: tuple[float, ...]  # each timed step's wall time

    @property
    def median_context(self) -> float:
        """The median context of the timed steps (each step grows the cache by one)."""
        return spread(self.step_contexts).median

    @property
    def median_s(self) -> float:
        return spread(self.step_s).median


@dataclass(frozen=True)
class ContextSweep:
    """One long prefill, then decode steps timed at several (batch size, context length) points."""

    prefill_len: int
    prefill_s: float  # the long prompt's prefill (a TTFT point far from the short prompts)
    points: tuple[DecodePoint, ...]
    threads: int

    def point(self, batch_size: int, context_len: int) -> DecodePoint:
        """The point measured at this batch size and starting context."""
        for point in self.points:
            if (point.batch_size, point.context_len) == (batch_size, context_len):
                return point
        measured = [(p.batch_size, p.context_len) for p in self.points]
        raise validation.fail(ValueError, "(batch_size, context_len)", f"one of {measured}",
                              (batch_size, context_len))

    def select(self, pairs: Sequence[tuple[int, int]]) -> "ContextSweep":
        """The same sweep with only these (batch_size, context_len) points (to hold the others out of a fit)."""
        return ContextSweep(self.prefill_len, self.prefill_s, tuple(self.point(b, c) for b, c in pairs),
                            self.threads)


def decode_sweep(lm: Any, token_ids: torch.Tensor, pairs: Sequence[tuple[int, int]], *, steps: int = 3,
                 warmup: int = 1, threads: int | None = None) -> ContextSweep:
    """Time decode steps at each (batch_size, context_len) of ``pairs``, from one prefill of the longest context.

    ``token_ids`` ``[1, n]`` with n > every context_len. The prefill of ``token_ids[:, :longest]`` is timed once;
    each point then decodes from a copy of that cache cut to its context length and repeated over the batch
    (every row the same text: a step's cost depends on the shapes, not on the values), first ``warmup`` untimed
    steps, then ``steps`` timed ones, each a forward pass and a greedy choice as in ``generate``. The points take
    their steps in turn, one step each per round, so a slow spell of a shared machine is spread over them.
    """
    validation.tensor("token_ids", token_ids, kind="int", ndim=2, shape="[1, n_tokens]", nonempty=True)
    if token_ids.shape[0] != 1:
        raise validation.fail(ValueError, "token_ids", "one row [1, n_tokens]", tuple(token_ids.shape))
    if not isinstance(pairs, (list, tuple)) or not pairs:
        raise validation.fail(ValueError, "pairs", "a non-empty list of (batch_size, context_len)", pairs)
    for batch_size, context in pairs:
        validation.integer("batch_size", batch_size, min=1)
        validation.integer("context_len", context, min=1, max=token_ids.shape[1] - 1,
                           note="token_ids must hold one more token to feed")
    steps, warmup = validation.integer("steps", steps, min=1), validation.integer("warmup", warmup, min=0)
    longest = max(context for _, context in pairs)
    device = model_device(lm)
    with held_threads(threads) as held:
        prefill(lm, token_ids[:, :8])  # warm-up of the prefill path
        started = time.perf_counter()
        # a model whose attention slides keeps its whole prefix on this cache, so it can be cut back to any context
        _, base = forward(lm, token_ids[:, :longest], rollback_cache(lm))
        synchronize(device)
        prefill_s = time.perf_counter() - started
        caches, tokens = [], []
        for batch_size, context in pairs:
            cache = crop(copy_cache(base), context)
            cache.batch_repeat_interleave(batch_size)
            caches.append(cache)
            tokens.append(token_ids[:, context:context + 1].repeat(batch_size, 1))  # [batch, 1]: the next token
        step_s: list[list[float]] = [[] for _ in pairs]
        # Round-robin: step k of every point, then step k + 1. A slow spell on a shared machine then costs one
        # step of several points (which their medians drop), not every step of one point.
        for step in range(warmup + steps):
            for index in range(len(pairs)):
                started = time.perf_counter()
                logits, caches[index] = decode_one_token(lm, tokens[index], caches[index])
                tokens[index] = logits.cpu().argmax(dim=-1, keepdim=True)  # greedy, as generate() at T = 0
                synchronize(device)
                if step >= warmup:
                    step_s[index].append(time.perf_counter() - started)
        points = [DecodePoint(batch_size, context, tuple(range(context + warmup, context + warmup + steps)),
                              tuple(times)) for (batch_size, context), times in zip(pairs, step_s)]
    return ContextSweep(longest, prefill_s, tuple(points), held)


def calibrate(prefill_points: Sequence[tuple[int, float]], batches: Sequence[BatchPoint],
              sweep: ContextSweep | None = None) -> LatencyFit:
    """A latency model fitted to a prefill sweep (batch 1), a batching sweep and a context sweep.

    Prefill points: each (prompt_len, seconds), every prefill of the batching sweep, the sweep's long prefill.
    Decode points, one per timed run: its median step at its median context (a median shrugs off a step slowed
    by another process); the fit's context range is that of every step measured. Without a sweep every decode
    point sits at the batching sweep's one short context, and the fit reports the per-cached-token cost as
    unidentifiable.
    """
    prefill = [(length, 1, seconds) for length, seconds in prefill_points]
    prefill += [(run.prompt_len, run.batch_size, run.prefill_s) for point in batches for run in point.runs.runs]
    decode = [(run.batch_size, spread(run.context_lens[1:]).median, spread(run.decode_step_s).median)
              for point in batches for run in point.runs.runs if run.decode_step_s]
    contexts = [c for point in batches for run in point.runs.runs for c in run.context_lens[1:]]
    if sweep is not None:
        prefill.append((sweep.prefill_len, 1, sweep.prefill_s))
        decode += [(point.batch_size, point.median_context, point.median_s) for point in sweep.points]
        contexts += [c for point in sweep.points for c in point.step_contexts]
    return fit_latency(prefill, decode, (min(contexts), max(contexts)) if contexts else None)
