"""The bug zoo of lab 05: the KV-cache mistakes of the seed course (and of learners), each caught with a hint."""

import dataclasses

import pytest

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.core.budget import budget, kv_batch_capacity, max_batch_size
from labkit.exercises.checking import check_function
from labkit.exercises import exercises, get
from labkit.exercises.lab05 import (
    ACT_8B, EIGHT_B_LIKE, LLAMA_8B, LLAMA_8B_BF16, TINY_FREE, fewest_h100s_fp16_chunked, gqa_multiplier,
    largest_batch_budget, qwen3_full_context_kv_gib, reference_kv_cache_gib, reference_largest_batch,
    seed_formula_experiment_gib,
)
from labkit.core.memory import GB, GIB, kv_bytes_per_token, kv_cache_bytes as labkit_kv_cache_bytes, to_gib
from labkit.core.presets import gpu_preset, model_preset
from zoo import assert_zoo

KV = get("05.kv_cache_gib")
BATCH = get("05.largest_batch")


# ----- exercise 5.1: kv_cache_gib -----

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


# ----- exercise 5.2: largest_batch with chunked prefill -----

def batch_solution(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens,
                   activation_bytes_per_token, reserve_fraction):
    capacity = gpu_memory_mib * 2**20
    free = capacity - int(capacity * reserve_fraction) - weights_bytes
    per_sequence = 2 * seq_len * spec.n_layers * spec.n_kv_heads * spec.head_dim * bytes_per_value

    def fits(n):
        return n * per_sequence + min(chunk_tokens, n * seq_len) * activation_bytes_per_token <= free

    if not fits(1):
        return 0
    low, high = 1, 2  # fits(low), and a batch that does not fit is searched for by doubling
    while fits(high):
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def closed_form_solution(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens,
                         activation_bytes_per_token, reserve_fraction):
    free = gpu_memory_mib * 2**20 * (1 - reserve_fraction) - weights_bytes
    per_sequence = 2 * seq_len * spec.n_layers * spec.n_kv_heads * spec.head_dim * bytes_per_value
    if free < per_sequence + min(chunk_tokens, seq_len) * activation_bytes_per_token:
        return 0
    full = (free - chunk_tokens * activation_bytes_per_token) // per_sequence  # a whole chunk in flight
    if full * seq_len >= chunk_tokens:
        return int(full)
    return int(min(chunk_tokens // seq_len, free // (per_sequence + seq_len * activation_bytes_per_token)))


def one_pass(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation, reserve):
    return batch_solution(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, 10**12, activation, reserve)


def full_chunk_always(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation, reserve):
    free = gpu_memory_mib * 2**20 * (1 - reserve) - weights_bytes - chunk_tokens * activation
    per_sequence = 2 * seq_len * spec.n_layers * spec.n_kv_heads * spec.head_dim * bytes_per_value
    return max(0, int(free // per_sequence))


def chunk_per_sequence(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation,
                       reserve):
    in_flight = min(chunk_tokens, seq_len)  # as if each sequence had its own chunk
    per_sequence = 2 * seq_len * spec.n_layers * spec.n_kv_heads * spec.head_dim * bytes_per_value
    free = gpu_memory_mib * 2**20 * (1 - reserve) - weights_bytes
    return max(0, int(free // (per_sequence + in_flight * activation)))


def d_model_width(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation, reserve):
    wide = dataclasses.replace(spec, n_kv_heads=1, head_dim=spec.d_model)  # the seed's 2 x L x d_model per token
    return batch_solution(wide, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation,
                          reserve)


def no_activations(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation, reserve):
    return batch_solution(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, 0, reserve)


def no_reserve(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation, reserve):
    return batch_solution(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation, 0.0)


def reserve_of_what_is_left(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation,
                            reserve):
    left = gpu_memory_mib * 2**20 - weights_bytes
    used = weights_bytes + int(left * reserve)  # the reserve taken from what the weights leave
    return batch_solution(spec, gpu_memory_mib, seq_len, used, bytes_per_value, chunk_tokens, activation, 0.0)


def decimal_mb_memory(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation,
                      reserve):
    missing = round(gpu_memory_mib * (2**20 - 10**6) * (1 - reserve))  # as if a MiB were 10**6 bytes
    return batch_solution(spec, gpu_memory_mib, seq_len, weights_bytes + missing, bytes_per_value, chunk_tokens,
                          activation, reserve)


def gib_read_as_gb(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation, reserve):
    missing = round(gpu_memory_mib * (2**20 - 10**9 / 1024) * (1 - reserve))  # MiB / 1024 taken as decimal GB
    return batch_solution(spec, gpu_memory_mib, seq_len, weights_bytes + missing, bytes_per_value, chunk_tokens,
                          activation, reserve)


def ignores_weights(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation, reserve):
    return batch_solution(spec, gpu_memory_mib, seq_len, 0, bytes_per_value, chunk_tokens, activation, reserve)


def query_heads(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation, reserve):
    as_if_mha = dataclasses.replace(spec, n_kv_heads=spec.n_heads)
    return batch_solution(as_if_mha, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation,
                          reserve)


def counts_one_too_many(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation,
                        reserve):
    answer = batch_solution(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation,
                            reserve)
    return answer + 1 if answer else 0


def goes_negative(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation, reserve):
    free = gpu_memory_mib * 2**20 * (1 - reserve) - weights_bytes
    if free >= 0:
        return batch_solution(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation,
                              reserve)
    return int((free - chunk_tokens * activation) // (2 * seq_len * spec.n_layers * spec.n_kv_heads * spec.head_dim
                                                      * bytes_per_value))


def calls_max_batch_size(spec, gpu_memory_mib, seq_len, weights_bytes, bytes_per_value, chunk_tokens, activation,
                         reserve):
    return max_batch_size(spec, H100, seq_len, prefill_chunk_tokens=chunk_tokens)


H100 = gpu_preset("H100-SXM")

BATCH_ZOO = {
    one_pass: "neither n x seq_len tokens",
    chunk_per_sequence: "nor a chunk per sequence",
    d_model_width: "not d_model",
    full_chunk_always: "not always a full chunk",
    no_activations: "the activations of a chunk take memory too",
    no_reserve: "keep the reserve",
    reserve_of_what_is_left: "a fraction of the whole GPU",
    decimal_mb_memory: "MiB is 2**20 = 1,048,576 bytes",
    gib_read_as_gb: "is GiB (2**30 bytes), not GB",
    ignores_weights: "subtract weights_bytes",
    query_heads: "use spec.n_kv_heads",
    counts_one_too_many: "one sequence too many",
    goes_negative: "not a negative batch",
    calls_max_batch_size: "calls labkit's own `labkit.core.budget.max_batch_size`",
}


def test_batch_solutions_pass():
    for solution in (batch_solution, closed_form_solution):
        assert check_function(BATCH, solution).status == "passed", check_function(BATCH, solution, seed=0)


@pytest.mark.parametrize("wrong,pointer", BATCH_ZOO.items(), ids=[f.__name__ for f in BATCH_ZOO])
def test_every_batch_bug_fails_with_a_pointed_hint(wrong, pointer):
    assert_zoo(BATCH, batch_solution, {wrong: pointer})


def test_batch_reference_on_hand_figures():
    llama = LLAMA_8B
    assert ACT_8B == 2 * (2 * 4096 + (32 + 2 * 8) * 128 + 2 * 14_336)  # labkit's estimate, BF16
    # An H100 shows 81,559 MiB: (that - its 10% - 16,060,522,496 - 8,192 x 86,016) // (2 GiB per sequence) = 28
    capacity = 81_559 * 2**20
    assert capacity == gpu_preset("H100-SXM").memory_bytes
    assert reference_largest_batch(llama, 81_559, 16_384, LLAMA_8B_BF16, 2, 8192, ACT_8B, 0.1) == 28
    # a one-pass prefill of the whole batch allows 17; the KV cache alone 28
    free = capacity - int(capacity * 0.1) - LLAMA_8B_BF16
    assert free // (2 * GIB + 16_384 * ACT_8B) == 17 and free // (2 * GIB) == 28
    assert reference_largest_batch(TINY_FREE, 1, 10, 2**20 - 8800, 2, 40, 100, 0.0) == 10
    assert reference_largest_batch(TINY_FREE, 1, 10, 2**20 - 8799, 2, 40, 100, 0.0) == 9
    assert reference_largest_batch(TINY_FREE, 1, 10, 2**20 - 5920, 2, 400, 100, 0.0) == 4
    assert reference_largest_batch(llama, 15_360, 8192, LLAMA_8B_BF16, 2, 8192, ACT_8B, 0.1) == 0  # a T4


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_batch_reference_is_the_last_batch_whose_budget_fits(seed):
    case = BATCH.random_case(torch.Generator().manual_seed(seed))
    answer = reference_largest_batch(*case.args)  # asserts its own boundary too
    assert answer == batch_solution(*case.args)
    if answer:
        assert largest_batch_budget(*case.args, batch_size=answer).fits
    assert not largest_batch_budget(*case.args, batch_size=answer + 1).fits


def test_the_exercise_budget_is_labkits_chunked_budget():
    # With labkit's own activation estimate, the exercise's budget is budget(...) minus the FP32 logits.
    spec, h100 = LLAMA_8B, gpu_preset("H100-SXM")
    ours = largest_batch_budget(spec, 81_559, 4096, LLAMA_8B_BF16, 2, 8192, ACT_8B, 0.1, batch_size=20)
    core = budget(spec, h100, 20, 4096, kv_dtype="bf16", prefill_chunk_tokens=8192)
    assert ours.total_bytes == core.total_bytes - 20 * spec.vocab * 4


# ----- the predictions -----

def test_prediction_answers():
    assert qwen3_full_context_kv_gib() == 4.375  # 2 x 28 x 8 x 128 x 2 B x 40,960 tokens
    assert gqa_multiplier() == 0.25
    assert seed_formula_experiment_gib() == 640.0  # 8 x the truth, 80 GiB
    assert fewest_h100s_fp16_chunked() == 4


@pytest.mark.parametrize("exercise_id,right,wrong", [
    ("05.predict_qwen3_kv_gib", 4.4, 2.1875),  # 2.1875: head_dim taken as d_model / n_heads = 64
    ("05.predict_gqa_multiplier", 0.25, 4),
    ("05.seed_formula_gib", 640, 80.0),
    ("05.predict_h100_count", 4, 8),
])
def test_predictions_pass_near_the_truth_and_fail_on_the_traps(exercise_id, right, wrong):
    exercise = get(exercise_id)
    assert exercise.n_random == 0 and exercise.allowed_text.startswith("No labkit function")
    assert check_function(exercise, lambda: right).status == "passed"
    if exercise.kind == "prediction":  # answered either way; only the wrong one is not close
        assert check_function(exercise, lambda: right).close is True
        assert (check_function(exercise, lambda: wrong).status, check_function(exercise, lambda: wrong).close) == (
            "passed", False)
    else:
        assert check_function(exercise, lambda: wrong).status == "failed"


def test_lab05_registers_its_exercises_and_predictions():
    assert [ex.id for ex in exercises("05")] == [
        "05.kv_cache_gib", "05.largest_batch", "05.predict_qwen3_kv_gib", "05.predict_gqa_multiplier",
        "05.seed_formula_gib", "05.predict_h100_count"]
    assert [ex.points for ex in exercises("05")] == [2, 3, 1, 1, 1, 1]
