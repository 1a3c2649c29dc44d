"""The KV-cache bytes predicted from a config equal a real model's cache, byte for byte, on every test architecture.

Each model of tests/any_models.py (and small DeepSeek-V2 and V3, whose multi-latent attention caches a latent) is built
in-process from its config with random weights, runs a prompt through ``labkit.runtime.forward.prefill`` and one
decode step, and its cache is measured by ``labkit.runtime.cache.cache_bytes`` (the tensors' storage). The
prediction is ``labkit.core.memory.kv_cache_bytes`` of the spec read from the model's config object and from the
config.json it saves (what the memory explorer reads). Prompts of 5, 7, 8 and 20 tokens straddle the window of 8
that Mistral (every layer), Gemma 2 (every other layer), Gemma 3, gpt-oss, Qwen2 and Cohere 2 slide: transformers
keeps window - 1 = 7 tokens.
"""

import json

import pytest
import torch

from any_models import ARCHITECTURES, SLIDING, tiny_config
from labkit.core.memory import kv_cache_bytes
from labkit.core.spec import ModelSpec
from labkit.runtime.cache import cache_bytes, cache_length
from labkit.runtime.forward import decode_one_token, prefill

VOCAB = 97
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def deepseek_v2_config():
    """A three-layer DeepSeek-V2 (no query compression, two shared experts): latent 16, rotary key 8, 4 heads."""
    from transformers import AutoConfig

    return AutoConfig.for_model(
        "deepseek_v2", vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=2, first_k_dense_replace=1, n_group=1, topk_group=1, max_position_embeddings=256)


def deepseek_v3_config():
    """A two-layer DeepSeek-V3 (one dense layer, one of four experts): latent 16, rotary key 8, 4 heads."""
    from transformers import AutoConfig

    return AutoConfig.for_model(
        "deepseek_v3", vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1, max_position_embeddings=256)


# More ways to slide a window, each as its config class lays the layers out (beyond tests/any_models.py's two):
# Gemma 3 (five sliding layers, then a full one), gpt-oss (alternating, with experts), Qwen2 with its window on
# from layer max_window_layers, Cohere 2 (three sliding, then a full one).
SMALL = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 256, "sliding_window": 8}
MORE_SLIDING = {
    "gemma3_text": {"num_hidden_layers": 6, "head_dim": 16, "query_pre_attn_scalar": 16},
    "gpt_oss": {"num_hidden_layers": 4, "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2": {"num_hidden_layers": 4, "use_sliding_window": True, "max_window_layers": 1},
    "cohere2": {"num_hidden_layers": 4},
}


def build(model_type: str, kv_dtype: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    if model_type.startswith("deepseek"):
        config = deepseek_v3_config() if model_type == "deepseek_v3" else deepseek_v2_config()
    elif model_type.endswith(" (sliding)"):
        family = model_type.removesuffix(" (sliding)")
        config = AutoConfig.for_model(family, **SMALL, **MORE_SLIDING[family])
    else:
        config = tiny_config(model_type, VOCAB)
    torch.manual_seed(0)
    module = AutoModelForCausalLM.from_config(config).eval()
    return module.to(DTYPES[kv_dtype])


def saved_config(module, folder) -> dict:
    """The config.json the model saves, read back as a plain dict (no transformers defaults filled in)."""
    module.config.save_pretrained(folder)
    return json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize("kv_dtype", sorted(DTYPES))
@pytest.mark.parametrize("model_type", [*ARCHITECTURES, "deepseek_v2", "deepseek_v3",
                                        *(f"{f} (sliding)" for f in MORE_SLIDING)])
def test_predicted_kv_bytes_equal_the_real_cache(model_type, kv_dtype, tmp_path):
    module = build(model_type, kv_dtype)
    specs = [ModelSpec.from_config(module.config), ModelSpec.from_config(saved_config(module, tmp_path))]
    generator = torch.Generator().manual_seed(1)
    for prompt_len in (5, 7, 8, 20):
        token_ids = torch.randint(0, VOCAB, (2, prompt_len), generator=generator)
        _, cache = prefill(module, token_ids)
        measured = [cache_bytes(cache)]
        _, cache = decode_one_token(module, token_ids[:, -1:], cache)
        measured.append(cache_bytes(cache))
        assert cache_length(cache) == prompt_len + 1
        for spec in specs:
            predicted = [kv_cache_bytes(spec, 2, n, kv_dtype) for n in (prompt_len, prompt_len + 1)]
            assert predicted == measured, (model_type, prompt_len)


def test_the_sliding_models_really_keep_fewer_tokens_than_the_prompt():
    # Without this, a prediction that ignored the window would pass the test above on the sliding models.
    for model_type in (*SLIDING, *(f"{family} (sliding)" for family in MORE_SLIDING)):
        module = build(model_type, "fp32")
        _, cache = prefill(module, torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(2)))
        kept = [layer.keys.shape[-2] for layer in cache.layers]
        spec = ModelSpec.from_config(module.config)
        assert min(kept) == 7 < 20 and kept.count(7) == spec.n_sliding_layers
        full_attention = kv_cache_bytes(ModelSpec.from_config({**module.config.to_dict(), "sliding_window": None,
                                                               "layer_types": None}), 1, 20, "fp32")
        assert cache_bytes(cache) < full_attention


def test_by_hand_the_tiny_models_hold_what_the_formula_says():
    # 2 sequences x 20 tokens, float32 (4 B), 2 layers of 2 KV heads x 16: 2 (K, V) x 2 x 20 x 2 x 2 x 16 x 4.
    full = 2 * 2 * 20 * 2 * 2 * 16 * 4
    expected = {"llama": full, "gpt_neox": 2 * full,  # GPT-NeoX: a KV head per query head (4)
                "mistral": full * 7 // 20,  # both layers keep the last 7 tokens
                "gemma2": full // 2 + full // 2 * 7 // 20,  # layer 0 slides, layer 1 keeps all
                "deepseek_v3": 2 * 20 * 2 * (16 + 8) * 4}  # one latent (16) and one rotary key (8) per token
    for model_type, n_bytes in expected.items():
        _, cache = prefill(build(model_type, "fp32"),
                           torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(3)))
        assert cache_bytes(cache) == n_bytes, model_type
