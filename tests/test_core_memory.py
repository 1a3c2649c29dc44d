import dataclasses
import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from toys import tiny_llama_config
from labkit.runtime import cache_bytes, decode_one_token
from labkit.core.memory import (
    GB, GIB, LLAMA, MIB, BlockLayout, bytes_per_value, format_bits, kv_bytes_per_token, kv_cache_bytes,
    kv_heads_per_rank, param_breakdown, param_count, params_12d2, sparse_2_4_bytes,
    stored_bytes, to_gb, to_gib, weights_bytes,
)
from labkit.core.presets import gpu_preset, gpu_presets, model_layout, model_preset, model_presets, model_source
from labkit.core.course import CHAPTER_8B
from labkit.core.spec import ModelSpec

# The seed's worked example (section 8.6): 32 layers, 8 KV heads of width 128, as in Llama-3-8B.
EIGHT_B_LIKE = CHAPTER_8B
TOY = ModelSpec("toy", n_layers=1, d_model=4, n_heads=2, n_kv_heads=1, head_dim=2, vocab=10, d_ff=8)


# ----- units and formats -----

def test_gb_and_gib_are_different_units():
    assert (GB, GIB, MIB) == (10**9, 2**30, 2**20)
    assert to_gb(GIB) == 1.073741824
    assert to_gib(80 * GB) == pytest.approx(74.5058, abs=1e-4)  # an "80 GB" datasheet figure read literally


@pytest.mark.parametrize("fmt,expected", [("fp32", 4), ("FP16", 2), ("bf16", 2), ("fp8", 1), ("int8", 1),
                                          ("int4", 0.5)])
def test_bytes_per_value(fmt, expected):
    assert bytes_per_value(fmt) == expected


def test_four_bit_weights_with_a_scale_per_64_take_0_53125_mib():
    # Seed 001: 2^20 four-bit codes are 0.5 MiB; 2^20 / 64 two-byte scales add 32,768 bytes.
    assert stored_bytes(2**20, "int4", group_size=64, scale_bytes=2) == 557_056
    assert stored_bytes(2**20, "int4", group_size=64) / MIB == 0.53125


@pytest.mark.parametrize("n_values,n_scales", [(63, 1), (64, 1), (65, 2), (128, 2), (129, 3)])
def test_partial_last_group_still_gets_a_scale(n_values, n_scales):
    assert stored_bytes(n_values, "int8", group_size=64, scale_bytes=2) == n_values + 2 * n_scales


def test_odd_int4_count_rounds_up_to_whole_bytes():
    assert [stored_bytes(n, "int4") for n in (1, 2, 3)] == [1, 1, 2]


# ----- KV cache -----

def test_worked_example_is_exactly_8_gib():
    n_bytes = kv_cache_bytes(EIGHT_B_LIKE, batch_size=16, seq_len=4096, kv_dtype="fp16")
    assert n_bytes == 8_589_934_592 == 8 * GIB
    assert round(to_gb(n_bytes), 2) == 8.59


def test_llama_3_3_70b_at_32k_tokens():
    spec = model_preset("Llama-3.3-70B")
    assert kv_bytes_per_token(spec, "bf16") == 327_680  # 2 x 80 layers x 8 heads x 128 x 2 B
    assert kv_cache_bytes(spec, 1, 32_000, "bf16") == 10_485_760_000  # 9.77 GiB
    assert to_gib(kv_cache_bytes(spec, 1, 32_000, "fp16")) == 9.765625
    assert kv_cache_bytes(spec, 1, 32_768, "fp16") == 10 * GIB


def test_mha_only_formula_overstates_llama_70b_eight_times():
    # Seed 004 sizes "LLaMA 70B at 32K" with 64 KV heads (every query head): ~86 GB. Llama 70B has 8.
    spec = model_preset("Llama-3.3-70B")
    as_if_mha = dataclasses.replace(spec, n_kv_heads=spec.n_heads)
    assert kv_cache_bytes(as_if_mha, 1, 32_768, "fp16") == 85_899_345_920  # 85.9 GB, the seed's figure
    assert kv_cache_bytes(spec, 1, 32_768, "fp16") == 10_737_418_240  # 10.7 GB: the truth
    # Seed 000's d_model formula is the same mistake: Llama-3-70B, 16,384 tokens, batch 16, FP16.
    d_model_formula = 2 * spec.n_layers * spec.d_model * 16_384 * 16 * 2
    assert d_model_formula == 640 * GIB
    assert kv_cache_bytes(spec, 16, 16_384, "fp16") == 80 * GIB


def test_kv_cache_uses_head_dim_not_d_model_over_heads():
    qwen = model_preset("Qwen3-0.6B")  # head_dim 128, while 1024 / 16 = 64
    assert kv_bytes_per_token(qwen, "bf16") == 2 * 28 * 8 * 128 * 2


def test_kv_dtype_multipliers():
    per_token = {fmt: kv_bytes_per_token(EIGHT_B_LIKE, fmt) for fmt in ("fp32", "bf16", "fp8", "int4")}
    assert per_token == {"fp32": 262_144, "bf16": 131_072, "fp8": 65_536, "int4": 32_768}


specs = st.builds(
    lambda n_layers, n_kv_heads, group, head_dim, d_model, vocab, d_ff: ModelSpec(
        "random", n_layers=n_layers, d_model=d_model, n_heads=n_kv_heads * group, n_kv_heads=n_kv_heads,
        head_dim=head_dim, vocab=vocab, d_ff=d_ff),
    st.integers(1, 6), st.integers(1, 8), st.integers(1, 8), st.integers(1, 64), st.integers(1, 256),
    st.integers(1, 1000), st.integers(1, 512),
)
formats = st.sampled_from(["fp32", "fp16", "bf16", "fp8", "int8", "int4"])
counts = st.integers(0, 10_000)


@given(specs, counts, counts, counts, formats)
def test_kv_bytes_are_linear_in_batch_and_seq_len(spec, a, b, seq_len, kv_dtype):
    assert kv_cache_bytes(spec, a + b, seq_len, kv_dtype) == (
        kv_cache_bytes(spec, a, seq_len, kv_dtype) + kv_cache_bytes(spec, b, seq_len, kv_dtype))
    assert kv_cache_bytes(spec, seq_len, a + b, kv_dtype) == (
        kv_cache_bytes(spec, seq_len, a, kv_dtype) + kv_cache_bytes(spec, seq_len, b, kv_dtype))


@given(specs, st.integers(1, 64), st.integers(1, 4096), formats)
def test_mqa_le_gqa_le_mha(spec, batch_size, seq_len, kv_dtype):
    mqa = dataclasses.replace(spec, n_kv_heads=1)
    mha = dataclasses.replace(spec, n_kv_heads=spec.n_heads)
    sizes = [kv_cache_bytes(s, batch_size, seq_len, kv_dtype) for s in (mqa, spec, mha)]
    assert sizes == sorted(sizes)
    assert sizes[2] == sizes[1] * spec.query_per_kv  # GQA saves exactly the group factor


# ----- parameters and weights -----

def test_smollm2_135m_count_is_exact():
    spec = model_preset("SmolLM2-135M")
    assert param_count(spec) == 134_515_008
    assert param_breakdown(spec) == {"embeddings": 28_311_552, "attention": 26_542_080, "mlp": 79_626_240,
                                     "norms": 35_136, "lm_head": 0}


@pytest.mark.parametrize("name", sorted(model_presets()))
def test_architecture_count_reproduces_every_preset(name):
    spec = model_preset(name)
    assert param_count(spec, model_layout(name)) == spec.n_params
    assert model_source(name).startswith("https://huggingface.co/")


def test_pythia_layout_reproduces_the_paper_count_for_pythia_70m():
    # Biderman et al. 2023, table 1: Pythia-70M has 70,426,624 parameters (18,915,328 non-embedding).
    spec = dataclasses.replace(model_preset("Pythia-14M"), d_model=512, n_heads=8, n_kv_heads=8, head_dim=64,
                               d_ff=2048, n_params=None)
    parts = param_breakdown(spec, model_layout("Pythia-14M"))
    assert sum(parts.values()) == 70_426_624
    assert parts["attention"] + parts["mlp"] + parts["norms"] == 18_915_328


def test_12d2_rule_against_the_architecture():
    d4096 = ModelSpec("d4096", n_layers=1, d_model=4096, n_heads=32, n_kv_heads=32, head_dim=128, vocab=1)
    assert params_12d2(d4096) == 201_326_592  # the seed's one-block figure
    # Llama-3-8B: GQA shrinks attention to 2.5 d^2 but the 3.5 d-wide gated MLP is 10.5 d^2: 13 d^2, not 12.
    spec = model_preset("Llama-3-8B")
    parts = param_breakdown(spec)
    assert parts["attention"] + parts["mlp"] == 13 * spec.d_model**2 * spec.n_layers
    assert params_12d2(spec, include_embeddings=True) == 12 * 4096**2 * 32 + 2 * 128_256 * 4096


def test_weights_bytes_by_format():
    spec = model_preset("Llama-3.3-70B")
    assert weights_bytes(spec, "bf16") == 141_107_412_992  # 141.1 GB, 131.4 GiB
    assert weights_bytes(spec, "int4") == 35_276_853_248
    assert weights_bytes(spec, "int4", group_size=128) == 35_276_853_248 + 551_200_832 * 2


# ----- tensor parallelism -----

def test_kv_heads_split_or_replicate_across_ranks():
    spec = model_preset("Llama-3.3-70B")  # 64 query heads, 8 KV heads
    assert [kv_heads_per_rank(spec, tp) for tp in (1, 2, 8, 16, 64)] == [8, 4, 1, 1, 1]
    assert kv_cache_bytes(spec, 1, 32_768, "bf16", tp=8) == 10 * GIB // 8
    assert kv_cache_bytes(spec, 1, 32_768, "bf16", tp=16) == 10 * GIB // 8  # each KV head held twice


def test_tp_replicates_only_norms_for_llama_70b():
    spec = model_preset("Llama-3.3-70B")
    norms = param_breakdown(spec)["norms"]
    assert param_count(spec, tp=8) == 8_820_367_360
    assert param_count(spec, tp=8) * 8 - param_count(spec) == 7 * norms


@given(specs, st.sampled_from([1, 2, 4, 8]))
def test_ranks_hold_at_least_their_share(spec, tp):
    spec = dataclasses.replace(spec, n_heads=8 * spec.n_kv_heads, d_ff=8 * spec.d_ff)  # divisible by tp
    assume(spec.n_kv_heads % tp == 0 if tp <= spec.n_kv_heads else tp % spec.n_kv_heads == 0)
    per_rank, whole = param_count(spec, tp=tp), param_count(spec)
    assert per_rank * tp >= whole
    assert per_rank <= whole


@pytest.mark.parametrize("spec,tp,match", [
    (model_preset("Falcon-7B"), 2, r"tp must divide n_heads \(71\)"),
    (model_preset("Llama-3.3-70B"), 3, r"tp must divide n_heads \(64\)"),
    (ModelSpec("x", n_layers=1, d_model=8, n_heads=12, n_kv_heads=4, head_dim=2, vocab=5), 6,
     r"multiple of it, got 6"),
    (ModelSpec("x", n_layers=1, d_model=8, n_heads=12, n_kv_heads=6, head_dim=2, vocab=5), 4,
     r"divide n_kv_heads \(6\)"),
])
def test_unshardable_tp_is_rejected(spec, tp, match):
    with pytest.raises(ValueError, match=match):
        kv_heads_per_rank(spec, tp)


def test_wrong_layout_for_a_preset_is_caught_when_sharding():
    with pytest.raises(ValueError, match="pass the model's layout"):
        weights_bytes(model_preset("Pythia-14M"), "bf16", tp=2, layout=LLAMA)


# ----- presets, sparsity -----

def test_gpu_presets_hold_the_driver_reading_and_keep_the_vendor_figures():
    gpus = gpu_presets()
    assert set(gpus) == {"T4", "L4", "A100-40GB", "A100-80GB", "H100-SXM", "H200", "RTX-4090", "RTX-A6000"}
    # nvidia-smi's totals in MiB: HBM cards show (about) whole GiB, so their capacity exceeds the datasheet's GB
    readings = {"T4": 15_360, "L4": 23_034, "A100-40GB": 40_960, "A100-80GB": 81_920, "H100-SXM": 81_559,
                "H200": 143_771, "RTX-4090": 24_564, "RTX-A6000": 49_140}
    assert {name: g.memory_bytes // MIB for name, g in gpus.items()} == readings
    assert all(g.memory_bytes % MIB == 0 and g.memory_bytes > g.vendor_memory_bytes for g in gpus.values())
    assert gpu_preset("A100-80GB").memory_bytes == 80 * GIB and gpu_preset("A100-40GB").memory_bytes == 40 * GIB
    assert gpu_preset("h200").vendor_memory_bytes == 141 * GB and gpu_preset("H200").bandwidth_bytes_per_s == 4.8e12
    assert gpu_preset("A100-80GB").vendor_memory == "80 GB HBM2e"
    assert all(g.source.startswith("https://www.nvidia.com/") for g in gpus.values())
    assert all("nvidia-smi" in g.memory_source for g in gpus.values())


def test_falcon_and_qwen_presets_keep_their_odd_shapes():
    falcon, qwen = model_preset("Falcon-7B"), model_preset("Qwen3-0.6B")
    assert (falcon.n_heads, falcon.n_kv_heads, falcon.head_dim) == (71, 1, 64)
    assert qwen.head_dim == 128 != qwen.d_model // qwen.n_heads


def test_2_4_sparse_projection_is_56_percent_of_dense():
    s = sparse_2_4_bytes(4096, 4096, "bf16")
    assert (s.values_bytes, s.metadata_bytes, s.total_bytes, s.dense_bytes) == (
        16_777_216, 2_097_152, 18_874_368, 33_554_432)
    assert s.total_bytes / s.dense_bytes == 0.5625


# ----- errors name the argument, the value and what is accepted -----

@pytest.mark.parametrize("call,error,match", [
    (lambda: bytes_per_value("fp12"), ValueError, r"fmt must be one of \['bf16', .*got 'fp12'"),
    (lambda: kv_cache_bytes(TOY, 1, 8, "e4m3"), ValueError, r"kv_dtype must be one of .*'e4m3'"),
    (lambda: BlockLayout(gated_mlp="yes"), TypeError, r"gated_mlp must be a bool, got 'yes'"),
    (lambda: kv_cache_bytes(TOY, -1, 8), ValueError, r"batch_size must be an int >= 0, got -1"),
    (lambda: kv_cache_bytes(TOY, 1.5, 8), TypeError, r"batch_size must be an int >= 0, got 1.5"),
    (lambda: kv_cache_bytes(TOY, True, 8), TypeError, r"batch_size must be an int >= 0, got True"),
    (lambda: kv_cache_bytes(TOY, "8", 8), TypeError, r"batch_size must be an int >= 0, got '8'"),
    (lambda: bytes_per_value(16), TypeError, r"fmt must be one of \['bf16', .*got 16"),
    (lambda: kv_cache_bytes({"n_layers": 2}, 1, 8), TypeError, r"spec must be a labkit.core.spec.ModelSpec"),
    (lambda: stored_bytes(10, "int4", group_size=0), ValueError, r"group_size must be an int >= 1, got 0"),
    (lambda: param_count(dataclasses.replace(TOY, d_ff=None)), ValueError, r"spec.d_ff is None for 'toy'"),
    (lambda: param_count(TOY, layout="llama"), TypeError, r"layout must be a BlockLayout, got 'llama'"),
    (lambda: sparse_2_4_bytes(4, 6), ValueError, r"cols must be a multiple of 4 .*got 6"),
    (lambda: model_preset("gpt-5"), ValueError, r"name must be one of \['Falcon-7B', .*got 'gpt-5'"),
    (lambda: gpu_preset("V100"), ValueError, r"gpu must be one of \['A100-40GB', .*got 'V100'"),
    (lambda: format_bits("int3", "weight_fmt"), ValueError, r"weight_fmt must be one of .*got 'int3'"),
])
def test_errors_name_argument_value_and_choices(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_block_layout_defaults_are_llama():
    assert LLAMA == BlockLayout(gated_mlp=True, linear_bias=False, norm_bias=False, norms_per_layer=2)


# ----- agreement with transformers -----

def _forward(model_cls, config, batch_size, n_tokens, dtype=None):
    torch = pytest.importorskip("torch")
    from labkit import runtime

    torch.manual_seed(0)
    model = model_cls(config).eval()
    if dtype is not None:
        model = model.to(dtype)
    return model, runtime.prefill(model, torch.randint(0, config.vocab_size, (batch_size, n_tokens))).cache


def test_transformers_llama_cache_matches_formula():
    transformers = pytest.importorskip("transformers")
    import torch

    config = tiny_llama_config()
    spec = ModelSpec.from_config(config, name="tiny-llama")
    model, cache = _forward(transformers.LlamaForCausalLM, config, batch_size=3, n_tokens=7)
    assert cache_bytes(cache) == kv_cache_bytes(spec, 3, 7, "fp32") == 3 * 7 * 2 * 2 * 2 * 16 * 4
    assert param_count(spec) == sum(p.numel() for p in model.parameters())
    decode_one_token(model, torch.randint(0, 100, (3, 1)), cache)  # one decode step adds one token's worth
    assert cache_bytes(cache) == kv_cache_bytes(spec, 3, 8, "fp32")
    _, bf16_cache = _forward(transformers.LlamaForCausalLM, config, 2, 5, dtype=torch.bfloat16)
    assert cache_bytes(bf16_cache) == kv_cache_bytes(spec, 2, 5, "bf16")
    legacy = [(layer.keys, layer.values) for layer in bf16_cache.layers]
    assert cache_bytes(legacy) == kv_cache_bytes(spec, 2, 5, "bf16")


@pytest.mark.parametrize("arch,preset", [("gpt_neox", "Pythia-14M"), ("qwen3", "Qwen3-0.6B")])
def test_transformers_agree_on_other_layouts(arch, preset):
    transformers = pytest.importorskip("transformers")
    if arch == "gpt_neox":
        model_cls, config = transformers.GPTNeoXForCausalLM, transformers.GPTNeoXConfig(
            vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
            tie_word_embeddings=False)
    else:  # head_dim 32 while 64 / 4 = 16, plus q/k norms
        model_cls, config = transformers.Qwen3ForCausalLM, transformers.Qwen3Config(
            vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, intermediate_size=128, tie_word_embeddings=True)
    spec = ModelSpec.from_config(config, name=arch)
    model, cache = _forward(model_cls, config, batch_size=2, n_tokens=5)
    assert param_count(spec, model_layout(preset)) == sum(p.numel() for p in model.parameters())
    assert cache_bytes(cache) == kv_cache_bytes(spec, 2, 5, "fp32")


def test_transformers_falcon_multi_query_cache_and_count():
    transformers = pytest.importorskip("transformers")
    config = transformers.FalconConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       multi_query=True, parallel_attn=True, bias=False,
                                       new_decoder_architecture=False)
    spec = ModelSpec("tiny-falcon", n_layers=2, d_model=64, n_heads=4, n_kv_heads=1, head_dim=16, vocab=100,
                     d_ff=256, tied_embeddings=True)
    model, cache = _forward(transformers.FalconForCausalLM, config, batch_size=2, n_tokens=5)
    assert param_count(spec, model_layout("Falcon-7B")) == sum(p.numel() for p in model.parameters())
    assert cache_bytes(cache) == kv_cache_bytes(spec, 2, 5, "fp32")


def test_from_falcon_config_object_reads_multi_query():
    transformers = pytest.importorskip("transformers")
    config = transformers.FalconConfig(hidden_size=64, num_attention_heads=4, multi_query=True,
                                       new_decoder_architecture=False)
    assert ModelSpec.from_config(config).n_kv_heads == 1
