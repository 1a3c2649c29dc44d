"""Predict, then measure: labkit's byte counts equal the bytes the embedded model really holds.

The embedded SmolLM2-135M-Instruct runs in FP32 (4-byte elements) with grouped-query attention (9 query heads,
3 KV heads of width 64, 30 layers), so every token it caches holds 2 x 30 x 3 x 64 x 4 = 46,080 bytes.
"""

import pytest
import torch

from labkit.core.memory import kv_bytes_per_token, kv_cache_bytes, param_breakdown, param_count, params_12d2, weights_bytes
from labkit.runtime import cache_bytes, decode_one_token, prefill
from labkit.core.presets import model_preset


def _prefill(embedded, batch_size, n_tokens, seed=0):
    generator = torch.Generator().manual_seed(seed)
    token_ids = torch.randint(0, embedded.spec.vocab, (batch_size, n_tokens), generator=generator)  # [batch, seq_len]
    return token_ids, prefill(embedded, token_ids).cache


@pytest.mark.parametrize("batch_size,n_tokens", [(1, 1), (1, 17), (2, 64), (3, 5), (4, 128)])
def test_kv_cache_after_prefill_is_exactly_the_prediction(embedded, batch_size, n_tokens):
    _, cache = _prefill(embedded, batch_size, n_tokens)
    assert cache_bytes(cache) == kv_cache_bytes(embedded.spec, batch_size, n_tokens, "fp32")


def test_every_layer_holds_keys_and_values_of_the_kv_heads_only(embedded):
    _, cache = _prefill(embedded, 2, 9)
    spec = embedded.spec
    assert len(cache.layers) == spec.n_layers
    for layer in cache.layers:
        for tensor in (layer.keys, layer.values):  # [batch, n_kv_heads, seq_len, head_dim], not n_heads
            assert tuple(tensor.shape) == (2, spec.n_kv_heads, 9, spec.head_dim)
            assert tensor.dtype == torch.float32
    assert kv_bytes_per_token(spec, "fp32") == 46_080


def test_each_decode_step_adds_one_token_per_sequence(embedded):
    token_ids, cache = _prefill(embedded, 2, 10)
    for step in range(1, 4):
        cache = decode_one_token(embedded, token_ids[:, -1:], cache).cache
        assert cache_bytes(cache) == kv_cache_bytes(embedded.spec, 2, 10 + step, "fp32")


def test_weight_bytes_are_the_sum_over_loaded_parameters(embedded):
    params = list(embedded.model.parameters())  # a tied matrix appears once
    assert sum(p.numel() * p.element_size() for p in params) == weights_bytes(embedded.spec, "fp32") == 538_060_032
    assert sum(p.numel() for p in params) == param_count(embedded.spec) == embedded.spec.n_params


def test_architecture_count_by_part_matches_the_modules(embedded):
    parts = param_breakdown(embedded.spec)
    named = dict(embedded.model.named_parameters())
    attention = sum(p.numel() for n, p in named.items() if ".self_attn." in n)
    mlp = sum(p.numel() for n, p in named.items() if ".mlp." in n)
    assert (parts["attention"], parts["mlp"]) == (attention, mlp)
    assert parts["embeddings"] == embedded.model.get_input_embeddings().weight.numel()


def test_12_d2_rule_against_the_real_model(embedded):
    spec = embedded.spec
    blocks = param_count(spec) - param_breakdown(spec)["embeddings"]
    # 12 d^2 x 30 = 119,439,360 against 106,203,456 real: GQA shrinks k/v and the MLP is 2.67 d, not 4 d wide.
    assert params_12d2(spec) == 119_439_360 and blocks == 106_203_456
    assert params_12d2(spec, include_embeddings=True) == 119_439_360 + 28_311_552


def test_embedded_spec_is_the_preset(embedded):
    assert embedded.spec == model_preset("SmolLM2-135M-Instruct")
