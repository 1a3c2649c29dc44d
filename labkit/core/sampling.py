"""From logits to a sampling distribution: temperature, top-k, top-p and min-p, then a draw.

Shapes: ``logits`` is ``[vocab]`` or ``[batch, vocab]``; every function works on the last dimension and returns
a new tensor (the input is never modified). The pipeline, in reading order::

    apply_temperature -> top_k_filter -> top_p_filter -> min_p_filter -> softmax -> sample

Filters return logits with the removed entries at ``-inf``; a later softmax renormalizes over what is left.
Entries already at ``-inf`` (removed by an earlier step) are allowed; ``+inf`` and ``NaN`` are not. Each step
reads them from a row maximum it computes anyway (no extra pass); ``apply_temperature`` at ``T > 0`` is a bare
division and leaves them to the next step.

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
  :func:`top_p_filter_reference` is this rule as written (one full sort); :func:`top_p_filter` is a fast path
  that sorts only the tokens near the cut, and is tested equal to it.
- **Min-p** keeps the tokens whose probability is at least ``min_p`` times the largest one (Nguyen et al.,
  2024; transformers' ``MinPLogitsWarper``). Exactly: since ``p_i / p_max = exp(z_i - z_max)``, a token is kept
  when ``z_i - z_max >= log(min_p) - MIN_P_TOLERANCE`` (a relative slack of about 1e-6 on the ratio), so logits
  ``log 8, log 2`` at ``min_p = 1/4`` keep both. ``min_p == 0`` switches it off.
- **Order.** ``"temperature_first"`` divides by ``T`` and then filters the tempered distribution;
  ``"filters_first"`` filters the ``T = 1`` distribution and then applies ``T`` to the surviving logits. The
  lesson's example shows they differ: at ``T = 1/2`` and ``p = 3/4`` the first keeps one token, the second two.

Used by lab 00 (the warm-up exercise) and lab 01 (sampling); ``sampling_probs`` and ``sample`` drive the
generation loop of lab 02. Left out: repetition penalties, typical/eta sampling, beam search. What is left of a
distribution after the filters (tokens kept, their mass, entropy, a greedy choice's margin) is measured in
:mod:`labkit.core.distribution`.
"""

from __future__ import annotations

import math

import torch

from labkit.core import validation

TOP_P_TOLERANCE = 1e-6  # a prefix whose float64 mass is within this of p counts as reaching p
MIN_P_TOLERANCE = 1e-6  # slack on log(min_p): a ratio within about 1e-6 (relative) of min_p reaches it
ORDERS = ("temperature_first", "filters_first")

# top_p_filter's fast path (see _top_p): value buckets below each row's maximum, 1/64 of a logit wide. 4096 of them
# reach 64 below the maximum; everything lower shares the last bucket (its mass is under vocab * e^-64).
_BUCKETS, _BUCKETS_PER_LOGIT = 4096, 64
# A fast-path mass this close to p - TOP_P_TOLERANCE is decided again by the plain rule: far above the float64
# rounding of either summation order (about vocab * 2^-53, 5e-12 for 49,152 tokens), far below the tolerance.
_TOP_P_GUARD = 1e-9


# ---------------------------------------------------------------------------------------------------------------
# Validation at the public edge (labkit.core.validation): arguments once, and the logits' values from a row maximum that
# every step computes anyway, never in an extra pass over [batch, vocab].


def _logits(logits: torch.Tensor) -> torch.Tensor:
    return validation.tensor("logits", logits, kind="float", ndim=(1, 2), shape="[vocab] or [batch, vocab]",
                             nonempty=True)


def _check_values(row_max: torch.Tensor) -> None:
    """NaN (a maximum propagates it), +inf, or a row with no finite logit (maximum -inf) are errors."""
    if bool(row_max.isfinite().all()):
        return
    if bool(row_max.isnan().any()):
        raise ValueError("logits contain NaN; a NaN score has no place in a ranking")
    if bool(row_max.isposinf().any()):
        raise ValueError("logits contain +inf; use finite scores (-inf marks a removed token)")
    raise ValueError("a row of logits is entirely -inf: at least one token must remain possible")


def _temperature_value(temperature: float) -> float:
    return validation.real("temperature", temperature, min=0, note="0 means greedy")


def _top_k_value(top_k: int) -> int:
    return validation.integer("top_k", top_k, min=0, note="0 switches it off")


def _top_p_value(top_p: float) -> float:
    return validation.real("top_p", top_p, min=0, max=1, min_open=True, note="1 switches it off")


def _min_p_value(min_p: float) -> float:
    return validation.real("min_p", min_p, min=0, max=1, note="0 switches it off")


def check_settings(temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                   order: str = "temperature_first") -> dict:
    """The sampling settings validated, as the keyword arguments of :func:`sampling_probs` (generation uses it).

    >>> check_settings(temperature=0, top_k=50)
    {'temperature': 0.0, 'top_k': 50, 'top_p': 1.0, 'min_p': 0.0, 'order': 'temperature_first'}
    """
    return dict(temperature=_temperature_value(temperature), top_k=_top_k_value(top_k), top_p=_top_p_value(top_p),
                min_p=_min_p_value(min_p), order=validation.choice("order", order, ORDERS))


def _unchanged(logits: torch.Tensor) -> torch.Tensor:
    """What a public step returns when it changes nothing: a checked copy (the input is never handed back)."""
    _check_values(logits.amax(dim=-1))
    return logits.clone()


def _fresh(filtered: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    return _unchanged(logits) if filtered is logits else filtered


# ---------------------------------------------------------------------------------------------------------------
# The steps


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Divide logits by ``temperature``; at 0, keep only the first argmax of each row (greedy).

    At ``T > 0`` this is one elementwise division and nothing else: a NaN or ``+inf`` passes through to the next
    step (a filter, :func:`sampling_probs` or :func:`sample`), which rejects it.

    >>> apply_temperature(torch.tensor([2.0, 1.0]), 0.5)
    tensor([4., 2.])
    >>> apply_temperature(torch.tensor([1.0, 3.0, 3.0]), 0)
    tensor([-inf, 0., -inf])
    """
    return _temperature(_logits(logits), _temperature_value(temperature))


def _temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature > 0:
        return logits / temperature
    # Greedy: argmax returns the first maximal index, which is the tie rule we promise. It also ranks NaN first,
    # so the chosen values are the row maxima that the values check needs.
    first_max = logits.argmax(dim=-1, keepdim=True)  # [batch, 1]
    _check_values(logits.gather(-1, first_max))
    return torch.full_like(logits, -math.inf).scatter(-1, first_max, 0.0)


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


# Each filter is a public function that validates its arguments, and a private one that does the work on
# arguments already checked (sampling_logits checks once and chains the private ones). A private filter that is
# switched off hands back its input; one that is on does a single masked_fill of the tokens it removes.


def _top_k_candidates(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The k highest (values, ids), each ``[batch, k]``, and whether no row has a tie straddling the cut.

    One ``topk`` of k + 1: the first value is the row maximum (the values check), and the (k+1)-th equal to the
    k-th means a tie at the cut, where ``topk``'s choice among equal values is not our lower-id rule.
    """
    values, ids = logits.topk(top_k + 1, dim=-1)  # [batch, k + 1], highest first (NaN ranks first)
    _check_values(values[..., 0])
    clean_cut = not bool((values[..., top_k] == values[..., top_k - 1]).any())
    return values[..., :top_k], ids[..., :top_k], clean_cut


def _top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    if top_k == 0 or top_k >= logits.shape[-1]:
        return logits
    values, ids, clean_cut = _top_k_candidates(logits, top_k)
    if clean_cut:  # put the k kept logits back into a row of -inf (cheaper than masking the whole row)
        return torch.full_like(logits, -math.inf).scatter_(-1, ids, values)
    # Of the logits equal to the k-th value, keep the lowest ids until k tokens are kept.
    kth = values[..., -1:]  # [batch, 1]
    above, at_cut = logits > kth, logits == kth
    room = top_k - above.sum(dim=-1, keepdim=True)  # [batch, 1]: how many tied tokens still fit
    return logits.masked_fill(~(above | (at_cut & (at_cut.cumsum(dim=-1) <= room))), -math.inf)


def top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the ``top_k`` highest logits of each row (a tie at the cut goes to the lower id); ``0`` keeps all.

    >>> top_k_filter(torch.tensor([1.0, 3.0, 2.0, 3.0]), 2)
    tensor([-inf, 3., -inf, 3.])
    >>> top_k_filter(torch.tensor([2.0, 2.0, 2.0]), 2)
    tensor([2., 2., -inf])
    """
    logits = _logits(logits)
    return _fresh(_top_k(logits, _top_k_value(top_k)), logits)


def _nucleus_reference(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Which tokens the top-p rule keeps (bool, shaped like ``logits``), exactly as the rule reads."""
    # Rank: highest logit first, equal logits by lower id (a stable sort keeps id order among ties).
    ranked_logits, ranked_ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    # Probabilities in float64, so that p and the tolerance decide the boundary, not float32 rounding.
    log_norm = torch.logsumexp(logits.double(), dim=-1, keepdim=True)
    ranked_probs = (ranked_logits.double() - log_norm).exp()
    # Mass of the tokens ranked strictly before each token: an exclusive cumulative sum.
    mass = ranked_probs.cumsum(dim=-1)
    mass_before = torch.cat([torch.zeros_like(mass[..., :1]), mass[..., :-1]], dim=-1)
    keep_ranked = mass_before < top_p - TOP_P_TOLERANCE
    keep_ranked[..., 0] = True  # the prefix is never empty
    return keep_ranked.scatter(-1, ranked_ids, keep_ranked)  # back to vocabulary order


def top_p_filter_reference(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The top-p rule as written (sort, float64 mass, cut): the definition :func:`top_p_filter` must equal.

    Keep a token while the probability mass ranked before it is below ``top_p - TOP_P_TOLERANCE``; the first
    token always stays. One full sort of the vocabulary per row: the reference that exercises are graded
    against and that tests compare the fast :func:`top_p_filter` with.

    >>> top_p_filter_reference(torch.tensor([8.0, 4.0, 2.0, 1.0]).log(), 0.8).isfinite()
    tensor([ True,  True, False, False])
    """
    logits, top_p = _logits(logits), _top_p_value(top_p)
    if top_p == 1:
        return _unchanged(logits)
    _check_values(logits.amax(dim=-1))
    return logits.masked_fill(~_nucleus_reference(logits, top_p), -math.inf)


def _top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The fast path of the top-p rule: rank only the tokens of the one value bucket where the mass reaches p.

    Same rule, same float64 probabilities, summed in another order (by bucket, then within the boundary
    bucket). Where that order could matter (a mass within _TOP_P_GUARD of the threshold) the row is decided by
    the reference; so the result always equals :func:`top_p_filter_reference`.
    """
    if top_p == 1:
        return logits
    rows = logits.reshape(-1, logits.shape[-1])  # [batch, vocab]
    batch_size = rows.shape[0]
    row_max = rows.amax(dim=-1, keepdim=True)  # [batch, 1]
    _check_values(row_max)
    threshold = top_p - TOP_P_TOLERANCE
    # 1. Distance below the row maximum, in float64 (exact for float32 logits), bucketed: a bucket id never
    #    decreases down the ranking, so the nucleus is every bucket before the boundary one and a prefix of it.
    below = rows - row_max.double()  # [batch, vocab] float64, <= 0; -inf for removed tokens
    bucket = below.mul(-_BUCKETS_PER_LOGIT).clamp_(max=_BUCKETS - 1).long()  # [batch, vocab]
    weights = below.exp_()  # exp(z - z_max): probabilities times the row's normalizer
    bucket_mass = torch.zeros(batch_size, _BUCKETS, dtype=torch.float64).scatter_add_(-1, bucket, weights)
    total = bucket_mass.sum(dim=-1, keepdim=True)  # [batch, 1]
    # Mass of buckets 0..b-1 for b = 0..B (a zero in front): the mass ranked before each bucket.
    mass_before_bucket = torch.nn.functional.pad(bucket_mass.cumsum(dim=-1) / total, (1, 0))  # [batch, B + 1]
    # 2. The boundary bucket: the first whose mass takes the running total to the threshold.
    boundary = (mass_before_bucket[:, 1:] < threshold).sum(dim=-1, keepdim=True)  # [batch, 1], B if never
    # 3. Rank the boundary bucket's tokens: nonzero lists them by row, ids ascending; a stable sort by value
    #    (highest first), then a stable sort by row, leaves each row's tokens in ranking order.
    row_ids, token_ids = (bucket == boundary).nonzero(as_tuple=True)
    by_value = rows[row_ids, token_ids].sort(descending=True, stable=True).indices
    ranked = by_value[row_ids[by_value].sort(stable=True).indices]
    row_ids, token_ids = row_ids[ranked], token_ids[ranked]
    counts = torch.bincount(row_ids, minlength=batch_size)  # [batch]
    slots = torch.arange(len(row_ids)) - (counts.cumsum(0) - counts)[row_ids]  # place within its row's ranking
    bucket_probs = torch.zeros(batch_size, int(counts.max()) if len(counts) else 0, dtype=torch.float64)
    bucket_probs[row_ids, slots] = weights[row_ids, token_ids] / total[row_ids, 0]
    in_bucket_before = bucket_probs.cumsum(dim=-1) - bucket_probs  # [batch, n]: exclusive, within the bucket
    mass_before = mass_before_bucket.gather(-1, boundary)[row_ids, 0] + in_bucket_before[row_ids, slots]
    keep = (mass_before < threshold) | ((slots == 0) & (boundary[row_ids, 0] == 0))  # the first token stays
    # 4. Keep every bucket before the boundary and the kept prefix of the boundary bucket.
    remove = bucket >= boundary
    remove[row_ids[keep], token_ids[keep]] = False
    # 5. The guard: a row whose deciding masses sit near the threshold (or that never reached it) is re-decided
    #    by the reference rule; float64 rounding in either order is far smaller than the guard.
    mass_after_boundary = mass_before_bucket.gather(-1, (boundary + 1).clamp_(max=_BUCKETS))[:, 0]
    unsure = (boundary[:, 0] == _BUCKETS) | ((mass_after_boundary - threshold).abs() <= _TOP_P_GUARD)
    unsure[row_ids[(mass_before - threshold).abs() <= _TOP_P_GUARD]] = True
    if bool(unsure.any()):
        remove[unsure] = ~_nucleus_reference(rows[unsure], top_p)
    return logits.masked_fill(remove.reshape(logits.shape), -math.inf)


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest ranked prefix whose probability mass reaches ``top_p`` (the crossing token included).

    The lesson's example, ``p = (8, 4, 2, 1) / 15``: at ``p = 3/4`` and at the exact boundary ``p = 4/5`` the
    first two tokens survive (``8/15 < 4/5 <= 12/15``). This is the fast function (it sorts only the tokens
    near the cut); :func:`top_p_filter_reference` is the rule written plainly, and the two are tested equal.

    >>> logits = torch.tensor([8.0, 4.0, 2.0, 1.0]).log()
    >>> top_p_filter(logits, 0.8).isfinite()
    tensor([ True,  True, False, False])
    >>> top_p_filter(logits, 0.81).isfinite()
    tensor([ True,  True,  True, False])
    """
    logits = _logits(logits)
    return _fresh(_top_p(logits, _top_p_value(top_p)), logits)


def _min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    if min_p == 0:
        return logits
    row_max = logits.amax(dim=-1, keepdim=True)  # [batch, 1]
    _check_values(row_max)
    # p_i / p_max = exp(z_i - z_max) needs no normalization: compare log-ratios, no exp at all.
    return logits.masked_fill(logits - row_max < math.log(min_p) - MIN_P_TOLERANCE, -math.inf)


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep the tokens whose probability is at least ``min_p`` times the top token's; ``0`` keeps all.

    >>> min_p_filter(torch.tensor([8.0, 4.0, 2.0, 1.0]).log(), 0.25).isfinite()
    tensor([ True,  True,  True, False])
    """
    logits = _logits(logits)
    return _fresh(_min_p(logits, _min_p_value(min_p)), logits)


def _filters(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    if 0 < top_k < logits.shape[-1] and (top_p < 1 or min_p > 0):
        values, ids, clean_cut = _top_k_candidates(logits, top_k)
        if clean_cut:
            # Top-k leaves exactly these k tokens: run top-p and min-p on them alone, in id order (so equal
            # logits still rank lower id first), and put the survivors back into a row of -inf.
            ids = ids.sort(dim=-1).values  # [batch, k]
            survivors = _min_p(_top_p(logits.gather(-1, ids), top_p), min_p)
            return torch.full_like(logits, -math.inf).scatter_(-1, ids, survivors)
    return _min_p(_top_p(_top_k(logits, top_k), top_p), min_p)


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> torch.Tensor:
    """Top-k, then top-p, then min-p (transformers' order), each on what the previous step left.

    >>> filter_logits(torch.tensor([8.0, 4.0, 2.0, 1.0]).log(), top_k=3, top_p=0.9).isfinite()
    tensor([ True,  True,  True, False])
    """
    logits = _logits(logits)
    return _fresh(_filters(logits, _top_k_value(top_k), _top_p_value(top_p), _min_p_value(min_p)), logits)


def sampling_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                    min_p: float = 0.0, order: str = "temperature_first") -> torch.Tensor:
    """Temperature and filters in the given ``order``; removed tokens at ``-inf`` (see the module docstring).

    >>> logits = torch.tensor([8.0, 4.0, 2.0, 1.0], dtype=torch.float64).log()
    >>> sampling_logits(logits, temperature=0.5, top_p=0.75).isfinite()
    tensor([ True, False, False, False])
    >>> sampling_logits(logits, temperature=0.5, top_p=0.75, order="filters_first").isfinite()
    tensor([ True,  True, False, False])
    """
    logits, settings = _logits(logits), check_settings(temperature, top_k, top_p, min_p, order)
    temperature, top_k, top_p, min_p = (settings[name] for name in ("temperature", "top_k", "top_p", "min_p"))
    _check_values(logits.amax(dim=-1))  # once: a step that is switched off (or T > 0) reads no values
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
    validation.tensor("probs", probs, kind="float", ndim=(1, 2), shape="[vocab] or [batch, vocab]", nonempty=True)
    if not torch.isfinite(probs).all() or (probs < 0).any():
        raise ValueError("probs must be finite and >= 0 (got NaN, inf or a negative entry)")
    if not (probs.sum(dim=-1) > 0).all():
        raise ValueError("every row of probs needs a positive entry to draw from")
    if generator is not None:
        validation.instance("generator", generator, torch.Generator, "a torch.Generator or None")
    rows = probs.reshape(-1, probs.shape[-1])  # [batch, vocab]
    ids = torch.multinomial(rows, num_samples=1, generator=generator)[:, 0]  # [batch]
    return ids[0] if probs.ndim == 1 else ids
