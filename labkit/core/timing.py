"""Where the time of a generation goes: request metrics from timestamps, the cost of a step, the roofline.

Used by lab 06 (prefill, decode, TTFT and TPOT). Three parts, in reading order:

1. **Request metrics** from one generation's token emission times (seconds, or any one unit throughout):
   TTFT is the first emission minus the request start; the inter-token latencies (ITL) are the gaps between
   consecutive emissions; TPOT is their mean, ``(t_n - t_1) / (n - 1)``, over the ``n - 1`` intervals after the
   first token (the course chapter's definition and vLLM's ``(latency - ttft) / (output_len - 1)`` in
   ``benchmarks/serve.py``), and is *unavailable* (None) for a one-token answer — vLLM stores 0 there for its
   goodput count; we do not, because 0 would read as "infinitely fast". ITL p50/p99 pool every request's gaps
   and take numpy's linear-interpolation percentile, as vLLM does. E2E ~ TTFT + (n - 1) x TPOT.
2. **The cost of one forward step** from a ModelSpec: FLOPs (2 per weight per token for every matrix, the
   vocabulary projection only where logits are asked for, 4 x n_heads x head_dim per attended key for QK^T and
   AV) and bytes moved (every weight once per step, the KV cache read and the new K/V written).
3. **The roofline**: arithmetic intensity = FLOPs / bytes, ridge point = peak FLOP/s / bandwidth, a step's time
   floor = max(FLOPs / peak, bytes / bandwidth); the decode floor is bytes per token / bandwidth and bandwidth
   utilization = bytes per token x tokens/s / bandwidth. A small calibrated latency model (least squares over
   measured points, coefficients kept >= 0) predicts TTFT, TPOT and E2E for the timing explorer; the fit
   reports each coefficient's standard error, flags a coefficient its data cannot identify (collinear
   columns), and remembers the range it was measured over, so a prediction outside it can say so.

Left out: norms, softmax, rotary embeddings and the sampler (a few FLOPs per value, no weights), activation
traffic (it stays in cache at small batch), queueing, tokenization and network time (a service's TTFT adds
them; a local timer does not see them).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from labkit.core.memory import LLAMA, BlockLayout, format_bits, kv_bytes_per_token, param_breakdown
from labkit.core.resources import GB
from labkit.core.spec import ModelSpec
from labkit.core.validation import choice, fail, instance, integer, real

# ---------------------------------------------------------------------------------------------------------------
# 1. Request metrics


def _times(token_times: Any, name: str = "token_times") -> tuple[float, ...]:
    if isinstance(token_times, (str, bytes)) or not hasattr(token_times, "__len__"):
        raise fail(TypeError, name, "a sequence of emission times (one per output token)", token_times)
    times = tuple(real(f"{name}[{i}]", t) for i, t in enumerate(token_times))
    if not times:
        raise fail(ValueError, name, "a non-empty sequence of emission times", token_times)
    if any(later < earlier for earlier, later in zip(times, times[1:])):
        raise fail(ValueError, name, "non-decreasing emission times", token_times)
    return times


def inter_token_latencies(token_times: Sequence[float]) -> tuple[float, ...]:
    """The n - 1 gaps between consecutive emissions (empty for one token).

    >>> inter_token_latencies([0.7, 0.735, 0.775])
    (0.03500000000000003, 0.040000000000000036)
    """
    times = _times(token_times)
    return tuple(later - earlier for earlier, later in zip(times, times[1:]))


def tpot(token_times: Sequence[float]) -> float | None:
    """Mean time per output token after the first: (t_n - t_1) / (n - 1); None when n = 1 (unavailable).

    >>> tpot([700, 735, 770, 805]), tpot([700]) is None
    (35.0, True)
    """
    times = _times(token_times)
    return None if len(times) == 1 else (times[-1] - times[0]) / (len(times) - 1)


def e2e_estimate(ttft: float, tpot: float | None, n_tokens: int) -> float:
    """E2E ~ TTFT + (n - 1) x TPOT, in the unit of its inputs (TPOT may be None only when n = 1).

    >>> e2e_estimate(700, 35, 20)  # 700 ms to the first token, then 35 ms a token
    1365
    """
    n_tokens = integer("n_tokens", n_tokens, min=1)
    real("ttft", ttft, min=0)  # checked, then used as given: ints in, an exact int out
    if n_tokens == 1:
        return ttft
    if tpot is None:
        raise ValueError("tpot must be a number when n_tokens > 1 (it is unavailable only for one token), got None")
    real("tpot", tpot, min=0)
    return ttft + (n_tokens - 1) * tpot


@dataclass(frozen=True)
class RequestMetrics:
    """One request's timing, read from its token emission times (all in seconds)."""

    n_tokens: int  # output tokens
    ttft_s: float  # request start -> first token
    itl_s: tuple[float, ...]  # the n - 1 gaps between consecutive tokens
    tpot_s: float | None  # mean of itl_s; None for one token
    e2e_s: float  # request start -> last token

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second of the whole request (prefill included)."""
        return self.n_tokens / self.e2e_s if self.e2e_s > 0 else math.inf

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens per second of the decode phase alone, 1 / TPOT (None for one token)."""
        return None if self.tpot_s is None else (1 / self.tpot_s if self.tpot_s > 0 else math.inf)


def request_metrics(token_times_s: Sequence[float], start_s: float = 0.0) -> RequestMetrics:
    """TTFT, ITL, TPOT and E2E of one request from its emission times and its start.

    >>> m = request_metrics([0.5, 0.75, 1.0], start_s=0.0)
    >>> m.ttft_s, m.itl_s, m.tpot_s, m.e2e_s, m.tokens_per_s
    (0.5, (0.25, 0.25), 0.25, 1.0, 3.0)
    """
    times = _times(token_times_s, "token_times_s")
    start_s = real("start_s", start_s)
    if times[0] < start_s:
        raise fail(ValueError, "start_s", f"no later than the first emission ({times[0]!r})", start_s)
    return RequestMetrics(len(times), times[0] - start_s, inter_token_latencies(times), tpot(times),
                          times[-1] - start_s)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between order statistics (numpy's default).

    >>> percentile([1, 2, 3, 4], 50), percentile([1, 2, 3, 5], 75)  # 2 + 0.5 x 1; 3 + 0.25 x 2
    (2.5, 3.5)
    """
    q = real("q", q, min=0, max=100)
    if len(values) == 0:
        raise fail(ValueError, "values", "a non-empty sequence of numbers", values)
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def itl_percentiles(requests: Sequence[RequestMetrics], qs: Sequence[float] = (50, 99)) -> dict[float, float | None]:
    """ITL percentiles over every request's gaps pooled (vLLM's ``p50_itl_ms``...); None when no gap exists.

    >>> a, b = request_metrics([1, 2, 4]), request_metrics([1, 4])
    >>> itl_percentiles([a, b])  # pooled gaps 1, 2, 3
    {50: 2.0, 99: 2.98}
    """
    gaps = [gap for request in requests for gap in instance("request", request, RequestMetrics,
                                                             "a RequestMetrics").itl_s]
    return {q: (percentile(gaps, q) if gaps else None) for q in qs}


@dataclass(frozen=True)
class Spread:
    """A median and how far repeated measurements scatter around it."""

    median: float
    minimum: float
    maximum: float
    p25: float
    p75: float
    n: int  # measurements

    @property
    def relative_spread(self) -> float:
        """(max - min) / median: 0.1 means the runs scatter over 10% of the median."""
        return (self.maximum - self.minimum) / self.median if self.median else math.inf


def spread(samples: Sequence[float]) -> Spread:
    """Median, extremes and quartiles of repeated measurements (report the median, not the fastest run).

    >>> spread([3.0, 1.0, 2.0, 10.0]).median, spread([3.0, 1.0, 2.0]).relative_spread
    (2.5, 1.0)
    """
    if len(samples) == 0:
        raise fail(ValueError, "samples", "a non-empty sequence of measurements", samples)
    values = [real(f"samples[{i}]", s) for i, s in enumerate(samples)]
    return Spread(percentile(values, 50), min(values), max(values), percentile(values, 25), percentile(values, 75),
                  len(values))


class ScriptedClock:
    """A clock that moves only when told to, so a timing harness can be checked against known durations.

    Called, it returns the time now (in seconds from an arbitrary origin, as ``time.perf_counter``); ``advance``
    moves it on. Two clocks are equal when they started at the same time (a checker copies them).

    >>> clock = ScriptedClock(100.0)
    >>> clock.advance(0.25); clock()
    100.25
    """

    def __init__(self, start_s: float = 0.0) -> None:
        self.start_s = real("start_s", start_s)
        self.now_s = self.start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += real("seconds", seconds, min=0)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ScriptedClock) and other.start_s == self.start_s

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ScriptedClock(started at {self.start_s:g} s, now {self.now_s:g} s)"


class ScriptedSteps:
    """A generation whose steps take known times on a :class:`ScriptedClock`: ``step(k)`` advances the clock.

    ``step(0)`` starts the next request (its prefill and first token), ``step(k)`` for k >= 1 produces token k + 1.
    ``durations[r][k]`` is step k of request r, in seconds; a request beyond the table repeats its last row and a
    step beyond a row its row's last value. Equal when the clock and the table are (a checker copies them).

    >>> clock = ScriptedClock()
    >>> step = ScriptedSteps(clock, [[0.5, 0.25], [0.125, 0.0625]])
    >>> for k in range(3):
    ...     step(k)
    >>> clock(), step.requests
    (1.0, 1)
    >>> step(0); step(1); clock(), step.requests
    (1.1875, 2)
    """

    def __init__(self, clock: ScriptedClock, durations: Sequence[Sequence[float]]) -> None:
        instance("clock", clock, ScriptedClock, "a ScriptedClock")
        self.clock = clock
        self.durations = tuple(tuple(real("durations", d, min=0) for d in row) for row in durations)
        if not self.durations or not all(self.durations):
            raise fail(ValueError, "durations", "a non-empty table of non-empty rows", durations)
        self.requests = 0  # step(0) calls so far

    def __call__(self, k: int) -> None:
        k = integer("k", k, min=0)
        if k == 0:
            self.requests += 1
        row = self.durations[min(max(self.requests - 1, 0), len(self.durations) - 1)]
        self.clock.advance(row[min(k, len(row) - 1)])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ScriptedSteps) and (other.clock, other.durations) == (self.clock, self.durations)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        first = self.durations[0]
        return (f"ScriptedSteps({len(self.durations)} scripted requests; the first: prefill {first[0]:g} s, "
                f"then {len(first) - 1} decode steps)")


# ---------------------------------------------------------------------------------------------------------------
# 2. The cost of one forward step


@dataclass(frozen=True)
class StepCost:
    """FLOPs and bytes of one forward step, part by part."""

    flops: int  # matrix FLOPs (2 per multiply-add) of the projections, the vocabulary head and attention
    weight_bytes: int  # every weight read once
    kv_read_bytes: int  # the cached keys and values read by attention
    kv_write_bytes: int  # the new keys and values appended
    tokens: int  # new tokens in the step over the whole batch

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.bytes

    @classmethod
    def params_only(cls, n_params: float, bytes_per_param: float, tokens: int = 1) -> "StepCost":
        """A popular shortcut: 2 FLOPs per parameter per token, every parameter read once, no KV cache.

        >>> StepCost.params_only(70e9, 2).arithmetic_intensity  # one token: 1 FLOP/byte, not a reading's ~2
        1.0
        """
        return cls(round(2 * n_params * tokens), round(n_params * bytes_per_param), 0, 0, tokens)


def attended_keys(new_tokens: int, context_len: int) -> int:
    """Query-key pairs of a causal step: new token i (1-based) attends to context_len + i keys.

    >>> attended_keys(3, 0), attended_keys(1, 10)  # 1 + 2 + 3; one query over 10 cached keys and itself
    (6, 11)
    """
    new_tokens, context_len = integer("new_tokens", new_tokens, min=0), integer("context_len", context_len, min=0)
    return new_tokens * context_len + new_tokens * (new_tokens + 1) // 2


def step_cost(spec: ModelSpec, new_tokens: int, context_len: int = 0, batch_size: int = 1, *,
              weight_fmt: str = "fp32", kv_dtype: str = "fp32", logits_positions: str = "last",
              layout: BlockLayout = LLAMA) -> StepCost:
    """FLOPs and bytes of one step feeding ``new_tokens`` per sequence after ``context_len`` cached ones.

    Prefill is ``step_cost(spec, prompt_len)``; a decode step is ``step_cost(spec, 1, context_len)``.
    ``logits_positions="last"`` computes the vocabulary head for the last position only (labkit's runtime does).
    ``spec.d_ff`` must be known (the MLP's width).

    >>> toy = ModelSpec("toy", n_layers=1, d_model=4, n_heads=2, n_kv_heads=1, head_dim=2, vocab=10, d_ff=8)
    >>> cost = step_cost(toy, 1, context_len=3)  # matrices 48 + 96, head 40, attention 4*2*2*4 keys
    >>> cost.flops, cost.weight_bytes, cost.kv_read_bytes, cost.kv_write_bytes
    (432, 800, 48, 16)
    """
    spec = instance("spec", spec, ModelSpec, "a labkit.core.spec.ModelSpec")
    new_tokens = integer("new_tokens", new_tokens, min=1)
    context_len, batch_size = integer("context_len", context_len, min=0), integer("batch_size", batch_size, min=1)
    choice("logits_positions", logits_positions, ("last", "all"))
    parts = param_breakdown(spec, layout)
    tokens = batch_size * new_tokens
    head_params = spec.vocab * spec.d_model  # the output matrix (the embedding itself when tied)
    head_rows = batch_size * (1 if logits_positions == "last" else new_tokens)
    attention_flops = 4 * spec.n_layers * spec.n_heads * spec.head_dim * batch_size * attended_keys(
        new_tokens, context_len)
    flops = 2 * (parts["attention"] + parts["mlp"]) * tokens + 2 * head_params * head_rows + attention_flops
    weight_bits = format_bits(weight_fmt, "weight_fmt")
    read_params = parts["attention"] + parts["mlp"] + parts["norms"] + head_params
    if not spec.tied_embeddings:
        read_params += min(tokens, spec.vocab) * spec.d_model  # the embedding rows looked up (untied input matrix)
    kv_token = kv_bytes_per_token(spec, kv_dtype)
    return StepCost(flops=flops, weight_bytes=-(-read_params * weight_bits // 8),
                    kv_read_bytes=batch_size * context_len * kv_token, kv_write_bytes=tokens * kv_token,
                    tokens=tokens)


# ---------------------------------------------------------------------------------------------------------------
# 3. The roofline


def ridge_point(peak_flops_per_s: float, bandwidth_bytes_per_s: float) -> float:
    """FLOPs per byte where a kernel stops being memory-bound: peak FLOP/s / bandwidth.

    >>> ridge_point(312e12, 2e12)  # a course reading's A100 figures
    156.0
    """
    peak = real("peak_flops_per_s", peak_flops_per_s, min=0, min_open=True)
    return peak / real("bandwidth_bytes_per_s", bandwidth_bytes_per_s, min=0, min_open=True)


def attainable_flops_per_s(intensity: float, peak_flops_per_s: float, bandwidth_bytes_per_s: float) -> float:
    """The roofline: min(peak, intensity x bandwidth).

    >>> attainable_flops_per_s(1.0, 312e12, 2e12), attainable_flops_per_s(1000, 312e12, 2e12)
    (2000000000000.0, 312000000000000.0)
    """
    intensity = real("intensity", intensity, min=0)
    peak = real("peak_flops_per_s", peak_flops_per_s, min=0, min_open=True)
    return min(peak, intensity * real("bandwidth_bytes_per_s", bandwidth_bytes_per_s, min=0, min_open=True))


@dataclass(frozen=True)
class RooflineTime:
    """A step's two time floors; the larger one bounds it."""

    compute_s: float  # FLOPs / peak FLOP/s
    memory_s: float  # bytes / bandwidth

    @property
    def floor_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s > self.compute_s else "compute"

    @property
    def memory_bound_ratio(self) -> float:
        """memory time / compute time: above 1 the step waits on memory."""
        return self.memory_s / self.compute_s


def roofline_time(cost: StepCost, peak_flops_per_s: float, bandwidth_bytes_per_s: float) -> RooflineTime:
    """The compute and memory floors of a step.

    >>> t = roofline_time(StepCost.params_only(70e9, 2), 312e12, 2e12)  # a course reading's 70B on an A100
    >>> round(t.memory_s * 1e3, 1), round(t.compute_s * 1e3, 4), round(t.memory_bound_ratio)
    (70.0, 0.4487, 156)
    """
    cost = instance("cost", cost, StepCost, "a StepCost")
    peak = real("peak_flops_per_s", peak_flops_per_s, min=0, min_open=True)
    bandwidth = real("bandwidth_bytes_per_s", bandwidth_bytes_per_s, min=0, min_open=True)
    return RooflineTime(cost.flops / peak, cost.bytes / bandwidth)


def decode_floor_s(bytes_per_token: float, bandwidth_bytes_per_s: float) -> float:
    """The least time a decode step can take: every byte it must read, at full bandwidth.

    >>> decode_floor_s(538_060_032, 20e9)  # SmolLM2-135M in FP32 at 20 GB/s: about 27 ms
    0.0269030016
    """
    return real("bytes_per_token", bytes_per_token, min=0) / real(
        "bandwidth_bytes_per_s", bandwidth_bytes_per_s, min=0, min_open=True)


def bandwidth_utilization(bytes_per_token: float, tokens_per_s: float, bandwidth_bytes_per_s: float) -> float:
    """Fraction of the bandwidth a decode loop uses: bytes/token x tokens/s / bandwidth.

    >>> bandwidth_utilization(538e6, 15, 20e9)  # 15 tokens/s reading 538 MB each, on 20 GB/s
    0.4035
    """
    used = real("bytes_per_token", bytes_per_token, min=0) * real("tokens_per_s", tokens_per_s, min=0)
    return used / real("bandwidth_bytes_per_s", bandwidth_bytes_per_s, min=0, min_open=True)


# Peak dense (no 2:4 sparsity) 16-bit tensor-core FLOP/s from each vendor's datasheet; gpu_presets.json has no
# FLOP/s field, so the table lives here, keyed by the same preset names.
PEAK_DENSE_16BIT_FLOPS = {
    "A100-40GB": 312e12,  # https://www.nvidia.com/en-us/data-center/a100/ (BF16/FP16 tensor core, dense)
    "A100-80GB": 312e12,
    "H100-SXM": 989e12,  # https://www.nvidia.com/en-us/data-center/h100/ (1,979 with sparsity)
    "H200": 989e12,  # https://www.nvidia.com/en-us/data-center/h200/ (1,979 with sparsity)
    "T4": 65e12,  # https://www.nvidia.com/en-us/data-center/tesla-t4/ (mixed-precision FP16/FP32)
    "L4": 121e12,  # https://www.nvidia.com/en-us/data-center/l4/ (242 with sparsity)
}


def gpu_peak_flops(name: str) -> float:
    """A preset GPU's peak dense 16-bit FLOP/s (from PEAK_DENSE_16BIT_FLOPS).

    >>> gpu_peak_flops("a100-80gb")
    312000000000000.0
    """
    by_lower = {key.lower(): key for key in PEAK_DENSE_16BIT_FLOPS}
    if not isinstance(name, str) or name.lower() not in by_lower:
        raise fail(ValueError if isinstance(name, str) else TypeError, "name",
                   f"one of {sorted(PEAK_DENSE_16BIT_FLOPS)}", name)
    return PEAK_DENSE_16BIT_FLOPS[by_lower[name.lower()]]


# ---------------------------------------------------------------------------------------------------------------
# A latency model calibrated from measurements


@dataclass(frozen=True)
class LatencyPrediction:
    ttft_s: float
    tpot_s: float | None  # None for one output token
    e2e_s: float
    tokens_per_s: float  # output tokens of the whole batch per second of E2E


@dataclass(frozen=True)
class LatencyModel:
    """Step times as straight lines in the work they do; every coefficient >= 0 (seconds)."""

    prefill_fixed_s: float  # per prefill call, whatever its size
    prefill_per_token_s: float  # per prompt token over the batch
    decode_fixed_s: float  # per decode step (reading the weights dominates it)
    decode_per_sequence_s: float  # per sequence in the batch
    decode_per_cached_token_s: float  # per cached token attended, over the batch

    def prefill_s(self, prompt_len: int, batch_size: int = 1) -> float:
        return self.prefill_fixed_s + self.prefill_per_token_s * batch_size * prompt_len

    def decode_step_s(self, batch_size: int, context_len: int) -> float:
        return (self.decode_fixed_s + self.decode_per_sequence_s * batch_size
                + self.decode_per_cached_token_s * batch_size * context_len)

    def predict(self, prompt_len: int, output_len: int, batch_size: int = 1) -> LatencyPrediction:
        """TTFT = prefill; TPOT = mean decode step over the n - 1 steps (the cache grows by one each step).

        >>> model = LatencyModel(0.01, 0.001, 0.02, 0.005, 0.0)
        >>> p = model.predict(prompt_len=10, output_len=5, batch_size=2)
        >>> round(p.ttft_s, 6), round(p.tpot_s, 6), round(p.e2e_s, 6), round(p.tokens_per_s, 3)
        (0.03, 0.03, 0.15, 66.667)
        """
        prompt_len = integer("prompt_len", prompt_len, min=1)
        output_len, batch_size = integer("output_len", output_len, min=1), integer("batch_size", batch_size, min=1)
        ttft = self.prefill_s(prompt_len, batch_size)
        # decode step k = 1 .. n - 1 starts with prompt_len + k - 1 cached tokens: the mean is linear in k
        step = None if output_len == 1 else self.decode_step_s(batch_size, prompt_len + (output_len - 2) / 2)
        e2e = e2e_estimate(ttft, step, output_len)
        return LatencyPrediction(ttft, step, e2e, batch_size * output_len / e2e)


# A CPU like a laptop's, in seconds: prefill 20 ms + 1.5 ms per prompt token; a decode step 70 ms (the weights'
# read) + 6 ms per sequence + 2 us per cached token. Lab 06's predictions about batching are asked on it.
EXAMPLE_CPU = LatencyModel(prefill_fixed_s=0.020, prefill_per_token_s=0.0015, decode_fixed_s=0.070,
                           decode_per_sequence_s=0.006, decode_per_cached_token_s=2e-6)


def nonnegative_least_squares(features: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Coefficients >= 0 minimising the squared error, by trying every subset of columns (few columns only).

    >>> nonnegative_least_squares(np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]]), np.array([3.0, 2.0, 1.0]))
    array([2., 0.])
    """
    features, targets = np.asarray(features, dtype=np.float64), np.asarray(targets, dtype=np.float64)
    n_columns = features.shape[1]
    best, best_error = np.zeros(n_columns), float(np.sum(targets**2))
    for size in range(1, n_columns + 1):
        for columns in itertools.combinations(range(n_columns), size):
            solution, *_ = np.linalg.lstsq(features[:, columns], targets, rcond=None)
            if np.any(solution < 0):
                continue
            coefficients = np.zeros(n_columns)
            coefficients[list(columns)] = solution
            error = float(np.sum((features @ coefficients - targets) ** 2))
            if error < best_error - 1e-15 * max(best_error, 1e-300):
                best, best_error = coefficients, error
    return best


@dataclass(frozen=True)
class LinearFit:
    """A least-squares line through measured points: coefficients >= 0, each with its standard error.

    ``identifiable[j]`` is False when the points cannot tell coefficient j apart from the others (its column is
    a combination of other columns: collinear data); its standard error is then infinite. The standard errors are
    those of the unconstrained least-squares fit, sigma x sqrt(diag((X^T X)^+)) with sigma^2 = RSS / (n - rank):
    how far the scatter of these points leaves each coefficient free to move (NaN when no point is left over).
    """

    names: tuple[str, ...]
    coefficients: tuple[float, ...]  # >= 0 (nonnegative least squares)
    standard_errors: tuple[float, ...]  # inf where not identifiable, nan with no degree of freedom
    identifiable: tuple[bool, ...]
    rms_residual: float  # of the coefficients above, in the unit of the targets
    n_points: int

    def value(self, name: str) -> float:
        return self.coefficients[self._index(name)]

    def error(self, name: str) -> float:
        return self.standard_errors[self._index(name)]

    def _index(self, name: str) -> int:
        if name not in self.names:
            raise fail(ValueError, "name", f"one of {list(self.names)}", name)
        return self.names.index(name)


def fit_linear(features: Any, targets: Any, names: Sequence[str], *, relative: bool = False) -> LinearFit:
    """Nonnegative least squares with standard errors, and which coefficients the data identify.

    ``relative=True`` minimises the squared *relative* errors (each row weighted by 1 / its target): the right
    weighting when the scatter grows with the value, as a timing's does on a busy machine.

    >>> fit = fit_linear([[1, 1], [1, 2], [1, 3], [1, 4]], [3.1, 4.9, 7.1, 8.9], ("fixed", "slope"))
    >>> [round(c, 6) for c in fit.coefficients]  # slope 9.8 / 5 about the mean (2.5, 6.0); 6 - 2.5 x 1.96
    [1.1, 1.96]
    >>> [round(e, 4) for e in fit.standard_errors]  # RSS 0.032 over 2: sqrt(0.016 / 5), sqrt(0.016 x 1.5)
    [0.1549, 0.0566]
    >>> fit_linear([[1, 2], [1, 2], [1, 2]], [5.0, 5.0, 5.0], ("a", "b")).identifiable  # one point thrice
    (False, False)
    """
    features = np.asarray(features, dtype=np.float64)
    targets = np.asarray(targets, dtype=np.float64)
    names = tuple(names)
    if features.ndim != 2 or targets.shape != features.shape[:1] or len(names) != features.shape[1]:
        raise ValueError(f"fit_linear needs features [n, k], targets [n] and k names, got {features.shape}, "
                         f"{targets.shape} and {len(names)} names")
    if relative and not np.all(targets > 0):
        raise ValueError("fit_linear(relative=True) needs every target > 0 (it weights each row by 1 / target)")
    weights = 1 / targets if relative else np.ones_like(targets)
    rows, goals = features * weights[:, None], targets * weights  # the weighted problem
    coefficients = nonnegative_least_squares(rows, goals)
    # Identifiability does not depend on units: scale each column to unit length before the SVD.
    norms = np.linalg.norm(rows, axis=0)
    scaled = rows / np.where(norms > 0, norms, 1.0)
    _, singular, vt = np.linalg.svd(scaled, full_matrices=True)
    rank = int(np.sum(singular > 1e-9 * max(singular.max(initial=0.0), 1e-300)))
    null = vt[rank:]  # directions in coefficient space the data cannot see
    identifiable = tuple(bool(norms[j] > 0 and np.all(np.abs(null[:, j]) < 1e-6)) for j in range(len(names)))
    unconstrained, *_ = np.linalg.lstsq(rows, goals, rcond=None)
    left_over = len(goals) - rank
    variance = float(np.sum((rows @ unconstrained - goals) ** 2)) / left_over if left_over > 0 else math.nan
    diagonal = np.diag(np.linalg.pinv(rows.T @ rows))
    errors = tuple(math.sqrt(variance * max(float(d), 0.0)) if ok else math.inf
                   for ok, d in zip(identifiable, diagonal))
    residual = float(np.sqrt(np.mean((features @ coefficients - targets) ** 2)))
    return LinearFit(names, tuple(float(c) for c in coefficients), errors, identifiable, residual, len(targets))


PREFILL_TERMS = ("fixed", "per prompt token")
DECODE_TERMS = ("fixed", "per sequence", "per cached token")


@dataclass(frozen=True)
class LatencyFit:
    """A LatencyModel fitted to measurements, with each coefficient's uncertainty and the range measured."""

    model: LatencyModel
    prefill: LinearFit  # PREFILL_TERMS, in seconds
    decode: LinearFit  # DECODE_TERMS, in seconds
    prefill_tokens: tuple[int, int]  # (fewest, most) prompt tokens over the batch in one measured prefill
    batch_sizes: tuple[int, int]  # (smallest, largest) batch decoded
    context_lens: tuple[float, float]  # (fewest, most) tokens cached per sequence in a decode point

    def extrapolations(self, prompt_len: int, output_len: int, batch_size: int = 1) -> tuple[str, ...]:
        """What a prediction at this setting reads outside the measured range (empty: inside it).

        >>> fit = fit_latency([(8, 1, 0.1), (64, 1, 0.2)], [(1, 10, 0.05), (2, 10, 0.06), (1, 500, 0.07)])
        >>> fit.extrapolations(32, 8, 1)
        ()
        >>> for note in fit.extrapolations(50, 900, 4):
        ...     print(note)
        prefill of 200 tokens (4 x 50) > 64 measured
        batch 4 > 2 measured
        context up to 948 tokens > 500 measured
        """
        prompt_len = integer("prompt_len", prompt_len, min=1)
        output_len, batch_size = integer("output_len", output_len, min=1), integer("batch_size", batch_size, min=1)
        notes = []
        tokens, (fewest, most) = batch_size * prompt_len, self.prefill_tokens
        shown = f"{tokens:,} tokens" + (f" ({batch_size} x {prompt_len:,})" if batch_size > 1 else "")
        if tokens < fewest:
            notes.append(f"prefill of {shown} < {fewest:,} measured")
        elif tokens > most:
            notes.append(f"prefill of {shown} > {most:,} measured")
        if output_len > 1:  # decode steps exist
            if batch_size < self.batch_sizes[0]:
                notes.append(f"batch {batch_size} < {self.batch_sizes[0]} measured")
            elif batch_size > self.batch_sizes[1]:
                notes.append(f"batch {batch_size} > {self.batch_sizes[1]} measured")
            first, last = prompt_len, prompt_len + output_len - 2  # cached tokens before the first and last step
            if first < self.context_lens[0]:
                notes.append(f"context from {first:,} tokens < {self.context_lens[0]:,.0f} measured")
            if last > self.context_lens[1]:
                notes.append(f"context up to {last:,} tokens > {self.context_lens[1]:,.0f} measured")
        return tuple(notes)


def fit_latency(prefill_points: Sequence[tuple[int, int, float]], decode_points: Sequence[tuple[int, float, float]],
                context_lens: tuple[float, float] | None = None) -> LatencyFit:
    """Fit a LatencyModel to measured (prompt_len, batch_size, prefill_s) and (batch_size, context_len, step_s).

    ``context_lens`` is the (fewest, most) cached tokens of the steps measured, when each decode point is a median
    over several steps (default: the decode points' own range).

    Each line minimises the squared relative errors (a timing's scatter grows with it). Decode steps measured at
    one context length per batch size make the per-sequence and per-cached-token columns collinear: the fit then
    says the per-cached-token cost is not identifiable, whatever value it kept.

    >>> truth = LatencyModel(0.01, 0.001, 0.02, 0.005, 1e-6)
    >>> prefill = [(p, 1, truth.prefill_s(p, 1)) for p in (8, 64, 512)]
    >>> decode = [(b, c, truth.decode_step_s(b, c)) for b in (1, 3) for c in (16, 1024)]
    >>> fit_latency(prefill, decode).decode.identifiable
    (True, True, True)
    >>> fit_latency(prefill, [(b, 16, truth.decode_step_s(b, 16)) for b in (1, 2, 3)]).decode.identifiable
    (True, False, False)
    """
    if len(prefill_points) == 0 or len(decode_points) == 0:
        raise ValueError("fit_latency_model needs at least one prefill point and one decode point")
    # Relative errors: a 1.5 s prefill scatters by more milliseconds than a 0.1 s one, in the same proportion.
    prefill = fit_linear([[1.0, b * p] for p, b, _ in prefill_points], [s for *_, s in prefill_points],
                         PREFILL_TERMS, relative=True)
    decode = fit_linear([[1.0, b, b * c] for b, c, _ in decode_points], [s for *_, s in decode_points],
                        DECODE_TERMS, relative=True)
    model = LatencyModel(*prefill.coefficients, *decode.coefficients)
    tokens, batches = [b * p for p, b, _ in prefill_points], [b for b, _, _ in decode_points]
    contexts = [c for _, c, _ in decode_points]
    if context_lens is None:
        context_lens = (min(contexts), max(contexts))
    return LatencyFit(model, prefill, decode, (min(tokens), max(tokens)), (min(batches), max(batches)),
                      (context_lens[0], context_lens[1]))


def fit_latency_model(prefill_points: Sequence[tuple[int, int, float]],
                      decode_points: Sequence[tuple[int, float, float]]) -> LatencyModel:
    """Fit a LatencyModel to measured (prompt_len, batch_size, prefill_s) and (batch_size, context_len, step_s).

    >>> truth = LatencyModel(0.01, 0.001, 0.02, 0.005, 1e-6)
    >>> prefill = [(p, b, truth.prefill_s(p, b)) for p in (8, 64) for b in (1, 4)]
    >>> decode = [(b, c, truth.decode_step_s(b, c)) for b in (1, 4) for c in (8, 256)]
    >>> fitted = fit_latency_model(prefill, decode)
    >>> [round(x, 9) for x in (fitted.prefill_per_token_s, fitted.decode_fixed_s, fitted.decode_per_cached_token_s)]
    [0.001, 0.02, 1e-06]
    """
    return fit_latency(prefill_points, decode_points).model


def prediction_ratio(predicted_s: float, measured_s: float) -> float:
    """predicted / measured: 1.25 is 25 % slow, 0.8 20 % fast (the DESIGN target is within 0.75..1.25).

    >>> prediction_ratio(0.09, 0.08)
    1.125
    """
    return real("predicted_s", predicted_s, min=0) / real("measured_s", measured_s, min=0, min_open=True)


def gb_per_s(bandwidth_bytes_per_s: float) -> float:
    """Bytes per second to decimal GB/s (vendors' unit).

    >>> gb_per_s(2.5e10)
    25.0
    """
    return real("bandwidth_bytes_per_s", bandwidth_bytes_per_s, min=0) / GB
