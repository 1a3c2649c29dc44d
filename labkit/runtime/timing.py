"""Measuring where the time of a generation goes, on this machine: lab 06's measurements.

Every generation is timed through labkit's one loop, ``generation.generate(on_step=...)``: the callback stamps
each token's emission with ``time.perf_counter()`` (the device synchronized by the loop), and the request metrics
come from ``labkit.core.timing``. Measurements follow the PyTorch benchmarking recipe: warm-up runs first (the
first call pays for allocation and kernel selection), repeats reported as a median with their spread, and the
thread count recorded and held for the whole measurement (:func:`held_threads` restores the caller's).

Micro-benchmarks (memory read bandwidth, matmul FLOP/s) use ``torch.utils.benchmark.Timer``, which does its own
warm-up, holds the thread count and returns a median, rather than a hand-written loop.

What a local timer sees: TTFT here is from calling ``generate`` to the first token (argument checks, prefill,
choosing the token). A service's TTFT adds queueing, tokenization, transport and detokenization.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
from torch.utils.benchmark import Timer

from labkit.core import validation
from labkit.core.timing import (LatencyFit, RequestMetrics, Spread, fit_latency, itl_percentiles, request_metrics,
                                ridge_point, spread)
from labkit.runtime import copy_cache, crop, decode_one_token, prefill, synchronize
from labkit.runtime.forward import model_device
from labkit.runtime.generation import first_divergence, generate


@contextlib.contextmanager
def held_threads(threads: int | None = None) -> Iterator[int]:
    """Run the block with ``threads`` torch threads (None: as they are); the caller's count comes back after.

    >>> before = torch.get_num_threads()
    >>> with held_threads(1) as n:
    ...     n == torch.get_num_threads() == 1
    True
    >>> torch.get_num_threads() == before
    True
    """
    threads = validation.integer("threads", threads, min=1, optional=True)
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(previous)


# ---------------------------------------------------------------------------------------------------------------
# One generation, and repeats of it


@dataclass(frozen=True)
class TimedRun:
    """One timed generation: the request metrics and what each step of the loop reported."""

    metrics: RequestMetrics  # TTFT, ITL, TPOT, E2E from the emission times
    step_s: tuple[float, ...]  # each step's own wall time (step 0 is the prefill)
    context_lens: tuple[int, ...]  # tokens cached before each step (0 for the prefill)
    new_token_ids: torch.Tensor  # [batch, n_new]
    batch_size: int
    prompt_len: int
    threads: int
    step_logits: torch.Tensor | None = None  # [batch, n_new, vocab] when keep_logits=True was passed

    @property
    def prefill_s(self) -> float:
        return self.step_s[0]

    @property
    def decode_step_s(self) -> tuple[float, ...]:
        return self.step_s[1:]


def timed_generation(lm: Any, input_ids: torch.Tensor, max_new_tokens: int, *, threads: int | None = None,
                     **generate_options: Any) -> TimedRun:
    """Generate with per-token timestamps (greedy unless told otherwise); ``generate_options`` go to generate."""
    validation.integer("max_new_tokens", max_new_tokens, min=1)
    emitted: list[float] = []
    infos: list[Any] = []

    def on_step(info: Any) -> None:
        emitted.append(time.perf_counter())
        infos.append(info)

    with held_threads(threads) as held:
        started = time.perf_counter()
        result = generate(lm, input_ids, max_new_tokens, on_step=on_step, **generate_options)
    use_cache = generate_options.get("use_cache", True)
    # StepInfo.cache_length counts the cache after the step; before a decode step it held one token less.
    context = tuple(0 if i == 0 or not use_cache else info.cache_length - 1 for i, info in enumerate(infos))
    return TimedRun(request_metrics(emitted, started), tuple(info.step_s for info in infos), context,
                    result.new_token_ids, input_ids.shape[0], input_ids.shape[1], held, result.step_logits)


@dataclass(frozen=True)
class RepeatedRuns:
    """Warm-up runs thrown away, then repeats summarised by their median and spread."""

    runs: tuple[TimedRun, ...]
    warmup: int
    threads: int

    @property
    def ttft_s(self) -> Spread:
        return spread([run.metrics.ttft_s for run in self.runs])

    @property
    def tpot_s(self) -> Spread | None:
        values = [run.metrics.tpot_s for run in self.runs if run.metrics.tpot_s is not None]
        return spread(values) if values else None

    @property
    def e2e_s(self) -> Spread:
        return spread([run.metrics.e2e_s for run in self.runs])

    @property
    def prefill_s(self) -> Spread:
        return spread([run.prefill_s for run in self.runs])

    @property
    def itl_p50_p99_s(self) -> dict[float, float | None]:
        return itl_percentiles([run.metrics for run in self.runs], (50, 99))

    @property
    def same_tokens(self) -> bool:
        """Every repeat produced the same tokens (expected for greedy decoding on one machine)."""
        first = self.runs[0].new_token_ids
        return all(torch.equal(run.new_token_ids, first) for run in self.runs[1:])


def measure_generation(lm: Any, input_ids: torch.Tensor, max_new_tokens: int, *, warmup: int = 1,
                       repeats: int = 5, threads: int | None = None, **generate_options: Any) -> RepeatedRuns:
    """``warmup`` untimed generations, then ``repeats`` timed ones, all at one held thread count."""
    warmup = validation.integer("warmup", warmup, min=0)
    repeats = validation.integer("repeats", repeats, min=1)
    with held_threads(threads) as held:
        for _ in range(warmup):
            generate(lm, input_ids, max_new_tokens, **generate_options)
        runs = tuple(timed_generation(lm, input_ids, max_new_tokens, **generate_options) for _ in range(repeats))
    return RepeatedRuns(runs, warmup, held)


class GreedySteps:
    """A real generation one step at a time, for a timing harness written by hand: ``step(k)`` runs step k.

    ``step(0)`` starts a request: it prefills ``prompt_ids`` (``[1, prompt_len]``) and chooses the first token;
    ``step(k)`` for k >= 1 decodes the next one from the cache (greedy). Each call returns the chosen token id
    with the device synchronized, so a clock read after it sees the token's emission.
    """

    def __init__(self, lm: Any, prompt_ids: torch.Tensor) -> None:
        validation.tensor("prompt_ids", prompt_ids, kind="int", ndim=2, shape="[1, prompt_len]", nonempty=True)
        self.lm, self.prompt_ids = lm, prompt_ids
        self._token: torch.Tensor | None = None
        self._cache: Any = None

    def __call__(self, k: int) -> int:
        k = validation.integer("k", k, min=0)
        if k > 0 and self._cache is None:
            raise ValueError("step(0) starts a request (the prefill); call it before step(1)")
        with torch.inference_mode():
            if k == 0:
                logits, self._cache = prefill(self.lm, self.prompt_ids)
            else:
                logits, self._cache = decode_one_token(self.lm, self._token, self._cache)
            self._token = logits.argmax(dim=-1, keepdim=True)  # [1, 1]
        synchronize(model_device(self.lm))
        return int(self._token[0, 0])


# ---------------------------------------------------------------------------------------------------------------
# Cached against uncached decoding


@dataclass(frozen=True)
class CacheComparison:
    """The KV-cached loop and full recomputation on identical prefixes: logits, choices and step times."""

    steps_compared: int  # steps whose prefixes were identical in both runs
    max_abs_diff: float  # largest |cached - uncached| logit over those steps
    argmax_agree: tuple[bool, ...]  # per step: both paths pick the same greedy token
    tokens_identical: bool  # the two generations are token-identical
    cached_step_s: tuple[float, ...]  # per step, step 0 = prefill
    uncached_step_s: tuple[float, ...]  # per step: a full forward pass over the whole prefix
    prefix_lens: tuple[int, ...]  # tokens each step's forward pass sees without a cache
    new_token_ids: torch.Tensor | None = None  # [batch, n_new]: the cached run's tokens (for greedy_margins)


def cached_vs_uncached(lm: Any, input_ids: torch.Tensor, max_new_tokens: int, *,
                       threads: int | None = None) -> CacheComparison:
    """Run greedy generation with and without the KV cache, keeping every step's logits, and compare them.

    Step k's logits depend on the prompt and the k tokens chosen before it, so they are compared only while
    both runs chose the same tokens (up to and including the first step where they part, if they do).
    """
    with held_threads(threads):
        generate(lm, input_ids, 2, use_cache=True)  # warm-up of both paths
        generate(lm, input_ids, 2, use_cache=False)
        cached = timed_generation(lm, input_ids, max_new_tokens, use_cache=True, keep_logits=True)
        uncached = timed_generation(lm, input_ids, max_new_tokens, use_cache=False, keep_logits=True)
    cached_logits, uncached_logits = cached.step_logits, uncached.step_logits
    parted = first_divergence(cached.new_token_ids[0], uncached.new_token_ids[0])
    n_steps = min(cached_logits.shape[1], uncached_logits.shape[1])
    compared = n_steps if parted is None else min(parted + 1, n_steps)
    ours, reference = cached_logits[:, :compared], uncached_logits[:, :compared]
    agree = tuple(bool(a) for a in (ours.argmax(-1) == reference.argmax(-1)).all(dim=0))
    return CacheComparison(compared, float((ours - reference).abs().max()), agree, parted is None,
                           cached.step_s, uncached.step_s,
                           tuple(input_ids.shape[1] + k for k in range(len(uncached.step_s))), cached.new_token_ids)


# ---------------------------------------------------------------------------------------------------------------
# The roofline of this machine: memory bandwidth and matmul FLOP/s


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


# ---------------------------------------------------------------------------------------------------------------
# Sweeps: threads, prompt lengths, batch sizes


@dataclass(frozen=True)
class ThreadPoint:
    threads: int
    prefill_s: float  # median prefill of the prompt
    decode_step_s: float  # median decode step
    bandwidth_bytes_per_s: float  # the bandwidth probe at this thread count


def thread_sweep(lm: Any, input_ids: torch.Tensor, thread_counts: Sequence[int], *, max_new_tokens: int = 8,
                 repeats: int = 2, quick: bool = True) -> tuple[ThreadPoint, ...]:
    """Prefill, decode step and read bandwidth at each thread count (decode follows bandwidth, prefill FLOPs)."""
    points = []
    for threads in thread_counts:
        runs = measure_generation(lm, input_ids, max_new_tokens, repeats=repeats, threads=threads)
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


def prefill_sweep(lm: Any, input_ids: torch.Tensor, prompt_lens: Sequence[int], *, repeats: int = 3,
                  threads: int | None = None) -> tuple[tuple[int, float], ...]:
    """(prompt_len, median prefill seconds) for prefixes of ``input_ids`` (``[1, n]``), one token generated."""
    out = []
    with held_threads(threads) as held:
        for length in prompt_lens:
            validation.integer("prompt_len", length, min=1, max=input_ids.shape[1])
            runs = measure_generation(lm, input_ids[:, :length], 1, repeats=repeats, threads=held)
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


def decode_sweep(lm: Any, input_ids: torch.Tensor, pairs: Sequence[tuple[int, int]], *, steps: int = 3,
                 warmup: int = 1, threads: int | None = None) -> ContextSweep:
    """Time decode steps at each (batch_size, context_len) of ``pairs``, from one prefill of the longest context.

    ``input_ids`` ``[1, n]`` with n > every context_len. The prefill of ``input_ids[:, :longest]`` is timed once;
    each point then decodes from a copy of that cache cut to its context length and repeated over the batch
    (every row the same text: a step's cost depends on the shapes, not on the values), first ``warmup`` untimed
    steps, then ``steps`` timed ones, each a forward pass and a greedy choice as in ``generate``. The points take
    their steps in turn, one step each per round, so a slow spell of a shared machine is spread over them.
    """
    validation.tensor("input_ids", input_ids, kind="int", ndim=2, shape="[1, n_tokens]", nonempty=True)
    if input_ids.shape[0] != 1:
        raise validation.fail(ValueError, "input_ids", "one row [1, n_tokens]", tuple(input_ids.shape))
    if not isinstance(pairs, (list, tuple)) or not pairs:
        raise validation.fail(ValueError, "pairs", "a non-empty list of (batch_size, context_len)", pairs)
    for batch_size, context in pairs:
        validation.integer("batch_size", batch_size, min=1)
        validation.integer("context_len", context, min=1, max=input_ids.shape[1] - 1,
                           note="input_ids must hold one more token to feed")
    steps, warmup = validation.integer("steps", steps, min=1), validation.integer("warmup", warmup, min=0)
    longest = max(context for _, context in pairs)
    device = model_device(lm)
    with held_threads(threads) as held:
        prefill(lm, input_ids[:, :8])  # warm-up of the prefill path
        started = time.perf_counter()
        _, base = prefill(lm, input_ids[:, :longest])
        synchronize(device)
        prefill_s = time.perf_counter() - started
        caches, tokens = [], []
        for batch_size, context in pairs:
            cache = crop(copy_cache(base), context)
            cache.batch_repeat_interleave(batch_size)
            caches.append(cache)
            tokens.append(input_ids[:, context:context + 1].repeat(batch_size, 1))  # [batch, 1]: the next token
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


# ---------------------------------------------------------------------------------------------------------------
# transformers' own generate, timed the same way (a reference for labkit's loop)


def transformers_generation(lm: Any, input_ids: torch.Tensor, max_new_tokens: int, *,
                            threads: int | None = None) -> tuple[RequestMetrics, torch.Tensor]:
    """Greedy ``model.generate`` with a streamer stamping each token: (metrics, new token ids ``[1, n]``)."""
    from transformers.generation.streamers import BaseStreamer

    emitted: list[float] = []

    class Stamps(BaseStreamer):
        prompt_seen = False

        def put(self, value: Any) -> None:  # first call: the prompt; then one call per new token
            if self.prompt_seen:
                emitted.append(time.perf_counter())
            self.prompt_seen = True

        def end(self) -> None:
            pass

    model = lm.model if hasattr(lm, "model") else lm
    with held_threads(threads), torch.inference_mode():
        started = time.perf_counter()
        output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                                min_new_tokens=max_new_tokens, do_sample=False, streamer=Stamps(),
                                pad_token_id=model.config.eos_token_id)
    return request_metrics(emitted, started), output[:, input_ids.shape[1]:]
