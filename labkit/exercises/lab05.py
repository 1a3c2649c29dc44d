"""Lab 05's exercises: the KV-cache size of eq. 8.3 in GiB, the largest batch a GPU serves with chunked prefill,
and the predictions the lab asks for before it computes their answers.

Both exercises take a labkit.core.spec.ModelSpec, so the learner must pick the right fields: n_kv_heads (not n_heads)
and head_dim (not d_model // n_heads). The largest batch adds judgement: which parts of the memory grow with the
batch (the KV cache), which stop growing (the activations of a chunked prefill, once a chunk is full), and which
do not (weights, the reserve). The mistakes below are the ones the seed course itself makes, and learners' own.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from labkit.core.course import CHAPTER_8B
from labkit.core.budget import MemoryBudget, activations_bytes, workspace_bytes
from labkit.exercises.checking import Case, Exercise, Mistake, prediction, single_answer
from labkit.exercises import register
from labkit.core.memory import GB, GIB, MIB, kv_cache_bytes, weights_bytes, to_gb, to_gib
from labkit.core.presets import gpu_preset, model_preset
from labkit.core.spec import ModelSpec

# What the learner may use: the spec's fields and properties, and the unit conversions (GB, GIB are constants).
_ALLOWED = (ModelSpec, to_gib, to_gb)

# bytes_per_value as the learner passes it -> labkit's format name
_FORMAT = {4: "fp32", 2: "bf16", 1: "fp8", 0.5: "int4"}

# Every shortcut gives a different answer on this toy: n_heads/n_kv_heads = 4, d_model/n_heads = 3 x head_dim.
TOY = ModelSpec("toy: 4 query heads per KV head, head_dim 4 though d_model / n_heads = 12",
                n_layers=3, d_model=48, n_heads=4, n_kv_heads=1, head_dim=4, vocab=100)
EIGHT_B_LIKE = CHAPTER_8B  # the chapter's example: 32 layers, 8 KV heads of 128


def _kv_format(bytes_per_value: float) -> str:
    if bytes_per_value not in _FORMAT:
        raise ValueError(f"bytes_per_value must be one of {sorted(_FORMAT)}, got {bytes_per_value!r}")
    return _FORMAT[bytes_per_value]


def reference_kv_cache_gib(spec: ModelSpec, batch_size: int, seq_len: int, bytes_per_value: float) -> float:
    """labkit's answer: eq. 8.3 in binary GiB (2**30 bytes)."""
    return to_gib(kv_cache_bytes(spec, batch_size, seq_len, _kv_format(bytes_per_value)))


def largest_batch_budget(spec: ModelSpec, gpu_memory_mib: int, seq_len: int, weights_bytes: int,
                         bytes_per_value: float, chunk_tokens: int, activation_bytes_per_token: int,
                         reserve_fraction: float, batch_size: int) -> MemoryBudget:
    """The GPU's memory at batch_size, part by part: what exercise 5.2 asks to fit.

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


def _random_spec(generator: torch.Generator) -> ModelSpec:
    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=generator))

    n_kv_heads, group = draw(1, 8), [1, 2, 4, 8][draw(0, 3)]
    n_heads = n_kv_heads * group
    head_dim = [32, 64, 80, 96, 128, 256][draw(0, 5)]
    d_model = n_heads * head_dim // [1, 1, 2][draw(0, 2)]  # a third of the specs break d_model = n_heads x head_dim
    return ModelSpec("random", n_layers=draw(1, 96), d_model=max(d_model, 1), n_heads=n_heads,
                     n_kv_heads=n_kv_heads, head_dim=head_dim, vocab=32000)


def _random_kv_case(generator: torch.Generator) -> Case:
    spec = _random_spec(generator)
    batch_size = int(torch.randint(1, 65, (1,), generator=generator))
    seq_len = int(torch.randint(1, 131_073, (1,), generator=generator))
    bytes_per_value = list(_FORMAT)[int(torch.randint(0, 4, (1,), generator=generator))]
    return Case((spec, batch_size, seq_len, bytes_per_value), label="a random model shape")


def _random_batch_case(generator: torch.Generator) -> Case:
    def pick(options: list) -> Any:
        return options[int(torch.randint(0, len(options), (1,), generator=generator))]

    spec = _random_spec(generator)
    gpu_memory_mib = pick([15_360, 23_034, 24_564, 40_960, 49_140, 81_559, 81_920, 143_771])
    weights = int(torch.randint(0, gpu_memory_mib * MIB * 6 // 5, (1,), generator=generator))  # sometimes too big
    # short contexts too: a chunk then holds several whole sequences
    seq_len = int(torch.randint(1, 32_769, (1,), generator=generator)) // pick([1, 64])
    activation_per_token = 2 * int(torch.randint(1_000, 200_001, (1,), generator=generator))
    return Case((spec, gpu_memory_mib, max(seq_len, 1), weights, pick(list(_FORMAT)), pick([512, 2048, 8192, 16_384]),
                 activation_per_token, pick([0.0, 0.05, 0.1, 0.25])), label="a random model on a random GPU")


# ----- deliberately wrong versions of exercise 5.1 (matched on a failing case to give a pointed hint) -----

def _d_model_formula(spec, batch_size, seq_len, bytes_per_value):  # the seed lab's formula
    return 2 * batch_size * seq_len * spec.n_layers * spec.d_model * bytes_per_value / GIB


def _query_heads(spec, batch_size, seq_len, bytes_per_value):
    return 2 * batch_size * seq_len * spec.n_layers * spec.n_heads * spec.head_dim * bytes_per_value / GIB


def _head_dim_from_d_model(spec, batch_size, seq_len, bytes_per_value):
    head_dim = spec.d_model // spec.n_heads
    return 2 * batch_size * seq_len * spec.n_layers * spec.n_kv_heads * head_dim * bytes_per_value / GIB


def _decimal_gb(spec, batch_size, seq_len, bytes_per_value):
    return 2 * batch_size * seq_len * spec.n_layers * spec.n_kv_heads * spec.head_dim * bytes_per_value / GB


def _keys_only(spec, batch_size, seq_len, bytes_per_value):
    return batch_size * seq_len * spec.n_layers * spec.n_kv_heads * spec.head_dim * bytes_per_value / GIB


def _no_layers(spec, batch_size, seq_len, bytes_per_value):
    return 2 * batch_size * seq_len * spec.n_kv_heads * spec.head_dim * bytes_per_value / GIB


def _bytes_not_gib(spec, batch_size, seq_len, bytes_per_value):
    return 2 * batch_size * seq_len * spec.n_layers * spec.n_kv_heads * spec.head_dim * bytes_per_value


KV_CACHE = register(Exercise(
    id="05.kv_cache_gib",
    title="KV-cache size (eq. 8.3) in GiB",
    function="kv_cache_gib",
    reference=reference_kv_cache_gib,
    allowed=_ALLOWED,
    points=2,
    rtol=1e-9,
    atol=0.0,
    hand_cases=(
        Case((TOY, 2, 2**17, 2), label="the toy, 2 x 131,072 tokens: 2 x 2 x 2**17 x 3 layers x 1 KV head x 4 x 2 B "
                                        "= 12 MiB = 0.01171875 GiB"),
        Case((EIGHT_B_LIKE, 16, 4096, 2), label="the chapter's worked example: exactly 8 GiB"),
        Case((model_preset("Llama-3.3-70B"), 1, 32_000, 2), label="Llama 3.3 70B, 32,000 tokens: 9.765625 GiB"),
        Case((model_preset("Llama-3.3-70B"), 1, 32_768, 2), label="Llama 3.3 70B, 32,768 tokens: 10 GiB"),
        Case((model_preset("Qwen3-0.6B"), 4, 1000, 1), label="Qwen3-0.6B: head_dim 128 while 1024 / 16 = 64"),
        Case((model_preset("Falcon-7B"), 2, 2048, 0.5), label="Falcon-7B: multi-query, one KV head; 4-bit cache"),
        Case((EIGHT_B_LIKE, 0, 4096, 2), label="an empty batch holds nothing"),
    ),
    random_case=_random_kv_case,
    hints=("2 (keys and values) x batch_size x seq_len x n_layers x n_kv_heads x head_dim x bytes_per_value, "
           "then divide by 2**30",),
    mistakes=(
        Mistake("n_kv_heads x head_dim, not d_model: d_model counts every query head (the lab reading's formula)",
                _d_model_formula),
        Mistake("use spec.n_kv_heads: only the key/value heads are cached, the query heads are not", _query_heads),
        Mistake("use spec.head_dim: it is not always d_model // n_heads (Qwen3-0.6B: 128, not 64)",
                _head_dim_from_d_model),
        Mistake("GiB is 2**30 bytes; dividing by 10**9 gives decimal GB", _decimal_gb),
        Mistake("the cache holds keys AND values: multiply by 2", _keys_only),
        Mistake("every layer has its own cache: multiply by n_layers", _no_layers),
        Mistake("return GiB (bytes / 2**30), not bytes", _bytes_not_gib),
    ),
))


# ----- deliberately wrong versions of exercise 5.2 -----
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

LARGEST_BATCH = register(Exercise(
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
        Mistake("n_kv_heads x head_dim, not d_model: d_model counts every query head (the lab reading's formula)",
                _d_model_batch),
        Mistake("one sequence too many: return the last batch that fits, not the first that does not (round down)",
                _one_too_many),
        Mistake("when the weights and the reserve alone do not fit, the answer is 0, not a negative batch",
                _negative_when_too_big),
    ),
))


# ----- predictions and computations the lab asks for before it shows their answers -----

QWEN3 = model_preset("Qwen3-0.6B")


def qwen3_full_context_kv_gib() -> float:
    """Qwen3-0.6B's BF16 KV cache for one sequence at its whole configured context: 4.375 GiB."""
    return to_gib(kv_cache_bytes(QWEN3, 1, QWEN3.max_position_embeddings, "bf16"))


PREDICT_KV = register(prediction(
    "05.predict_qwen3_kv_gib", "Predict: Qwen3-0.6B's KV cache at its full context, in GiB", "predicted_qwen3_kv_gib",
    qwen3_full_context_kv_gib, rtol=0.02,
    asked=f"Qwen3-0.6B, one sequence of {QWEN3.max_position_embeddings:,} tokens, BF16 (within 2%)",
    hint="return a number of GiB; which two fields give the width of the cached keys of one layer?"))


def gqa_multiplier() -> float:
    """Llama-3-8B's KV cache as a fraction of the same model with one KV head per query head."""
    as_if_mha = dataclasses.replace(LLAMA_8B, n_kv_heads=LLAMA_8B.n_heads)
    return kv_cache_bytes(LLAMA_8B, 1, 1) / kv_cache_bytes(as_if_mha, 1, 1)


PREDICT_GQA = register(prediction(
    "05.predict_gqa_multiplier", "Predict: Llama-3-8B's KV cache as a fraction of full multi-head attention's",
    "predicted_gqa_multiplier", gqa_multiplier, atol=0.005,
    asked="Llama-3-8B (32 query heads, 8 KV heads) against the same shape with 32 KV heads (within 0.005)",
    hint="return a fraction such as 0.5; which heads does the cache store?"))

SEED_EXPERIMENT = dict(batch_size=16, seq_len=16_384, bytes_per_value=2)  # seed 000: "Llama-3-70B ... 16,384 x 16"


def seed_formula_experiment_gib() -> float:
    """The seed lab's calculate_inference_vram KV cache for its own experiment (FP16): 640.0 (GiB)."""
    n_bytes = 2 * SEED_EXPERIMENT["bytes_per_value"] * LLAMA_70B.n_layers * LLAMA_70B.d_model \
        * SEED_EXPERIMENT["seq_len"] * SEED_EXPERIMENT["batch_size"]  # 2 x b x L x d_model x T x B
    return n_bytes / 1024**3


COMPUTE_SEED = register(single_answer(
    "05.seed_formula_gib", "Compute: the lab reading's formula, its KV cache for its own 70B experiment",
    "seed_formula_kv_gib",
    seed_formula_experiment_gib, rtol=1e-3,
    asked="the lab reading's formula, Llama-3-70B (80 layers, d_model 8,192), 16 sequences of 16,384 tokens, FP16",
    hint="return the number the reading's function would report as kv_cache_gb: 2 x bytes x layers x d_model x "
         "seq_len x batch / 1024**3"))


def fewest_h100s_fp16_chunked() -> int:
    """The fewest tensor-parallel H100s (1, 2, 4, 8) on which the seed lab's FP16 experiment fits, chunked prefill."""
    from labkit.core.budget import budget

    h100 = gpu_preset("H100-SXM")
    return next(tp for tp in (1, 2, 4, 8) if budget(LLAMA_70B, h100, 16, 16_384, weight_fmt="fp16", kv_dtype="fp16",
                                                    tp=tp, prefill_chunk_tokens=8192).fits)


PREDICT_GPUS = register(prediction(
    "05.predict_h100_count", "Predict: the fewest H100s that serve the lab reading's FP16 experiment",
    "predicted_h100_count", fewest_h100s_fp16_chunked, choices=(1, 2, 4, 8),
    asked="Llama-3.3-70B in FP16, 16 x 16,384 tokens, FP16 cache, chunks of 8,192 tokens, 10% reserve: 1, 2, 4 or 8",
    hint="return 1, 2, 4 or 8; add the weights and the cache first, then divide by the GPUs"))
