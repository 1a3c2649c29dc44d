"""The bug zoo of lab 06: a hand-written KV-cached loop's mistakes, a timing harness's (and n = 1), the decode
floor's, each caught with a hint; the predictions against the model and labkit's arithmetic."""

import statistics

import numpy as np
import pytest
import torch

from labkit.core.latency_model import EXAMPLE_CPU
from labkit.core.memory import kv_cache_bytes
from labkit.core.presets import model_preset
from labkit.core.timing import ScriptedClock, ScriptedSteps
from labkit.exercises import exercises, get, lab06
from labkit.exercises.checking import check_function
from labkit.exercises.lab06 import reference_decode_floor_ms, throughput_gain_on_the_example
from labkit.runtime.generation import generate
from labkit.runtime.step_counter import StepCounter
from zoo import assert_zoo

LOOP = get("06.greedy_loop")
HARNESS = get("06.latency_harness")
FLOOR = get("06.decode_floor_ms")
FIT = get("06.overhead_bandwidth_fit")
PREDICT = get("06.predict_batch_throughput")


# ----- 06.greedy_loop -----

def loop_solution(runner, prompt_ids, max_new_tokens, eos_token_id):
    logits, cache = runner.prefill(prompt_ids)
    token = logits[:, -1].argmax(dim=-1, keepdim=True)  # [1, 1]
    new_tokens = [int(token)]
    while len(new_tokens) < max_new_tokens and new_tokens[-1] != eos_token_id:
        logits, cache = runner.decode_one_token(token, cache)
        token = logits[:, -1].argmax(dim=-1, keepdim=True)
        new_tokens.append(int(token))
    return new_tokens


def refeeds_the_prefix(runner, prompt_ids, max_new_tokens, eos_token_id):
    ids, new_tokens = prompt_ids, []
    while len(new_tokens) < max_new_tokens:
        logits, _ = runner.prefill(ids)  # the whole prefix again, every step
        token = logits[:, -1].argmax(dim=-1, keepdim=True)
        new_tokens.append(int(token))
        ids = torch.cat([ids, token], dim=1)
        if new_tokens[-1] == eos_token_id:
            break
    return new_tokens


def refeeds_the_prefix_into_decode(runner, prompt_ids, max_new_tokens, eos_token_id):
    logits, cache = runner.prefill(prompt_ids)
    ids = torch.cat([prompt_ids, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    while ids.shape[1] - prompt_ids.shape[1] < max_new_tokens and int(ids[0, -1]) != eos_token_id:
        logits, cache = runner.decode_one_token(ids, cache)
        ids = torch.cat([ids, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    return ids[0, prompt_ids.shape[1]:].tolist()


def feeds_a_stale_token(runner, prompt_ids, max_new_tokens, eos_token_id):
    logits, cache = runner.prefill(prompt_ids)
    token = logits[:, -1].argmax(dim=-1, keepdim=True)
    new_tokens = [int(token)]
    while len(new_tokens) < max_new_tokens and new_tokens[-1] != eos_token_id:
        logits, cache = runner.decode_one_token(prompt_ids[:, -1:], cache)  # never the new token
        new_tokens.append(int(logits[:, -1].argmax(dim=-1)))
    return new_tokens


def reads_the_first_position(runner, prompt_ids, max_new_tokens, eos_token_id):
    logits, cache = runner.prefill(prompt_ids)
    token = logits[:, 0].argmax(dim=-1, keepdim=True)
    new_tokens = [int(token)]
    while len(new_tokens) < max_new_tokens and new_tokens[-1] != eos_token_id:
        logits, cache = runner.decode_one_token(token, cache)
        token = logits[:, 0].argmax(dim=-1, keepdim=True)
        new_tokens.append(int(token))
    return new_tokens


def one_step_short(runner, prompt_ids, max_new_tokens, eos_token_id):
    logits, cache = runner.prefill(prompt_ids)
    token = logits[:, -1].argmax(dim=-1, keepdim=True)
    new_tokens = [int(token)]
    for _ in range(max_new_tokens - 2):  # off by one
        if new_tokens[-1] == eos_token_id:
            break
        logits, cache = runner.decode_one_token(token, cache)
        token = logits[:, -1].argmax(dim=-1, keepdim=True)
        new_tokens.append(int(token))
    return new_tokens


def one_decode_too_many(runner, prompt_ids, max_new_tokens, eos_token_id):
    logits, cache = runner.prefill(prompt_ids)
    new_tokens = []
    for _ in range(max_new_tokens):  # decodes after every token, the last one included
        token = logits[:, -1].argmax(dim=-1, keepdim=True)
        new_tokens.append(int(token))
        if new_tokens[-1] == eos_token_id:
            break
        logits, cache = runner.decode_one_token(token, cache)
    return new_tokens


def ignores_the_end_token(runner, prompt_ids, max_new_tokens, eos_token_id):
    return loop_solution(runner, prompt_ids, max_new_tokens, None)


def drops_the_end_token(runner, prompt_ids, max_new_tokens, eos_token_id):
    tokens = loop_solution(runner, prompt_ids, max_new_tokens, eos_token_id)
    return tokens[:-1] if tokens[-1] == eos_token_id else tokens


def calls_generate(runner, prompt_ids, max_new_tokens, eos_token_id):
    from labkit.runtime.models import load_model

    lm = load_model(progress=False)
    return generate(lm, prompt_ids, max_new_tokens, eos_token_id=eos_token_id).new_token_ids[0].tolist()


def loop_stub(runner, prompt_ids, max_new_tokens, eos_token_id):
    raise NotImplementedError


LOOP_ZOO = {
    refeeds_the_prefix: "the prompt is prefilled once",
    refeeds_the_prefix_into_decode: "re-feeding it repeats its work",
    feeds_a_stale_token: "feed decode_one_token the token you just chose",
    reads_the_first_position: "logits[:, -1], not logits[:, 0]",
    one_step_short: "one token short",
    one_decode_too_many: "n new tokens take n - 1 decode calls",
    ignores_the_end_token: "none after the end token",
    drops_the_end_token: "keep the end token itself",
    calls_generate: "calls labkit's own `labkit.",
}


@pytest.mark.parametrize("wrong,pointer", LOOP_ZOO.items(), ids=[f.__name__ for f in LOOP_ZOO])
def test_every_loop_bug_fails_with_a_pointed_hint(embedded, wrong, pointer):
    assert_zoo(LOOP, loop_solution, {wrong: pointer})


def test_the_loop_stub_is_not_attempted_and_the_solution_passes(embedded):
    # (how long a verdict takes is measured by `make bench`, not asserted here)
    assert check_function(LOOP, loop_stub).status == "not attempted"
    assert check_function(LOOP, loop_solution).status == "passed"


def test_the_loop_cases_match_generate_and_their_end_token(embedded):
    the_tide = lab06.THE_TIDE
    assert embedded.text_ids("The tide").tolist() == the_tide.tolist()
    assert embedded.text_ids("The").tolist() == lab06.THE.tolist()
    tokens = generate(embedded, the_tide, 5).new_token_ids[0].tolist()
    assert tokens[2] == lab06.THIRD_TOKEN and lab06.THIRD_TOKEN not in tokens[:2]
    stopped = generate(embedded, the_tide, 5, eos_token_id=lab06.THIRD_TOKEN).new_token_ids[0].tolist()
    assert lab06.reference_greedy_tokens(StepCounter(), the_tide, 5, lab06.THIRD_TOKEN) == stopped == tokens[:3]
    for case in LOOP.hand_cases:  # every case's cap is the number of decode calls the answer needs
        runner, prompt_ids, max_new_tokens, eos = case.args
        assert runner.max_decode_calls == len(lab06.reference_greedy_tokens(runner, prompt_ids, max_new_tokens,
                                                                            eos)) - 1


def test_every_loop_prompt_is_far_from_a_greedy_tie(embedded):
    from labkit.core.distribution import CLEAR_MARGIN
    from labkit.runtime.generation import greedy_margins

    for text in lab06.LOOP_PROMPTS + ("The tide", "The"):
        ids = embedded.text_ids(text)
        margins = greedy_margins(embedded, ids, generate(embedded, ids, 5).new_token_ids)
        assert bool((margins > CLEAR_MARGIN).all()), (text, margins)


# ----- 06.latency_harness -----

def harness_solution(step, clock, n_tokens, warmup, repeats):
    for _ in range(warmup):
        for k in range(n_tokens):
            step(k)
    ttfts, tpots, e2es = [], [], []
    for _ in range(repeats):
        start = clock()
        stamps = []
        for k in range(n_tokens):
            step(k)
            stamps.append(clock())
        ttfts.append(stamps[0] - start)
        tpots.append((stamps[-1] - stamps[0]) / (n_tokens - 1))
        e2es.append(stamps[-1] - start)
    return torch.tensor([statistics.median(ttfts), statistics.median(tpots), statistics.median(e2es)])


def harness_in_float32_with_torch(step, clock, n_tokens, warmup, repeats):
    result = harness_solution(step, clock, n_tokens, warmup, repeats)
    return result.float()  # a float32 answer is within the tolerance


def harness(step, clock, n_tokens, warmup, repeats, *, warm=True, average=statistics.median, divide="n - 1",
            first_in_tpot=False, origin="request", stamp="after"):
    early = clock()
    for _ in range(warmup if warm else 0):
        for k in range(n_tokens):
            step(k)
    late = clock()
    ttfts, tpots, e2es = [], [], []
    for _ in range(repeats):
        start = {"request": clock(), "before warm-up": early, "before repeats": late}[origin]
        stamps = []
        for k in range(n_tokens):
            if stamp == "before":
                stamps.append(clock())
            step(k)
            if stamp == "after":
                stamps.append(clock())
        first = start if first_in_tpot else stamps[0]
        intervals = n_tokens if divide == "n" or first_in_tpot else n_tokens - 1
        ttfts.append(stamps[0] - start)
        tpots.append((stamps[-1] - first) / intervals)
        e2es.append(stamps[-1] - start)
    return torch.tensor([average(ttfts), average(tpots), average(e2es)], dtype=torch.float64)


def no_warmup(*args):
    return harness(*args, warm=False)


def mean_not_median(*args):
    return harness(*args, average=statistics.fmean)


def first_token_in_tpot(*args):
    return harness(*args, first_in_tpot=True)


def n_intervals(*args):
    return harness(*args, divide="n")


def origin_before_warmup(*args):
    return harness(*args, origin="before warm-up")


def origin_before_repeats(*args):
    return harness(*args, origin="before repeats")


def stamp_before_step(*args):
    return harness(*args, stamp="before")


def harness_stub(step, clock, n_tokens, warmup, repeats):
    raise NotImplementedError


HARNESS_ZOO = {
    no_warmup: "run `warmup` whole requests first",
    mean_not_median: "report the median over the repeats, not the mean",
    first_token_in_tpot: "TPOT leaves the first token out",
    n_intervals: "divide t_n - t_1 by n - 1, not n",
    origin_before_warmup: "not once before the warm-up",
    origin_before_repeats: "not once before all the repeats",
    stamp_before_step: "stamp the clock after step(k) returns",
}


@pytest.mark.parametrize("wrong,pointer", HARNESS_ZOO.items(), ids=[f.__name__ for f in HARNESS_ZOO])
def test_every_harness_bug_fails_with_a_pointed_hint(wrong, pointer):
    assert_zoo(HARNESS, harness_solution, {wrong: pointer})


def test_the_harness_passes_in_float32_and_its_stub_is_not_attempted():
    assert check_function(HARNESS, harness_in_float32_with_torch).status == "passed"
    assert check_function(HARNESS, harness_stub).status == "not attempted"


def test_the_harness_example_is_700_ms_then_35_ms_a_token():
    step, clock, n_tokens, warmup, repeats = HARNESS.hand_cases[0].args
    ttft, tpot, e2e = lab06.reference_latency_harness(step, clock, n_tokens, warmup, repeats).tolist()
    assert (ttft, round(tpot, 12), round(e2e, 12)) == (0.7, 0.035, 1.365)  # E2E = TTFT + 19 x TPOT


def test_a_scripted_case_is_cold_for_its_warmup_requests():
    step, clock = lab06._script(0.5, 0.05, warmup=2, repeats=1, n_tokens=3)
    assert isinstance(step, ScriptedSteps) and isinstance(clock, ScriptedClock)
    assert step.durations[:3] == ((1.5, 0.15, 0.15), (1.5, 0.15, 0.15), (0.5, 0.05, 0.05))


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


# ----- 06.overhead_bandwidth_fit -----

def fit_solution(bytes_read, step_s):
    medians = step_s.median(dim=1).values.numpy()  # odd repeats: the middle value
    slope, intercept = np.polyfit(bytes_read.numpy(), medians, 1)
    return torch.tensor([intercept * 1e3, 1 / slope / 1e9], dtype=torch.float64)


def fit_in_float32_with_lstsq(bytes_read, step_s):
    medians = step_s.float().median(dim=1).values  # [k]
    design = torch.stack([torch.ones_like(medians), bytes_read.float() / 1e9], dim=1)  # bytes in GB
    intercept, seconds_per_gb = torch.linalg.lstsq(design, medians[:, None]).solution[:, 0]
    return torch.stack([intercept * 1e3, 1 / seconds_per_gb])  # float32, within the tolerance


def line(bytes_read, step_s, *, average="median", origin=False, byte_unit=1e9, overhead_unit=1e3):
    x = bytes_read.numpy()
    y = np.median(step_s.numpy(), axis=1) if average == "median" else step_s.numpy().mean(axis=1)
    if origin:
        slope, intercept = float(np.sum(x * y) / np.sum(x * x)), 0.0
    else:
        slope, intercept = np.polyfit(x, y, 1)
    return torch.tensor([intercept * overhead_unit, 1 / slope / byte_unit], dtype=torch.float64)


def through_the_origin(bytes_read, step_s):
    return line(bytes_read, step_s, origin=True)


def means_of_the_repeats(bytes_read, step_s):
    return line(bytes_read, step_s, average="mean")


def gib_per_s(bytes_read, step_s):
    return line(bytes_read, step_s, byte_unit=2**30)


def bytes_per_s(bytes_read, step_s):
    return line(bytes_read, step_s, byte_unit=1)


def overhead_in_seconds(bytes_read, step_s):
    return line(bytes_read, step_s, overhead_unit=1)


def every_repeat_a_point(bytes_read, step_s):  # with equal repeats per format: the line through the means
    repeats = step_s.shape[1]
    slope, intercept = np.polyfit(np.repeat(bytes_read.numpy(), repeats), step_s.numpy().ravel(), 1)
    return torch.tensor([intercept * 1e3, 1 / slope / 1e9], dtype=torch.float64)


def calls_fit_step_time(bytes_read, step_s):
    from labkit.core.roofline import fit_step_time

    fit = fit_step_time(bytes_read.tolist(), step_s.tolist())
    return torch.tensor([fit.overhead_s * 1e3, fit.bandwidth_bytes_per_s / 1e9], dtype=torch.float64)


def fit_stub(bytes_read, step_s):
    raise NotImplementedError


FIT_ZOO = {
    through_the_origin: "not time = b x bytes through the origin",
    means_of_the_repeats: "median over its repeats, not the mean",
    gib_per_s: "not 2**30",
    bytes_per_s: "divide by 10**9",
    overhead_in_seconds: "return the overhead in milliseconds",
    every_repeat_a_point: "median over its repeats, not the mean",
    calls_fit_step_time: "calls labkit's own `labkit.core.roofline.fit_step_time`",
}


@pytest.mark.parametrize("wrong,pointer", FIT_ZOO.items(), ids=[f.__name__ for f in FIT_ZOO])
def test_every_fit_bug_fails_with_a_pointed_hint(wrong, pointer):
    assert_zoo(FIT, fit_solution, {wrong: pointer})


def test_the_fit_passes_in_float32_and_its_stub_is_not_attempted():
    assert check_function(FIT, fit_in_float32_with_lstsq).status == "passed"
    assert check_function(FIT, fit_stub).status == "not attempted"


def test_the_fit_hand_cases_by_hand():
    exact, two, stalled, off_line, four = FIT.hand_cases
    assert lab06.reference_overhead_bandwidth_fit(*exact.args).tolist() == pytest.approx([20, 25], rel=1e-12)
    assert lab06.reference_overhead_bandwidth_fit(*two.args).tolist() == pytest.approx([8, 30], rel=1e-12)
    assert lab06.reference_overhead_bandwidth_fit(*stalled.args).tolist() == pytest.approx([12, 40], rel=1e-12)
    assert lab06.reference_overhead_bandwidth_fit(*four.args).tolist() == pytest.approx([45, 60], rel=1e-12)
    # +1, -2, +1 ms around the generating line: least squares through all three (numpy's own fit) is another line
    bytes_read, step_s = off_line.args
    slope, intercept = np.polyfit(bytes_read.numpy(), step_s[:, 0].numpy(), 1)
    assert lab06.reference_overhead_bandwidth_fit(*off_line.args).tolist() == pytest.approx(
        [intercept * 1e3, 1 / slope / 1e9], rel=1e-9)
    assert abs(intercept * 1e3 - 30) > 0.1  # off the line: not the generating line's 30 ms


def test_the_random_fit_cases_have_a_clear_cost_per_byte():
    generator = torch.Generator().manual_seed(3)
    for _ in range(200):
        overhead_ms, bandwidth = lab06.reference_overhead_bandwidth_fit(*FIT.random_case(generator).args).tolist()
        assert 0 < bandwidth < 200 and -20 < overhead_ms < 80  # drawn: 5-100 GB/s, 2-60 ms, 1 % noise


# ----- 06.predict_batch_throughput -----

def test_the_prediction_passes_within_a_quarter_and_fails_outside():
    truth = throughput_gain_on_the_example()
    assert 4 < truth < 5  # the batch shares the weights' read, not the prefill
    assert EXAMPLE_CPU.predict(32, 16, 8).e2e_s > EXAMPLE_CPU.predict(32, 16, 1).e2e_s  # each request waits longer
    assert check_function(PREDICT, lambda: truth * 1.2).close is True
    assert check_function(PREDICT, lambda: 8).close is False  # "eight times" ignores the prefill


def test_lab06_registers_its_exercises_in_notebook_order_of_sections():
    assert [ex.id for ex in exercises("06")] == ["06.predict_forward_calls", "06.greedy_loop",
                                                 "06.latency_harness", "06.predict_shorter_run_e2e",
                                                 "06.decode_floor_ms", "06.overhead_bandwidth_fit",
                                                 "06.predict_requests_sooner",
                                                 "06.predict_batch_throughput"]


# ----- the predictions -----

def test_eight_tokens_need_seven_calls_after_the_prefill(embedded):
    exercise = get("06.predict_forward_calls")
    assert lab06.decode_calls_for_eight_tokens() == 7  # counted on the model's own loop
    assert check_function(exercise, lambda: 7).close is True
    assert check_function(exercise, lambda: 8).close is False  # the prefill already chose the first token


def test_half_the_tokens_at_the_same_speed_is_ttft_plus_nine_tpot():
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
