"""The bug zoo of lab 05: the memory mistakes of published formulas (and of learners), and a paged allocator's,
each caught with a hint."""

import dataclasses
import inspect

import pytest

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.core.budget import budget, max_batch_size
from labkit.exercises.checking import check_function
from labkit.exercises import exercises, get
from labkit.exercises.lab05 import (
    ACT_8B, LLAMA_8B, LLAMA_8B_BF16, TINY_FREE, fewest_h100s_fp16_chunked, gqa_memory_fraction, largest_batch_budget,
    qwen3_full_context_kv_gib, reference_largest_batch, replay_with_mistake,
)
from labkit.core.memory import GIB
from labkit.core.paging import replay_block_events
from labkit.core.presets import gpu_preset
from zoo import assert_zoo

BATCH = get("05.largest_batch")
PAGED = get("05.paged_allocator")


# ----- the largest batch, with chunked prefill -----

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
    # Llama-3-8B, 16 x 8,192 tokens in BF16: (16,060,522,496 + 17,179,869,184) B as built against
    # (17,671,135,232 + 68,719,476,736) B with 32 KV heads (its k/v projections 4x wider: 2 x 32 x 4096 x 3072 more)
    assert gqa_memory_fraction() == pytest.approx((16_060_522_496 + 2**34) / (17_671_135_232 + 2**36), rel=1e-12)
    assert 17_671_135_232 - 16_060_522_496 == 2 * 2 * 32 * 4096 * 3072
    assert fewest_h100s_fp16_chunked() == 4


@pytest.mark.parametrize("exercise_id,right,wrong", [
    ("05.predict_qwen3_kv_gib", 4.4, 2.1875),  # 2.1875: head_dim taken as d_model / n_heads = 64
    ("05.predict_gqa_multiplier", 0.39, 0.25),  # 0.25: the cache alone shrinks 4x, not the weights
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
        "05.predict_qwen3_kv_gib", "05.predict_gqa_multiplier", "05.predict_h100_count", "05.largest_batch",
        "05.paged_allocator"]
    assert [ex.points for ex in exercises("05")] == [1, 1, 1, 3, 3]


# ----- the paged KV allocator -----

def paged_solution(events, n_blocks, block_size):
    free_pool = list(range(n_blocks))
    tables, tokens, refused = {}, {}, []
    for index, (kind, request, n_tokens) in enumerate(events):
        if kind == "free":
            if request in tables:
                free_pool += tables.pop(request)
                del tokens[request]
            continue
        if kind == "append" and request not in tables:
            continue
        total = tokens.get(request, 0) + n_tokens
        needed = -(-total // block_size) - len(tables.get(request, []))
        if needed > len(free_pool):
            refused.append(index)
            continue
        free_pool.sort()
        tables.setdefault(request, []).extend(free_pool[:needed])
        del free_pool[:needed]
        tokens[request] = total
    wasted = sum(len(blocks) * block_size - tokens[request] for request, blocks in tables.items())
    return tables, len(free_pool), wasted, refused


# A learner's replay with one judgement changed is written once, in labkit.exercises.lab05 (the exercise's bug zoo
# uses it). The check reports any call into labkit's files, so the test compiles the same source as a learner's cell.
_learner_cell: dict = {}
exec(compile(inspect.getsource(replay_with_mistake), "<learner cell>", "exec"), _learner_cell)
learner_like = _learner_cell["replay_with_mistake"]


def new_block_when_exactly_full(events, n_blocks, block_size):
    return learner_like(events, n_blocks, block_size, blocks_for=lambda n: n // block_size + 1)


def floor_blocks(events, n_blocks, block_size):
    return learner_like(events, n_blocks, block_size, blocks_for=lambda n: n // block_size)


def block_per_token(events, n_blocks, block_size):
    return learner_like(events, n_blocks, block_size, blocks_for=lambda n: n)


def keeps_freed_table(events, n_blocks, block_size):
    return learner_like(events, n_blocks, block_size, keep_freed=True)


def never_reuses(events, n_blocks, block_size):
    return learner_like(events, n_blocks, block_size, fresh_ids=True)


def partial_allocation(events, n_blocks, block_size):
    return learner_like(events, n_blocks, block_size, partial=True)


def waste_per_event(events, n_blocks, block_size):
    return learner_like(events, n_blocks, block_size, waste="per event")


def waste_filled_slots(events, n_blocks, block_size):
    return learner_like(events, n_blocks, block_size, waste="filled")


def waste_whole_pool(events, n_blocks, block_size):
    return learner_like(events, n_blocks, block_size, waste="whole pool")


def crashes_on_second_free(events, n_blocks, block_size):
    freed = set()
    for kind, request, _ in events:  # as if free ran `free_pool += tables.pop(request)` unguarded
        if kind == "free" and request in freed:
            raise KeyError(request)
        if kind == "free":
            freed.add(request)
    return paged_solution(events, n_blocks, block_size)


def calls_labkit(events, n_blocks, block_size):
    return replay_block_events(events, n_blocks, block_size)


PAGED_ZOO = {
    new_block_when_exactly_full: "a block that is exactly full needs no new block",
    floor_blocks: "round up",
    block_per_token: "not one per token",
    keeps_freed_table: "free must also remove the request from the block table",
    never_reuses: "reuse freed blocks",
    partial_allocation: "refused whole",
    waste_per_event: "not added up event by event",
    waste_filled_slots: "not the filled ones",
    waste_whole_pool: "free blocks are not fragmentation",
    crashes_on_second_free: "raised KeyError",
    calls_labkit: "calls labkit's own `labkit.core.paging.replay_block_events`",
}


@pytest.mark.parametrize("wrong,pointer", PAGED_ZOO.items(), ids=[f.__name__ for f in PAGED_ZOO])
def test_every_paged_allocator_bug_fails_with_a_pointed_hint(wrong, pointer):
    assert_zoo(PAGED, paged_solution, {wrong: pointer})


def test_the_paged_allocator_stub_is_not_attempted():
    def stub(events, n_blocks, block_size):
        raise NotImplementedError

    assert check_function(PAGED, stub).status == "not attempted"
    assert check_function(PAGED, paged_solution).status == "passed"  # its speed: `make bench`


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_random_event_streams_agree_with_a_plain_replay_and_often_run_out(seed):
    case = PAGED.random_case(torch.Generator().manual_seed(seed))
    assert replay_block_events(*case.args) == tuple(paged_solution(*case.args))


def test_random_streams_cover_refusals_frees_and_full_blocks():
    generator = torch.Generator().manual_seed(0)
    replays = [replay_block_events(*PAGED.random_case(generator).args) for _ in range(200)]
    assert sum(bool(replay.refused) for replay in replays) > 40
    assert sum(replay.wasted_slots == 0 and bool(replay.block_tables) for replay in replays) > 10
    cases = [PAGED.random_case(torch.Generator().manual_seed(seed)) for seed in range(200)]
    assert sum(any(kind == "free" for kind, _, _ in case.args[0]) for case in cases) > 100


def test_what_each_exercise_may_call():
    assert BATCH.allowed_text == (
        "You may call `labkit.core.spec.ModelSpec` (its methods and properties), `labkit.core.memory.to_gib` and "
        "`labkit.core.memory.to_gb`; any other labkit function is reported by the check.")
    assert PAGED.allowed_text == (
        "No labkit function may be called inside your function: the check reports any call into labkit.")
