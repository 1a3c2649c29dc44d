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
