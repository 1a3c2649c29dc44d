"""The bug zoo of lab 06: the timing mistakes the seed chapter warns about (and n = 1), each caught with a hint."""

import pytest

from labkit.core.memory import kv_cache_bytes
from labkit.core.presets import model_preset
from labkit.core.timing import tpot
from labkit.exercises import exercises, get, lab06
from labkit.exercises.checking import check_function
from labkit.exercises.lab06 import (
    CHAPTER_STAMPS, EXAMPLE_CPU, reference_decode_floor_ms, reference_e2e_ms, reference_tpot_ms,
    throughput_gain_on_the_example,
)
from zoo import assert_zoo

TPOT = get("06.tpot_ms")
E2E = get("06.e2e_ms")
FLOOR = get("06.decode_floor_ms")
PREDICT = get("06.predict_batch_throughput")


# ----- 06.tpot_ms -----

def tpot_solution(start_ms, token_times_ms):
    n = len(token_times_ms)
    if n == 1:
        return None
    return (token_times_ms[-1] - token_times_ms[0]) / (n - 1)


def total_over_n(start_ms, token_times_ms):
    return (token_times_ms[-1] - start_ms) / len(token_times_ms)


def divides_by_n(start_ms, token_times_ms):
    return (token_times_ms[-1] - token_times_ms[0]) / len(token_times_ms)


def counts_the_first_wait(start_ms, token_times_ms):
    if len(token_times_ms) == 1:
        return None
    return (token_times_ms[-1] - start_ms) / (len(token_times_ms) - 1)  # the TTFT wait spread over the intervals


def zero_for_one_token(start_ms, token_times_ms):
    n = len(token_times_ms)
    return 0.0 if n == 1 else (token_times_ms[-1] - token_times_ms[0]) / (n - 1)


def crashes_on_one_token(start_ms, token_times_ms):
    return (token_times_ms[-1] - token_times_ms[0]) / (len(token_times_ms) - 1)


def calls_labkit(start_ms, token_times_ms):
    return tpot(token_times_ms)


TPOT_ZOO = {
    total_over_n: "dividing the total time by n",
    divides_by_n: "divide by n - 1, not n",
    counts_the_first_wait: "the first token's wait is TTFT",
    zero_for_one_token: "return None, not 0",
    crashes_on_one_token: "ZeroDivisionError",
    calls_labkit: "calls labkit's own `labkit.core.timing.tpot`",
}


@pytest.mark.parametrize("wrong,pointer", TPOT_ZOO.items(), ids=[f.__name__ for f in TPOT_ZOO])
def test_every_tpot_bug_fails_with_a_pointed_hint(wrong, pointer):
    assert_zoo(TPOT, tpot_solution, {wrong: pointer})


def test_tpot_reference_on_the_chapter_example():
    assert len(CHAPTER_STAMPS) == 20 and reference_tpot_ms(0.0, CHAPTER_STAMPS) == 35.0
    assert reference_tpot_ms(0.0, [700.0]) is None
    assert TPOT.allowed_text.startswith("No labkit function may be called")


# ----- 06.e2e_ms -----

def e2e_solution(ttft_ms, tpot_ms, n_tokens):
    return ttft_ms if n_tokens == 1 else ttft_ms + (n_tokens - 1) * tpot_ms


def n_intervals(ttft_ms, tpot_ms, n_tokens):
    return ttft_ms + n_tokens * (tpot_ms or 0)


def forgets_ttft(ttft_ms, tpot_ms, n_tokens):
    return (n_tokens - 1) * (tpot_ms or 0)


def none_breaks_it(ttft_ms, tpot_ms, n_tokens):
    return ttft_ms + (n_tokens - 1) * tpot_ms


E2E_ZOO = {n_intervals: "not n", forgets_ttft: "add TTFT", none_breaks_it: "TypeError"}


@pytest.mark.parametrize("wrong,pointer", E2E_ZOO.items(), ids=[f.__name__ for f in E2E_ZOO])
def test_every_e2e_bug_fails_with_a_pointed_hint(wrong, pointer):
    assert_zoo(E2E, e2e_solution, {wrong: pointer})


def test_e2e_reference_gives_1365_ms():
    assert reference_e2e_ms(700.0, 35.0, 20) == 1365.0 and reference_e2e_ms(700, None, 1) == 700.0


# ----- 06.decode_floor_ms -----

def floor_solution(spec, bytes_per_value, context_len, batch_size, bandwidth_gb_per_s):
    weights = spec.n_params * bytes_per_value
    kv = 2 * batch_size * context_len * spec.n_layers * spec.n_kv_heads * spec.head_dim * bytes_per_value
    return (weights + kv) / (bandwidth_gb_per_s * 1e9) * 1e3


def weights_only(spec, bytes_per_value, context_len, batch_size, bandwidth_gb_per_s):
    return spec.n_params * bytes_per_value / (bandwidth_gb_per_s * 1e9) * 1e3


def weights_per_sequence(spec, bytes_per_value, context_len, batch_size, bandwidth_gb_per_s):
    return batch_size * floor_solution(spec, bytes_per_value, 0, 1, bandwidth_gb_per_s) + \
        floor_solution(spec, bytes_per_value, context_len, batch_size, bandwidth_gb_per_s) - \
        floor_solution(spec, bytes_per_value, 0, 1, bandwidth_gb_per_s)


def gib_bandwidth(spec, bytes_per_value, context_len, batch_size, bandwidth_gb_per_s):
    return floor_solution(spec, bytes_per_value, context_len, batch_size, bandwidth_gb_per_s * 2**30 / 1e9)


def in_seconds(spec, bytes_per_value, context_len, batch_size, bandwidth_gb_per_s):
    return floor_solution(spec, bytes_per_value, context_len, batch_size, bandwidth_gb_per_s) / 1e3


def query_heads(spec, bytes_per_value, context_len, batch_size, bandwidth_gb_per_s):
    kv = 2 * batch_size * context_len * spec.n_layers * spec.n_heads * spec.head_dim * bytes_per_value
    return (spec.n_params * bytes_per_value + kv) / (bandwidth_gb_per_s * 1e9) * 1e3


def calls_kv_cache_bytes(spec, bytes_per_value, context_len, batch_size, bandwidth_gb_per_s):
    kv = kv_cache_bytes(spec, batch_size, context_len, "bf16") * bytes_per_value / 2
    return (spec.n_params * bytes_per_value + kv) / (bandwidth_gb_per_s * 1e9) * 1e3


FLOOR_ZOO = {
    weights_only: "add the KV cache",
    weights_per_sequence: "a batch shares one read of the weights",
    gib_bandwidth: "not 2**30",
    in_seconds: "return milliseconds",
    query_heads: "use spec.n_kv_heads",
    calls_kv_cache_bytes: "calls labkit's own `labkit.core.memory.kv_cache_bytes`",
}


@pytest.mark.parametrize("wrong,pointer", FLOOR_ZOO.items(), ids=[f.__name__ for f in FLOOR_ZOO])
def test_every_floor_bug_fails_with_a_pointed_hint(wrong, pointer):
    assert_zoo(FLOOR, floor_solution, {wrong: pointer})


def test_floor_reference_by_hand():
    smol = model_preset("SmolLM2-135M")
    assert reference_decode_floor_ms(smol, 4, 0, 1, 20.0) == pytest.approx(538_060_032 / 20e9 * 1e3, rel=1e-12)
    llama = model_preset("Llama-3-8B")  # 16 x 4,096 tokens in BF16: exactly 8 GiB of cache
    assert reference_decode_floor_ms(llama, 2, 4096, 16, 3350.0) == pytest.approx(
        (2 * llama.n_params + 8 * 2**30) / 3350e9 * 1e3, rel=1e-12)


# ----- 06.predict_batch_throughput -----

def test_the_prediction_passes_within_a_quarter_and_fails_outside():
    truth = throughput_gain_on_the_example()
    assert 4 < truth < 5  # the batch shares the weights' read, not the prefill
    assert EXAMPLE_CPU.predict(32, 16, 8).e2e_s > EXAMPLE_CPU.predict(32, 16, 1).e2e_s  # each request waits longer
    assert check_function(PREDICT, lambda: truth * 1.2).close is True
    assert check_function(PREDICT, lambda: 8).close is False  # "eight times" ignores the prefill


def test_lab06_registers_its_exercises_in_notebook_order_of_sections():
    assert [ex.id for ex in exercises("06")] == ["06.tpot_ms", "06.e2e_ms", "06.decode_floor_ms",
                                                 "06.predict_batch_throughput", "06.predict_forward_calls",
                                                 "06.predict_shorter_run_e2e", "06.predict_requests_sooner"]


# ----- Lesson 4.1's questions 2, 6 and 7 -----

def test_eight_tokens_need_seven_calls_after_the_prefill(embedded):
    exercise = get("06.predict_forward_calls")
    assert lab06.decode_calls_for_eight_tokens() == 7  # counted on the model's own loop
    assert check_function(exercise, lambda: 7).close is True
    assert check_function(exercise, lambda: 8).close is False  # the prefill already chose the first token


def test_half_the_tokens_at_the_same_speed_is_the_chapter_arithmetic():
    exercise = get("06.predict_shorter_run_e2e")
    assert lab06.shorter_run_e2e_ms() == 700 + 9 * 35 == 1015
    assert check_function(exercise, lambda: 1015).close is True
    assert check_function(exercise, lambda: 1365 / 2).close is False  # half the E2E: the TTFT does not halve


def test_batching_three_requests_does_not_make_every_one_finish_sooner():
    exercise = get("06.predict_requests_sooner")
    alone, together = (EXAMPLE_CPU.predict(32, 16, b).e2e_s for b in (1, 3))
    assert alone < together < 2 * alone  # the first in line loses, the second and third gain
    assert lab06.requests_finishing_sooner_in_a_batch() == 2
    assert check_function(exercise, lambda: 2).close is True
    assert check_function(exercise, lambda: 3).close is False
