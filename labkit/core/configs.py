"""What a transformers config says beyond ModelSpec's numbers: which layers slide a window, what a mixture of
experts or a latent attention weighs, and what labkit cannot count (and why).

``labkit.core.spec.ModelSpec.from_config`` reads a config through these rules, each written as transformers'
config classes and modeling files (5.x) apply it, so a prediction made from a config.json equals what the model
transformers builds from it holds (tests/test_kv_prediction_any_model.py). Used by the memory lab's explorer on any
model. Left out: state-space and linear-attention layers, caches shared across layers, a sparse-attention indexer's
keys (named and refused), and the weights of expert layouts other than DeepSeek's, Mixtral's and Qwen3-MoE's.
"""

from __future__ import annotations

from typing import Any, Mapping


# Config keys of layers or caches this reading does not count, and why (each refused rather than guessed).
_UNCOUNTED = {
    "layers_block_type": "state-space (Mamba) layers keep a state, not a KV cache",
    "hybrid_override_pattern": "state-space (Mamba) layers keep a state, not a KV cache",
    "num_kv_shared_layers": "some layers reuse another layer's KV cache",
    "kv_sharing_modes": "some layers reuse another layer's KV cache",
    "index_head_dim": "the sparse-attention indexer caches keys of its own",
}
# Window patterns transformers' configs fill in when a config.json gives no layer_types: a layer i slides when
# (i + 1) % pattern != 0 (Gemma2Config, Gemma3TextConfig's sliding_window_pattern, Cohere2Config, GptOssConfig).
_PATTERNS = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6, "cohere2": 4, "gpt_oss": 2}


def uncounted_reason(cfg: Mapping[str, Any]) -> str | None:
    """Why a config's KV cache cannot be counted, or None when it can (its layer types aside: sliding_layers).

    >>> uncounted_reason({"num_kv_shared_layers": 20}).split(": ")[1]
    "some layers reuse another layer's KV cache, which labkit does not count"
    >>> uncounted_reason({"model_type": "llama"}) is None
    True
    """
    for key, why in _UNCOUNTED.items():
        if cfg.get(key) not in (None, 0, [], ""):
            return f"config of {cfg.get('model_type', 'this model')!r} has {key}: {why}, which labkit does not count"
    if cfg.get("use_bidirectional_attention"):
        return "config has use_bidirectional_attention: an encoder, not a causal LM with a KV cache"
    return None


def sliding_layers(config: Mapping[str, Any], n_layers: int) -> tuple[int | None, int]:
    """(sliding_window, how many of the n_layers slide it) from a config dict, as transformers decides it.

    ``layer_types`` when the config lists them ("sliding_attention" / "full_attention"; Llama 4's
    "chunked_attention" keeps ``attention_chunk_size`` tokens the same way); otherwise the family's rule, as
    transformers' config classes fill it in: Qwen2/Qwen3 slide only with ``use_sliding_window`` and only from layer
    ``max_window_layers`` on; Gemma 2, Gemma 3, Cohere 2 and gpt-oss alternate; any other config with a
    ``sliding_window`` slides it on every layer (Mistral, Phi-3). Any other layer type is refused.

    >>> sliding_layers({"model_type": "gemma2", "sliding_window": 4096}, 42)
    (4096, 21)
    >>> sliding_layers({"model_type": "qwen2", "sliding_window": 32768, "use_sliding_window": False}, 28)
    (None, 0)
    """
    window = config.get("sliding_window")
    if config.get("use_sliding_window") is False:
        window = None  # Qwen2Config and Qwen3Config drop the window when use_sliding_window is off
    layer_types = config.get("layer_types")
    if layer_types is None:
        if window is None:
            return None, 0
        model_type = config.get("model_type")
        if "use_sliding_window" in config:  # Qwen2/Qwen3: the layers from max_window_layers on slide
            n_sliding = max(n_layers - config.get("max_window_layers", 28), 0)
        elif model_type in _PATTERNS:
            pattern = config.get("sliding_window_pattern", _PATTERNS[model_type])
            n_sliding = sum(1 for i in range(n_layers) if (i + 1) % pattern)
        else:
            n_sliding = n_layers
        return (window, n_sliding) if n_sliding else (None, 0)
    if len(layer_types) != n_layers:
        raise ValueError(f"config's layer_types lists {len(layer_types)} layers, num_hidden_layers is {n_layers}")
    windows = {"sliding_attention": window, "chunked_attention": config.get("attention_chunk_size")}
    unknown = sorted(set(layer_types) - {"full_attention", *windows})
    if unknown:
        raise ValueError(f"config's layer_types has {unknown}: labkit counts the KV cache of full_attention, "
                         "sliding_attention and chunked_attention layers only (other layers keep other state)")
    used = {windows[kind] for kind in layer_types if kind in windows}
    if None in used or len(used) > 1:
        raise ValueError(f"config's layer_types slide windows {sorted(map(str, used))}: labkit counts one window "
                         "size, given as sliding_window (or attention_chunk_size)")
    n_sliding = sum(kind in windows for kind in layer_types)
    return (used.pop(), n_sliding) if n_sliding else (None, 0)


# Families whose mixture-of-experts or latent-attention weights expert_param_count follows (their modeling files).
_COUNTED_EXPERTS = ("deepseek_v2", "deepseek_v3", "mixtral", "qwen3_moe")


def expert_param_count(config: Mapping[str, Any]) -> int | None:
    """Parameters transformers builds for a mixture-of-experts or multi-latent-attention config; None for a dense
    model with standard attention (``labkit.core.memory.param_count`` counts those from a block layout).

    Counted for DeepSeek V2/V3 (latent attention; ``first_k_dense_replace`` dense layers, then routed and shared
    experts), Mixtral and Qwen3-MoE (every layer's MLP is a router and its experts); RMSNorm everywhere, no biases.
    Buffers (DeepSeek-V3's router score bias) are not parameters. Any other such config is refused with the reason.

    >>> expert_param_count({"model_type": "mixtral", "hidden_size": 4, "num_attention_heads": 2,
    ...     "num_key_value_heads": 1, "num_hidden_layers": 1, "vocab_size": 10, "intermediate_size": 8,
    ...     "num_local_experts": 2})  # 2 x 40 embeddings, 4 x 4 x 2 + 4 x 2 x 2 attention, 2 x 96 + 8 MLP, 12 norms
    340
    """
    cfg = config
    n_experts = next((cfg[key] for key in ("n_routed_experts", "num_local_experts", "num_experts") if cfg.get(key)), 0)
    latent = cfg.get("kv_lora_rank") is not None
    if not n_experts and not latent:
        return None
    model_type = cfg.get("model_type")
    needed = ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size"]
    needed += ["kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"] if latent else []
    missing = [key for key in needed if cfg.get(key) is None]
    if missing:
        raise ValueError(f"config of {model_type!r} has experts or latent attention but no {missing}")
    if model_type not in _COUNTED_EXPERTS or cfg.get("attention_bias") or cfg.get("moe_layer_freq", 1) != 1 \
            or cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
        raise ValueError(f"config of {model_type!r} has experts or latent attention laid out in a way labkit does not "
                         f"count; its weights are counted for {list(_COUNTED_EXPERTS)} as transformers builds them")
    d, n_layers, n_heads = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    if latent:
        qk_head_dim, rank = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"], cfg.get("q_lora_rank")
        query = d * n_heads * qk_head_dim if rank is None else d * rank + rank + rank * n_heads * qk_head_dim
        attention = (query + d * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) + cfg["kv_lora_rank"]  # + its norm
                     + cfg["kv_lora_rank"] * n_heads * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"])
                     + n_heads * cfg["v_head_dim"] * d)
    else:
        head_dim = cfg.get("head_dim") or d // n_heads
        n_kv_heads = cfg.get("num_key_value_heads") or n_heads
        attention = 2 * d * n_heads * head_dim + 2 * d * n_kv_heads * head_dim
        attention += 2 * head_dim if model_type == "qwen3_moe" else 0  # q and k norms
    expert_width = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    shared = cfg.get("n_shared_experts") or 0
    moe_mlp = n_experts * 3 * d * expert_width + n_experts * d + shared * 3 * d * expert_width  # experts, router
    n_dense = cfg.get("first_k_dense_replace", 0) if n_experts else n_layers
    dense_mlp = 3 * d * cfg["intermediate_size"]
    embeddings = cfg["vocab_size"] * d * (1 if cfg.get("tie_word_embeddings") else 2)
    return (embeddings + d + n_layers * (attention + 2 * d) + n_dense * dense_mlp
            + (n_layers - n_dense) * moe_mlp)
