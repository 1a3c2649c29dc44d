"""Lab 05's exercises: the largest batch a GPU serves with chunked prefill, the paged KV allocator (a block table
over a fixed pool of blocks), and the predictions the lab asks for before it computes their answers.

The largest batch takes a labkit.core.spec.ModelSpec, so the learner must pick the right fields: n_kv_heads (not
n_heads) and head_dim (not d_model // n_heads), and judge which parts of the memory grow with the batch (the KV
cache), which stop growing (the activations of a chunked prefill, once a chunk is full), and which do not (weights,
the reserve). The paged allocator is checked against labkit.core.paging.replay_block_events. The mistakes below are
the ones published memory formulas make, and learners' own.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from labkit.core.budget import MemoryBudget, activations_bytes, workspace_bytes
from labkit.exercises.definitions import Case, CodeExercise, Mistake, prediction
from labkit.exercises import register
from labkit.exercises.random_cases import random_spec
from labkit.core.memory import GB, MIB, kv_cache_bytes, weights_bytes, to_gb, to_gib
from labkit.core.paging import EVENT_KINDS, replay_block_events
from labkit.core.presets import gpu_preset, model_preset
from labkit.core.spec import ModelSpec, with_attention

# What the learner may use: the spec's fields and properties, and the unit conversions (GB, GIB are constants).
_ALLOWED = (ModelSpec, to_gib, to_gb)

# bytes_per_value as the learner passes it -> labkit's format name
_FORMAT = {4: "fp32", 2: "bf16", 1: "fp8", 0.5: "int4"}

def _kv_format(bytes_per_value: float) -> str:
    if bytes_per_value not in _FORMAT:
        raise ValueError(f"bytes_per_value must be one of {sorted(_FORMAT)}, got {bytes_per_value!r}")
    return _FORMAT[bytes_per_value]


def largest_batch_budget(spec: ModelSpec, gpu_memory_mib: int, seq_len: int, weights_bytes: int,
                         bytes_per_value: float, chunk_tokens: int, activation_bytes_per_token: int,
                         reserve_fraction: float, batch_size: int) -> MemoryBudget:
    """The GPU's memory at batch_size, part by part: what the largest-batch exercise asks to fit.

    The activations of a chunked prefill: at most chunk_tokens tokens are in flight in one forward step, fewer
    when the whole batch holds fewer (labkit.core.budget.activations_bytes's rule, per token given here).
    """
    capacity = gpu_memory_mib * MIB  # nvidia-smi's total: MiB of 2**20 bytes
    in_flight = min(chunk_tokens, batch_size * seq_len)
    return MemoryBudget(weights_bytes=weights_bytes,
                        kv_cache_bytes=kv_cache_bytes(spec, batch_size, seq_len, _kv_format(bytes_per_value)),
                        activations_bytes=in_flight * activation_bytes_per_token,
                        workspace_bytes=workspace_bytes(capacity, reserve_fraction), capacity_bytes=capacity)


def reference_largest_batch(spec: ModelSpec, gpu_memory_mib: int, seq_len: int, weights_bytes: int,
                            bytes_per_value: float, chunk_tokens: int, activation_bytes_per_token: int,
                            reserve_fraction: float) -> int:
    """labkit's answer: the most sequences whose budget (largest_batch_budget) fits; 0 if not even one.

    The total grows with the batch, so the answer is the last batch that fits: the KV cache grows by one
    sequence's bytes per sequence, the activations by seq_len tokens' until the chunk is full, then not at all.
    """
    args = (spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation_bytes_per_token,
            reserve_fraction)
    empty = largest_batch_budget(*args, batch_size=0)
    free = empty.headroom_bytes  # capacity - reserve - weights
    if free < 0:
        return 0
    per_sequence = kv_cache_bytes(spec, 1, seq_len, _kv_format(bytes_per_value))
    # batches whose tokens fit in one chunk: each sequence brings its cache and seq_len tokens of activations
    within_chunk = min(chunk_tokens // seq_len, free // (per_sequence + seq_len * activation_bytes_per_token))
    # larger batches: a full chunk of activations, then only the cache grows
    beyond_chunk = (free - chunk_tokens * activation_bytes_per_token) // per_sequence
    best = beyond_chunk if beyond_chunk > chunk_tokens // seq_len else within_chunk
    assert largest_batch_budget(*args, batch_size=best).fits and not largest_batch_budget(*args, best + 1).fits
    return int(best)


def _random_batch_case(generator: torch.Generator) -> Case:
    def pick(options: list) -> Any:
        return options[int(torch.randint(0, len(options), (1,), generator=generator))]

    spec = random_spec(generator, head_dims=(32, 64, 80, 96, 128, 256), max_layers=96, uneven_width=True)
    gpu_memory_mib = pick([15_360, 23_034, 24_564, 40_960, 49_140, 81_559, 81_920, 143_771])
    weights = int(torch.randint(0, gpu_memory_mib * MIB * 6 // 5, (1,), generator=generator))  # sometimes too big
    # short contexts too: a chunk then holds several whole sequences
    seq_len = int(torch.randint(1, 32_769, (1,), generator=generator)) // pick([1, 64])
    activation_per_token = 2 * int(torch.randint(1_000, 200_001, (1,), generator=generator))
    return Case((spec, gpu_memory_mib, max(seq_len, 1), weights, pick(list(_FORMAT)), pick([512, 2048, 8192, 16_384]),
                 activation_per_token, pick([0.0, 0.05, 0.1, 0.25])), label="a random model on a random GPU")


# ----- deliberately wrong versions of the largest batch -----
# Each changes one judgement of the reference; the answer is then the last batch its own total lets fit.

def _wrong_largest(total, free_bytes) -> int:
    """The last batch whose total(batch) <= free_bytes, for a total that grows with the batch (0 if none)."""
    if total(1) > free_bytes:
        return 0
    low, high = 1, 2
    while total(high) <= free_bytes:
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if total(middle) <= free_bytes else (low, middle)
    return low


def _kv(spec, seq_len, bytes_per_value, kv_heads=None, width=None):
    return 2 * seq_len * spec.n_layers * (width or (kv_heads or spec.n_kv_heads) * spec.head_dim) * bytes_per_value


def _free(gpu_memory_mib, weights_bytes, reserve_fraction, unit=MIB):
    return int(gpu_memory_mib * unit) - weights_bytes - int(int(gpu_memory_mib * unit) * reserve_fraction)


def _one_pass(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation, reserve):
    return _wrong_largest(lambda n: n * (_kv(spec, seq_len, bytes_per_value) + seq_len * activation),
                          _free(gpu_memory_mib, weights_bytes, reserve))


def _full_chunk_always(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation,
                       reserve):
    return _wrong_largest(lambda n: n * _kv(spec, seq_len, bytes_per_value) + chunk_tokens * activation,
                          _free(gpu_memory_mib, weights_bytes, reserve))


def _right_total(spec, seq_len, bytes_per_value, chunk_tokens, activation, **kv_options):
    return lambda n: n * _kv(spec, seq_len, bytes_per_value, **kv_options) + min(chunk_tokens, n * seq_len) * activation


def _no_activations(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation, reserve):
    return _wrong_largest(lambda n: n * _kv(spec, seq_len, bytes_per_value),
                          _free(gpu_memory_mib, weights_bytes, reserve))


def _reserve_of_what_is_left(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation,
                             reserve):
    left = gpu_memory_mib * MIB - weights_bytes
    return _wrong_largest(_right_total(spec, seq_len, bytes_per_value, chunk_tokens, activation),
                          left - int(left * reserve))


def _no_reserve(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation, reserve):
    return _wrong_largest(_right_total(spec, seq_len, bytes_per_value, chunk_tokens, activation),
                          _free(gpu_memory_mib, weights_bytes, 0.0))


def _decimal_mb_memory(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation,
                       reserve):
    return _wrong_largest(_right_total(spec, seq_len, bytes_per_value, chunk_tokens, activation),
                          _free(gpu_memory_mib, weights_bytes, reserve, unit=10**6))


def _gib_read_as_gb(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation,
                    reserve):
    return _wrong_largest(_right_total(spec, seq_len, bytes_per_value, chunk_tokens, activation),
                          _free(gpu_memory_mib, weights_bytes, reserve, unit=GB / 1024))


def _ignores_weights(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation, reserve):
    return _wrong_largest(_right_total(spec, seq_len, bytes_per_value, chunk_tokens, activation),
                          _free(gpu_memory_mib, 0, reserve))


def _query_heads_batch(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation,
                       reserve):
    return _wrong_largest(_right_total(spec, seq_len, bytes_per_value, chunk_tokens, activation, kv_heads=spec.n_heads),
                          _free(gpu_memory_mib, weights_bytes, reserve))


def _d_model_batch(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation, reserve):
    return _wrong_largest(_right_total(spec, seq_len, bytes_per_value, chunk_tokens, activation, width=spec.d_model),
                          _free(gpu_memory_mib, weights_bytes, reserve))


def _one_too_many(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation, reserve):
    answer = reference_largest_batch(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens,
                                     activation, reserve)
    return answer + 1 if answer else 0  # e.g. rounding the division up, or `while total <= free: n += 1` returning n


def _negative_when_too_big(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation,
                           reserve):
    free = _free(gpu_memory_mib, weights_bytes, reserve)
    if free >= 0:
        return reference_largest_batch(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens,
                                       activation, reserve)
    return int((free - chunk_tokens * activation) // _kv(spec, seq_len, bytes_per_value))


LLAMA_8B = model_preset("Llama-3-8B")
LLAMA_8B_BF16 = weights_bytes(LLAMA_8B, "bf16")  # 16,060,522,496 bytes
LLAMA_70B = model_preset("Llama-3.3-70B")
LLAMA_70B_INT4 = weights_bytes(LLAMA_70B, "int4", group_size=128)  # 36,379,254,912 bytes with 2-byte scales


def activation_bytes_per_token(spec: ModelSpec) -> int:
    """labkit's per-token activation estimate in BF16 (labkit.core.budget.activations_bytes without the logits)."""
    return activations_bytes(spec, 1, 1) - activations_bytes(spec, 1, 0)


ACT_8B, ACT_70B = activation_bytes_per_token(LLAMA_8B), activation_bytes_per_token(LLAMA_70B)  # 86,016 and 167,936 B
# A toy whose free memory is set by the weights: 3 layers x 1 KV head x 4 x 2 (K, V) x 2 B = 48 B per token
TINY_FREE = ModelSpec("toy: 48 B of cache per token", n_layers=3, d_model=24, n_heads=4, n_kv_heads=1, head_dim=4,
                      vocab=100)

LARGEST_BATCH = CodeExercise(
    id="05.largest_batch",
    title="The largest batch that fits with chunked prefill",
    function="largest_batch",
    reference=reference_largest_batch,
    allowed=_ALLOWED,
    points=3,
    rtol=0.0,
    atol=0.0,
    hand_cases=(
        Case((TINY_FREE, 1, 10, 0, 2, 40, 100, 0.0),
             label="a 1 MiB card (1,048,576 bytes) and nothing else on it, 480 B of cache per sequence, chunks of 40 "
                   "tokens of 100 B: (1,048,576 - 40 x 100) // 480 = 2,176"),
        Case((TINY_FREE, 1, 10, MIB - 8800, 2, 40, 100, 0.0),
             label="a 1 MiB card with 8,800 bytes free, 480 per sequence, chunks of 40 tokens of 100 B: exactly "
                   "10 sequences (10 x 480 + 40 x 100 = 8,800)"),
        Case((TINY_FREE, 1, 10, MIB - 8799, 2, 40, 100, 0.0), label="one byte less: 9"),
        Case((TINY_FREE, 1, 10, MIB - 5920, 2, 400, 100, 0.0),
             label="5,920 bytes free and chunks of 400 tokens: 4 sequences of 10 tokens fill 40 of them, "
                   "4 x (480 + 10 x 100) = 5,920"),
        Case((TINY_FREE, 2, 10, MIB - 8800, 2, 40, 100, 0.5),
             label="a 2 MiB card with half reserved: the same 8,800 bytes free, 10"),
        Case((LLAMA_8B, 81_559, 16_384, LLAMA_8B_BF16, 2, 8192, ACT_8B, 0.1),
             label="Llama-3-8B in BF16 on an H100 (81,559 MiB), 16,384 tokens, chunks of 8,192, 10% reserve: 28 "
                   "(a one-pass prefill of the whole batch would allow 17)"),
        Case((LLAMA_8B, 81_559, 4096, LLAMA_8B_BF16, 2, 8192, ACT_8B, 0.1), label="the same at 4,096 tokens: 112"),
        Case((LLAMA_70B, 40_960, 4096, LLAMA_70B_INT4, 2, 8192, ACT_70B, 0.1),
             label="Llama-3.3-70B in INT4 on a 40 GB A100 (40,960 MiB) with a 10% reserve: 1"),
        Case((LLAMA_70B, 40_960, 4096, LLAMA_70B_INT4, 2, 2048, ACT_70B, 0.0),
             label="the same card with no reserve, chunks of 2,048: 4"),
        Case((LLAMA_8B, 15_360, 8192, LLAMA_8B_BF16, 2, 8192, ACT_8B, 0.1),
             label="Llama-3-8B in BF16 on a T4 (15,360 MiB): the weights and the reserve exceed the card, 0"),
        Case((model_preset("Falcon-7B"), 24_564, 2048, 4 * 10**9, 0.5, 2048, 2 * 4544 * 8, 0.05),
             label="multi-query Falcon-7B on an RTX 4090 (24,564 MiB), 4-bit cache, 72,704 B of activations per "
                   "token: 4,844"),
    ),
    random_case=_random_batch_case,
    hints=("GPU bytes = gpu_memory_mib x 2**20; free = GPU bytes - weights_bytes - floor(reserve_fraction x GPU "
           "bytes); a batch of n needs n x (one sequence's KV bytes) + min(chunk_tokens, n x seq_len) x "
           "activation_bytes_per_token; "
           "return the largest n that fits, 0 if none",),
    mistakes=(
        Mistake("a chunked prefill holds at most chunk_tokens tokens of the whole batch in one step: the activations "
                "are min(chunk_tokens, n x seq_len) tokens' worth, neither n x seq_len tokens nor a chunk per sequence",
                _one_pass),
        Mistake("when the whole batch holds fewer than chunk_tokens tokens, only those are in flight: "
                "min(chunk_tokens, n x seq_len), not always a full chunk", _full_chunk_always),
        Mistake("the activations of a chunk take memory too: add min(chunk_tokens, n x seq_len) x "
                "activation_bytes_per_token", _no_activations),
        Mistake("the reserve is a fraction of the whole GPU (gpu_memory_mib x 2**20), not of what the weights leave",
                _reserve_of_what_is_left),
        Mistake("keep the reserve: reserve_fraction x the GPU's bytes is not available to the model", _no_reserve),
        Mistake("nvidia-smi's MiB is 2**20 = 1,048,576 bytes; multiplying by 10**6 loses 4.6% of the card",
                _decimal_mb_memory),
        Mistake("gpu_memory_mib / 1024 is GiB (2**30 bytes), not GB: read as 10**9-byte GB, the card loses 7% of "
                "its bytes",
                _gib_read_as_gb),
        Mistake("the weights are already in the GPU: subtract weights_bytes", _ignores_weights),
        Mistake("use spec.n_kv_heads: only the key/value heads are cached", _query_heads_batch),
        Mistake("n_kv_heads x head_dim, not d_model: d_model counts every query head (a popular formula "
                "computes the cache as 2 x bytes x n_layers x d_model x seq_len)", _d_model_batch),
        Mistake("one sequence too many: return the last batch that fits, not the first that does not (round down)",
                _one_too_many),
        Mistake("when the weights and the reserve alone do not fit, the answer is 0, not a negative batch",
                _negative_when_too_big),
    ),
)


# ----- predictions and computations the lab asks for before it shows their answers -----

QWEN3 = model_preset("Qwen3-0.6B")


def qwen3_full_context_kv_gib() -> float:
    """Qwen3-0.6B's BF16 KV cache for one sequence at its whole configured context: 4.375 GiB."""
    return to_gib(kv_cache_bytes(QWEN3, 1, QWEN3.max_position_embeddings, "bf16"))


PREDICT_KV = prediction(
    "05.predict_qwen3_kv_gib", "Predict: Qwen3-0.6B's KV cache at its full context, in GiB", "predicted_qwen3_kv_gib",
    qwen3_full_context_kv_gib, rtol=0.02,
    asked=f"Qwen3-0.6B, one sequence of {QWEN3.max_position_embeddings:,} tokens, BF16 (within 2%)",
    hint="return a number of GiB; which two fields give the width of the cached keys of one layer?",
    reveal="""Per token and layer the cache holds keys and values for 8 KV heads of width 128: 2 × 8 × 128 = 2,048
    numbers, 4,096 bytes in BF16. Times 28 layers that is 114,688 bytes a token, and times 40,960 tokens 4.375 GiB.
    The shortcut head_dim = d_model / n_heads (64 here) halves it: read head_dim from the config. The next cell
    computes both, and the worked example of the lesson.""",
    giveaways=("4.375", "114,688", "halves it", "halves Qwen3"))


SERVED = (16, 8192)  # the prediction's batch: 16 sequences of 8,192 tokens


def gqa_memory_fraction() -> float:
    """Llama-3-8B in BF16 serving 16 x 8,192 tokens: weights + KV cache as built (8 KV heads), as a fraction of
    the same model with multi-head attention (32 KV heads, so key and value projections four times wider).

    The cache alone shrinks to 8/32 = 0.25; the weights barely change, so the whole shrinks far less (0.385).
    """
    def weights_and_cache(spec: ModelSpec) -> int:
        return weights_bytes(spec, "bf16") + kv_cache_bytes(spec, *SERVED, "bf16")

    return weights_and_cache(LLAMA_8B) / weights_and_cache(with_attention(LLAMA_8B, "MHA"))


PREDICT_GQA = prediction(
    "05.predict_gqa_multiplier", "Predict: what grouped-query attention leaves of Llama-3-8B's weights + KV cache",
    "predicted_gqa_multiplier", gqa_memory_fraction, atol=0.02,
    asked="Llama-3-8B in BF16, 16 x 8,192 tokens: weights + KV cache with 8 KV heads as a fraction of the same "
          "with 32 (within 0.02)",
    hint="return a fraction such as 0.5; which of the two parts does the number of KV heads change, and how "
         "large is each?",
    reveal="""The cache follows the KV heads: 8/32 of multi-head attention's, and 1/32 with multi-query. The
    weights do not: for 16 sequences of 8,192 tokens, weights + cache shrink to about 0.38 of the multi-head
    model's, not to a quarter, because the 16 GB of weights stay. On an A100 80GB (the dashed line in the next
    figure: what Llama-3-8B's BF16 weights leave), one 128K-token multi-head sequence (64 GiB) would just fit, with
    nothing else; as built it needs 16 GiB.""",
    giveaways=("0.38", "0.385", "not to a quarter", "weights stay", "x 0.385"))


def fewest_h100s_fp16_chunked() -> int:
    """The fewest tensor-parallel H100s (1, 2, 4, 8) on which Llama-3.3-70B in FP16 serves 16 x 16,384 tokens
    with an FP16 cache and chunked prefill."""
    from labkit.core.budget import budget

    h100 = gpu_preset("H100-SXM")
    return next(tp for tp in (1, 2, 4, 8) if budget(LLAMA_70B, h100, 16, 16_384, weight_fmt="fp16", kv_dtype="fp16",
                                                    tp=tp, prefill_chunk_tokens=8192).fits)


PREDICT_GPUS = prediction(
    "05.predict_h100_count", "Predict: the fewest H100s for Llama-3.3-70B in FP16, 16 x 16,384 tokens",
    "predicted_h100_count", fewest_h100s_fp16_chunked, choices=(1, 2, 4, 8),
    asked="Llama-3.3-70B in FP16, 16 x 16,384 tokens, FP16 cache, chunks of 8,192 tokens, 10% reserve: 1, 2, 4 or 8",
    hint="return 1, 2, 4 or 8; add the weights and the cache first, then divide by the GPUs",
    reveal="""**4**. With chunks, FP16 fits on 4 H100s and INT4 on 2; in one pass INT4 needs 4, the worst case
    rather than how a server runs. The KV cache (80 GiB in all) outweighs the INT4 weights: quantizing the weights
    alone buys less than it seems. The next cell draws the grid of every setting and prints the parts.""",
    giveaways=("fits on 4", "4 H100s", "**4** H100s", "four H100s", "fewest H100s: 4"))


# ----- the paged KV allocator: a block table over a fixed pool of blocks -----

def _random_events_case(generator: torch.Generator) -> Case:
    """A short stream of allocate / append / free events on a small pool, so the pool often runs out."""
    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=generator))

    block_size, n_blocks = [1, 2, 3, 4, 8, 16][draw(0, 5)], draw(1, 12)
    events, started = [], []
    for _ in range(draw(3, 12)):
        kind = "allocate" if not started else EVENT_KINDS[draw(0, 2)]
        if kind == "allocate":
            started.append(len(started))
            events.append(("allocate", started[-1], draw(1, 3 * block_size)))
        else:
            request = started[draw(0, len(started) - 1)]
            events.append((kind, request, 0 if kind == "free" else draw(1, 2 * block_size)))
    return Case((events, n_blocks, block_size), label="a random stream of events")


def replay_with_mistake(events, n_blocks, block_size, *, blocks_for=None, keep_freed=False, fresh_ids=False,
                        partial=False, waste="last block"):
    """replay_block_events written the way a learner would, with one judgement changed by a flag (the default
    flags change nothing). The bug zoo below and its test (tests/test_exercises_lab05.py) both use this one copy."""
    blocks_for = blocks_for or (lambda n: -(-n // block_size))
    pool, tables, tokens, refused, next_id, event_waste = list(range(n_blocks)), {}, {}, [], 0, 0
    n_free = n_blocks
    for index, (kind, request, n_tokens) in enumerate(events):
        if kind == "free":
            if request in tables:
                pool += tables[request]
                n_free += len(tables[request])
                if keep_freed:
                    continue  # the table still points at the blocks just freed
                event_waste -= len(tables[request]) * block_size - tokens[request]
                del tables[request], tokens[request]
            continue
        if kind == "append" and request not in tables:
            continue
        total = tokens.get(request, 0) + n_tokens
        needed = max(blocks_for(total) - len(tables.get(request, [])), 0)
        if needed > n_free:
            refused.append(index)
            if not partial or not n_free:
                continue
            needed = n_free  # hands out what is left
        if fresh_ids:
            new, next_id = list(range(next_id, next_id + needed)), next_id + needed
        else:
            pool.sort()
            new, pool = pool[:needed], pool[needed:]
        n_free -= needed
        tables.setdefault(request, []).extend(new)
        tokens[request] = total
        event_waste += -(-n_tokens // block_size) * block_size - n_tokens
    if waste == "per event":
        wasted = event_waste
    elif waste == "filled":
        wasted = sum(tokens[request] % block_size for request in tables)
    elif waste == "whole pool":
        wasted = n_blocks * block_size - sum(tokens.values())
    else:
        wasted = sum(len(blocks) * block_size - tokens[request] for request, blocks in tables.items())
    return tables, n_free, wasted, refused


def _floor_blocks(events, n_blocks, block_size):
    return replay_with_mistake(events, n_blocks, block_size, blocks_for=lambda n: n // block_size)


def _new_block_when_full(events, n_blocks, block_size):
    return replay_with_mistake(events, n_blocks, block_size, blocks_for=lambda n: n // block_size + 1)


def _block_per_token(events, n_blocks, block_size):
    return replay_with_mistake(events, n_blocks, block_size, blocks_for=lambda n: n)


def _keeps_freed_table(events, n_blocks, block_size):
    return replay_with_mistake(events, n_blocks, block_size, keep_freed=True)


def _never_reuses(events, n_blocks, block_size):
    return replay_with_mistake(events, n_blocks, block_size, fresh_ids=True)


def _partial_allocation(events, n_blocks, block_size):
    return replay_with_mistake(events, n_blocks, block_size, partial=True)


def _waste_per_event(events, n_blocks, block_size):
    return replay_with_mistake(events, n_blocks, block_size, waste="per event")


def _waste_filled_slots(events, n_blocks, block_size):
    return replay_with_mistake(events, n_blocks, block_size, waste="filled")


def _waste_whole_pool(events, n_blocks, block_size):
    return replay_with_mistake(events, n_blocks, block_size, waste="whole pool")


def _case(events, n_blocks, block_size, label):
    return Case((events, n_blocks, block_size), label=label)


PAGED_ALLOCATOR = CodeExercise(
    id="05.paged_allocator",
    title="A paged KV allocator: block tables over a fixed pool of blocks",
    function="paged_allocator",
    reference=replay_block_events,
    allowed=(),
    points=3,
    rtol=0.0,
    atol=0.0,
    time_limit_s=2.0,
    hand_cases=(
        _case([("allocate", 0, 4)], 4, 4, "a 4-token prompt fills one block of 4 exactly: 1 block, nothing wasted"),
        _case([("allocate", 0, 5)], 4, 4, "one token over: 2 blocks, 3 empty slots in the second"),
        _case([("allocate", 0, 3), ("append", 0, 1), ("append", 0, 1)], 4, 4,
              "3 tokens, then one that fills the block (no new block), then one that needs a new block"),
        _case([("allocate", 0, 5), ("allocate", 1, 2), ("free", 0, 0), ("allocate", 2, 6)], 4, 4,
              "freed blocks are reused, lowest-numbered first: request 2 gets blocks 0 and 1 back"),
        _case([("allocate", 0, 4), ("free", 0, 0), ("free", 0, 0), ("allocate", 1, 8)], 2, 4,
              "a request freed twice: the second free does nothing"),
        _case([("allocate", 0, 8), ("allocate", 1, 5), ("append", 0, 1), ("free", 1, 0)], 3, 4,
              "out of blocks: request 1 needs 2 with 1 free and is refused whole; its free does nothing"),
        _case([("allocate", 0, 2), ("allocate", 1, 2), ("append", 0, 5)], 3, 4,
              "an append that needs 2 new blocks with 1 free is refused: request 0 keeps its 2 tokens"),
        _case([("allocate", 0, 3), ("append", 0, 2), ("allocate", 1, 1)], 8, 1,
              "blocks of 1 token: a block per token, nothing ever wasted"),
        _case([("allocate", 0, 17), ("append", 0, 15), ("append", 0, 1), ("allocate", 1, 16), ("free", 0, 0),
               ("allocate", 2, 40)], 6, 16, "blocks of 16 (vLLM's default) on a pool of 6"),
    ),
    random_case=_random_events_case,
    n_random=40,
    hints=("a request of n tokens holds ceil(n / block_size) blocks; take the lowest-numbered free blocks; refuse "
           "an event the pool cannot serve in full; free returns every block of the request; wasted slots = "
           "blocks x block_size - tokens over the live requests",),
    mistakes=(
        Mistake("a block that is exactly full needs no new block: n tokens hold ceil(n / block_size) blocks, not "
                "n // block_size + 1", _new_block_when_full),
        Mistake("round up: n tokens need ceil(n / block_size) blocks (-(-n // block_size)); n // block_size leaves "
                "the last tokens without a block", _floor_blocks),
        Mistake("a block holds block_size tokens: take a new block only when the request's last block is full, not "
                "one per token", _block_per_token),
        Mistake("free must also remove the request from the block table: nothing may still point at blocks that "
                "went back to the pool (and a second free must not return them again)", _keeps_freed_table),
        Mistake("reuse freed blocks: hand out the lowest-numbered free block, not a new number each time",
                _never_reuses),
        Mistake("an event the pool cannot serve in full is refused whole: hand out no block at all and record its "
                "index in refused", _partial_allocation),
        Mistake("wasted slots belong to each live request's last block: blocks x block_size - tokens, from the "
                "request's total, not added up event by event", _waste_per_event),
        Mistake("wasted slots are the empty slots of the last block (blocks x block_size - tokens), not the "
                "filled ones (tokens % block_size)", _waste_filled_slots),
        Mistake("free blocks are not fragmentation: count the empty slots inside the live requests' blocks only",
                _waste_whole_pool),
    ),
)


for _exercise in (PREDICT_KV, PREDICT_GQA, PREDICT_GPUS, LARGEST_BATCH, PAGED_ALLOCATOR):
    register(_exercise)  # in the order the notebook asks them
