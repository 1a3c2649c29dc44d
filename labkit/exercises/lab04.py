"""Lab 04's exercises: the KV-cache size of eq. 8.3 in GiB, and the largest batch that fits a GPU.

Both take a labkit.core.spec.ModelSpec, so the learner must pick the right fields: n_kv_heads (not n_heads) and
head_dim (not d_model // n_heads). The mistakes below are the ones the seed course itself makes.
"""

from __future__ import annotations

import dataclasses

import torch

from labkit.core.course import CHAPTER_8B
from labkit.core.budget import kv_batch_capacity
from labkit.exercises.checking import Case, Exercise, Mistake
from labkit.exercises import register
from labkit.core.memory import GB, GIB, kv_cache_bytes, to_gb, to_gib
from labkit.core.presets import model_preset
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


def reference_largest_batch(spec: ModelSpec, gpu_memory_gb: float, seq_len: int, weights_bytes: int,
                            bytes_per_value: float) -> int:
    """labkit's answer: sequences whose KV cache fits in a datasheet's decimal GB after the weights (0 if none)."""
    free = round(gpu_memory_gb * GB) - weights_bytes
    return kv_batch_capacity(spec, max(free, 0), seq_len, _kv_format(bytes_per_value))


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
    spec = _random_spec(generator)
    gpu_memory_gb = [16, 24, 40, 48, 80, 141][int(torch.randint(0, 6, (1,), generator=generator))]
    weights = int(torch.randint(0, gpu_memory_gb * 10**9 * 6 // 5, (1,), generator=generator))  # sometimes too big
    seq_len = int(torch.randint(1, 32_769, (1,), generator=generator))
    bytes_per_value = list(_FORMAT)[int(torch.randint(0, 4, (1,), generator=generator))]
    return Case((spec, gpu_memory_gb, seq_len, weights, bytes_per_value), label="a random model on a random GPU")


# ----- deliberately wrong versions of exercise 4.1 (matched on a failing case to give a pointed hint) -----

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
    id="04.kv_cache_gib",
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
        Mistake("n_kv_heads x head_dim, not d_model: d_model counts every query head (the seed lab's formula)",
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


# ----- deliberately wrong versions of exercise 4.2 -----

def _per_sequence_bytes(spec, seq_len, bytes_per_value, kv_heads=None):
    return 2 * seq_len * spec.n_layers * (kv_heads or spec.n_kv_heads) * spec.head_dim * bytes_per_value


def _gib_memory(spec, gpu_memory_gb, seq_len, weights_bytes, bytes_per_value):
    free = gpu_memory_gb * GIB - weights_bytes
    return max(0, int(free // _per_sequence_bytes(spec, seq_len, bytes_per_value)))


def _ignores_weights(spec, gpu_memory_gb, seq_len, weights_bytes, bytes_per_value):
    return int(gpu_memory_gb * GB // _per_sequence_bytes(spec, seq_len, bytes_per_value))


def _rounds_to_nearest(spec, gpu_memory_gb, seq_len, weights_bytes, bytes_per_value):
    free = gpu_memory_gb * GB - weights_bytes
    return max(0, round(free / _per_sequence_bytes(spec, seq_len, bytes_per_value)))


def _negative_when_too_big(spec, gpu_memory_gb, seq_len, weights_bytes, bytes_per_value):
    free = gpu_memory_gb * GB - weights_bytes
    return int(free // _per_sequence_bytes(spec, seq_len, bytes_per_value))


def _query_heads_batch(spec, gpu_memory_gb, seq_len, weights_bytes, bytes_per_value):
    free = gpu_memory_gb * GB - weights_bytes
    return max(0, int(free // _per_sequence_bytes(spec, seq_len, bytes_per_value, spec.n_heads)))


LLAMA_8B = model_preset("Llama-3-8B")
LLAMA_8B_BF16 = 2 * LLAMA_8B.n_params  # 16,060,522,496 bytes

LARGEST_BATCH = register(Exercise(
    id="04.largest_batch",
    title="The largest batch whose KV cache fits next to the weights",
    function="largest_batch",
    reference=reference_largest_batch,
    allowed=_ALLOWED,
    points=2,
    rtol=0.0,
    atol=0.0,
    hand_cases=(
        Case((LLAMA_8B, 80, 4096, LLAMA_8B_BF16, 2), label="Llama-3-8B in BF16 on an 80 GB card, 4,096 tokens: 119"),
        Case((EIGHT_B_LIKE, 16, 4096, 16 * GB - 8 * GIB, 2),
             label="weights leave exactly 8 GiB of a 16 GB card: exactly 16 sequences"),
        Case((LLAMA_8B, 16, 8192, LLAMA_8B_BF16, 2), label="weights larger than the card: nothing fits, answer 0"),
        Case((LLAMA_8B, 24, 8192, LLAMA_8B_BF16, 2), label="a 24 GB card: 7 sequences of 8,192 tokens"),
        Case((model_preset("Falcon-7B"), 16, 2048, 4 * 10**9, 0.5), label="multi-query Falcon-7B, 4-bit cache"),
    ),
    random_case=_random_batch_case,
    hints=("free bytes = gpu_memory_gb x 10**9 - weights_bytes; each sequence needs "
           "2 x seq_len x n_layers x n_kv_heads x head_dim x bytes_per_value; round down, never below 0",),
    mistakes=(
        Mistake("a datasheet's GB is 10**9 bytes; multiplying by 2**30 invents 7% more memory", _gib_memory),
        Mistake("the weights are already in the GPU: subtract weights_bytes first", _ignores_weights),
        Mistake("use spec.n_kv_heads: only the key/value heads are cached", _query_heads_batch),
        Mistake("round DOWN: a sequence that only partly fits does not fit", _rounds_to_nearest),
        Mistake("when the weights alone do not fit, the answer is 0, not a negative batch", _negative_when_too_big),
    ),
))
