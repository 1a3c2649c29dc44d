"""labkit.core.roofline: step costs and the roofline — hand cases, properties, agreement with torch's counter."""

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from labkit.core.memory import kv_bytes_per_token, param_count
from labkit.core.presets import gpu_peak_flops, gpu_preset, model_preset
from labkit.core.resources import load_json
from labkit.core.roofline import (
    StepCost, attainable_flops_per_s, attended_keys, bandwidth_utilization, decode_floor_s, fit_step_time,
    ridge_point, roofline_time, step_cost,
)
from labkit.core.spec import ModelSpec
from toys import tiny_llama_config

SMOL = model_preset("SmolLM2-135M")
TOY = ModelSpec("toy", n_layers=1, d_model=4, n_heads=2, n_kv_heads=1, head_dim=2, vocab=10, d_ff=8)


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
    from transformers import LlamaForCausalLM

    from labkit import runtime

    # tests/toys.py's tiny Llama (2 layers, 4 query heads sharing 2 KV heads), narrower and with a tied head
    config = tiny_llama_config(vocab_size=64, hidden_size=32, intermediate_size=48, head_dim=8,
                               tie_word_embeddings=True)
    torch.manual_seed(0)
    config._attn_implementation = "eager"  # attention as plain matmuls, which the counter sees (SDPA it does not)
    module = LlamaForCausalLM(config).eval()
    spec = ModelSpec.from_config(config, n_params=sum(p.numel() for p in module.parameters()))
    token_ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))  # [batch 2, 7]
    _, cache = runtime.prefill(module, token_ids)
    with FlopCounterMode(display=False) as counter:
        runtime.decode_one_token(module, token_ids[:, -1:], cache)
    # transformers 4.x computes the rotary angles as a matmul (inverse frequencies x positions: 2 x head_dim/2 x
    # tokens FLOPs, 8 here); the cost model leaves that out like the other elementwise work. 5.x counts none there.
    rotary = sum(sum(ops.values()) for name, ops in counter.get_flop_counts().items()
                 if name.endswith("rotary_emb"))
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


def test_gpu_peak_flops_are_the_datasheet_figures_kept_beside_the_other_gpu_facts():
    # The same numbers the table in the code held before they moved to data/gpu_presets.json.
    assert {name: gpu_peak_flops(name) for name in ("A100-40GB", "A100-80GB", "H100-SXM", "H200", "T4", "L4")} == {
        "A100-40GB": 312e12, "A100-80GB": 312e12, "H100-SXM": 989e12, "H200": 989e12, "T4": 65e12, "L4": 121e12}
    assert gpu_peak_flops("h100-sxm") == 989e12 and isinstance(gpu_peak_flops("T4"), float)
    gpus = load_json("gpu_presets.json")["gpus"]
    with_peak = sorted(name for name, entry in gpus.items() if "peak_dense_16bit_tflops" in entry)
    assert with_peak == ["A100-40GB", "A100-80GB", "H100-SXM", "H200", "L4", "T4"]
    for name in with_peak:  # every figure names its datasheet and where to read it
        source = gpus[name]["peak_dense_16bit_tflops_source"]
        assert "datasheet" in source and "https://www.nvidia.com/" in source, name
    with pytest.raises(ValueError, match=re.escape(f"name must be one of {with_peak}, got 'RTX-4090'")):
        gpu_peak_flops("RTX-4090")
    with pytest.raises(TypeError, match="name must be one of"):
        gpu_peak_flops(4090)


RIDGE_REL = 1e-9  # one tolerance for "at the ridge": both sides of the equivalence below use it


@settings(max_examples=60, deadline=None)
@given(st.floats(0, 1e4), st.floats(1e9, 1e15), st.floats(1e9, 1e13))
@example(0.99999995, 1e9, 1e9)  # found by Hypothesis when the two sides used two tolerances (1e-6 and 1e-9)
def test_roofline_is_the_minimum_of_two_lines(intensity, peak, bandwidth):
    attained = attainable_flops_per_s(intensity, peak, bandwidth)
    memory_line = intensity * bandwidth
    assert attained in (peak, memory_line)  # min() returns one of its arguments, bit for bit
    assert attained <= peak and attained <= memory_line
    ridge = ridge_point(peak, bandwidth)
    if intensity >= ridge * (1 + RIDGE_REL):  # clearly right of the ridge: compute-bound
        assert attained == peak
    elif intensity <= ridge * (1 - RIDGE_REL):  # clearly left: memory-bound, below the peak
        assert attained == memory_line < peak
    else:  # at the ridge within RIDGE_REL: the two lines meet, so either is the peak within that tolerance
        assert attained == pytest.approx(peak, rel=2 * RIDGE_REL)


def test_decode_floor_and_utilization_by_hand():
    assert decode_floor_s(538_060_032, 20e9) == pytest.approx(0.0269030016)
    assert bandwidth_utilization(538_060_032, 1 / decode_floor_s(538_060_032, 20e9), 20e9) == pytest.approx(1.0)
    assert bandwidth_utilization(1e9, 5, 20e9) == 0.25


# ----- the line time = overhead + bytes / bandwidth through measured formats -----

def test_step_time_fit_recovers_an_exact_line_and_ignores_a_stalled_repeat():
    sizes = [538_060_032, 269_030_016, 134_515_008]  # SmolLM2-135M in 4, 2 and 1 bytes per weight
    times = [[0.012 + size / 30e9] * 3 for size in sizes]
    times[1][2] = 10.0  # one stalled repeat: the median ignores it
    fit = fit_step_time(sizes, times)
    assert fit.overhead_s == pytest.approx(0.012, rel=1e-12)
    assert fit.bandwidth_bytes_per_s == pytest.approx(30e9, rel=1e-12)
    assert fit.time_s(0) == pytest.approx(0.012, rel=1e-12) and fit.n_points == 3
    assert fit.overhead_se_s == pytest.approx(0, abs=1e-12)  # three points on one line: no scatter


def test_step_time_fit_is_numpys_least_squares_with_its_standard_errors():
    generator = np.random.default_rng(0)
    sizes = np.array([5.4e8, 2.7e8, 1.4e8, 0.7e8])
    medians = 0.02 + sizes / 25e9 + generator.normal(0, 1e-3, 4)
    fit = fit_step_time(sizes, medians[:, None])
    slope, intercept = np.polyfit(sizes, medians, 1)  # numpy's own fit, an independent implementation
    assert (fit.seconds_per_byte, fit.overhead_s) == pytest.approx((slope, intercept), rel=1e-9)
    _, covariance = np.polyfit(sizes, medians, 1, cov="unscaled")
    sigma2 = np.sum((medians - (intercept + slope * sizes)) ** 2) / 2
    assert (fit.seconds_per_byte_se, fit.overhead_se_s) == pytest.approx(
        tuple(np.sqrt(sigma2 * np.diag(covariance))), rel=1e-6)


def test_step_time_fit_with_no_cost_per_byte_has_no_finite_bandwidth_and_rejects_bad_input():
    assert fit_step_time([2e8, 1e8], [[0.05], [0.05]]).bandwidth_bytes_per_s == math.inf
    with pytest.raises(ValueError, match="at least two distinct"):
        fit_step_time([2e8, 2e8], [[0.05], [0.04]])
    with pytest.raises(ValueError, match=re.escape("bytes_read [k] and step_s [k, repeats]")):
        fit_step_time([2e8, 1e8], [0.05, 0.04])
