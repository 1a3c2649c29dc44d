"""Request metrics: TTFT, ITL, TPOT and E2E from one generation's emission times, their percentiles and spreads.

Layer 1 (core), used by lab 06. TTFT is the first emission minus the request start (seconds, or any one unit
throughout); the inter-token latencies (ITL) are the gaps between consecutive emissions; TPOT is their mean,
``(t_n - t_1) / (n - 1)``, over the ``n - 1`` intervals after the first token (the course chapter's definition and
vLLM's ``(latency - ttft) / (output_len - 1)`` in vllm-project/vllm, ``benchmarks/serve.py``), and is
*unavailable* (None) for a one-token answer — vLLM stores 0 there for its goodput count; we do not, because 0
would read as "infinitely fast". ITL p50/p99 pool every request's gaps and take numpy's linear-interpolation
percentile, as vLLM does. E2E ~ TTFT + (n - 1) x TPOT. Repeated measurements are summarised by their median and
spread. A scripted clock and scripted steps let a timing harness be checked against known durations.

The cost of a step and the roofline are in :mod:`labkit.core.roofline`; the latency model calibrated from
measurements in :mod:`labkit.core.latency_model`. Left out: queueing, tokenization and network time (a service's
TTFT adds them; a local timer does not see them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from labkit.core.validation import fail, instance, integer, real


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
