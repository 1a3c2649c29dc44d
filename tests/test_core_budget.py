"""labkit.core.budget: one GPU's parts, the headroom, and the reverse questions (largest batch, longest context)."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.core.course import CHAPTER_8B
from labkit.core.budget import (
    GPUSpec, MemoryBudget, activations_bytes, budget, kv_batch_capacity, max_batch_size, max_seq_len,
    workspace_bytes,
)
from labkit.core.memory import GB, GIB, MIB, BlockLayout, kv_cache_bytes, param_count
from labkit.core.presets import gpu_preset, model_layout, model_preset
from labkit.core.spec import ModelSpec

EIGHT_B_LIKE = CHAPTER_8B
TOY = ModelSpec("toy", n_layers=1, d_model=4, n_heads=2, n_kv_heads=1, head_dim=2, vocab=10, d_ff=8)
formats = st.sampled_from(["fp32", "fp16", "bf16", "fp8", "int8", "int4"])


# ----- budget and reverse questions -----

def test_seed_invented_8_gib_device():
    b = MemoryBudget(weights_bytes=4 * GIB, kv_cache_bytes=3 * GIB // 2, activations_bytes=3 * GIB // 4,
                     workspace_bytes=GIB // 2, capacity_bytes=8 * GIB, other_bytes=GIB // 2)
    assert (b.total_gib, b.headroom_gib, b.fits) == (7.25, 0.75, True)
    assert list(b.parts) == ["weights", "kv_cache", "activations", "workspace", "other"]


def test_budget_parts_for_llama_8b_on_an_h100():
    spec, h100 = model_preset("Llama-3-8B"), gpu_preset("H100-SXM")
    b = budget(spec, h100, batch_size=16, seq_len=4096, weight_fmt="bf16", kv_dtype="fp16")
    assert b.weights_bytes == 2 * 8_030_261_248
    assert b.kv_cache_bytes == 8 * GIB
    assert b.capacity_bytes == 81_559 * MIB  # nvidia-smi's total on an H100 SXM
    assert b.workspace_bytes == 81_559 * MIB // 10
    assert b.total_bytes == sum(b.parts.values()) and b.headroom_bytes == 81_559 * MIB - b.total_bytes


def test_seed_claim_int4_70b_on_one_a100():
    # Seed 004: "INT4 = 35GB (fits on 1 A100!)". With group-128 scales and vLLM's 10% reserve, the 40 GB card
    # (40 GiB as nvidia-smi shows it) holds one sequence of a few thousand tokens; the 80 GB card over 100K.
    spec = model_preset("Llama-3.3-70B")
    options = dict(weight_fmt="int4", group_size=128, kv_dtype="bf16", prefill_chunk_tokens=8192)
    assert 0 < max_seq_len(spec, gpu_preset("A100-40GB"), batch_size=1, **options) < 8192
    assert max_seq_len(spec, gpu_preset("A100-80GB"), batch_size=1, **options) > 100_000


def test_the_40gb_a100_with_real_capacity_and_its_datasheet_figure():
    # 36.38 GB of INT4 weights with scales: above the 36 GB a 10% reserve leaves of a literal "40 GB", below the
    # 38.65 GB it leaves of the card's real 40 GiB.
    spec = model_preset("Llama-3.3-70B")
    options = dict(weight_fmt="int4", group_size=128, kv_dtype="bf16", prefill_chunk_tokens=8192)
    a100 = gpu_preset("A100-40GB")
    as_printed = GPUSpec("40 GB read literally", memory_bytes=a100.vendor_memory_bytes)
    assert 36 * GB < budget(spec, a100, 1, 1, **options).weights_bytes < 0.9 * 40 * GIB
    assert max_seq_len(spec, as_printed, batch_size=1, **options) == 0
    assert [max_seq_len(spec, a100, batch_size=1, workspace_fraction=r, **options) for r in (0.1, 0.05, 0)] == [
        4590, 9297, 15851]


def test_seed_lab_experiment_on_h100s_one_pass_and_chunked():
    # Seed 000's Llama-3-70B, batch 16 x 16,384 tokens, FP16 KV cache, per H100 (81,559 MiB): one 262,144-token
    # prefill needs 41 GiB of activations on one GPU. FP16 fits on 4 GPUs either way; INT4 on 2 only in chunks.
    spec, h100 = model_preset("Llama-3.3-70B"), gpu_preset("H100-SXM")
    for weight_fmt, group_size, tp, one_pass_fits in [("fp16", None, 4, True), ("fp16", None, 2, False),
                                                      ("int4", 128, 2, False), ("int4", 128, 4, True)]:
        options = dict(weight_fmt=weight_fmt, group_size=group_size, kv_dtype="fp16", tp=tp)
        one_pass = budget(spec, h100, 16, 16_384, **options)
        chunked = budget(spec, h100, 16, 16_384, prefill_chunk_tokens=8192, **options)
        assert one_pass.fits == one_pass_fits and chunked.fits == (tp >= 4 or weight_fmt == "int4")
        assert chunked.activations_bytes == activations_bytes(spec, 1, 8192, tp=tp) + 15 * spec.vocab // tp * 4
    assert round(budget(spec, h100, 16, 16_384, kv_dtype="fp16").activations_gib) == 41


def test_tensor_parallel_budget_is_per_gpu():
    spec, h100 = model_preset("Llama-3.3-70B"), gpu_preset("H100-SXM")
    assert not budget(spec, h100, 1, 4096).fits  # 141 GB of BF16 weights on one 80 GB GPU
    b = budget(spec, h100, 1, 4096, tp=4)
    assert b.fits and b.weights_bytes == 2 * param_count(spec, tp=4)
    assert b.kv_cache_bytes == kv_cache_bytes(spec, 1, 4096) // 4


small_specs = st.builds(
    lambda n_layers, n_kv_heads, group, head_dim, d_model, d_ff: ModelSpec(
        "small", n_layers=n_layers, d_model=d_model, n_heads=n_kv_heads * group, n_kv_heads=n_kv_heads,
        head_dim=head_dim, vocab=50, d_ff=d_ff),
    st.integers(1, 3), st.integers(1, 4), st.integers(1, 4), st.integers(1, 16), st.integers(1, 32),
    st.integers(1, 64),
)


@settings(max_examples=60)
@given(small_specs, st.integers(1, 10**7), st.integers(1, 512), formats, formats)
def test_max_batch_size_sits_on_the_boundary(spec, capacity, seq_len, weight_fmt, kv_dtype):
    gpu, options = GPUSpec("random", capacity), dict(weight_fmt=weight_fmt, kv_dtype=kv_dtype)
    n = max_batch_size(spec, gpu, seq_len, **options)
    assert n == 0 or budget(spec, gpu, n, seq_len, **options).fits
    assert not budget(spec, gpu, n + 1, seq_len, **options).fits


@settings(max_examples=60)
@given(small_specs, st.integers(1, 10**7), st.integers(1, 64), formats)
def test_max_seq_len_sits_on_the_boundary(spec, capacity, batch_size, kv_dtype):
    gpu = GPUSpec("random", capacity)
    n = max_seq_len(spec, gpu, batch_size, kv_dtype=kv_dtype)
    assert n == 0 or budget(spec, gpu, batch_size, n, kv_dtype=kv_dtype).fits
    assert not budget(spec, gpu, batch_size, n + 1, kv_dtype=kv_dtype).fits


# ----- the two estimates -----

def test_activation_estimate_by_hand_for_a_toy_and_its_tp_share():
    # per token: residual + normed copy 8, q/k/v (2 + 2) x 2 = 8, gate + up 16 -> 32 values x 2 B; logits 10 x 4 B
    assert activations_bytes(TOY, 1, 3) == 3 * 32 * 2 + 40
    # tp=2: q/k/v (1 + 2) x 2 = 6, gate + up 8 -> 22 values; logits 5 rows of the vocabulary
    assert activations_bytes(TOY, 1, 3, tp=2) == 3 * 22 * 2 + 5 * 4
    assert activations_bytes(TOY, 2, 3, act_fmt="fp32") == 2 * 3 * 32 * 4 + 2 * 40


def test_activation_estimate_is_small_next_to_the_kv_cache_of_a_long_context():
    spec = model_preset("Llama-3-8B")
    acts, kv = activations_bytes(spec, 1, 8192), kv_cache_bytes(spec, 1, 8192)
    assert acts < kv  # one layer's tensors at a time versus every layer's keys and values


@given(st.integers(0, 64), st.integers(0, 4096), st.sampled_from([BlockLayout(), BlockLayout(gated_mlp=False)]))
def test_activation_estimate_grows_linearly_with_tokens_beyond_the_logits(batch_size, seq_len, layout):
    spec = dataclasses.replace(TOY, d_ff=16)
    logits = batch_size * spec.vocab * 4
    one = activations_bytes(spec, 1, 1, layout=layout) - spec.vocab * 4
    assert activations_bytes(spec, batch_size, seq_len, layout=layout) == batch_size * seq_len * one + logits


def test_chunked_prefill_caps_the_tokens_in_flight_by_hand():
    # 4 of the 2 x 3 tokens in flight x 64 B, plus 2 sequences' FP32 logits of 40 B
    assert activations_bytes(TOY, 2, 3, prefill_chunk_tokens=4) == 4 * 64 + 2 * 40
    assert activations_bytes(TOY, 2, 3, prefill_chunk_tokens=6) == activations_bytes(TOY, 2, 3)
    assert activations_bytes(TOY, 2, 3, prefill_chunk_tokens=100) == activations_bytes(TOY, 2, 3)
    assert activations_bytes(TOY, 2, 3, prefill_chunk_tokens=1) == 64 + 2 * 40


@given(st.integers(0, 64), st.integers(0, 4096), st.integers(1, 10_000))
def test_chunked_activations_never_exceed_one_pass_and_stop_growing_at_the_chunk(batch_size, seq_len, chunk):
    chunked = activations_bytes(TOY, batch_size, seq_len, prefill_chunk_tokens=chunk)
    assert chunked <= activations_bytes(TOY, batch_size, seq_len)
    assert chunked == activations_bytes(TOY, batch_size, 0) + min(chunk, batch_size * seq_len) * 64
    b = budget(TOY, GPUSpec("1 GB", GB), batch_size, seq_len, prefill_chunk_tokens=chunk)
    assert b.activations_bytes == chunked


@pytest.mark.parametrize("capacity,fraction,expected", [(80 * GB, 0.1, 8 * GB), (16 * GB, 0, 0),
                                                         (1000, 0.25, 250), (7, 0.5, 3)])
def test_workspace_is_a_stated_fraction_rounded_down(capacity, fraction, expected):
    assert workspace_bytes(capacity, fraction) == expected


def test_gb_and_gib_views_of_one_budget():
    b = budget(ModelSpec("x", n_layers=1, d_model=4, n_heads=1, n_kv_heads=1, head_dim=4, vocab=4,
                          d_ff=4, n_params=GB // 2), GPUSpec("1 GiB", GIB), 1, 1, workspace_fraction=0)
    assert b.capacity_gib == 1.0 and b.capacity_gb == 1.073741824
    assert b.total_gb == b.total_bytes / 10**9 and b.total_gib == b.total_bytes / 2**30


# ----- the KV-only reverse question -----

def test_kv_batch_capacity_is_the_worked_example_read_backwards():
    assert kv_batch_capacity(EIGHT_B_LIKE, 8 * GIB, 4096, "fp16") == 16
    assert kv_batch_capacity(EIGHT_B_LIKE, 8 * GIB - 1, 4096, "fp16") == 15
    assert kv_batch_capacity(EIGHT_B_LIKE, 0, 4096) == 0


@given(st.integers(0, 10**12), st.integers(1, 10**5), formats)
def test_kv_batch_capacity_sits_on_the_boundary(kv_budget, seq_len, kv_dtype):
    n = kv_batch_capacity(EIGHT_B_LIKE, kv_budget, seq_len, kv_dtype)
    assert kv_cache_bytes(EIGHT_B_LIKE, n, seq_len, kv_dtype) <= kv_budget
    assert kv_cache_bytes(EIGHT_B_LIKE, n + 1, seq_len, kv_dtype) > kv_budget


def test_pythia_budget_needs_its_own_layout_when_sharded():
    spec = model_preset("Pythia-14M")
    b = budget(spec, gpu_preset("T4"), 1, 2048, tp=2, layout=model_layout("Pythia-14M"))
    assert b.weights_bytes == 2 * param_count(spec, model_layout("Pythia-14M"), tp=2)


# ----- errors name the argument, the value and what is accepted -----

@pytest.mark.parametrize("call,error,match", [
    (lambda: budget(TOY, GPUSpec("x", GB), 1, 8, weight_fmt="q4"), ValueError, r"weight_fmt must be one of .*'q4'"),
    (lambda: budget(TOY, GPUSpec("x", GB), 1, 8, act_fmt="fp64"), ValueError, r"act_fmt must be one of .*'fp64'"),
    (lambda: MemoryBudget(-1, 0, 0, 0, GB), ValueError, r"weights_bytes must be an int >= 0, got -1"),
    (lambda: budget(TOY, "T4", 1, 8), TypeError, r"gpu must be a GPUSpec .*got 'T4'"),
    (lambda: workspace_bytes(GB, 1.0), ValueError, r"fraction must be a real number in \[0, 1\), got 1.0"),
    (lambda: max_batch_size(TOY, GPUSpec("x", GB), seq_len=0), ValueError, r"seq_len must be an int >= 1, got 0"),
    (lambda: GPUSpec("x", memory_bytes=0), ValueError, r"memory_bytes must be an int >= 1, got 0"),
    (lambda: kv_batch_capacity(TOY, -1, 8), ValueError, r"kv_budget_bytes must be an int >= 0, got -1"),
    (lambda: kv_batch_capacity(TOY, 10, 0), ValueError, r"seq_len must be an int >= 1, got 0"),
    (lambda: max_seq_len(TOY, GPUSpec("x", GB), batch_size=0), ValueError, r"batch_size must be an int >= 1"),
    (lambda: activations_bytes(TOY, 1, 8, prefill_chunk_tokens=0), ValueError,
     r"prefill_chunk_tokens must be an int >= 1, got 0"),
    (lambda: budget(TOY, GPUSpec("x", GB), 1, 8, prefill_chunk_tokens=2.5), TypeError,
     r"prefill_chunk_tokens must be an int >= 1, got 2.5"),
])
def test_errors_name_argument_value_and_choices(call, error, match):
    with pytest.raises(error, match=match):
        call()
