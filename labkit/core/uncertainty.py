"""How sure a measured difference is: bootstrap intervals, and the comparison word an interval allows.

Layer 1 (core), used by labs 04 (perplexity cost of a quantization scheme), 06 and 07 (speedups, TPOT ratios,
acceptance rates). Two kinds of measurement, two resampling schemes:

- **Paired** (:func:`paired_bootstrap`, :func:`delta_ppl_interval`): a baseline and a scheme measured on the *same*
  items, e.g. the per-token negative log-likelihoods of one text under the original and the quantized model.
  Resampling keeps the pairs together, so the text's own difficulty (shared by both) cancels. Neighbouring tokens
  are correlated (they share context), so items are resampled in contiguous blocks: the circular block bootstrap
  (Politis & Romano, 1992), which draws blocks of ``block_size`` consecutive items starting anywhere and wrapping
  past the end, so every item is equally likely to be drawn.
- **Unpaired** (:func:`unpaired_bootstrap`, :func:`ratio_of_medians_interval`): two sets measured separately, e.g.
  repeated timings of a baseline and of a faster path; each set is resampled on its own.

Intervals are percentile intervals (the ``confidence`` central part of the resampled statistics), seeded and
deterministic: the same inputs and ``seed`` give the same interval on any machine. :func:`comparison_word` turns an
interval into "larger", "smaller" or "indistinguishable" against a null value (0 for a difference, 1 for a ratio),
so the prose a lab prints follows its interval.

Why numpy and not ``scipy.stats.bootstrap``: scipy resamples single observations (``paired=True`` keeps pairs but not
blocks of neighbours), and a block bootstrap is a few lines here; scipy is not otherwise a dependency of labkit.
Left out: bias-corrected (BCa) and studentized intervals, and the choice of block length from the data (the caller
states ``block_size``). :func:`delta_ppl_interval` defaults to 16 tokens: on the course's evaluation text the
per-token NLL differences between the embedded model and its quantized copies (lab 04) correlate at most 0.11 with
the next token's and near 0 beyond two tokens. A resample needs at least 10 blocks: with fewer, the blocks'
spread says little about the statistic's (two blocks of 64 among 128 tokens give an interval narrower than
one-at-a-time resampling).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from labkit.core.validation import fail, integer, real

_CHUNK_VALUES = 4_000_000  # resampled values held at once (per input), ~32 MB of float64


@dataclass(frozen=True)
class Interval:
    """A measured statistic and its bootstrap interval.

    >>> Interval(-1.8, -3.1, -0.4, 0.95).format("+.1f", " %")
    '-1.8 % (95% interval -3.1 % to -0.4 %)'
    """

    estimate: float  # the statistic on the data as measured
    low: float  # lower end of the interval
    high: float  # upper end
    confidence: float  # the interval's coverage, e.g. 0.95

    def contains(self, value: float) -> bool:
        """Whether ``value`` lies inside the interval (ends included)."""
        return self.low <= value <= self.high

    def format(self, spec: str = ".3g", unit: str = "") -> str:
        """``"<estimate><unit> (95% interval <low><unit> to <high><unit>)"`` with ``spec`` the number format."""
        return (f"{self.estimate:{spec}}{unit} ({self.confidence:.0%} interval "
                f"{self.low:{spec}}{unit} to {self.high:{spec}}{unit})")


def comparison_word(interval: Interval, null: float = 0.0) -> str:
    """"larger" when the whole interval is above ``null``, "smaller" when below, else "indistinguishable".

    ``null`` is the value of "no difference": 0 for a difference (ΔPPL %), 1 for a ratio (a speedup). An interval
    that touches ``null`` at an end does not resolve the difference.

    >>> comparison_word(Interval(2.0, 0.5, 3.5, 0.95)), comparison_word(Interval(-1.8, -3.1, 0.0, 0.95))
    ('larger', 'indistinguishable')
    >>> comparison_word(Interval(0.8, 0.7, 0.9, 0.95), null=1.0)
    'smaller'
    """
    if not isinstance(interval, Interval):
        raise fail(TypeError, "interval", "a labkit.core.uncertainty.Interval", interval)
    null = real("null", null)
    if interval.low > null:
        return "larger"
    if interval.high < null:
        return "smaller"
    return "indistinguishable"


def _values(name: str, values: Any, min_size: int) -> np.ndarray:
    """A 1-D float64 array of finite numbers (from a sequence, numpy array or torch tensor)."""
    accepted = f"a 1-D sequence of at least {min_size} finite numbers"
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise fail(TypeError, name, accepted, values)
    if isinstance(values, torch.Tensor):
        values = values.detach().to("cpu", torch.float64).numpy()
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise fail(TypeError, name, accepted, values) from None
    if array.ndim != 1 or array.size < min_size or not np.isfinite(array).all():
        raise fail(ValueError, name, accepted, values)
    return array


def _settings(confidence: Any, n_resamples: Any, seed: Any) -> tuple[float, int, np.random.Generator]:
    confidence = real("confidence", confidence, min=0, max=1, min_open=True, max_open=True)
    n_resamples = integer("n_resamples", n_resamples, min=100)
    return confidence, n_resamples, np.random.default_rng(integer("seed", seed, min=0))


def _interval(estimate: float, resampled: np.ndarray, confidence: float) -> Interval:
    low, high = np.quantile(resampled, [(1 - confidence) / 2, (1 + confidence) / 2])
    return Interval(float(estimate), float(low), float(high), confidence)


def _statistic(statistic: Any, *samples: np.ndarray) -> np.ndarray:
    if not callable(statistic):
        raise fail(TypeError, "statistic", "a function of the samples reducing over their last axis", statistic)
    return np.asarray(statistic(*samples), dtype=np.float64)


def paired_bootstrap(baseline: Any, scheme: Any, statistic: Callable[[np.ndarray, np.ndarray], Any], *,
                     block_size: int = 1, confidence: float = 0.95, n_resamples: int = 2000,
                     seed: int = 0) -> Interval:
    """Interval for ``statistic(baseline, scheme)`` over items measured both ways, resampled in blocks of pairs.

    ``baseline`` and ``scheme``: [n_items], item i measured under both. ``statistic(b, s)`` receives arrays of shape
    [..., n] and reduces over the last axis (``lambda b, s: s.mean(-1) - b.mean(-1)``). Each resample draws
    ceil(n / block_size) blocks of ``block_size`` consecutive items (circularly) with the same indices for both;
    ``block_size`` may be at most n / 10 (10 blocks or more).

    >>> base, scheme = np.zeros(200), np.ones(200)  # every pair differs by exactly 1
    >>> paired_bootstrap(base, scheme, lambda b, s: s.mean(-1) - b.mean(-1), block_size=10)
    Interval(estimate=1.0, low=1.0, high=1.0, confidence=0.95)
    """
    baseline, scheme = _values("baseline", baseline, 10), _values("scheme", scheme, 10)
    if scheme.size != baseline.size:
        raise fail(ValueError, "scheme", f"as many items as baseline ({baseline.size}, paired)", scheme)
    n = baseline.size
    block_size = integer("block_size", block_size, min=1, max=n // 10, note=f"10 blocks or more of the {n} items")
    confidence, n_resamples, rng = _settings(confidence, n_resamples, seed)
    estimate = _statistic(statistic, baseline, scheme)
    if estimate.shape != ():
        raise fail(ValueError, "statistic", "a function returning one number for 1-D samples", statistic)
    n_blocks = -(-n // block_size)
    offsets = np.arange(block_size)
    chunk = max(1, _CHUNK_VALUES // (n_blocks * block_size))
    resampled = []
    for done in range(0, n_resamples, chunk):
        starts = rng.integers(0, n, size=(min(chunk, n_resamples - done), n_blocks, 1))
        index = ((starts + offsets) % n).reshape(len(starts), -1)  # [resamples, n_blocks * block_size]
        resampled.append(_statistic(statistic, baseline[index], scheme[index]))
    return _interval(estimate, np.concatenate(resampled), confidence)


def delta_ppl_interval(baseline_nll: Any, scheme_nll: Any, *, block_size: int = 16, confidence: float = 0.95,
                       n_resamples: int = 2000, seed: int = 0) -> Interval:
    """ΔPPL in percent, 100 (PPL_scheme / PPL_baseline - 1), with a paired block-bootstrap interval.

    ``baseline_nll``, ``scheme_nll``: [n_tokens], the negative log-likelihood (nats) of each token of the same text
    under the baseline and the scheme. PPL = exp(mean NLL), so the ratio is exp(mean(scheme - baseline)).

    >>> nll = np.full(160, 3.0)
    >>> delta_ppl_interval(nll, nll + np.log(1.5)).format(".1f", " %")
    '50.0 % (95% interval 50.0 % to 50.0 %)'
    """
    def delta_pct(base: np.ndarray, scheme: np.ndarray) -> np.ndarray:
        return 100.0 * np.expm1((scheme - base).mean(-1))

    return paired_bootstrap(baseline_nll, scheme_nll, delta_pct, block_size=block_size, confidence=confidence,
                            n_resamples=n_resamples, seed=seed)


def unpaired_bootstrap(first: Any, second: Any, statistic: Callable[[np.ndarray, np.ndarray], Any], *,
                       confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0) -> Interval:
    """Interval for ``statistic(first, second)`` over two sets measured separately, each resampled on its own.

    ``statistic(a, b)`` receives arrays of shape [..., len(first)] and [..., len(second)] and reduces over the
    last axis. Each set needs at least 3 values; with few values the interval is coarse (a median of 5 timings
    can take only 5 values), so take more repeats where a comparison matters.

    >>> unpaired_bootstrap([1, 1, 1], [2, 2, 2, 2], lambda a, b: b.mean(-1) - a.mean(-1)).estimate
    1.0
    """
    first, second = _values("first", first, 3), _values("second", second, 3)
    confidence, n_resamples, rng = _settings(confidence, n_resamples, seed)
    estimate = _statistic(statistic, first, second)
    if estimate.shape != ():
        raise fail(ValueError, "statistic", "a function returning one number for 1-D samples", statistic)
    chunk = max(1, _CHUNK_VALUES // max(first.size, second.size))
    resampled = []
    for done in range(0, n_resamples, chunk):
        size = min(chunk, n_resamples - done)
        a = first[rng.integers(0, first.size, size=(size, first.size))]
        b = second[rng.integers(0, second.size, size=(size, second.size))]
        resampled.append(_statistic(statistic, a, b))
    return _interval(estimate, np.concatenate(resampled), confidence)


def ratio_of_medians_interval(numerator: Any, denominator: Any, *, confidence: float = 0.95,
                              n_resamples: int = 2000, seed: int = 0) -> Interval:
    """median(numerator) / median(denominator) with an unpaired bootstrap interval (null value: 1).

    A speedup is ``ratio_of_medians_interval(baseline_times_s, faster_times_s)``; a TPOT ratio
    ``ratio_of_medians_interval(tpot_a_ms, tpot_b_ms)``. Every value must be positive.

    >>> ratio_of_medians_interval([2.0, 2.0, 2.0], [1.0, 1.0, 1.0])
    Interval(estimate=2.0, low=2.0, high=2.0, confidence=0.95)
    """
    for name, values in (("numerator", numerator), ("denominator", denominator)):
        if (_values(name, values, 3) <= 0).any():
            raise fail(ValueError, name, "positive measurements (times, rates)", values)
    return unpaired_bootstrap(numerator, denominator, lambda a, b: np.median(a, -1) / np.median(b, -1),
                              confidence=confidence, n_resamples=n_resamples, seed=seed)
