"""Lab 08's exercises: the drill book, short code exercises on the pieces the labs use but never ask the learner to
write (issue #51).

Each drill is a plain function on small tensors, checked like every exercise: hand cases (the boundaries), random
cases, tolerances, and three or more mistakes learners really make, each with the hint that points at it. The
pieces, in the notebook's order, with the lab each belongs to:

- RMSNorm (lab 04: the norm that shrinks the residual stream's outliers before q/k/v_proj);
- rotary position embedding, RoPE (labs 05 and 06: what a cached key carries of its position);
- a causal mask with left padding (lab 06: a batch of prompts of different lengths);
- ``repeat_kv`` for grouped-query attention (lab 05: the KV heads the query heads share);
- appending one decode step to a KV cache (labs 05 and 06);
- one query attending over a cache (lab 06: the decode step's attention);
- the online softmax that FlashAttention computes blockwise (lab 06: attention over a long context);
- min-p and a repetition penalty as transformers defines it (lab 01: the sampling filters);
- packing and unpacking 4-bit codes two to a byte, and group-wise INT4 with scales and zero points (labs 03-05:
  what a 4-bit weight costs in bytes and error);
- the SwiGLU MLP (lab 04: its product is the down_proj input where the largest activations appear).

The references live here beside their cases: each is a few lines, used by this drill only, and checked by
``tests/test_exercises_lab08.py`` against an independent implementation where one exists (torch's
``scaled_dot_product_attention``, transformers' ``RepetitionPenaltyLogitsProcessor`` and rotary embedding). min-p's
reference is the sampling module's own filter. Left out: batched decode with a cache, beam search, the rounding
rules of a particular GGUF or AWQ packing.

Each drill's task text in ``notebooks/solutions/08_drills.ipynb`` states the rules used here.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from labkit.core import sampling
from labkit.exercises import register
from labkit.exercises.definitions import Case, CodeExercise, Mistake


def _draw(generator: torch.Generator, low: int, high: int) -> int:
    """A random int from low to high inclusive."""
    return int(torch.randint(low, high + 1, (1,), generator=generator))


# --------------------------------------------------------------------------------------------------------------
# 08.rms_norm (lab 04)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The reference: x / sqrt(mean(x^2 over the last dim) + eps) * weight (Llama's RMSNorm).

    >>> rms_norm(torch.tensor([[3.0, 4.0]]), torch.ones(2), 0.0).mul(1000).round().tolist()
    [[849.0, 1131.0]]
    """
    wide = x.double()
    normed = wide / torch.sqrt(wide.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (normed * weight.double()).to(x.dtype)


def _rms_norm_case(generator: torch.Generator) -> Case:
    shape = [_draw(generator, 1, 3), _draw(generator, 1, 4), _draw(generator, 2, 24)][_draw(generator, 0, 1):]
    x = torch.randn(*shape, generator=generator) * float(torch.rand(1, generator=generator) * 4 + 0.05)
    weight = torch.randn(shape[-1], generator=generator) * 0.5 + 1
    eps = (1e-6, 1e-5, 0.1, 1.0)[_draw(generator, 0, 3)]
    return Case((x, weight, eps), label=f"random x of shape {tuple(shape)}, eps = {eps:g}")


def _eps_outside_the_root(x, weight, eps):
    return x / (x.pow(2).mean(dim=-1, keepdim=True).sqrt() + eps) * weight


def _subtracts_the_mean(x, weight, eps):
    centred = x - x.mean(dim=-1, keepdim=True)
    return centred / torch.sqrt(centred.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def _mean_over_everything(x, weight, eps):
    return x / torch.sqrt(x.pow(2).mean() + eps) * weight


def _forgets_the_weight(x, weight, eps):
    return x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


RMS_NORM = register(CodeExercise(
    id="08.rms_norm",
    title="Drill: RMSNorm",
    function="rms_norm",
    reference=rms_norm,
    rtol=1e-5,
    atol=1e-6,
    hand_cases=(
        Case((torch.tensor([[3.0, 4.0]]), torch.ones(2), 0.0),
             label="rms of (3, 4) is sqrt(12.5) = 3.536: (0.849, 1.131)"),
        Case((torch.tensor([[1.0, 1.0], [2.0, -2.0]]), torch.tensor([2.0, 0.5]), 1.0),
             label="eps = 1 goes inside the root: 1 / sqrt(1 + 1) and 2 / sqrt(4 + 1), times the weight"),
        Case((torch.tensor([[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]]), torch.ones(3), 1e-6),
             label="an all-zero token stays zero (eps keeps the division finite); each token has its own rms"),
        Case((torch.tensor([[[1.0, 3.0], [5.0, 5.0]], [[0.5, 0.5], [-4.0, 0.0]]]), torch.tensor([1.0, -1.0]), 1e-5),
             label="[batch, seq, d]: the mean is over the last dim only"),
    ),
    random_case=_rms_norm_case,
    hints=("divide each token (each row of the last dim) by sqrt(mean(x ** 2) + eps), then multiply by weight",),
    mistakes=(
        Mistake("eps goes inside the square root: x / sqrt(mean(x^2) + eps), not x / (sqrt(mean(x^2)) + eps)",
                _eps_outside_the_root),
        Mistake("RMSNorm does not subtract the mean (that is LayerNorm): divide x itself by its root mean square",
                _subtracts_the_mean),
        Mistake("one root mean square per token: take the mean over the last dim (dim=-1, keepdim=True), not over "
                "the whole tensor", _mean_over_everything),
        Mistake("multiply by `weight` at the end: it is the learned gain per channel", _forgets_the_weight),
    ),
    forbidden=(torch.nn.functional.rms_norm,),
))


# --------------------------------------------------------------------------------------------------------------
# 08.apply_rotary (labs 05 and 06): transformers' Llama convention, rotate_half pairs channel i with i + head_dim/2


def _rotate(x, positions, base, pair="half", step=2):
    """x rotated by positions * base^(-step * i / head_dim) in each pair of channels; ``pair`` "half" pairs i with
    i + head_dim/2 (transformers' Llama), "adjacent" pairs 2i with 2i + 1 (the RoFormer paper, GPT-J)."""
    head_dim = x.shape[-1]
    inv_freq = base ** (-(torch.arange(0, head_dim // 2, dtype=torch.float64) * step) / head_dim)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()
    wide = x.double()
    if pair == "half":
        first, second = wide[..., : head_dim // 2], wide[..., head_dim // 2:]
        out = torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
    else:
        first, second = wide[..., 0::2], wide[..., 1::2]
        out = torch.stack([first * cos - second * sin, second * cos + first * sin], dim=-1).flatten(-2)
    return out.to(x.dtype)


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """The reference: each token of x [seq, head_dim] rotated by its position (transformers' Llama RoPE).

    Channel i is paired with channel i + head_dim/2 and the pair turned by the angle
    positions * base^(-2i / head_dim); position 0 leaves x as it is.

    >>> apply_rotary(torch.tensor([[1.0, 0.0]]), torch.tensor([1]), 10000.0).mul(1000).round().tolist()
    [[540.0, 841.0]]
    """
    return _rotate(x, positions, base)


def _rotary_case(generator: torch.Generator) -> Case:
    seq, head_dim = _draw(generator, 1, 6), 2 * _draw(generator, 1, 16)
    start = _draw(generator, 0, 300)
    positions = start + torch.arange(seq) if _draw(generator, 0, 1) else torch.randint(0, 400, (seq,), generator=generator)
    base = (10000.0, 500000.0, 100.0)[_draw(generator, 0, 2)]
    x = torch.randn(seq, head_dim, generator=generator)
    return Case((x, positions, base), label=f"random x [{seq}, {head_dim}], positions {positions.tolist()}, "
                                            f"base {base:g}")


def _adjacent_pairs(x, positions, base):
    return _rotate(x, positions, base, pair="adjacent")


def _turns_backwards(x, positions, base):
    return _rotate(x, -positions, base)


def _position_plus_one(x, positions, base):
    return _rotate(x, positions + 1, base)


def _frequencies_without_the_two(x, positions, base):
    return _rotate(x, positions, base, step=1)


ROTARY = register(CodeExercise(
    id="08.apply_rotary",
    title="Drill: rotary position embedding (RoPE)",
    function="apply_rotary",
    reference=apply_rotary,
    rtol=1e-4,
    atol=2e-4,  # an angle of a few hundred radians in float32 is off by ~1e-5 rad: float32 and float64 both pass
    hand_cases=(
        Case((torch.tensor([[1.0, 2.0, 3.0, 4.0]]), torch.tensor([0]), 10000.0),
             label="position 0 is no rotation: x comes back as it is"),
        Case((torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]), torch.tensor([1, 2, 1]), 10000.0),
             label="head_dim 2: one pair turned by the position in radians: (cos 1, sin 1), (cos 2, sin 2), "
                   "(-sin 1, cos 1)"),
        Case((torch.tensor([[1.0, 1.0, 0.0, 0.0]]), torch.tensor([1]), 100.0),
             label="head_dim 4, base 100: channel 0 pairs with 2 (angle 1), channel 1 with 3 (angle 1/10)"),
        Case((torch.tensor([[0.5, -1.0, 2.0, 0.25, 1.5, -0.5]] * 2), torch.tensor([7, 7]), 10000.0),
             label="a decode step at position 7, twice: equal positions give equal rotations"),
    ),
    random_case=_rotary_case,
    hints=("inv_freq = base ** (-arange(0, head_dim, 2) / head_dim); angle = position * inv_freq; with x1, x2 the "
           "two halves of the last dim, return cat(x1 cos - x2 sin, x2 cos + x1 sin)",),
    mistakes=(
        Mistake("transformers' Llama pairs channel i with channel i + head_dim/2 (rotate_half), not 2i with 2i+1: "
                "split the last dim into two halves", _adjacent_pairs),
        Mistake("the rotation turns the pair forwards: (x1 cos - x2 sin, x2 cos + x1 sin); your signs turn it "
                "backwards", _turns_backwards),
        Mistake("the first token is at position 0, and positions[i] is already the position: an angle of "
                "(position + 1) * inv_freq is the off-by-one rotation", _position_plus_one),
        Mistake("the frequencies step by 2 in the exponent: base ** (-2i / head_dim) for pair i "
                "(arange(0, head_dim, 2)), not base ** (-i / head_dim)", _frequencies_without_the_two),
    ),
))


# --------------------------------------------------------------------------------------------------------------
# 08.causal_padding_mask (lab 06)


def causal_padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """The reference: allowed[b, i, j] is True where query i of sequence b may read key j: j <= i and key j is a
    real token (attention_mask[b, j] == 1). A padding query's row reads no padding key.

    >>> causal_padding_mask(torch.tensor([[0, 1, 1]])).int().tolist()
    [[[0, 0, 0], [0, 1, 0], [0, 1, 1]]]
    """
    seq = attention_mask.shape[-1]
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    return causal[None, :, :] & attention_mask.bool()[:, None, :]


def _mask_case(generator: torch.Generator) -> Case:
    batch, seq = _draw(generator, 1, 4), _draw(generator, 1, 9)
    lengths = torch.randint(1, seq + 1, (batch,), generator=generator)
    mask = (torch.arange(seq)[None, :] >= seq - lengths[:, None]).long()  # left padding: real tokens at the end
    return Case((mask,), label=f"left-padded attention_mask of {batch} sequences of {seq}: lengths "
                               f"{lengths.tolist()}")


def _sees_the_future(attention_mask):
    seq = attention_mask.shape[-1]
    return torch.ones(seq, seq, dtype=torch.bool).triu()[None] & attention_mask.bool()[:, None, :]


def _cannot_see_itself(attention_mask):
    seq = attention_mask.shape[-1]
    return torch.ones(seq, seq, dtype=torch.bool).tril(-1)[None] & attention_mask.bool()[:, None, :]


def _ignores_padding(attention_mask):
    seq = attention_mask.shape[-1]
    return torch.ones(seq, seq, dtype=torch.bool).tril()[None].expand(attention_mask.shape[0], seq, seq).clone()


def _masks_the_queries(attention_mask):
    seq = attention_mask.shape[-1]
    return torch.ones(seq, seq, dtype=torch.bool).tril()[None] & attention_mask.bool()[:, :, None]


CAUSAL_MASK = register(CodeExercise(
    id="08.causal_padding_mask",
    title="Drill: a causal mask with left padding",
    function="causal_padding_mask",
    reference=causal_padding_mask,
    rtol=0.0,
    atol=0.0,
    hand_cases=(
        Case((torch.tensor([[1, 1, 1]]),), label="no padding: the lower triangle, diagonal included"),
        Case((torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]),),
             label="two padding tokens on the left of the first sequence: no query reads them"),
        Case((torch.tensor([[0, 0, 0, 1]]),), label="a one-token prompt left-padded to 4: only (3, 3) is allowed"),
        Case((torch.tensor([[1]]),), label="one token reads itself"),
    ),
    random_case=_mask_case,
    hints=("allowed[b, i, j] = (j <= i) and attention_mask[b, j] == 1: a lower triangle (torch.tril) combined "
           "with the padding of the keys (the last dim)",),
    mistakes=(
        Mistake("your mask lets a token see the future: query i may read keys j <= i, the LOWER triangle "
                "(torch.tril), not the upper", _sees_the_future),
        Mistake("a token reads itself: the diagonal (j == i) is allowed, so use tril() with diagonal 0, not -1",
                _cannot_see_itself),
        Mistake("a padding key must never be read: combine the triangle with attention_mask[b, j] for each key j "
                "(attention_mask[:, None, :])", _ignores_padding),
        Mistake("the padding belongs to the keys (the last dim, attention_mask[:, None, :]), not the queries "
                "(attention_mask[:, :, None]): a real token must not read the padding before it", _masks_the_queries),
    ),
))


# --------------------------------------------------------------------------------------------------------------
# 08.repeat_kv (lab 05)


def repeat_kv(kv: torch.Tensor, n_rep: int) -> torch.Tensor:
    """The reference (transformers' ``repeat_kv``): [batch, n_kv_heads, seq, head_dim] -> [batch, n_kv_heads *
    n_rep, seq, head_dim], each KV head repeated n_rep times in a row, so query head h reads KV head h // n_rep.

    >>> repeat_kv(torch.tensor([1.0, 2.0]).reshape(1, 2, 1, 1), 2).flatten().tolist()
    [1.0, 1.0, 2.0, 2.0]
    """
    batch, n_kv_heads, seq, head_dim = kv.shape
    return kv[:, :, None].expand(batch, n_kv_heads, n_rep, seq, head_dim).reshape(batch, n_kv_heads * n_rep, seq,
                                                                                    head_dim)


def _repeat_kv_case(generator: torch.Generator) -> Case:
    shape = (_draw(generator, 1, 2), _draw(generator, 1, 4), _draw(generator, 1, 5), _draw(generator, 1, 6))
    n_rep = (1, 2, 3, 4, 8)[_draw(generator, 0, 4)]
    return Case((torch.randn(*shape, generator=generator), n_rep),
                label=f"random kv [batch, n_kv_heads, seq, head_dim] = {list(shape)}, n_rep = {n_rep}")


def _tiled_heads(kv, n_rep):
    return kv.repeat(1, n_rep, 1, 1)


def _repeats_the_positions(kv, n_rep):
    return kv.repeat_interleave(n_rep, dim=2)


def _repeats_the_batch(kv, n_rep):
    return kv.repeat_interleave(n_rep, dim=0)


REPEAT_KV = register(CodeExercise(
    id="08.repeat_kv",
    title="Drill: repeat_kv for grouped-query attention",
    function="repeat_kv",
    reference=repeat_kv,
    rtol=0.0,
    atol=0.0,
    hand_cases=(
        Case((torch.tensor([10.0, 20.0]).reshape(1, 2, 1, 1), 2),
             label="two KV heads, n_rep 2: heads 10, 10, 20, 20 (not 10, 20, 10, 20)"),
        Case((torch.arange(6.0).reshape(1, 1, 3, 2), 3), label="one KV head (multi-query) read by three query heads"),
        Case((torch.arange(8.0).reshape(2, 2, 2, 1), 1), label="n_rep 1 (multi-head attention): unchanged"),
    ),
    random_case=_repeat_kv_case,
    hints=("insert a dim after the heads, expand it to n_rep and reshape to [batch, n_kv_heads * n_rep, seq, "
           "head_dim] (or repeat_interleave(n_rep, dim=1))",),
    mistakes=(
        Mistake("kv.repeat(1, n_rep, 1, 1) tiles the heads (0, 1, 0, 1): query head h must read KV head "
                "h // n_rep, so each head is repeated n_rep times in a row (0, 0, 1, 1): "
                "repeat_interleave(n_rep, dim=1)", _tiled_heads),
        Mistake("repeat the heads (dim 1), not the positions (dim 2)", _repeats_the_positions),
        Mistake("repeat the heads (dim 1), not the batch (dim 0)", _repeats_the_batch),
    ),
))


# --------------------------------------------------------------------------------------------------------------
# 08.cache_append (labs 05 and 06): one decode step into a cache of rotated keys


def cache_append(cache_keys: torch.Tensor, cache_values: torch.Tensor, new_key: torch.Tensor,
                 new_value: torch.Tensor, base: float) -> torch.Tensor:
    """The reference: the cache after one more step, as one tensor [2, n_kv_heads, t + 1, head_dim] (keys, then
    values). The cache [n_kv_heads, t, head_dim] holds keys already rotated; the new key [n_kv_heads, head_dim] is
    rotated at its position t (the number of tokens before it) and goes after the others.
    """
    position = torch.tensor([cache_keys.shape[1]])
    key = _rotate(new_key, position.expand(new_key.shape[0]), base)
    return torch.stack([torch.cat([cache_keys, key[:, None]], dim=1),
                        torch.cat([cache_values, new_value[:, None]], dim=1)])


def _cache_case(generator: torch.Generator) -> Case:
    heads, length, head_dim = _draw(generator, 1, 4), _draw(generator, 0, 12), 2 * _draw(generator, 1, 8)
    cache_keys, cache_values = (torch.randn(heads, length, head_dim, generator=generator) for _ in range(2))
    new_key, new_value = (torch.randn(heads, head_dim, generator=generator) for _ in range(2))
    return Case((cache_keys, cache_values, new_key, new_value, 10000.0),
                label=f"a cache of {length} steps, {heads} KV heads of {head_dim}")


def _stores_the_key_unrotated(cache_keys, cache_values, new_key, new_value, base):
    return torch.stack([torch.cat([cache_keys, new_key[:, None]], dim=1),
                        torch.cat([cache_values, new_value[:, None]], dim=1)])


def _rotates_one_position_late(cache_keys, cache_values, new_key, new_value, base):
    key = _rotate(new_key, torch.full((new_key.shape[0],), cache_keys.shape[1] + 1), base)
    return torch.stack([torch.cat([cache_keys, key[:, None]], dim=1),
                        torch.cat([cache_values, new_value[:, None]], dim=1)])


def _rotates_the_value_too(cache_keys, cache_values, new_key, new_value, base):
    positions = torch.full((new_key.shape[0],), cache_keys.shape[1])
    return torch.stack([torch.cat([cache_keys, _rotate(new_key, positions, base)[:, None]], dim=1),
                        torch.cat([cache_values, _rotate(new_value, positions, base)[:, None]], dim=1)])


def _puts_the_step_first(cache_keys, cache_values, new_key, new_value, base):
    key = _rotate(new_key, torch.full((new_key.shape[0],), cache_keys.shape[1]), base)
    return torch.stack([torch.cat([key[:, None], cache_keys], dim=1),
                        torch.cat([new_value[:, None], cache_values], dim=1)])


def _cache_hand_cases() -> tuple[Case, ...]:
    generator = torch.Generator().manual_seed(8)
    keys, values = torch.randn(2, 3, 4, generator=generator), torch.randn(2, 3, 4, generator=generator)
    new_key, new_value = torch.randn(2, 4, generator=generator), torch.randn(2, 4, generator=generator)
    return (
        Case((torch.zeros(1, 0, 2), torch.zeros(1, 0, 2), torch.tensor([[1.0, 0.0]]), torch.tensor([[0.5, 0.5]]),
              10000.0), label="an empty cache: the first token is at position 0, so its key is stored as it is"),
        Case((torch.tensor([[[1.0, 0.0]]]), torch.tensor([[[2.0, 2.0]]]), torch.tensor([[1.0, 0.0]]),
              torch.tensor([[3.0, -3.0]]), 10000.0),
             label="one step cached: the new key is at position 1, turned by 1 radian: (cos 1, sin 1); the value is "
                   "stored as it is"),
        Case((keys, values, new_key, new_value, 10000.0), label="3 steps of 2 KV heads cached: the new step goes "
                                                                 "at position 3, after them"),
    )


CACHE_APPEND = register(CodeExercise(
    id="08.cache_append",
    title="Drill: append one decode step to a KV cache",
    function="cache_append",
    reference=cache_append,
    rtol=1e-5,
    atol=1e-5,
    hand_cases=_cache_hand_cases(),
    random_case=_cache_case,
    hints=("rotate new_key at position t = cache_keys.shape[1] (your apply_rotary with positions "
           "torch.full((n_kv_heads,), t)), concatenate it after the cached keys along dim 1 (new_key[:, None]), "
           "the same for the value without rotating it, and return torch.stack([keys, values])",),
    mistakes=(
        Mistake("the cache holds keys AFTER rotation: rotate the new key at its position before storing it (a key "
                "stored unrotated is never rotated later)", _stores_the_key_unrotated),
        Mistake("the new token's position is the number of tokens before it, t = cache_keys.shape[1] (0 for the "
                "first token), not t + 1", _rotates_one_position_late),
        Mistake("only queries and keys are rotated: store the value as it is", _rotates_the_value_too),
        Mistake("the new step goes at the END of the cache (after the t cached steps), not at the front",
                _puts_the_step_first),
    ),
))


# --------------------------------------------------------------------------------------------------------------
# 08.attend_one_query (lab 06): the decode step's attention, one new query over the whole cache


def attend_one_query(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The reference: query [n_heads, head_dim] over keys and values [n_kv_heads, t, head_dim]; query head h reads
    KV head h // (n_heads // n_kv_heads); softmax(q . k / sqrt(head_dim)) @ v per head -> [n_heads, head_dim].

    >>> attend_one_query(torch.zeros(1, 4), torch.zeros(1, 2, 4), torch.tensor([[[1.0] * 4, [3.0] * 4]])).tolist()
    [[2.0, 2.0, 2.0, 2.0]]
    """
    n_rep = query.shape[0] // keys.shape[0]
    wide_keys = keys.double().repeat_interleave(n_rep, dim=0)  # [n_heads, t, head_dim]
    wide_values = values.double().repeat_interleave(n_rep, dim=0)
    scores = torch.einsum("hd,htd->ht", query.double(), wide_keys) / math.sqrt(query.shape[-1])
    return torch.einsum("ht,htd->hd", scores.softmax(dim=-1), wide_values).to(query.dtype)


def _attention_case(generator: torch.Generator) -> Case:
    n_kv_heads, n_rep = _draw(generator, 1, 4), (1, 2, 3, 4)[_draw(generator, 0, 3)]
    length, head_dim = _draw(generator, 1, 20), (2, 4, 8, 16, 64)[_draw(generator, 0, 4)]
    query = torch.randn(n_kv_heads * n_rep, head_dim, generator=generator)
    keys, values = (torch.randn(n_kv_heads, length, head_dim, generator=generator) for _ in range(2))
    return Case((query, keys, values), label=f"{n_kv_heads * n_rep} query heads over {n_kv_heads} KV heads of "
                                             f"{head_dim}, {length} cached steps")


def _scores(query, keys, n_rep, scale):
    return torch.einsum("hd,htd->ht", query, keys.repeat_interleave(n_rep, dim=0)) * scale


def _unscaled(query, keys, values):
    n_rep = query.shape[0] // keys.shape[0]
    return torch.einsum("ht,htd->hd", _scores(query, keys, n_rep, 1.0).softmax(-1), values.repeat_interleave(n_rep, 0))


def _scaled_by_head_dim(query, keys, values):
    n_rep = query.shape[0] // keys.shape[0]
    weights = _scores(query, keys, n_rep, 1 / query.shape[-1]).softmax(-1)
    return torch.einsum("ht,htd->hd", weights, values.repeat_interleave(n_rep, 0))


def _softmax_over_heads(query, keys, values):
    n_rep = query.shape[0] // keys.shape[0]
    weights = _scores(query, keys, n_rep, query.shape[-1] ** -0.5).softmax(0)
    return torch.einsum("ht,htd->hd", weights, values.repeat_interleave(n_rep, 0))


def _heads_tiled(query, keys, values):
    n_rep = query.shape[0] // keys.shape[0]
    tiled_keys, tiled_values = keys.repeat(n_rep, 1, 1), values.repeat(n_rep, 1, 1)
    weights = (torch.einsum("hd,htd->ht", query, tiled_keys) * query.shape[-1] ** -0.5).softmax(-1)
    return torch.einsum("ht,htd->hd", weights, tiled_values)


def _exp_without_the_max(query, keys, values):
    n_rep = query.shape[0] // keys.shape[0]
    exps = _scores(query, keys, n_rep, query.shape[-1] ** -0.5).exp()
    return torch.einsum("ht,htd->hd", exps / exps.sum(-1, keepdim=True), values.repeat_interleave(n_rep, 0))


ATTEND_ONE_QUERY = register(CodeExercise(
    id="08.attend_one_query",
    title="Drill: one query attending over a KV cache",
    function="attend_one_query",
    reference=attend_one_query,
    rtol=1e-5,
    atol=1e-5,
    hand_cases=(
        Case((torch.tensor([[1.0, 0.0]]), torch.tensor([[[5.0, 1.0]]]), torch.tensor([[[0.5, -2.0]]])),
             label="one cached step: all the weight on it, the output is its value"),
        Case((torch.tensor([[2.0, 0.0, 0.0, 0.0]]), torch.tensor([[[1.0, 0, 0, 0], [0, 0, 0, 0]]]),
              torch.tensor([[[1.0, 0, 0, 0], [0, 1.0, 0, 0]]])),
             label="scores 2 / sqrt(4) = 1 and 0: weights e / (e + 1) and 1 / (e + 1)"),
        Case((torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]]),
              torch.tensor([[[2.0, 0.0], [0.0, 2.0]], [[1.0, 1.0], [-1.0, 3.0]]]),
              torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[5.0, 5.0], [-5.0, 5.0]]])),
             label="4 query heads over 2 KV heads: heads 0 and 1 read KV head 0, heads 2 and 3 read KV head 1"),
        Case((torch.tensor([[30.0, 30.0]]), torch.tensor([[[30.0, 30.0], [29.0, 29.0]]]),
              torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])),
             label="scores of 1,273 and 1,230: exp overflows unless the largest score is subtracted first"),
    ),
    random_case=_attention_case,
    hints=("scores = q . k / sqrt(head_dim) for every cached step, softmax over the steps, then the weighted sum "
           "of the values; query head h reads KV head h // (n_heads // n_kv_heads)",),
    mistakes=(
        Mistake("scale the scores by 1 / sqrt(head_dim) before the softmax", _unscaled),
        Mistake("the scale is 1 / sqrt(head_dim), not 1 / head_dim", _scaled_by_head_dim),
        Mistake("the softmax runs over the cached steps (the last dim of the scores [n_heads, t]), not over the "
                "heads", _softmax_over_heads),
        Mistake("query head h reads KV head h // n_rep (heads 0 and 1 share KV head 0): repeat_interleave the "
                "KV heads, not repeat (which gives h % n_kv_heads)", _heads_tiled),
        Mistake("exp of a large score overflows to inf (inf / inf is NaN): subtract each row's largest score before "
                "exp, or call torch.softmax", _exp_without_the_max),
    ),
    forbidden=(torch.nn.functional.scaled_dot_product_attention,),
))


# --------------------------------------------------------------------------------------------------------------
# 08.online_softmax (lab 06): one pass over blocks of scores, a running max and a running sum


def online_softmax(scores: torch.Tensor, block_size: int) -> torch.Tensor:
    """The reference: the state of the one-pass softmax after each block of ``block_size`` scores (the last block
    may be shorter), as [n_blocks, 2]: the running max m and the running sum l = sum over the scores seen so far of
    exp(score - m). At the end, softmax(scores) = exp(scores - m) / l. Before any finite score, m = -inf, l = 0.

    >>> online_softmax(torch.tensor([0.0, 0.0, math.log(2.0)]), 2).tolist()
    [[0.0, 2.0], [0.6931471824645996, 2.0]]
    """
    wide = scores.double()
    states, running_max, running_sum = [], -math.inf, 0.0
    for start in range(0, wide.shape[0], block_size):
        block = wide[start:start + block_size]
        new_max = max(running_max, float(block.max()))
        if new_max > -math.inf:  # a block of -inf before any finite score adds nothing (and exp(-inf + inf) is NaN)
            running_sum = running_sum * math.exp(running_max - new_max) + float((block - new_max).exp().sum())
        running_max = new_max
        states.append((running_max, running_sum))
    return torch.tensor(states, dtype=scores.dtype)


def _online_case(generator: torch.Generator) -> Case:
    length = _draw(generator, 1, 40)
    scores = torch.randn(length, generator=generator) * float(torch.rand(1, generator=generator) * 8 + 0.1)
    kind = _draw(generator, 0, 3)
    if kind == 1:  # rising scores: the max moves in every block, the sum must be rescaled every time
        scores = scores.sort().values
    elif kind == 2:  # all negative: a running max started at 0 would be wrong
        scores = -scores.abs() - 1
    block_size = _draw(generator, 1, 12)
    return Case((scores, block_size), label=f"random scores of length {length}, block_size {block_size}")


def _run_blocks(scores, block_size, rescale, start_max=-math.inf, own_block_max=False):
    """A one-pass softmax with a rule for the sum's rescaling: rescale(old_sum, old_max, new_max)."""
    states, running_max, running_sum = [], start_max, 0.0
    for start in range(0, scores.shape[0], block_size):
        block = scores[start:start + block_size].double()
        new_max = float(block.max()) if own_block_max else max(running_max, float(block.max()))
        if new_max > -math.inf:
            running_sum = rescale(running_sum, running_max, new_max) + float((block - new_max).exp().sum())
        running_max = new_max
        states.append((running_max, running_sum))
    return torch.tensor(states, dtype=scores.dtype)


def _forgets_to_rescale(scores, block_size):
    return _run_blocks(scores, block_size, lambda old_sum, old_max, new_max: old_sum)


def _rescales_the_wrong_way(scores, block_size):
    return _run_blocks(scores, block_size,
                       lambda old_sum, old_max, new_max: old_sum * math.exp(new_max - old_max) if old_sum else 0.0)


def _starts_the_max_at_zero(scores, block_size):
    return _run_blocks(scores, block_size, lambda old_sum, old_max, new_max: old_sum * math.exp(old_max - new_max),
                       start_max=0.0)


def _keeps_the_block_max(scores, block_size):
    return _run_blocks(scores, block_size, lambda old_sum, old_max, new_max: old_sum * math.exp(old_max - new_max),
                       own_block_max=True)


ONLINE_SOFTMAX = register(CodeExercise(
    id="08.online_softmax",
    title="Drill: the online softmax (running max and sum)",
    function="online_softmax",
    reference=online_softmax,
    rtol=1e-5,
    atol=1e-6,
    hand_cases=(
        Case((torch.tensor([1.0, 2.0, 3.0]), 3), label="one block: m = 3, l = e^-2 + e^-1 + 1"),
        Case((torch.tensor([0.0, 0.0, math.log(2.0), math.log(2.0)]), 2),
             label="the max rises from 0 to log 2: the first block's sum 2 is rescaled to 1, plus 2"),
        Case((torch.tensor([5.0, 1.0, 1.0]), 1), label="block size 1; the max stays 5, nothing to rescale"),
        Case((torch.tensor([-3.0, -2.0, -5.0, -1.0, -4.0]), 2),
             label="all negative, a last block of one: the running max starts at -inf, not 0"),
        Case((torch.tensor([-math.inf, -math.inf, 0.5, -math.inf, 2.0]), 2),
             label="a masked (-inf) first block: m = -inf and l = 0 until a finite score arrives (no NaN)"),
    ),
    random_case=_online_case,
    hints=("keep m (start -inf) and l (start 0); for each block: m_new = max(m, block.max()), "
           "l = l * exp(m - m_new) + sum(exp(block - m_new)), m = m_new; record (m, l) after each block",),
    mistakes=(
        Mistake("when the max rises, the sum so far was taken against the old max: rescale it, "
                "l = l * exp(m_old - m_new), before adding the block's exps", _forgets_to_rescale),
        Mistake("rescale by exp(m_old - m_new), which is at most 1 (the old terms shrink against a larger max), not "
                "exp(m_new - m_old)", _rescales_the_wrong_way),
        Mistake("start the running max at -inf, not 0: with all scores negative a max of 0 is never a score",
                _starts_the_max_at_zero),
        Mistake("the running max is the largest score seen so far, max(m, block.max()), not the current block's "
                "own max", _keeps_the_block_max),
    ),
    forbidden=(torch.softmax, torch.nn.functional.softmax, torch.logsumexp),
))


# --------------------------------------------------------------------------------------------------------------
# 08.min_p (lab 01)


def keep_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """The reference: labkit's ``sampling.min_p_filter``. A token is kept when its probability is at least min_p
    times the top token's, i.e. logit - max logit >= log(min_p); the others become -inf; min_p 0 keeps all."""
    return sampling.min_p_filter(logits, min_p)


MIN_P_MARGIN = 1e-3  # how near log(min_p) a random case's logit gap may come (labkit's slack is ~1e-6)


def _min_p_case(generator: torch.Generator) -> Case:
    for _ in range(1000):
        rows, vocab = _draw(generator, 1, 3), _draw(generator, 2, 30)
        logits = torch.randn(rows, vocab, generator=generator) * float(torch.rand(1, generator=generator) * 3 + 0.2)
        if rows == 1 and _draw(generator, 0, 1):
            logits = logits[0]
        threshold = (0.0, 0.05, 0.1, 0.2, 0.5, 0.9, 1.0)[_draw(generator, 0, 6)]
        gaps = logits - logits.max(dim=-1, keepdim=True).values
        if threshold in (0.0, 1.0) or bool(((gaps - math.log(threshold)).abs() > MIN_P_MARGIN).all()):
            break
    return Case((logits, threshold), label=f"random logits of shape {tuple(logits.shape)}, min_p = {threshold}")


def _threshold_on_logits(logits, min_p):
    top = logits.max(dim=-1, keepdim=True).values
    return logits.masked_fill(logits < min_p * top, -math.inf)


def _absolute_threshold(logits, min_p):
    return logits.masked_fill(logits.softmax(dim=-1) < min_p, -math.inf)


def _strictly_above(logits, min_p):
    probs = logits.softmax(dim=-1)
    return logits.masked_fill(probs <= min_p * probs.max(dim=-1, keepdim=True).values, -math.inf)


def _returns_probabilities(logits, min_p):
    probs = logits.softmax(dim=-1)
    return probs.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, 0.0)


MIN_P = register(CodeExercise(
    id="08.min_p",
    title="Drill: min-p filtering",
    function="keep_min_p",
    reference=keep_min_p,
    rtol=1e-6,
    atol=1e-6,
    hand_cases=(
        Case((torch.tensor([4.0, 2.0, 1.0, 1.0]).log(), 0.3),
             label="probabilities (4, 2, 1, 1)/8, min_p 0.3: the bar is 0.3 x 1/2 = 0.15, so 1/4 is kept"),
        Case((torch.tensor([8.0, 4.0, 2.0, 1.0]).log(), 0.25),
             label="probabilities (8, 4, 2, 1)/15, min_p 1/4: 2/15 is exactly a quarter of 8/15 and is kept; "
                   "1/15 goes"),
        Case((torch.tensor([3.0, -1.0, 0.5]), 0.0), label="min_p 0 keeps every token"),
        Case((torch.tensor([[2.0, 2.0, 1.0], [0.0, -5.0, -1.0]]), 1.0),
             label="min_p 1 keeps the top token and its ties; each row has its own top"),
        Case((torch.tensor([-math.inf, 1.0, 0.0, -0.5]), 0.5),
             label="a token already removed (-inf) stays removed; the logits are not probabilities"),
    ),
    random_case=_min_p_case,
    hints=("keep a token when softmax(logits) >= min_p * its row's largest probability (equivalently "
           "logit - max logit >= log(min_p)); set the others to -inf and return the logits",),
    mistakes=(
        Mistake("compare probabilities, not logits: a logit is a log-probability plus a constant, so min_p times "
                "the top logit means nothing; use logit - max >= log(min_p)", _threshold_on_logits),
        Mistake("a token exactly at the threshold is kept (>=, not >)", _strictly_above),
        Mistake("the threshold is relative to the top token: probability >= min_p * max probability, not "
                ">= min_p", _absolute_threshold),
        Mistake("return the logits with the removed tokens at -inf, not probabilities", _returns_probabilities),
    ),
))


# --------------------------------------------------------------------------------------------------------------
# 08.repetition_penalty (lab 01): transformers' RepetitionPenaltyLogitsProcessor (the CTRL paper's rule)


def repetition_penalty(logits: torch.Tensor, previous_ids: torch.Tensor, penalty: float) -> torch.Tensor:
    """The reference: each token that occurs in previous_ids (once or many times) has its logit divided by the
    penalty when positive, multiplied when negative; the others are unchanged. logits: [vocab].

    >>> repetition_penalty(torch.tensor([2.0, -2.0, 1.0]), torch.tensor([0, 1, 1]), 2.0).tolist()
    [1.0, -4.0, 1.0]
    """
    seen = torch.zeros(logits.shape[-1], dtype=torch.bool)
    seen[previous_ids] = True
    return torch.where(seen, torch.where(logits < 0, logits * penalty, logits / penalty), logits)


def _penalty_case(generator: torch.Generator) -> Case:
    vocab, n_previous = _draw(generator, 2, 30), _draw(generator, 0, 20)
    logits = torch.randn(vocab, generator=generator) * 3
    previous = torch.randint(0, vocab, (n_previous,), generator=generator)
    penalty = (1.0, 1.1, 1.3, 2.0, 0.8)[_draw(generator, 0, 4)]
    return Case((logits, previous, penalty), label=f"random logits [{vocab}], {n_previous} previous tokens "
                                                   f"{previous.tolist()}, penalty {penalty}")


def _divides_every_logit(logits, previous_ids, penalty):
    out = logits.clone()
    out[previous_ids] = logits[previous_ids] / penalty
    return out


def _penalizes_each_occurrence(logits, previous_ids, penalty):
    out = logits.clone()
    for token in previous_ids.tolist():
        out[token] = out[token] * penalty if out[token] < 0 else out[token] / penalty
    return out


def _penalizes_the_others(logits, previous_ids, penalty):
    seen = torch.zeros(logits.shape[-1], dtype=torch.bool)
    seen[previous_ids] = True
    return torch.where(~seen, torch.where(logits < 0, logits * penalty, logits / penalty), logits)


def _subtracts_the_penalty(logits, previous_ids, penalty):
    out = logits.clone()
    out[previous_ids] = logits[previous_ids] - penalty
    return out


REPETITION_PENALTY = register(CodeExercise(
    id="08.repetition_penalty",
    title="Drill: a repetition penalty as transformers defines it",
    function="repetition_penalty",
    reference=repetition_penalty,
    rtol=1e-6,
    atol=1e-6,
    hand_cases=(
        Case((torch.tensor([2.0, -2.0, 1.0, -1.0]), torch.tensor([0, 1]), 2.0),
             label="penalty 2: a positive logit is halved (2 -> 1), a negative one doubled (-2 -> -4)"),
        Case((torch.tensor([3.0, 0.0, -3.0]), torch.tensor([0, 0, 0, 2]), 1.5),
             label="a token seen three times is penalized once (3 -> 2); -3 -> -4.5"),
        Case((torch.tensor([1.0, -1.0]), torch.tensor([], dtype=torch.long), 2.0),
             label="no previous tokens: nothing changes"),
        Case((torch.tensor([0.0, 4.0]), torch.tensor([0, 1]), 1.0), label="penalty 1 changes nothing; 0 stays 0"),
    ),
    random_case=_penalty_case,
    hints=("for each distinct token in previous_ids: logit / penalty if the logit is positive (or 0), "
           "logit * penalty if negative; leave every other token as it is",),
    mistakes=(
        Mistake("a negative logit is MULTIPLIED by the penalty (it becomes more negative, less likely); dividing "
                "it would make the repeated token more likely", _divides_every_logit),
        Mistake("each token is penalized once, however often it occurred (transformers scatters one value per "
                "token)", _penalizes_each_occurrence),
        Mistake("the penalty applies to the tokens that DID occur in previous_ids, not to the others",
                _penalizes_the_others),
        Mistake("the penalty divides (or multiplies) the logit; it is not subtracted", _subtracts_the_penalty),
    ),
))


# --------------------------------------------------------------------------------------------------------------
# 08.pack_int4 and 08.unpack_int4 (labs 03 and 05): two 4-bit codes in one byte, the even one in the low nibble


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """The reference: codes [..., n] (uint8, 0..15, n even) -> bytes [..., n/2] (uint8): byte i holds code 2i in
    its low 4 bits and code 2i+1 in its high 4 bits.

    >>> pack_int4(torch.tensor([1, 2, 15, 0], dtype=torch.uint8)).tolist()
    [33, 15]
    """
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The reference: bytes [..., m] (uint8) -> codes [..., 2m] (uint8), the inverse of :func:`pack_int4`.

    >>> unpack_int4(torch.tensor([33, 15], dtype=torch.uint8)).tolist()
    [1, 2, 15, 0]
    """
    return torch.stack([packed & 15, packed >> 4], dim=-1).flatten(-2).to(torch.uint8)


def _codes_case(generator: torch.Generator) -> Case:
    shape = [_draw(generator, 1, 4), 2 * _draw(generator, 1, 12)][_draw(generator, 0, 1):]
    codes = torch.randint(0, 16, shape, generator=generator, dtype=torch.uint8)
    return Case((codes,), label=f"random codes of shape {tuple(shape)}")


def _bytes_case(generator: torch.Generator) -> Case:
    shape = [_draw(generator, 1, 4), _draw(generator, 1, 12)][_draw(generator, 0, 1):]
    return Case((torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8),),
                label=f"random bytes of shape {tuple(shape)}")


def _high_nibble_first(codes):
    return ((codes[..., 0::2] << 4) | codes[..., 1::2]).to(torch.uint8)


def _pairs_the_halves(codes):
    half = codes.shape[-1] // 2
    return (codes[..., :half] | (codes[..., half:] << 4)).to(torch.uint8)


def _adds_without_shifting(codes):
    return (codes[..., 0::2] + codes[..., 1::2]).to(torch.uint8)


def _shifts_by_eight(codes):
    return (codes[..., 0::2] | (codes[..., 1::2] << 8)).to(torch.uint8)


PACK = register(CodeExercise(
    id="08.pack_int4",
    title="Drill: pack two 4-bit codes into a byte",
    function="pack_int4",
    reference=pack_int4,
    rtol=0.0,
    atol=0.0,
    hand_cases=(
        Case((torch.tensor([1, 2, 15, 0], dtype=torch.uint8),), label="(1, 2) -> 1 + 2 * 16 = 33; (15, 0) -> 15"),
        Case((torch.tensor([[0, 15], [15, 15]], dtype=torch.uint8),), label="rows packed separately: 240 and 255"),
        Case((torch.tensor([3, 0, 0, 3, 7, 9], dtype=torch.uint8),), label="(3, 0) -> 3, (0, 3) -> 48, (7, 9) -> 151"),
    ),
    random_case=_codes_case,
    hints=("byte i = codes[2i] | (codes[2i + 1] << 4): take codes[..., 0::2] and codes[..., 1::2]",),
    mistakes=(
        Mistake("the even code goes in the LOW nibble: codes[2i] | codes[2i + 1] << 4, not codes[2i] << 4 | ...",
                _high_nibble_first),
        Mistake("pack neighbours, codes 2i and 2i + 1 (codes[..., 0::2] and codes[..., 1::2]), not code i with code "
                "i + n/2", _pairs_the_halves),
        Mistake("the odd code must be shifted into the high nibble (<< 4, i.e. times 16) before it is combined",
                _adds_without_shifting),
        Mistake("a nibble is 4 bits: shift by 4; a uint8 shifted by 8 loses the code", _shifts_by_eight),
    ),
))


def _unpack_swapped(packed):
    return torch.stack([packed >> 4, packed & 15], dim=-1).flatten(-2).to(torch.uint8)


def _unpack_without_the_mask(packed):
    return torch.stack([packed, packed >> 4], dim=-1).flatten(-2).to(torch.uint8)


def _unpack_into_halves(packed):
    return torch.cat([packed & 15, packed >> 4], dim=-1).to(torch.uint8)


UNPACK = register(CodeExercise(
    id="08.unpack_int4",
    title="Drill: unpack a byte into two 4-bit codes",
    function="unpack_int4",
    reference=unpack_int4,
    rtol=0.0,
    atol=0.0,
    hand_cases=(
        Case((torch.tensor([33, 15], dtype=torch.uint8),), label="33 = 1 + 2 * 16 -> (1, 2); 15 -> (15, 0)"),
        Case((torch.tensor([[240], [255]], dtype=torch.uint8),), label="240 -> (0, 15), 255 -> (15, 15)"),
        Case((torch.tensor([151, 48, 0], dtype=torch.uint8),), label="151 -> (7, 9), 48 -> (0, 3), 0 -> (0, 0)"),
    ),
    random_case=_bytes_case,
    hints=("code 2i = byte & 15 (the low nibble), code 2i + 1 = byte >> 4; interleave them with "
           "torch.stack([...], dim=-1).flatten(-2)",),
    mistakes=(
        Mistake("the low nibble (byte & 15) is the EVEN code, the first of the pair", _unpack_swapped),
        Mistake("keep only the low 4 bits for the even code: byte & 15 (or byte % 16)", _unpack_without_the_mask),
        Mistake("the codes are interleaved (low, high, low, high ...): stack them on a new last dim and flatten, "
                "rather than concatenating all lows then all highs", _unpack_into_halves),
    ),
))


# --------------------------------------------------------------------------------------------------------------
# 08.int4_groups (labs 03 and 04): affine 4-bit, one scale and zero point per group of consecutive values in a row


def _group_grid(groups: torch.Tensor, q_max: int = 15) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero point) per group (the last dim): MinMaxObserver's rule over a range widened to contain 0."""
    low, high = groups.amin(dim=-1, keepdim=True).clamp(max=0), groups.amax(dim=-1, keepdim=True).clamp(min=0)
    scale = ((high - low) / q_max).clamp(min=torch.finfo(groups.dtype).eps)
    return scale, (-torch.round(low / scale)).clamp(0, q_max)


def int4_groups(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """The reference: weight [out, in] fake-quantized to 4-bit codes 0..15, one scale and zero point per group of
    ``group_size`` consecutive values of a row (group_size divides in). For each group: the range [min, max]
    widened to contain 0, s = range / 15, z = round(-low / s) clamped to 0..15, q = clamp(round(x / s) + z, 0, 15),
    returned as s * (q - z). A group of zeros comes back as zeros.

    >>> int4_groups(torch.tensor([[0.0, 1.5, -1.0, 2.0]]), 2).mul(100).round().tolist()
    [[0.0, 150.0, -100.0, 200.0]]
    """
    out_features, in_features = weight.shape
    groups = weight.reshape(out_features, in_features // group_size, group_size)
    scale, zero = _group_grid(groups)
    codes = (torch.round(groups / scale) + zero).clamp(0, 15)
    return (scale * (codes - zero)).reshape(out_features, in_features)


INT4_TIE_MARGIN = 1e-3  # in codes: how near a half code a random case's x / s may come


def _int4_near_a_tie(weight: torch.Tensor, group_size: int) -> bool:
    """Whether some x / s or low / s of a group lies within INT4_TIE_MARGIN of a half code, where x / s and
    x * (1 / s) may round apart (lab 03's exercise met one): random cases are drawn away from such inputs."""
    groups = weight.double().reshape(weight.shape[0], -1, group_size)
    low = groups.amin(dim=-1, keepdim=True).clamp(max=0)
    high = groups.amax(dim=-1, keepdim=True).clamp(min=0)
    scale = ((high - low) / 15).clamp(min=1e-30)
    scaled = torch.cat([groups, low], dim=-1) / scale
    return bool(((scaled - scaled.floor() - 0.5).abs() < INT4_TIE_MARGIN).any())


def _int4_case(generator: torch.Generator) -> Case:
    for _ in range(1000):
        group_size = (2, 4, 8, 16)[_draw(generator, 0, 3)]
        out_features, in_features = _draw(generator, 1, 4), group_size * _draw(generator, 2, 4)
        weight = torch.randn(out_features, in_features, generator=generator) * 0.05
        weight[:, :group_size] *= 20  # one group far larger than the next: a scale per row would flatten the rest
        if _draw(generator, 0, 2) == 0:
            weight = weight.abs()  # all positive: the zero point is 0
        if not _int4_near_a_tie(weight, group_size):
            break
    return Case((weight, group_size), label=f"random weight [{out_features}, {in_features}], group_size {group_size}")


def _affine(groups, q_max=15):
    scale, zero = _group_grid(groups, q_max)
    return scale * ((torch.round(groups / scale) + zero).clamp(0, q_max) - zero)


def _groups_down_the_columns(weight, group_size):
    columns = weight.T.reshape(weight.shape[1], weight.shape[0] // group_size, group_size)
    return _affine(columns).reshape(weight.shape[1], weight.shape[0]).T


def _groups_by_stride(weight, group_size):
    strided = weight.reshape(weight.shape[0], group_size, -1).transpose(1, 2)  # every (in / g)-th value together
    return _affine(strided).transpose(1, 2).reshape(weight.shape)


def _one_scale_per_row(weight, group_size):
    return _affine(weight)


def _forgets_the_zero_point(weight, group_size):
    groups = weight.reshape(weight.shape[0], -1, group_size)
    scale, zero = _group_grid(groups)
    return (scale * (torch.round(groups / scale) + zero).clamp(0, 15)).reshape(weight.shape)


def _sixteen_steps(weight, group_size):
    groups = weight.reshape(weight.shape[0], -1, group_size)
    scale, zero = _group_grid(groups, 16)
    return (scale * ((torch.round(groups / scale) + zero).clamp(0, 15) - zero)).reshape(weight.shape)


INT4_GROUPS = register(CodeExercise(
    id="08.int4_groups",
    title="Drill: group-wise INT4 with scales and zero points",
    function="int4_groups",
    reference=int4_groups,
    rtol=1e-5,
    atol=1e-6,
    hand_cases=(
        Case((torch.tensor([[0.0, 1.5, -1.0, 2.0], [0.5, 0.5, 3.0, -1.5]]), 2),
             label="groups (0, 1.5): s = 0.1, z = 0; (-1, 2): s = 0.2, z = 5; (0.5, 0.5): s = 1/30, z = 0; "
                   "(3, -1.5): s = 0.3, z = 5; every value on its group's grid"),
        Case((torch.tensor([[-1.5, 0.0, 1.0, 6.0, 2.0, 4.0, 8.0, 10.0]]), 4),
             label="group 1: range [-1.5, 6], s = 0.5, z = 3; group 2: range [0, 10], s = 2/3, z = 0"),
        Case((torch.tensor([[0.0, 0.0, 5.0, 5.0], [1.0, -2.0, 0.0, 0.0]]), 2),
             label="a group of zeros comes back as zeros (its scale would be 0); a constant group of 5 exactly"),
        Case((torch.tensor([[30.0, -15.0, 0.3, -0.1], [0.01, 0.025, 0.03, 0.045]]), 2),
             label="a large group must not flatten the small one next to it: one grid per group, not per row"),
    ),
    random_case=_int4_case,
    hints=("reshape weight to [out, in / group_size, group_size], compute each group's scale and zero point over "
           "the last dim (keepdim=True), quantize and dequantize, and reshape back",),
    mistakes=(
        Mistake("a group is group_size CONSECUTIVE values along a row: reshape weight to [out, in / group_size, "
                "group_size], not the transposed weight (groups down a column)", _groups_down_the_columns),
        Mistake("reshape to [out, in / group_size, group_size]: [out, group_size, in / group_size] puts every "
                "(in / group_size)-th value in a group", _groups_by_stride),
        Mistake("one scale and zero point per GROUP (reduce over the last dim of [out, in / group_size, "
                "group_size]), not per row", _one_scale_per_row),
        Mistake("dequantize with the zero point: s * (q - z), not s * q", _forgets_the_zero_point),
        Mistake("4 bits give 16 codes, 0 .. 15: the range is divided into 15 steps, not 16", _sixteen_steps),
    ),
))



# --------------------------------------------------------------------------------------------------------------
# 08.swiglu_mlp (lab 04): the MLP of a Llama block, whose product is the down_proj input lab 04 finds outliers in


def swiglu_mlp(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """The reference: down(silu(gate(x)) * up(x)), each projection a Linear without bias (weights [out, in]):
    x [tokens, d_model], w_gate and w_up [d_ff, d_model], w_down [d_model, d_ff] -> [tokens, d_model].

    >>> swiglu_mlp(torch.tensor([[1.0, -2.0]]), torch.eye(2), torch.eye(2), torch.eye(2)).mul(1000).round().tolist()
    [[731.0, 477.0]]
    """
    wide = x.double()
    product = F.silu(wide @ w_gate.double().T) * (wide @ w_up.double().T)  # [tokens, d_ff]: down_proj's input
    return (product @ w_down.double().T).to(x.dtype)


def _swiglu_case(generator: torch.Generator) -> Case:
    tokens, d_model, d_ff = _draw(generator, 1, 4), _draw(generator, 2, 16), _draw(generator, 2, 32)
    x = torch.randn(tokens, d_model, generator=generator) * 2
    w_gate, w_up = (torch.randn(d_ff, d_model, generator=generator) * 0.5 for _ in range(2))
    w_down = torch.randn(d_model, d_ff, generator=generator) * 0.5
    return Case((x, w_gate, w_up, w_down), label=f"random x [{tokens}, {d_model}], d_ff {d_ff}")


def _silu_on_up(x, w_gate, w_up, w_down):
    return ((x @ w_gate.T) * torch.nn.functional.silu(x @ w_up.T)) @ w_down.T


def _sigmoid_gate(x, w_gate, w_up, w_down):
    return (torch.sigmoid(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T


def _gelu_gate(x, w_gate, w_up, w_down):
    return (torch.nn.functional.gelu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T


def _no_activation(x, w_gate, w_up, w_down):
    return ((x @ w_gate.T) * (x @ w_up.T)) @ w_down.T


SWIGLU = register(CodeExercise(
    id="08.swiglu_mlp",
    title="Drill: the SwiGLU MLP of a Llama block",
    function="swiglu_mlp",
    reference=swiglu_mlp,
    rtol=1e-5,
    atol=1e-5,
    hand_cases=(
        Case((torch.tensor([[1.0, -2.0]]), torch.eye(2), torch.eye(2), torch.eye(2)),
             label="identity weights: silu(x) * x = (0.731, 0.477)"),
        Case((torch.zeros(2, 3), torch.ones(4, 3), torch.ones(4, 3), torch.ones(3, 4)),
             label="x = 0 gives 0 (silu(0) = 0)"),
        Case((torch.tensor([[2.0, 1.0]]), torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 1.0]]),
              torch.tensor([[1.0, 1.0], [1.0, -1.0], [0.5, 0.5]]), torch.tensor([[1.0, 1.0, 1.0], [0.0, 2.0, -1.0]])),
             label="d_ff 3 > d_model 2: gate (2, 1, -1), up (3, 1, 1.5)"),
    ),
    random_case=_swiglu_case,
    hints=("compute gate = x @ w_gate.T and up = x @ w_up.T ([tokens, d_ff]), multiply silu(gate) by up, and "
           "project back with @ w_down.T",),
    mistakes=(
        Mistake("silu goes on the GATE projection (x @ w_gate.T); the up projection is multiplied in as it is",
                _silu_on_up),
        Mistake("silu(g) = g * sigmoid(g), not sigmoid(g) alone (that is the original GLU)", _sigmoid_gate),
        Mistake("Llama's MLP uses silu (x * sigmoid(x)), not gelu", _gelu_gate),
        Mistake("apply silu to the gate before multiplying it with up: without it the MLP is a product of two "
                "linear maps", _no_activation),
    ),
))

__all__ = ["ATTEND_ONE_QUERY", "CACHE_APPEND", "CAUSAL_MASK", "INT4_GROUPS", "MIN_P", "ONLINE_SOFTMAX", "PACK",
           "REPEAT_KV", "REPETITION_PENALTY", "RMS_NORM", "ROTARY", "SWIGLU", "UNPACK", "apply_rotary",
           "attend_one_query", "cache_append", "causal_padding_mask", "int4_groups", "keep_min_p", "online_softmax",
           "pack_int4", "repeat_kv", "repetition_penalty", "rms_norm", "swiglu_mlp", "unpack_int4"]
