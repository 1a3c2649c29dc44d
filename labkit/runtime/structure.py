"""A causal LM's structure read from its module tree: the decoder blocks, the linear layers in each, and their roles.

Nothing here is keyed by ``config.model_type``. The blocks are the module's ``ModuleList`` of one entry per hidden
layer (:func:`layer_names`); the linear layers of a block are every ``torch.nn.Linear`` and every transformers
``Conv1D`` under it (GPT-2's ``c_attn``, a Linear stored transposed), in the block's module order
(:func:`block_linears`). A linear layer's role (which input it reads: the normalized residual entering attention,
attention's output, the MLP's input, the MLP's hidden) is named where its name is known across families
(:data:`ROLE_NAMES`: Llama's ``q_proj``, GPT-2's ``c_attn``, GPT-NeoX's ``query_key_value``, Phi-3's fused
``qkv_proj`` and ``gate_up_proj``, OPT's ``fc1``...) and is "linear k" where it is not: the layer is still found,
captured and quantized, only its role is not claimed. A model is refused only when there is nothing to read: no
repeated blocks, or no linear layer in them; the refusal says what was found.

Used by activation capture (lab 04, :mod:`labkit.runtime.activations`), the weight formats of any architecture
(lab 06) and early-exit drafts (lab 07). Layer 2 (runtime). Left out: output
projections split into their parts (a fused q/k/v matrix reads one input, which is what a capture keeps).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

# A linear layer's name (its last component) -> the input it reads, in the outlier visualizer's words. "dense" and
# "c_proj" are attention's output projection under an attention module and the MLP's second matrix under an MLP.
QKV, O, GATE_UP, DOWN = "q/k/v_proj input", "o_proj input", "gate/up_proj input", "down_proj input"
ROLE_NAMES = {
    QKV: ("q_proj", "k_proj", "v_proj", "qkv_proj", "c_attn", "query_key_value", "Wqkv", "W_pack", "qkv",
          "query", "key", "value", "q_attn", "in_proj", "q_a_proj", "kv_a_proj_with_mqa", "wq", "wk", "wv"),
    O: ("o_proj", "out_proj", "wo", "attn_out"),
    GATE_UP: ("gate_proj", "up_proj", "gate_up_proj", "c_fc", "dense_h_to_4h", "fc1", "fc_in", "w1", "w3",
              "c_fc2", "c_fc1"),
    DOWN: ("down_proj", "dense_4h_to_h", "fc2", "fc_out", "w2", "c_proj2"),
}
ATTENTION_WORDS = ("attn", "attention", "mixer")
MLP_WORDS = ("mlp", "ffn", "feed_forward", "moe")


def module_of(lm: Any) -> torch.nn.Module:
    """The torch module of a LoadedModel, or the module itself."""
    module = lm if isinstance(lm, torch.nn.Module) else getattr(lm, "model", None)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"lm must be a LoadedModel or a torch.nn.Module, got {type(lm).__name__}")
    return module


def is_linear(module: torch.nn.Module) -> bool:
    """A ``torch.nn.Linear`` or a transformers ``Conv1D`` (GPT-2's linear layer, its weight stored ``[in, out]``)."""
    if isinstance(module, torch.nn.Linear):
        return True
    pytorch_utils = sys.modules.get("transformers.pytorch_utils")  # a transformers model means it is imported
    return pytorch_utils is not None and isinstance(module, pytorch_utils.Conv1D)


def linear_weight(module: torch.nn.Module) -> torch.Tensor:
    """The layer's matrix as ``[out, in]`` (a ``Conv1D``'s ``[in, out]`` transposed; a view, nothing copied).

    >>> linear_weight(torch.nn.Linear(3, 2)).shape
    torch.Size([2, 3])
    """
    return module.weight if isinstance(module, torch.nn.Linear) else module.weight.t()


def _hidden_layers(config: Any) -> int | None:
    for name in ("num_hidden_layers", "n_layer", "num_layers", "n_layers"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def layer_names(lm: Any) -> list[str]:
    """Names of the decoder blocks, in order; their outputs are the residual stream after each layer.

    The blocks are the ``ModuleList`` with one entry per hidden layer (``config.num_hidden_layers``; without a
    config, the longest list), the one holding the most weights when several match: ``model.layers.<i>`` in
    Llama, ``transformer.h.<i>`` in GPT-2, ``gpt_neox.layers.<i>`` in GPT-NeoX, ``layers.<i>`` in labkit's own
    decoder. Refused, with the lists found, when there is none.

    >>> net = torch.nn.Module(); net.blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2)] * 3)
    >>> layer_names(net)
    ['blocks.0', 'blocks.1', 'blocks.2']
    """
    module = module_of(lm)
    n_layers = _hidden_layers(getattr(module, "config", None))
    lists = [(name, child) for name, child in module.named_modules() if isinstance(child, torch.nn.ModuleList)
             and len(child) > 0]
    matching = [(name, child) for name, child in lists if n_layers is None or len(child) == n_layers]
    if not matching:
        found = ", ".join(f"{name} ({len(child)})" for name, child in lists[:6]) or "none"
        raise ValueError(f"lm must be a model with a ModuleList of its {n_layers or 'repeated'} decoder blocks; "
                         f"{type(module).__name__} has the ModuleLists {found}")
    if n_layers is None:
        longest = max(len(child) for _, child in matching)
        matching = [(name, child) for name, child in matching if len(child) == longest]
    name, _ = max(matching, key=lambda pair: sum(p.numel() for p in pair[1].parameters()))
    return [f"{name}.{index}" for index in range(n_layers or len(module.get_submodule(name)))]


def block_linears(lm: Any, block: str) -> list[str]:
    """Names of the linear layers inside block ``block`` (relative to it), in the block's module order."""
    module = module_of(lm).get_submodule(block)
    return [name for name, child in module.named_modules() if name and is_linear(child)]


def role(relative_name: str) -> str | None:
    """The input a linear layer reads, from its name inside a block (:data:`ROLE_NAMES`), or None when unknown.

    >>> role("self_attn.q_proj"), role("attn.c_proj"), role("mlp.c_proj"), role("mlp.router")
    ('q/k/v_proj input', 'o_proj input', 'down_proj input', None)
    """
    parts = relative_name.split(".")
    leaf, parents = parts[-1], [part.lower() for part in parts[:-1]]
    for name, leaves in ROLE_NAMES.items():
        if leaf in leaves:
            return name
    if leaf in ("dense", "c_proj", "proj"):
        if any(word in part for part in parents for word in ATTENTION_WORDS):
            return O
        if any(word in part for part in parents for word in MLP_WORDS):
            return DOWN
    return None


def describe_block(lm: Any, block: str) -> str:
    """What a block holds, one line: its class and its children's (for a refusal that says what was found)."""
    module = module_of(lm).get_submodule(block)
    children = ", ".join(f"{name}: {type(child).__name__}" for name, child in module.named_children())
    return f"{block} is a {type(module).__name__} ({children or 'no children'})"
