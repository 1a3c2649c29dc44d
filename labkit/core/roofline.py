"""The cost of one forward step (FLOPs and bytes) and the roofline that bounds its time.

Layer 1 (core), used by labs 05 and 06. The cost of a step from a ModelSpec: FLOPs (2 per weight per token for
every matrix, the vocabulary projection only where logits are asked for, 4 x n_heads x head_dim per attended key
for QK^T and AV) and bytes moved (every weight once per step, the KV cache read and the new K/V written).
The roofline: arithmetic intensity = FLOPs / bytes, ridge point = peak FLOP/s / bandwidth, a step's time floor =
max(FLOPs / peak, bytes / bandwidth); the decode floor is bytes per token / bandwidth and bandwidth utilization =
bytes per token x tokens/s / bandwidth. A GPU's peak FLOP/s is a preset (``labkit.core.presets.gpu_peak_flops``).
Measured steps read back: a least-squares line time = overhead + bytes / bandwidth through several weight formats.

Left out: norms, softmax, rotary embeddings and the sampler (a few FLOPs per value, no weights), and activation
traffic (it stays in cache at small batch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from labkit.core.memory import LLAMA, BlockLayout, format_bits, kv_bytes_per_token, param_breakdown
from labkit.core.resources import GB
from labkit.core.spec import ModelSpec
from labkit.core.validation import choice, instance, integer, real


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


def gb_per_s(bandwidth_bytes_per_s: float) -> float:
    """Bytes per second to decimal GB/s (vendors' unit).

    >>> gb_per_s(2.5e10)
    25.0
    """
    return real("bandwidth_bytes_per_s", bandwidth_bytes_per_s, min=0) / GB


@dataclass(frozen=True)
class StepTimeFit:
    """time per step = overhead_s + bytes / bandwidth, a least-squares line through measured (bytes, time) points.

    The standard errors are the ordinary least-squares ones, sigma x sqrt(diag((X^T X)^-1)) with sigma^2 = RSS /
    (n - 2): NaN with two points (the line passes through both; nothing is left over to measure the scatter).
    """

    overhead_s: float  # the intercept: what a step costs whatever it reads
    seconds_per_byte: float  # the slope: 1 / the bandwidth the steps achieve
    overhead_se_s: float
    seconds_per_byte_se: float
    n_points: int

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """1 / slope; infinite when the points show no cost per byte (fewer bytes bought no time)."""
        return 1 / self.seconds_per_byte if self.seconds_per_byte > 0 else math.inf

    def time_s(self, bytes_read: float) -> float:
        return self.overhead_s + self.seconds_per_byte * bytes_read


def fit_step_time(bytes_read, step_s) -> StepTimeFit:
    """The line time = overhead + bytes / bandwidth through each format's (bytes read, median step time).

    ``bytes_read``: [k] bytes one step reads in each of k formats (at least two distinct values); ``step_s``: [k,
    repeats] each format's measured step times in seconds. Each row's median is its point: one stalled repeat
    moves a mean, not a median. The intercept is not forced to 0: a step's fixed costs (kernel launches, Python,
    the layers' small operations) do not shrink with the weights.

    >>> fit = fit_step_time([4e8, 2e8, 1e8], [[0.036], [0.028], [0.024]])  # 20 ms + bytes / 25 GB/s
    >>> round(fit.overhead_s * 1e3, 9), round(fit.bandwidth_bytes_per_s / GB, 9)
    (20.0, 25.0)
    >>> fit = fit_step_time([4e8, 2e8], [[0.036, 0.036, 0.1], [0.028, 0.5, 0.028]])  # one stall per row
    >>> round(fit.overhead_s * 1e3, 9), math.isnan(fit.overhead_se_s)
    (20.0, True)
    """
    x = np.asarray(bytes_read, dtype=np.float64)
    times = np.asarray(step_s, dtype=np.float64)
    if x.ndim != 1 or times.ndim != 2 or times.shape[0] != x.shape[0] or times.shape[1] == 0:
        raise ValueError(f"fit_step_time needs bytes_read [k] and step_s [k, repeats], got shapes {x.shape} and "
                         f"{times.shape}")
    if len(np.unique(x)) < 2 or not (np.all(np.isfinite(x)) and np.all(np.isfinite(times))):
        raise ValueError(f"bytes_read must hold at least two distinct finite byte counts (and step_s finite "
                         f"times), got {x.tolist()}")
    y = np.median(times, axis=1)  # one point per format
    # The two-coefficient least squares in its centred closed form: exact, and well conditioned with byte counts
    # near 1e9 (X^T X of the raw design would span 18 orders of magnitude).
    dx, dy = x - x.mean(), y - y.mean()
    sxx = float(np.sum(dx * dx))
    slope = float(np.sum(dx * dy)) / sxx
    overhead = float(y.mean()) - slope * float(x.mean())
    left_over = len(y) - 2
    residuals = y - (overhead + slope * x)
    sigma = math.sqrt(float(np.sum(residuals ** 2)) / left_over) if left_over else math.nan
    return StepTimeFit(overhead, slope, sigma * math.sqrt(1 / len(y) + float(x.mean()) ** 2 / sxx),
                       sigma / math.sqrt(sxx), len(y))
