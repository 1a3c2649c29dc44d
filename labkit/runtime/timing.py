"""Timing a generation on this machine: request metrics of one run, repeats of it, cached against uncached.

Layer 2 (runtime), lab 06's measurements. Every generation is timed through labkit's one loop,
``generation.generate(on_step=...)``: the callback stamps each token's emission with ``time.perf_counter()`` (the
device synchronized by the loop), and the request metrics come from ``labkit.core.timing``. Measurements follow
the PyTorch benchmarking recipe: warm-up runs first (the first call pays for allocation and kernel selection),
repeats reported as a median with their spread, and the thread count recorded and held for the whole measurement
(:func:`held_threads` restores the caller's). transformers' own ``generate`` is timed the same way, as a reference.

This machine's bandwidth and matmul FLOP/s are measured in :mod:`labkit.runtime.probes`; sweeps over threads,
prompt lengths, batch sizes and contexts, and the calibration of a latency model, in :mod:`labkit.runtime.sweeps`.

What a local timer sees: TTFT here is from calling ``generate`` to the first token (argument checks, prefill,
choosing the token). A service's TTFT adds queueing, tokenization, transport and detokenization.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from labkit.core import validation
from labkit.core.timing import RequestMetrics, Spread, itl_percentiles, request_metrics, spread
from labkit.runtime import decode_one_token, prefill, synchronize
from labkit.runtime.forward import model_device, module_of
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


def timed_generation(lm: Any, token_ids: torch.Tensor, max_new_tokens: int, *, threads: int | None = None,
                     **generate_options: Any) -> TimedRun:
    """Generate with per-token timestamps (greedy unless told otherwise); ``generate_options`` go to generate.

    ``token_ids``: the prompts, ``[batch, prompt_len]``.
    """
    validation.integer("max_new_tokens", max_new_tokens, min=1)
    emitted: list[float] = []
    infos: list[Any] = []

    def on_step(info: Any) -> None:
        emitted.append(time.perf_counter())
        infos.append(info)

    with held_threads(threads) as held:
        started = time.perf_counter()
        result = generate(lm, token_ids, max_new_tokens, on_step=on_step, **generate_options)
    use_cache = generate_options.get("use_cache", True)
    # StepInfo.cache_length counts the cache after the step; before a decode step it held one token less.
    context = tuple(0 if i == 0 or not use_cache else info.cache_length - 1 for i, info in enumerate(infos))
    return TimedRun(request_metrics(emitted, started), tuple(info.step_s for info in infos), context,
                    result.new_token_ids, token_ids.shape[0], token_ids.shape[1], held, result.step_logits)


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


def measure_generation(lm: Any, token_ids: torch.Tensor, max_new_tokens: int, *, warmup: int = 1,
                       repeats: int = 5, threads: int | None = None, **generate_options: Any) -> RepeatedRuns:
    """``warmup`` untimed generations, then ``repeats`` timed ones, all at one held thread count."""
    warmup = validation.integer("warmup", warmup, min=0)
    repeats = validation.integer("repeats", repeats, min=1)
    with held_threads(threads) as held:
        for _ in range(warmup):
            generate(lm, token_ids, max_new_tokens, **generate_options)
        runs = tuple(timed_generation(lm, token_ids, max_new_tokens, **generate_options) for _ in range(repeats))
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


def cached_vs_uncached(lm: Any, token_ids: torch.Tensor, max_new_tokens: int, *,
                       threads: int | None = None) -> CacheComparison:
    """Run greedy generation with and without the KV cache, keeping every step's logits, and compare them.

    Step k's logits depend on the prompt and the k tokens chosen before it, so they are compared only while
    both runs chose the same tokens (up to and including the first step where they part, if they do).
    """
    with held_threads(threads):
        generate(lm, token_ids, 2, use_cache=True)  # warm-up of both paths
        generate(lm, token_ids, 2, use_cache=False)
        cached = timed_generation(lm, token_ids, max_new_tokens, use_cache=True, keep_logits=True)
        uncached = timed_generation(lm, token_ids, max_new_tokens, use_cache=False, keep_logits=True)
    cached_logits, uncached_logits = cached.step_logits, uncached.step_logits
    parted = first_divergence(cached.new_token_ids[0], uncached.new_token_ids[0])
    n_steps = min(cached_logits.shape[1], uncached_logits.shape[1])
    compared = n_steps if parted is None else min(parted + 1, n_steps)
    ours, reference = cached_logits[:, :compared], uncached_logits[:, :compared]
    agree = tuple(bool(a) for a in (ours.argmax(-1) == reference.argmax(-1)).all(dim=0))
    return CacheComparison(compared, float((ours - reference).abs().max()), agree, parted is None,
                           cached.step_s, uncached.step_s,
                           tuple(token_ids.shape[1] + k for k in range(len(uncached.step_s))), cached.new_token_ids)


# ---------------------------------------------------------------------------------------------------------------
# transformers' own generate, timed the same way (a reference for labkit's loop)


def transformers_generation(lm: Any, token_ids: torch.Tensor, max_new_tokens: int, *,
                            threads: int | None = None) -> tuple[RequestMetrics, torch.Tensor]:
    """Greedy transformers ``generate`` with a streamer stamping each token: (metrics, new token ids ``[1, n]``)."""
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

    module = module_of(lm)
    with held_threads(threads), torch.inference_mode():
        started = time.perf_counter()
        output = module.generate(token_ids, attention_mask=torch.ones_like(token_ids), max_new_tokens=max_new_tokens,
                                min_new_tokens=max_new_tokens, do_sample=False, streamer=Stamps(),
                                pad_token_id=module.config.eos_token_id)
    return request_metrics(emitted, started), output[:, token_ids.shape[1]:]
