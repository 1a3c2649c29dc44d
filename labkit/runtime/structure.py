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

A fused projection (GPT-2's ``c_attn``, GPT-NeoX's and Falcon's ``query_key_value``, Phi-3's ``qkv_proj`` and
``gate_up_proj``...) reads one input and writes several outputs side by side; :func:`fused_parts` says which output
rows are each part's (q, k, v or gate, up), with the widths read from the config, and :class:`FusedParts` cuts a
layer's output, weight or bias into them. The order of the parts is code, not data: the same name
``query_key_value`` is ``[q | k | v]`` head by head in GPT-NeoX and key/value group by group in Falcon's new
architecture. So :data:`FUSED_LAYOUTS` names the class whose forward splits the layer, as read in transformers
5.24's modeling files (each checked against that forward by ``tests/test_runtime_structure_fused.py``); a fused
layer of any other class is refused with what was found, never guessed.

Used by activation capture (lab 04, :mod:`labkit.runtime.activations`), the weight formats of any architecture
(lab 06) and early-exit drafts (lab 07). Layer 2 (runtime). Left out: what a family does to a part after the split
(rotary turns, QK norms, a clamp): the parts are the fused layer's own outputs. Fused layers of families not in
the table (DBRX's and MPT's ``Wqkv``, CodeGen's ``qkv_proj``, state-space ``in_proj``s) are refused until read.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

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


# ---------------------------------------------------------------------------------------------------------------
# Fused projections: which output rows are each part's


@dataclass(frozen=True)
class FusedParts:
    """The parts of a fused linear layer: ``rows[part]`` are the part's output rows (of the ``[out, in]`` weight;
    an index tensor, in the order the family's forward reads them: head by head, each head's ``head_dim`` rows)."""

    layer: str  # the layer's name in the model
    layout: str  # how its outputs are laid out, in words
    rows: dict[str, torch.Tensor]  # part ("q", "k", "v", "gate", "up") -> output rows, int64 [part width]

    def split(self, output: torch.Tensor, dim: int = -1) -> dict[str, torch.Tensor]:
        """``output`` (the layer's output, its out width along ``dim``; a bias) cut into its parts."""
        return {part: output.index_select(dim, rows.to(output.device)) for part, rows in self.rows.items()}

    def split_weight(self, linear: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The layer's matrix cut into its parts' ``[part width, in]`` rows (a ``Conv1D``'s transposed first)."""
        return self.split(linear_weight(linear), dim=0)


def _head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _grouped(n_groups: int, slots: list[tuple[str, int]]) -> dict[str, torch.Tensor]:
    """Rows of each part when the outputs are ``n_groups`` groups of ``slots`` (part, width) side by side.

    >>> {part: rows.tolist() for part, rows in _grouped(2, [("q", 2), ("k", 1)]).items()}
    {'q': [0, 1, 3, 4], 'k': [2, 5]}
    """
    group_width = sum(width for _, width in slots)
    rows, offset = {}, 0
    for part, width in slots:
        starts = torch.arange(n_groups) * group_width + offset
        rows[part] = (starts[:, None] + torch.arange(width)).flatten()
        offset += width
    return rows


STACKED = "[q of every head | k of every key/value head | v of every key/value head]"
PER_HEAD = "per head: [q, k, v]"
Layout = tuple[str, dict[str, torch.Tensor]]  # (the layout in words, part -> its output rows)


def stacked_qkv(config: Any, n_kv_heads: int | None = None) -> Layout:
    """All queries, then all keys, then all values; ``n_kv_heads`` defaults to the config's (or one per head)."""
    head_dim = _head_dim(config)
    if n_kv_heads is None:
        n_kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return STACKED, _grouped(1, [("q", config.num_attention_heads * head_dim), ("k", n_kv_heads * head_dim),
                                 ("v", n_kv_heads * head_dim)])


def per_head_qkv(config: Any) -> Layout:
    """The query, key and value of head 0, then of head 1...: the outputs viewed as ``[heads, 3 * head_dim]``."""
    head_dim = _head_dim(config)
    return PER_HEAD, _grouped(config.num_attention_heads, [("q", head_dim), ("k", head_dim), ("v", head_dim)])


def falcon_qkv(config: Any) -> Layout:
    """``FalconAttention._split_heads``: three layouts, told apart by the config."""
    head_dim, n_heads = _head_dim(config), config.num_attention_heads
    if config.new_decoder_architecture:  # per key/value group: its queries, then its key and its value
        n_groups = config.num_kv_heads
        return ("per key/value group: [q of its heads, k, v]",
                _grouped(n_groups, [("q", n_heads // n_groups * head_dim), ("k", head_dim), ("v", head_dim)]))
    if config.multi_query:
        return "[q of every head | one k | one v]", stacked_qkv(config, 1)[1]
    return per_head_qkv(config)


def bigcode_qkv(config: Any) -> Layout:
    """``GPTBigCodeAttention``: one key/value head after all queries (``multi_query``), else head by head."""
    return stacked_qkv(config, 1) if config.multi_query else per_head_qkv(config)


def gate_up(config: Any) -> Layout:
    """The gate's rows, then the up projection's."""
    return "[gate | up]", _grouped(1, [("gate", config.intermediate_size), ("up", config.intermediate_size)])


# (a class whose forward splits the layer, the layer's name) -> its layout from the config. Read in transformers
# 5.24's modeling files; the split each forward makes is in the comment. A class that derives from one of these
# (FalconFlashAttention2, 4.x's GPT2SdpaAttention) splits the same way.
FUSED_LAYOUTS: dict[tuple[str, str], Callable[[Any], Layout]] = {
    ("GPT2Attention", "c_attn"): lambda config: stacked_qkv(config, config.num_attention_heads),  # .split(d_model)
    # .split((embed_dim, kv_dim, kv_dim)) or .view(..., heads, 3 * head_dim).split(3 * [head_dim])
    ("GPTBigCodeAttention", "c_attn"): bigcode_qkv,
    ("GPTNeoXAttention", "query_key_value"): per_head_qkv,  # .view(..., -1, 3 * head_size).chunk(3, dim=-1)
    ("BloomAttention", "query_key_value"): per_head_qkv,  # .view(..., num_heads, 3, head_dim)[..., 0 | 1 | 2, :]
    ("PersimmonAttention", "query_key_value"): per_head_qkv,  # the same view
    ("FalconAttention", "query_key_value"): falcon_qkv,  # _split_heads
    ("Phi3Attention", "qkv_proj"): stacked_qkv,  # qkv[..., :query_pos], then num_key_value_heads * head_dim each
    ("Phi3MLP", "gate_up_proj"): gate_up,  # gate, up = gate_up_proj(x).chunk(2, dim=-1)
    ("GlmMLP", "gate_up_proj"): gate_up,  # the same chunk
    ("Glm4MLP", "gate_up_proj"): gate_up,
}


def fused_parts(lm: Any, layer: str) -> FusedParts:
    """The parts of the fused linear layer named ``layer`` (``"transformer.h.0.attn.c_attn"``), their output rows
    from the model's config and the layout :data:`FUSED_LAYOUTS` holds for the class that holds it (or any class it
    derives from). A layer of a class whose layout labkit has not read, or whose widths disagree with the config,
    is refused with what was found.
    """
    module = module_of(lm)
    try:
        linear = module.get_submodule(layer)
    except AttributeError:
        raise ValueError(f"layer must name a linear layer of the model, got {layer!r}") from None
    if not is_linear(linear):
        raise ValueError(f"layer must name a linear layer of the model, got {layer!r}, a {type(linear).__name__}")
    parent_name, _, leaf = layer.rpartition(".")
    owner = module.get_submodule(parent_name) if parent_name else module
    layout = next((FUSED_LAYOUTS[key] for cls in type(owner).__mro__ if (key := (cls.__name__, leaf)) in
                   FUSED_LAYOUTS), None)
    width = linear_weight(linear).shape[0]
    if layout is None:
        known = ", ".join(f"{owner_class}.{name}" for owner_class, name in FUSED_LAYOUTS)
        raise ValueError(f"layer must be a fused layer whose layout labkit has read ({known}), got {layer!r}: "
                         f"{type(owner).__name__}.{leaf}, {width} outputs, in an order labkit does not know")
    config = getattr(module, "config", None)
    if config is None:
        raise ValueError(f"lm must carry its config (the widths of {layer!r}'s parts are read there), got a "
                         f"{type(module).__name__} without one")
    words, rows = layout(config)
    widths = {part: len(part_rows) for part, part_rows in rows.items()}
    if sum(widths.values()) != width or not torch.equal(torch.cat(list(rows.values())).sort().values,
                                                        torch.arange(width)):
        raise ValueError(f"layer {layer!r} has {width} outputs, but its config gives its parts {widths} "
                         f"({sum(widths.values())} in all)")
    return FusedParts(layer, words, rows)
