"""Small random causal LMs of several architectures, built locally from their configs (issue #45: "your model").

No test downloads anything: each model is ``AutoConfig.for_model(model_type, ...)`` at a few layers and a small
width, with random weights (seeded), saved with the embedded model's tokenizer into a folder in transformers'
layout (safetensors), so ``load_model(folder)`` reads it as it would a learner's own download. Two of them slide
their attention window (Mistral, Gemma 2) over fewer tokens than a test's prompt, so a cache that keeps only the
window is exercised too.
"""

from __future__ import annotations

from pathlib import Path

import torch

# model_type -> its config's settings beyond the shared small shape (each config's own names)
ARCHITECTURES: dict[str, dict] = {
    "llama": {},
    "qwen2": {},
    "qwen3": {"head_dim": 16},
    "gemma2": {"head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 16},
    "gpt_neox": {},
    "phi3": {},
    "mistral": {"sliding_window": 8},
}
SLIDING = ("gemma2", "mistral")
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 256, "tie_word_embeddings": False}


def tiny_config(model_type: str, vocab_size: int):
    """The config of a small ``model_type`` model (2 layers, width 64, 4 query heads sharing 2 key/value heads)."""
    from transformers import AutoConfig

    settings = {**SMALL, **ARCHITECTURES[model_type], "vocab_size": vocab_size}
    if model_type == "gpt_neox":  # GPT-NeoX has one key/value head per query head and names its MLP width so
        settings.pop("num_key_value_heads")
    config = AutoConfig.for_model(model_type, **settings)
    config.pad_token_id = None
    return config


def save_tiny_model(model_type: str, folder: Path, tokenizer, seed: int = 0) -> Path:
    """A random small ``model_type`` model and ``tokenizer`` saved to ``folder`` (transformers' layout)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    module = AutoModelForCausalLM.from_config(tiny_config(model_type, len(tokenizer)))
    folder.mkdir(parents=True, exist_ok=True)
    module.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


# ---------------------------------------------------------------------------------------------------------------
# The population: every causal LM architecture of the installed transformers, built small by one generic shrinker
# (issue #49). Each setting is applied only where the config class has the field (attribute_map aliases count:
# GPT-2's n_embd is hidden_size), so one table shrinks them all; nothing here is keyed by model_type.

SHRINK = {
    "hidden_size": 64, "d_model": 64, "n_embd": 64, "num_hidden_layers": 2, "num_layers": 2, "n_layer": 2,
    "num_attention_heads": 4, "n_head": 4, "num_key_value_heads": 2, "num_kv_heads": 2, "head_dim": 16,
    "intermediate_size": 128, "ffn_dim": 128, "n_inner": 128, "ffn_hidden_size": 128, "decoder_ffn_dim": 128,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "num_local_experts": 4, "num_experts": 4,
    "n_routed_experts": 4, "moe_num_experts": 4, "num_experts_per_tok": 2, "moe_topk": 2, "top_k": 2,
    "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
    "kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    "max_position_embeddings": 256, "n_positions": 256, "rotary_dim": 8, "partial_rotary_factor": 0.5,
    "decoder_layers": 2, "decoder_attention_heads": 4, "num_decoder_layers": 2,
}


MAX_PARAMS = 12_000_000  # two 49,152 x 64 tables are 6.3M: the rest must be small


class NotBuildable(Exception):
    """An architecture the shrinker cannot build small, with the reason (the sweep lists it)."""


def shrunk_config(model_type: str, vocab_size: int):
    """``model_type``'s config class at its defaults, then every field of :data:`SHRINK` it has, a vocabulary of
    ``vocab_size`` and per-layer lists cut to the layers kept."""
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    config = config_class()
    if any(getattr(config, name, None) is not None for name in ("text_config", "vision_config", "audio_config")):
        raise NotBuildable("a composite config (its text model sits beside a vision or audio tower)")
    for name, value in SHRINK.items():
        current = getattr(config, name, None)
        if current is None or isinstance(current, bool) or not isinstance(current, (int, float)):
            continue
        try:
            setattr(config, name, type(current)(value))
        except AttributeError:  # a derived property (Falcon's head_dim = hidden_size / heads): follows the others
            pass
    config.vocab_size = vocab_size
    n_layers = getattr(config, "num_hidden_layers", 2)
    for name in ("layer_types", "layers_block_type", "block_types", "attn_layer_indices"):
        value = getattr(config, name, None)
        if isinstance(value, (list, tuple)) and len(value) > n_layers and name != "attn_layer_indices":
            setattr(config, name, list(value)[:n_layers])
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not 0 <= value < vocab_size:
            setattr(config, name, None if name == "pad_token_id" else 0)
    if hasattr(config, "tie_word_embeddings"):
        config.tie_word_embeddings = False
    return config


def build_small(model_type: str, vocab_size: int, seed: int, head_scale: float = 100.0) -> torch.nn.Module:
    """A random small ``model_type`` causal LM in eval mode, its output head scaled by ``head_scale`` so that its
    greedy choices are clear (a random model's top two logits lie within a few 1e-4 of each other)."""
    from transformers import AutoModelForCausalLM

    try:
        config = shrunk_config(model_type, vocab_size)
        with torch.device("meta"):  # counted first, without memory: a class whose parts the shrinker misses is listed
            n_params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
        if n_params > MAX_PARAMS:
            raise NotBuildable(f"{n_params / 1e6:.0f}M parameters after shrinking (parts the shrinker does not reach)")
        torch.manual_seed(seed)
        module = AutoModelForCausalLM.from_config(config).eval()
    except NotBuildable:
        raise
    except Exception as error:  # noqa: BLE001 - the sweep lists every reason a class refuses its small config
        raise NotBuildable(f"{type(error).__name__}: {str(error).splitlines()[0][:160]}") from None
    head = module.get_output_embeddings()
    if head is None or not isinstance(getattr(head, "weight", None), torch.Tensor):
        raise NotBuildable("no output embedding (get_output_embeddings() is None)")
    with torch.no_grad():
        head.weight.mul_(head_scale)
    return module
