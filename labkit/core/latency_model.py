"""A latency model calibrated from measurements: step times as straight lines in the work a step does.

Layer 1 (core), used by lab 06's timing explorer. A :class:`LatencyModel` predicts TTFT, TPOT and E2E from a
prefill cost (fixed + per prompt token) and a decode-step cost (fixed + per sequence + per cached token). It is
fitted by least squares over measured points with every coefficient kept >= 0; the fit reports each
coefficient's standard error, flags a coefficient its data cannot identify (collinear columns), and remembers
the range it was measured over, so a prediction outside it can say so.

Request metrics (TTFT, TPOT, E2E from timestamps) are in :mod:`labkit.core.timing`; the analytic cost of a step
and the roofline in :mod:`labkit.core.roofline`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from labkit.core.timing import e2e_estimate
from labkit.core.validation import fail, integer, real


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

        >>> latency = LatencyModel(0.01, 0.001, 0.02, 0.005, 0.0)
        >>> p = latency.predict(prompt_len=10, output_len=5, batch_size=2)
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

    latency: LatencyModel  # the fitted model
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
    latency = LatencyModel(*prefill.coefficients, *decode.coefficients)
    tokens, batches = [b * p for p, b, _ in prefill_points], [b for b, _, _ in decode_points]
    contexts = [c for _, c, _ in decode_points]
    if context_lens is None:
        context_lens = (min(contexts), max(contexts))
    return LatencyFit(latency, prefill, decode, (min(tokens), max(tokens)), (min(batches), max(batches)),
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
    return fit_latency(prefill_points, decode_points).latency


def prediction_ratio(predicted_s: float, measured_s: float) -> float:
    """predicted / measured: 1.25 is 25 % slow, 0.8 20 % fast (docs/DESIGN.md's target: within 0.75..1.25).

    >>> prediction_ratio(0.09, 0.08)
    1.125
    """
    return real("predicted_s", predicted_s, min=0) / real("measured_s", measured_s, min=0, min_open=True)
