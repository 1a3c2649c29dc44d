"""labkit.core.timing: request metrics, step costs and the roofline — hand cases, properties, agreement."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.core.memory import kv_bytes_per_token, param_count
from labkit.core.presets import gpu_preset, model_preset
from labkit.core.spec import ModelSpec
from labkit.core.timing import (
    DECODE_TERMS, PEAK_DENSE_16BIT_FLOPS, LatencyModel, RequestMetrics, StepCost, attainable_flops_per_s,
    attended_keys, bandwidth_utilization, decode_floor_s, e2e_estimate, fit_latency, fit_latency_model, fit_linear,
    gpu_peak_flops, inter_token_latencies, itl_percentiles, nonnegative_least_squares, percentile, prediction_ratio,
    request_metrics, ridge_point, roofline_time, spread, step_cost, tpot,
)

SMOL = model_preset("SmolLM2-135M")
TOY = ModelSpec("toy", n_layers=1, d_model=4, n_heads=2, n_kv_heads=1, head_dim=2, vocab=10, d_ff=8)
times = st.lists(st.floats(0, 1e3, allow_nan=False), min_size=1, max_size=40).map(sorted)


# ----- request metrics -----

def test_chapter_8_example_is_exact():
    assert e2e_estimate(700, 35, 20) == 1365  # ints in, an exact int out
    assert e2e_estimate(0.7, 0.035, 20) == pytest.approx(1.365, abs=1e-12)
    assert e2e_estimate(700, None, 1) == 700  # one token: TTFT is the whole answer


def test_tpot_uses_the_n_minus_1_intervals_after_the_first_token():
    emitted = [700, 735, 770, 805]  # arrival at 0
    assert tpot(emitted) == 35.0
    assert (805 - 0) / 4 != 35.0 and (805 - 700) / 4 != 35.0  # total / n and divide-by-n are both wrong
    assert tpot([700]) is None and tpot([1.0, 1.0]) == 0.0


def test_request_metrics_by_hand():
    m = request_metrics([1.0, 1.5, 2.5], start_s=0.25)
    assert (m.n_tokens, m.ttft_s, m.itl_s, m.tpot_s, m.e2e_s) == (3, 0.75, (0.5, 1.0), 0.75, 2.25)
    assert m.tokens_per_s == 3 / 2.25 and m.decode_tokens_per_s == 1 / 0.75
    one = request_metrics([0.4], start_s=0.0)
    assert one.tpot_s is None and one.itl_s == () and one.decode_tokens_per_s is None and one.e2e_s == 0.4


@pytest.mark.parametrize("bad,error", [([], ValueError), ([2.0, 1.0], ValueError), ("12", TypeError),
                                       ([1.0, float("nan")], ValueError), (3.0, TypeError)])
def test_bad_timestamps_are_refused(bad, error):
    with pytest.raises(error, match="token_times"):
        tpot(bad)


def test_start_after_first_token_is_refused():
    with pytest.raises(ValueError, match=r"start_s must be no later than the first emission \(1.0\), got 2.0"):
        request_metrics([1.0], start_s=2.0)
    with pytest.raises(ValueError, match="tpot must be a number when n_tokens > 1"):
        e2e_estimate(1.0, None, 2)


@settings(max_examples=80, deadline=None)
@given(times, st.floats(0, 10))
def test_e2e_is_ttft_plus_n_minus_1_tpot(emitted, lead):
    start = emitted[0] - lead
    m = request_metrics(emitted, start_s=start)
    assert len(m.itl_s) == m.n_tokens - 1 and all(gap >= 0 for gap in m.itl_s)
    assert math.isclose(e2e_estimate(m.ttft_s, m.tpot_s, m.n_tokens), m.e2e_s, rel_tol=1e-9, abs_tol=1e-9)
    if m.tpot_s is not None:
        assert math.isclose(m.tpot_s, float(np.mean(m.itl_s)), rel_tol=1e-9, abs_tol=1e-9)
        assert min(m.itl_s) - 1e-9 <= m.tpot_s <= max(m.itl_s) + 1e-9


def test_itl_percentiles_pool_every_request_like_vllm():
    requests = [request_metrics([0, 1, 3, 6]), request_metrics([0, 10]), request_metrics([5])]
    pooled = [1, 2, 3, 10]
    assert itl_percentiles(requests, (50, 99)) == {50: np.percentile(pooled, 50), 99: np.percentile(pooled, 99)}
    assert itl_percentiles([request_metrics([5])]) == {50: None, 99: None}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=30), st.floats(0, 100))
def test_percentile_agrees_with_numpy(values, q):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12, abs=1e-9)


def test_spread_by_hand():
    s = spread([4.0, 1.0, 3.0, 2.0, 100.0])
    assert (s.median, s.minimum, s.maximum, s.n, s.p25, s.p75) == (3.0, 1.0, 100.0, 5, 2.0, 4.0)
    assert s.relative_spread == 33.0
    with pytest.raises(ValueError, match="samples must be a non-empty"):
        spread([])


# ----- step costs -----

def test_decode_step_of_the_toy_by_hand():
    cost = step_cost(TOY, 1, context_len=3)
    # q,o 4x4 + k,v 4x2 = 48 weights; gate/up/down 96; head 10 x 4 for one position; 4 x H 2 x d_h 2 x 4 keys
    assert cost.flops == 2 * (48 + 96) + 2 * 40 + 4 * 2 * 2 * 4
    assert cost.weight_bytes == 4 * (48 + 96 + 12 + 40 + 4)  # + one untied embedding row
    assert (cost.kv_read_bytes, cost.kv_write_bytes) == (3 * 16, 16)
    assert cost.arithmetic_intensity == cost.flops / (800 + 64)


def test_smollm2_decode_reads_every_weight_once():
    cost = step_cost(SMOL, 1, context_len=100)
    assert cost.weight_bytes == 4 * param_count(SMOL) == 538_060_032
    assert cost.kv_read_bytes == 100 * kv_bytes_per_token(SMOL, "fp32")
    # 2 FLOPs per parameter (matrices and the tied head run once; norms count no FLOPs) + attention over 101 keys
    attention = 4 * 30 * 9 * 64 * 101
    assert cost.flops == 2 * (SMOL.n_params - 30 * 2 * 576 - 576) + attention


def test_prefill_intensity_grows_with_the_prompt_decode_stays_near_one_half_per_fp32_byte():
    prefill = [step_cost(SMOL, n).arithmetic_intensity for n in (1, 16, 128, 1024)]
    assert prefill == sorted(prefill) and prefill[-1] > 100 * prefill[0]
    decode = step_cost(SMOL, 1, context_len=64).arithmetic_intensity
    assert 0.4 < decode < 0.55  # 2 FLOPs per 4-byte weight
    assert step_cost(SMOL, 1, 64, batch_size=8).arithmetic_intensity > 7 * decode  # a batch shares the weights


def test_logits_for_every_position_add_the_head_per_token():
    last, every = step_cost(SMOL, 10), step_cost(SMOL, 10, logits_positions="all")
    assert every.flops - last.flops == 2 * SMOL.vocab * SMOL.d_model * 9


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 64), st.integers(0, 64))
def test_attended_keys_counts_causal_pairs(new_tokens, context_len):
    assert attended_keys(new_tokens, context_len) == sum(context_len + i for i in range(1, new_tokens + 1))


def test_decode_flops_agree_with_torch_flop_counter():
    # An independent count: torch's FlopCounterMode over a real (tiny, random) Llama decode step with a cache.
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import LlamaConfig, LlamaForCausalLM

    from labkit import runtime

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)
    torch.manual_seed(0)
    config._attn_implementation = "eager"  # attention as plain matmuls, which the counter sees (SDPA it does not)
    model = LlamaForCausalLM(config).eval()
    spec = ModelSpec.from_config(config, n_params=sum(p.numel() for p in model.parameters()))
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    _, cache = runtime.prefill(model, ids)
    with FlopCounterMode(display=False) as counter:
        runtime.decode_one_token(model, ids[:, -1:], cache)
    # transformers 4.x computes the rotary angles as a matmul (inverse frequencies x positions: 2 x head_dim/2 x
    # tokens FLOPs, 8 here); the cost model leaves that out like the other elementwise work. 5.x counts none there.
    rotary = sum(sum(ops.values()) for module, ops in counter.get_flop_counts().items()
                 if module.endswith("rotary_emb"))
    assert rotary in (0, 2 * (8 // 2) * 1)
    assert counter.get_total_flops() - rotary == step_cost(spec, 1, context_len=7, batch_size=2).flops


@pytest.mark.parametrize("call,match", [
    (lambda: step_cost("smol", 1), "spec must be a labkit.core.spec.ModelSpec"),
    (lambda: step_cost(SMOL, 0), "new_tokens must be an int >= 1, got 0"),
    (lambda: step_cost(SMOL, 1, batch_size=0), "batch_size must be an int >= 1, got 0"),
    (lambda: step_cost(SMOL, 1, logits_positions="first"), r"logits_positions must be one of \['last', 'all'\]"),
    (lambda: step_cost(SMOL, 1, weight_fmt="fp64"), "weight_fmt must be one of"),
    (lambda: ridge_point(0, 1e9), r"peak_flops_per_s must be a real number > 0, got 0"),
    (lambda: decode_floor_s(1e6, 0), r"bandwidth_bytes_per_s must be a real number > 0, got 0"),
    (lambda: gpu_peak_flops("RTX-4090"), "name must be one of"),
])
def test_bad_arguments_name_themselves(call, match):
    with pytest.raises((TypeError, ValueError), match=match):
        call()


# ----- roofline -----

def test_the_seed_70b_analysis_recomputed():
    cost = StepCost.params_only(70e9, 2)  # the seed's 2 FLOPs per parameter, FP16, A100 at 2 TB/s and 312 TFLOPS
    t = roofline_time(cost, 312e12, 2e12)
    assert cost.arithmetic_intensity == 1.0  # the seed's prose says "~2 FLOPs/byte"; its own code computes 1
    assert t.memory_s == pytest.approx(0.070) and t.compute_s == pytest.approx(140e9 / 312e12)
    assert round(t.memory_bound_ratio) == 156 and t.bound == "memory"  # its comment says "~100x"
    assert ridge_point(312e12, 2e12) == 156.0  # the same 156: intensity 1 sits 156x left of the ridge


def test_presets_feed_the_same_arithmetic():
    a100 = gpu_preset("A100-80GB")
    ridge = ridge_point(gpu_peak_flops("A100-80GB"), a100.bandwidth_bytes_per_s)
    assert ridge == pytest.approx(312e12 / 2039e9)
    assert set(PEAK_DENSE_16BIT_FLOPS) <= {"T4", "L4", "A100-40GB", "A100-80GB", "H100-SXM", "H200", "RTX-4090",
                                           "RTX-A6000"}


@settings(max_examples=60, deadline=None)
@given(st.floats(0, 1e4), st.floats(1e9, 1e15), st.floats(1e9, 1e13))
def test_roofline_is_the_minimum_of_two_lines(intensity, peak, bandwidth):
    attained = attainable_flops_per_s(intensity, peak, bandwidth)
    assert attained <= peak and attained <= intensity * bandwidth * (1 + 1e-12)
    ridge = ridge_point(peak, bandwidth)
    assert (intensity >= ridge) == (attained == pytest.approx(peak)) or math.isclose(intensity, ridge)


def test_decode_floor_and_utilization_by_hand():
    assert decode_floor_s(538_060_032, 20e9) == pytest.approx(0.0269030016)
    assert bandwidth_utilization(538_060_032, 1 / decode_floor_s(538_060_032, 20e9), 20e9) == pytest.approx(1.0)
    assert bandwidth_utilization(1e9, 5, 20e9) == 0.25


# ----- the calibrated latency model -----

def test_nonnegative_least_squares_drops_a_column_that_would_go_negative():
    features = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    assert nonnegative_least_squares(features, np.array([1.0, 2.0, 3.0])) == pytest.approx([0.0, 1.0])
    assert nonnegative_least_squares(features, np.array([3.0, 2.0, 1.0])).tolist() == [2.0, 0.0]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0, 0.1), min_size=5, max_size=5))
def test_fit_recovers_a_model_it_was_given(coefficients):
    coefficients[0] += 1e-4  # every real call has some fixed cost: times > 0 (the fit weighs relative errors)
    coefficients[2] += 1e-4
    truth = LatencyModel(*coefficients)
    prefill = [(p, b, truth.prefill_s(p, b)) for p in (4, 32, 128) for b in (1, 3)]
    decode = [(b, c, truth.decode_step_s(b, c)) for b in (1, 2, 5) for c in (4, 64, 300)]
    fitted = fit_latency_model(prefill, decode)
    for p, b, s in prefill:
        assert fitted.prefill_s(p, b) == pytest.approx(s, abs=1e-9)
    for b, c, s in decode:
        assert fitted.decode_step_s(b, c) == pytest.approx(s, abs=1e-9)


def test_prediction_follows_eq_8_1_and_batching_trades_latency_for_throughput():
    model = LatencyModel(0.002, 0.0005, 0.030, 0.002, 1e-6)
    one, eight = model.predict(32, 20), model.predict(32, 20, batch_size=8)
    assert one.e2e_s == pytest.approx(one.ttft_s + 19 * one.tpot_s)
    assert eight.e2e_s > one.e2e_s and eight.tokens_per_s > one.tokens_per_s
    single = model.predict(32, 1)
    assert single.tpot_s is None and single.e2e_s == single.ttft_s
    with pytest.raises(ValueError, match="fit_latency_model needs"):
        fit_latency_model([], [(1, 1, 0.1)])


# A decode step like this machine's: 65 ms fixed, 5 ms per sequence, 20 us per cached token (per sequence).
TRUTH = LatencyModel(0.1, 0.0013, 0.065, 0.005, 20e-6)


def _noisy_decode(pairs, noise, rng):
    """(batch, context, seconds) with multiplicative noise of relative size ``noise`` (a shared machine's)."""
    return [(b, c, TRUTH.decode_step_s(b, c) * (1 + noise * rng.standard_normal())) for b, c in pairs]


def test_a_noisy_linear_cost_is_recovered_within_its_standard_errors():
    rng = np.random.default_rng(0)
    pairs = [(b, c) for b in (1, 3) for c in (16, 256, 1024)] * 3
    prefill = [(p, 1, TRUTH.prefill_s(p)) for p in (8, 64, 1024)]
    truth = (TRUTH.decode_fixed_s, TRUTH.decode_per_sequence_s, TRUTH.decode_per_cached_token_s)
    fits = [fit_latency(prefill, _noisy_decode(pairs, 0.03, rng)).decode for _ in range(200)]
    assert fits[0].names == DECODE_TERMS and fits[0].n_points == 18 and all(fits[0].identifiable)
    values, errors = np.array([f.coefficients for f in fits]), np.array([f.standard_errors for f in fits])
    # The errors a fit reports match the real scatter of its coefficients, and +-2 of them cover the truth about
    # 95 % of the time (a t distribution with 18 - 3 degrees of freedom: 93.6 %).
    covered = np.mean(np.abs(values - truth) < 2 * errors, axis=0)
    assert np.all((covered > 0.88) & (covered < 0.99)), covered
    assert np.std(values, axis=0) == pytest.approx(np.mean(errors, axis=0), rel=0.2)
    assert np.mean(values, axis=0) == pytest.approx(truth, rel=0.05)


def test_one_context_per_batch_leaves_the_per_cached_token_cost_unidentifiable():
    rng = np.random.default_rng(1)
    prefill = [(p, 1, TRUTH.prefill_s(p)) for p in (8, 64)]
    # Every batch decoded at the same context: b x c is a multiple of b, so the two columns are collinear.
    collinear = fit_latency(prefill, _noisy_decode([(b, 9) for b in (1, 3)] * 4, 0.03, rng)).decode
    assert collinear.identifiable == (True, False, False)
    assert collinear.error("per cached token") == math.inf == collinear.error("per sequence")
    assert math.isfinite(collinear.error("fixed"))
    # Contexts 7-10 per batch (one short generation): identifiable in principle, determined by nothing.
    narrow = fit_latency(prefill, _noisy_decode([(b, c) for b in (1, 3) for c in range(7, 11)], 0.03, rng)).decode
    assert all(narrow.identifiable) and narrow.error("per cached token") > 2 * TRUTH.decode_per_cached_token_s
    wide = fit_latency(prefill, _noisy_decode([(b, c) for b in (1, 3) for c in (16, 256, 1024)], 0.03, rng)).decode
    assert wide.error("per cached token") < 0.5 * TRUTH.decode_per_cached_token_s


def test_linear_fit_by_hand_and_at_its_edges():
    exact = fit_linear([[1, 2], [1, 5]], [7.0, 13.0], ("fixed", "slope"))  # two points, two coefficients
    assert exact.coefficients == pytest.approx((3.0, 2.0)) and exact.rms_residual == pytest.approx(0, abs=1e-12)
    assert all(math.isnan(e) for e in exact.standard_errors) and exact.identifiable == (True, True)
    zero_column = fit_linear([[1, 0], [1, 0], [1, 0]], [1.0, 2.0, 3.0], ("fixed", "never varied"))
    assert zero_column.identifiable == (True, False) and zero_column.value("fixed") == pytest.approx(2.0)
    with pytest.raises(ValueError, match="fit_linear needs features"):
        fit_linear([[1, 2]], [1.0, 2.0], ("a", "b"))
    with pytest.raises(ValueError, match=r"name must be one of \['fixed', 'slope'\]"):
        exact.value("slop")
    with pytest.raises(ValueError, match="needs every target > 0"):
        fit_linear([[1, 2], [1, 3]], [1.0, 0.0], ("a", "b"), relative=True)


def test_extrapolation_is_named_exactly_outside_the_measured_range():
    fit = fit_latency([(8, 1, 0.1), (32, 2, 0.2)], [(1, 10, 0.05), (3, 10, 0.06), (1, 500, 0.07)])
    assert (fit.prefill_tokens, fit.batch_sizes, fit.context_lens) == ((8, 64), (1, 3), (10, 500))
    assert fit.extrapolations(10, 492) == ()  # contexts 10 .. 500, prefill 10 tokens: on the edges
    assert fit.extrapolations(10, 493) == ("context up to 501 tokens > 500 measured",)
    assert fit.extrapolations(9, 2) == ("context from 9 tokens < 10 measured",)
    assert fit.extrapolations(7, 1) == ("prefill of 7 tokens < 8 measured",)  # one token: no decode step
    assert fit.extrapolations(20, 1, batch_size=4) == ("prefill of 80 tokens (4 x 20) > 64 measured",)
    assert prediction_ratio(0.1, 0.08) == pytest.approx(1.25)
    with pytest.raises(ValueError, match="measured_s must be"):
        prediction_ratio(0.1, 0)


def test_request_metrics_is_a_plain_dataclass():
    assert RequestMetrics(1, 0.1, (), None, 0.1).tokens_per_s == 10
    assert inter_token_latencies([1.0]) == ()


def test_a_scripted_clock_moves_only_with_its_steps():
    from copy import deepcopy

    from labkit.core.timing import ScriptedClock, ScriptedSteps

    clock = ScriptedClock(10.0)
    step = ScriptedSteps(clock, [[1.0, 0.5], [0.25]])
    copied_step, copied_clock = deepcopy((step, clock))
    assert copied_step.clock is copied_clock  # copied together, they stay joined
    for k in range(3):
        step(k)
    assert clock() == 12.0 and step.requests == 1
    step(0), step(5)
    assert clock() == 12.5 and step.requests == 2  # request 2 uses the last row, its last value
    assert copied_clock == clock and copied_clock() == 10.0 and copied_step == step  # equal: same script
    with pytest.raises(ValueError):
        clock.advance(-1.0)
    with pytest.raises(ValueError):
        ScriptedSteps(clock, [[]])
