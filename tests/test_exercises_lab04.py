"""The bug zoo of lab 04: the KV-cache mistakes of the seed course (and of learners), each caught with a hint."""

import dataclasses

import pytest

from labkit.core.budget import kv_batch_capacity
from labkit.exercises.checking import check_function
from labkit.exercises import exercises, get
from labkit.exercises.lab04 import EIGHT_B_LIKE, reference_kv_cache_gib, reference_largest_batch
from labkit.core.memory import GB, GIB, kv_bytes_per_token, kv_cache_bytes as labkit_kv_cache_bytes, to_gib
from labkit.core.presets import model_preset
from zoo import assert_zoo

KV = get("04.kv_cache_gib")
BATCH = get("04.largest_batch")


# ----- exercise 4.1: kv_cache_gib -----

def kv_solution(spec, batch_size, seq_len, bytes_per_value):
    return 2 * batch_size * seq_len * spec.n_layers * spec.n_kv_heads * spec.head_dim * bytes_per_value / 2**30


def ignores_kv_heads(spec, batch_size, seq_len, bytes_per_value):
    return 2 * batch_size * seq_len * spec.n_layers * spec.n_heads * spec.head_dim * bytes_per_value / 2**30


def forgets_values(spec, batch_size, seq_len, bytes_per_value):
    return batch_size * seq_len * spec.n_layers * spec.n_kv_heads * spec.head_dim * bytes_per_value / 2**30


def decimal_gb(spec, batch_size, seq_len, bytes_per_value):
    return 2 * batch_size * seq_len * spec.n_layers * spec.n_kv_heads * spec.head_dim * bytes_per_value / 1e9


def head_dim_from_d_model(spec, batch_size, seq_len, bytes_per_value):
    head_dim = spec.d_model // spec.n_heads
    return 2 * batch_size * seq_len * spec.n_layers * spec.n_kv_heads * head_dim * bytes_per_value / 2**30


def seed_formula(spec, batch_size, seq_len, bytes_per_value):  # seed 000's calculate_inference_vram
    return 2 * bytes_per_value * spec.n_layers * spec.d_model * seq_len * batch_size / (1024**3)


def no_layers(spec, batch_size, seq_len, bytes_per_value):
    return 2 * batch_size * seq_len * spec.n_kv_heads * spec.head_dim * bytes_per_value / 2**30


def returns_bytes(spec, batch_size, seq_len, bytes_per_value):
    return 2 * batch_size * seq_len * spec.n_layers * spec.n_kv_heads * spec.head_dim * bytes_per_value


def calls_labkit(spec, batch_size, seq_len, bytes_per_value):
    return labkit_kv_cache_bytes(spec, batch_size, seq_len, "bf16") / 2**30


def only_right_on_gqa_with_even_heads(spec, batch_size, seq_len, bytes_per_value):
    # Right whenever d_model == n_heads x head_dim; wrong for Qwen3 (and for random specs that break it)
    return 2 * batch_size * seq_len * spec.n_layers * spec.n_kv_heads * (spec.d_model / spec.n_heads) \
        * bytes_per_value / 2**30


KV_ZOO = {
    ignores_kv_heads: "use spec.n_kv_heads",
    forgets_values: "keys AND values",
    decimal_gb: "GiB is 2**30 bytes",
    head_dim_from_d_model: "use spec.head_dim",
    seed_formula: "not d_model",
    no_layers: "multiply by n_layers",
    returns_bytes: "return GiB",
    calls_labkit: "calls labkit's own `labkit.core.memory.kv_cache_bytes`",
    only_right_on_gqa_with_even_heads: "use spec.head_dim",
}


def test_kv_solution_passes():
    assert check_function(KV, kv_solution).status == "passed"


def kv_with_allowed_helpers(spec, batch_size, seq_len, bytes_per_value):
    # the spec's properties (and a copy of it) and labkit's unit conversion are allowed
    kv_heads = dataclasses.replace(spec).n_heads // spec.query_per_kv
    return to_gib(2 * batch_size * seq_len * spec.n_layers * kv_heads * spec.head_dim * bytes_per_value)


def test_the_spec_and_unit_helpers_are_allowed_other_labkit_functions_are_not():
    assert check_function(KV, kv_with_allowed_helpers).status == "passed"
    for exercise in (KV, BATCH):
        assert exercise.allowed_text == (
            "You may call `labkit.core.spec.ModelSpec` (its methods and properties), `labkit.core.memory.to_gib` and "
            "`labkit.core.memory.to_gb`; any other labkit function is reported by the check.")

    def per_token(spec, batch_size, seq_len, bytes_per_value):
        return kv_bytes_per_token(spec, "bf16") * batch_size * seq_len / 2**30

    assert "calls labkit's own `labkit.core.memory.kv_bytes_per_token`" in str(check_function(KV, per_token))


@pytest.mark.parametrize("wrong,pointer", KV_ZOO.items(), ids=[f.__name__ for f in KV_ZOO])
def test_every_kv_bug_fails_with_a_pointed_hint(wrong, pointer):
    assert_zoo(KV, kv_solution, {wrong: pointer})


def test_kv_reference_gives_the_chapter_figures():
    llama = model_preset("Llama-3.3-70B")
    assert reference_kv_cache_gib(EIGHT_B_LIKE, 16, 4096, 2) == 8.0
    assert reference_kv_cache_gib(llama, 1, 32_000, 2) == 9.765625
    assert reference_kv_cache_gib(llama, 1, 32_768, 2) == 10.0


# ----- exercise 4.2: largest_batch -----

def batch_solution(spec, gpu_memory_gb, seq_len, weights_bytes, bytes_per_value):
    free = gpu_memory_gb * 10**9 - weights_bytes
    per_sequence = 2 * seq_len * spec.n_layers * spec.n_kv_heads * spec.head_dim * bytes_per_value
    return max(0, int(free // per_sequence))


def gib_memory(spec, gpu_memory_gb, seq_len, weights_bytes, bytes_per_value):
    return batch_solution(spec, gpu_memory_gb * 2**30 / 10**9, seq_len, weights_bytes, bytes_per_value)


def ignores_weights(spec, gpu_memory_gb, seq_len, weights_bytes, bytes_per_value):
    return batch_solution(spec, gpu_memory_gb, seq_len, 0, bytes_per_value)


def rounds_up(spec, gpu_memory_gb, seq_len, weights_bytes, bytes_per_value):
    free = gpu_memory_gb * 10**9 - weights_bytes
    per_sequence = 2 * seq_len * spec.n_layers * spec.n_kv_heads * spec.head_dim * bytes_per_value
    return max(0, round(free / per_sequence))


def goes_negative(spec, gpu_memory_gb, seq_len, weights_bytes, bytes_per_value):
    free = gpu_memory_gb * 10**9 - weights_bytes
    return int(free // (2 * seq_len * spec.n_layers * spec.n_kv_heads * spec.head_dim * bytes_per_value))


def query_heads(spec, gpu_memory_gb, seq_len, weights_bytes, bytes_per_value):
    free = gpu_memory_gb * 10**9 - weights_bytes
    return max(0, int(free // (2 * seq_len * spec.n_layers * spec.n_heads * spec.head_dim * bytes_per_value)))


def calls_capacity(spec, gpu_memory_gb, seq_len, weights_bytes, bytes_per_value):
    return kv_batch_capacity(spec, max(0, gpu_memory_gb * GB - weights_bytes), seq_len, "bf16")


BATCH_ZOO = {
    gib_memory: "GB is 10**9 bytes",
    ignores_weights: "subtract weights_bytes",
    rounds_up: "round DOWN",
    goes_negative: "not a negative batch",
    query_heads: "use spec.n_kv_heads",
    calls_capacity: "calls labkit's own `labkit.core.budget.kv_batch_capacity`",
}


def test_batch_solution_passes():
    assert check_function(BATCH, batch_solution).status == "passed"


@pytest.mark.parametrize("wrong,pointer", BATCH_ZOO.items(), ids=[f.__name__ for f in BATCH_ZOO])
def test_every_batch_bug_fails_with_a_pointed_hint(wrong, pointer):
    assert_zoo(BATCH, batch_solution, {wrong: pointer})


def test_batch_reference_on_hand_figures():
    llama = model_preset("Llama-3-8B")
    # (80e9 - 16,060,522,496) // (2 x 4096 x 32 x 8 x 128 x 2 = 536,870,912) = 119
    assert reference_largest_batch(llama, 80, 4096, 2 * llama.n_params, 2) == 119
    assert reference_largest_batch(EIGHT_B_LIKE, 16, 4096, 16 * GB - 8 * GIB, 2) == 16
    assert reference_largest_batch(llama, 16, 1, 2 * llama.n_params, 2) == 0


def test_lab04_registers_two_exercises():
    assert [ex.id for ex in exercises("04")] == ["04.kv_cache_gib", "04.largest_batch"]
    assert all(ex.points == 2 for ex in exercises("04"))
