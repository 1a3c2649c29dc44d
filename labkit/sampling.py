"""From logits to a sampling distribution: temperature, top-k, top-p and min-p, then a draw.

Shapes: ``logits`` is ``[vocab]`` or ``[batch, vocab]``; every function works on the last dimension and returns
a new tensor (the input is never modified). The pipeline, in reading order::

    apply_temperature -> top_k_filter -> top_p_filter -> min_p_filter -> softmax -> sample

Filters return logits with the removed entries at ``-inf``; a later softmax renormalizes over what is left.
Entries already at ``-inf`` (removed by an earlier step) are allowed; ``+inf`` and ``NaN`` are not.

The rules, written down once and tested exactly at their boundaries:

- **Temperature.** For ``T > 0`` the logits are divided by ``T``. ``T == 0`` is *greedy*, by an explicit rule
  rather than a tiny clamp: the first maximal logit of each row becomes 0 and every other entry ``-inf``, so the
  softmax is a one-hot on the argmax (the first index wins a tie).
- **Ranking.** Tokens are ranked by logit, highest first; equal logits are ranked by token id, lowest first.
  Every filter keeps a prefix of this ranking, so the greedy token always survives.
- **Top-k** keeps exactly ``k`` tokens (the first ``k`` of the ranking, so a tie at the cut goes to the lower
  token id; transformers keeps every token tied with the k-th instead). ``k == 0`` switches it off, ``k`` at
  least the vocabulary keeps everything.
- **Top-p** keeps the smallest prefix of the ranking whose probability mass reaches ``p``, including the token
  that reaches or crosses it. Exactly: the mass is computed in float64, the first token is always kept, and a
  later token is kept when the mass of the tokens ranked before it is below ``p - TOP_P_TOLERANCE``. The
  tolerance (1e-6, about 17 float32 steps just below 1) makes a prefix whose exact mass *is* ``p`` count as
  reaching it even when rounding leaves it a hair short or long, e.g. logits ``log 8, log 4, log 2, log 1`` at
  ``p = 4/5`` keep exactly two tokens in float32 and in float64. ``p == 1`` switches the filter off.
- **Min-p** keeps the tokens whose probability is at least ``min_p`` times the largest one (Nguyen et al.,
  2024; transformers' ``MinPLogitsWarper``). Exactly: since ``p_i / p_max = exp(z_i - z_max)``, a token is kept
  when ``z_i - z_max >= log(min_p) - MIN_P_TOLERANCE`` (a relative slack of about 1e-6 on the ratio), so logits
  ``log 8, log 2`` at ``min_p = 1/4`` keep both. ``min_p == 0`` switches it off.
- **Order.** ``"temperature_first"`` divides by ``T`` and then filters the tempered distribution;
  ``"filters_first"`` filters the ``T = 1`` distribution and then applies ``T`` to the surviving logits. The
  lesson's example shows they differ: at ``T = 1/2`` and ``p = 3/4`` the first keeps one token, the second two.

Used by lab 00 (the warm-up exercise) and lab 01 (sampling); ``sampling_probs`` and ``sample`` drive the
generation loop of lab 02. Left out: repetition penalties, typical/eta sampling, beam search.
"""

from __future__ import annotations

import math
import numbers

import torch

TOP_P_TOLERANCE = 1e-6  # a prefix whose float64 mass is within this of p counts as reaching p
MIN_P_TOLERANCE = 1e-6  # slack on log(min_p): a ratio within about 1e-6 (relative) of min_p reaches it
TOP_P_CANDIDATES = (256, 4096)  # top-p first looks for the nucleus among this many top logits, then sorts all
ORDERS = ("temperature_first", "filters_first")


# ---------------------------------------------------------------------------------------------------------------
# Validation at the public edge


def _check_logits(logits: torch.Tensor) -> None:
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.ndim not in (1, 2) or logits.shape[-1] == 0:
        raise ValueError(f"logits must have shape [vocab] or [batch, vocab] with vocab >= 1, got {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a floating-point tensor, got dtype {logits.dtype}")
    if torch.isnan(logits.amax()):  # amax propagates NaN: one reduction, no [batch, vocab] mask
        raise ValueError("logits contain NaN; a NaN score has no place in a ranking")


def _check_support(logits: torch.Tensor) -> None:
    """The filters' extra demand: no +inf, and every row has at least one finite logit."""
    row_max = logits.amax(dim=-1)  # one pass: +inf shows as a row maximum, an all -inf row as a -inf maximum
    if torch.isposinf(row_max).any():
        raise ValueError("logits contain +inf; use finite scores (-inf marks a removed token)")
    if torch.isneginf(row_max).any():
        raise ValueError("a row of logits is entirely -inf: at least one token must remain possible")


def _check_temperature(temperature: float) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a real number >= 0, got {temperature!r}")
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number >= 0 (0 means greedy), got {temperature!r}")


def _check_top_k(top_k: int) -> None:
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral):
        raise TypeError(f"top_k must be an integer >= 0 (0 switches it off), got {top_k!r}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 switches it off), got {top_k!r}")


def _check_fraction(name: str, value: float, low_open: bool) -> None:
    accepted = "a number in (0, 1] (1 switches it off)" if low_open else "a number in [0, 1] (0 switches it off)"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {accepted}, got {value!r}")
    inside = (0 < value <= 1) if low_open else (0 <= value <= 1)
    if not inside:  # also False for NaN
        raise ValueError(f"{name} must be {accepted}, got {value!r}")


def _check_order(order: str) -> None:
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")


# ---------------------------------------------------------------------------------------------------------------
# The steps


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Divide logits by ``temperature``; at 0, keep only the first argmax of each row (greedy).

    >>> apply_temperature(torch.tensor([2.0, 1.0]), 0.5)
    tensor([4., 2.])
    >>> apply_temperature(torch.tensor([1.0, 3.0, 3.0]), 0)
    tensor([-inf, 0., -inf])
    """
    _check_logits(logits)
    _check_temperature(temperature)
    return _temperature(logits, temperature)


def _temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature > 0:
        return logits / temperature
    # Greedy: argmax returns the first maximal index, which is the tie rule we promise.
    greedy = torch.full_like(logits, -math.inf)
    return greedy.scatter(-1, logits.argmax(dim=-1, keepdim=True), 0.0)


def softmax_with_temperature(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Probabilities ``exp(z_i / T) / sum_j exp(z_j / T)`` over the last dimension (one-hot at ``T == 0``).

    The lesson's worked example: logits ``log 8, log 4, log 2, log 1`` give ``(8, 4, 2, 1) / 15`` at ``T = 1``
    and ``(64, 16, 4, 1) / 85`` at ``T = 1/2``.

    >>> logits = torch.tensor([8.0, 4.0, 2.0, 1.0], dtype=torch.float64).log()
    >>> (softmax_with_temperature(logits, 1.0) * 15).round(decimals=6)
    tensor([8., 4., 2., 1.], dtype=torch.float64)
    >>> (softmax_with_temperature(logits, 0.5) * 85).round(decimals=6)
    tensor([64., 16.,  4.,  1.], dtype=torch.float64)
    """
    # torch.softmax subtracts the row maximum before exponentiating, so large logits do not overflow.
    return torch.softmax(apply_temperature(logits, temperature), dim=-1)


def _remove(logits: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return logits.masked_fill(~keep, -math.inf)


# Each filter is a public function that validates its arguments, and a private one that does the work on
# arguments already checked (sampling_logits checks once and chains the private ones).


def _top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    if top_k == 0 or top_k >= logits.shape[-1]:
        return logits.clone()
    kth = logits.topk(top_k, dim=-1).values[..., -1:]  # [batch, 1]: the k-th largest value
    at_or_above = logits >= kth
    if bool((at_or_above.sum(dim=-1) == top_k).all()):
        return _remove(logits, at_or_above)  # no tie straddles the cut: exactly k tokens
    # Of the logits equal to the k-th value, keep the lowest ids until k tokens are kept.
    above, at_cut = logits > kth, logits == kth
    room = top_k - above.sum(dim=-1, keepdim=True)  # [batch, 1]: how many tied tokens still fit
    return _remove(logits, above | (at_cut & (at_cut.cumsum(dim=-1) <= room)))


def top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the ``top_k`` highest logits of each row (a tie at the cut goes to the lower id); ``0`` keeps all.

    >>> top_k_filter(torch.tensor([1.0, 3.0, 2.0, 3.0]), 2)
    tensor([-inf, 3., -inf, 3.])
    >>> top_k_filter(torch.tensor([2.0, 2.0, 2.0]), 2)
    tensor([2., 2., -inf])
    """
    _check_logits(logits)
    _check_top_k(top_k)
    return _top_k(logits, top_k)


def _ranking(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits sorted highest first with ties by lower id (a stable sort), and the ids in that order."""
    return torch.sort(logits, dim=-1, descending=True, stable=True)


def _nucleus_prefix(ranked_logits: torch.Tensor, log_norm: torch.Tensor, top_p: float) -> torch.Tensor:
    """Which tokens of a ranked prefix ``[rows, n]`` the top-p rule keeps; ``log_norm`` is each row's logsumexp."""
    ranked_probs = (ranked_logits.double() - log_norm).exp()  # float64, so the boundary is decided by p
    # Mass of the tokens ranked strictly before each token: an exclusive cumulative sum.
    mass = ranked_probs.cumsum(dim=-1)
    mass_before = torch.cat([torch.zeros_like(mass[..., :1]), mass[..., :-1]], dim=-1)
    keep = mass_before < top_p - TOP_P_TOLERANCE
    keep[..., 0] = True  # the prefix is never empty
    return keep


def _nucleus_among_top(rows: torch.Tensor, log_norm: torch.Tensor, top_p: float,
                       n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-p decided from each row's ``n`` highest logits alone: (keep ``[rows, vocab]``, decided ``[rows]``).

    A shortcut, not a second rule: ``topk`` is much cheaper than sorting the vocabulary, and most nuclei are
    small. A row is undecided when finite logits outside the candidates tie with the n-th one (the candidates
    would depend on ``topk``'s tie order) or when its nucleus reaches the last candidate (it may go on beyond).
    """
    values, ids = rows.topk(n, dim=-1)  # [rows, n]; equal values come in no promised order
    cut = values[:, -1:]
    clean_cut = ((rows >= cut).sum(dim=-1) == n) | cut[:, 0].isneginf()  # -inf tokens are removed anyway
    # Candidates in ranking order: sort by id, then a stable sort by value puts ties in id order.
    ids_ascending, by_id = ids.sort(dim=-1)
    ranked_values, by_rank = values.gather(-1, by_id).sort(dim=-1, descending=True, stable=True)
    ranked_ids = ids_ascending.gather(-1, by_rank)
    keep_ranked = _nucleus_prefix(ranked_values, log_norm, top_p)
    decided = clean_cut & ~keep_ranked[:, -1]
    return torch.zeros_like(rows, dtype=torch.bool).scatter(-1, ranked_ids, keep_ranked), decided


def _top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p == 1:
        return logits.clone()
    rows = logits.reshape(-1, logits.shape[-1])  # [batch, vocab]
    log_norm = torch.logsumexp(rows.double(), dim=-1, keepdim=True)  # [batch, 1]
    keep = torch.zeros_like(rows, dtype=torch.bool)
    pending = torch.arange(rows.shape[0])  # rows whose nucleus is not decided yet
    for n_candidates in TOP_P_CANDIDATES:
        if n_candidates >= rows.shape[-1] or len(pending) == 0:
            break
        candidate_keep, decided = _nucleus_among_top(rows[pending], log_norm[pending], top_p, n_candidates)
        keep[pending[decided]] = candidate_keep[decided]
        pending = pending[~decided]
    if len(pending):
        ranked_logits, ranked_ids = _ranking(rows[pending])  # [pending, vocab] each
        keep_ranked = _nucleus_prefix(ranked_logits, log_norm[pending], top_p)
        keep[pending] = keep_ranked.scatter(-1, ranked_ids, keep_ranked)  # back to vocabulary order
    return _remove(logits, keep.reshape(logits.shape))


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest ranked prefix whose probability mass reaches ``top_p`` (the crossing token included).

    The lesson's example, ``p = (8, 4, 2, 1) / 15``: at ``p = 3/4`` and at the exact boundary ``p = 4/5`` the
    first two tokens survive (``8/15 < 4/5 <= 12/15``).

    >>> logits = torch.tensor([8.0, 4.0, 2.0, 1.0]).log()
    >>> top_p_filter(logits, 0.8).isfinite()
    tensor([ True,  True, False, False])
    >>> top_p_filter(logits, 0.81).isfinite()
    tensor([ True,  True,  True, False])
    """
    _check_logits(logits)
    _check_fraction("top_p", top_p, low_open=True)
    if top_p < 1:
        _check_support(logits)
    return _top_p(logits, top_p)


def _min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    if min_p == 0:
        return logits.clone()
    # p_i / p_max = exp(z_i - z_max) needs no normalization: compare log-ratios, no exp at all.
    log_ratio = logits - logits.amax(dim=-1, keepdim=True)  # [batch, vocab], <= 0
    return _remove(logits, log_ratio >= math.log(min_p) - MIN_P_TOLERANCE)


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep the tokens whose probability is at least ``min_p`` times the top token's; ``0`` keeps all.

    >>> min_p_filter(torch.tensor([8.0, 4.0, 2.0, 1.0]).log(), 0.25).isfinite()
    tensor([ True,  True,  True, False])
    """
    _check_logits(logits)
    _check_fraction("min_p", min_p, low_open=False)
    if min_p > 0:
        _check_support(logits)
    return _min_p(logits, min_p)


def _filters(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    return _min_p(_top_p(_top_k(logits, top_k), top_p), min_p)


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> torch.Tensor:
    """Top-k, then top-p, then min-p (transformers' order), each on what the previous step left.

    >>> filter_logits(torch.tensor([8.0, 4.0, 2.0, 1.0]).log(), top_k=3, top_p=0.9).isfinite()
    tensor([ True,  True,  True, False])
    """
    _check_logits(logits)
    _check_support(logits)
    _check_top_k(top_k)
    _check_fraction("top_p", top_p, low_open=True)
    _check_fraction("min_p", min_p, low_open=False)
    return _filters(logits, top_k, top_p, min_p)


def sampling_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                    min_p: float = 0.0, order: str = "temperature_first") -> torch.Tensor:
    """Temperature and filters in the given ``order``; removed tokens at ``-inf`` (see the module docstring).

    >>> logits = torch.tensor([8.0, 4.0, 2.0, 1.0], dtype=torch.float64).log()
    >>> sampling_logits(logits, temperature=0.5, top_p=0.75).isfinite()
    tensor([ True, False, False, False])
    >>> sampling_logits(logits, temperature=0.5, top_p=0.75, order="filters_first").isfinite()
    tensor([ True,  True, False, False])
    """
    _check_logits(logits)
    _check_support(logits)
    _check_temperature(temperature)
    _check_top_k(top_k)
    _check_fraction("top_p", top_p, low_open=True)
    _check_fraction("min_p", min_p, low_open=False)
    _check_order(order)
    if order == "temperature_first":
        return _filters(_temperature(logits, temperature), top_k, top_p, min_p)
    return _temperature(_filters(logits, top_k, top_p, min_p), temperature)


def sampling_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                   min_p: float = 0.0, order: str = "temperature_first") -> torch.Tensor:
    """The distribution a sampler draws from: temperature and filters in ``order``, renormalized.

    ``order="temperature_first"`` divides by ``T`` and filters the tempered distribution;
    ``order="filters_first"`` filters the ``T = 1`` distribution, then applies ``T`` to the surviving logits.

    >>> logits = torch.tensor([8.0, 4.0, 2.0, 1.0], dtype=torch.float64).log()
    >>> sampling_probs(logits, top_k=2)  # (8, 4) / 12
    tensor([0.6667, 0.3333, 0.0000, 0.0000], dtype=torch.float64)
    >>> sampling_probs(logits, temperature=0.5, top_p=0.75, order="filters_first")  # (64, 16) / 80
    tensor([0.8000, 0.2000, 0.0000, 0.0000], dtype=torch.float64)
    """
    return torch.softmax(sampling_logits(logits, temperature, top_k, top_p, min_p, order), dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token id per row of ``probs`` with ``torch.multinomial``: ``[batch]`` ids, or 0-d for a row.

    A seeded ``generator`` makes the draw repeatable on this machine and torch version; it is not a promise
    across versions, devices or batch layouts.

    >>> sample(torch.tensor([0.0, 1.0, 0.0]))
    tensor(1)
    >>> sample(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), generator=torch.Generator().manual_seed(0))
    tensor([0, 1])
    """
    if not isinstance(probs, torch.Tensor):
        raise TypeError(f"probs must be a torch.Tensor, got {type(probs).__name__}")
    if probs.ndim not in (1, 2) or probs.shape[-1] == 0 or not probs.is_floating_point():
        raise ValueError(f"probs must be a float tensor of shape [vocab] or [batch, vocab], got "
                         f"{tuple(probs.shape)} {probs.dtype}")
    if not torch.isfinite(probs).all() or (probs < 0).any():
        raise ValueError("probs must be finite and >= 0 (got NaN, inf or a negative entry)")
    if not (probs.sum(dim=-1) > 0).all():
        raise ValueError("every row of probs needs a positive entry to draw from")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    rows = probs.reshape(-1, probs.shape[-1])  # [batch, vocab]
    ids = torch.multinomial(rows, num_samples=1, generator=generator)[:, 0]  # [batch]
    return ids[0] if probs.ndim == 1 else ids


# ---------------------------------------------------------------------------------------------------------------
# Summaries the lab shows next to the distribution


def kept_count(filtered_logits: torch.Tensor) -> torch.Tensor:
    """How many tokens a filter left possible in each row (entries above ``-inf``).

    >>> kept_count(torch.tensor([[0.0, -math.inf, 1.0], [2.0, 3.0, 4.0]]))
    tensor([2, 3])
    """
    return (filtered_logits > -math.inf).sum(dim=-1)


def kept_mass(logits: torch.Tensor, filtered_logits: torch.Tensor) -> torch.Tensor:
    """Probability mass, under ``softmax(logits)`` in float64, of the tokens ``filtered_logits`` kept.

    >>> logits = torch.tensor([8.0, 4.0, 2.0, 1.0]).log()
    >>> round(kept_mass(logits, top_p_filter(logits, 0.75)).item(), 6)  # 12 / 15
    0.8
    """
    probs = torch.softmax(logits.double(), dim=-1)
    return (probs * (filtered_logits > -math.inf)).sum(dim=-1)


def entropy_bits(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy ``-sum p log2 p`` of each row, in bits (zero-probability entries add nothing).

    >>> entropy_bits(torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]))
    tensor([1., 0.])
    """
    probs64 = probs.double()
    terms = torch.where(probs64 > 0, -probs64 * probs64.clamp_min(1e-300).log2(), torch.zeros_like(probs64))
    return terms.sum(dim=-1).to(probs.dtype)
