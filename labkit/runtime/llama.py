"""labkit's own Llama forward: the embedded model's decode step in a page of torch, at the memory floor.

The same arithmetic as transformers' ``LlamaForCausalLM`` (a test holds the logits within float32's rounding and the
greedy tokens identical), written the way pytorch-labs/gpt-fast's ``model.py`` writes it: the weights, then a block
= RMSNorm -> grouped-query attention with the rotary embedding -> residual -> RMSNorm -> SwiGLU MLP -> residual,
then the final norm and the output head tied to the embedding. Why a second forward: a decode step of this 135M
model reads 538 MB of FP32 weights, about 18 ms at 29 GB/s, and transformers' general-purpose forward spends about
as long again on Python and small operations (mask and cache bookkeeping, hooks, output objects). This one does
only the arithmetic, keeps a static KV cache allocated once (:class:`KVCache`: a decode step writes one row, nothing
is concatenated), stacks each layer's query, key and value matrices into one product and its gate and up matrices
into another (four products a layer where transformers runs seven), holds FP32 and BF16 matrices packed once for
oneDNN, and can hold its weights in BF16, INT8 or INT4 (:mod:`labkit.runtime.weight_formats`). What a step costs
beyond its products (norms, rotary turn, attention over one query, the cache write: about 5,000 operator calls,
5 to 7 ms on a 2-core CPU) is measured per operator by ``python -m benchmarks decode``.

The runtime decodes a plain Llama through it (``runtime.forward`` with a cache, hence ``generate``, the timing
harness, batching, speculative decoding and its drafters): :class:`LlamaDecoder`, this forward's implementation of
:class:`labkit.runtime.decoder.Decoder`, is chosen once, when the model loads (:func:`choose_decoder`), and held on
the LoadedModel (``lm.decoder``, named by ``lm.forward_name``); ``with_forward(lm, "transformers")`` gives the same
model on transformers' forward. Passes without a cache (scoring a text, capturing activations) and hooked or
edited models stay on transformers. :func:`decoder` gives a LoadedModel that decodes in a chosen weight format.

Left out: sliding windows, rope scaling beyond the model's own ``inv_freq``, biases, tensor parallelism,
``torch.compile`` (measured on the INT4 decoder, 2-core AMD EPYC: 1.25x faster a step, but its first call takes
about 60 s with an empty inductor cache and 9 s with a warm one, and Colab starts every session empty).
Layer: runtime. Used by labs 06 and 07 (and every lab
that generates).
"""

from __future__ import annotations

import copy
import dataclasses
import weakref
from typing import Any, Iterator

import torch
import torch.nn.functional as F

from labkit.core import validation
from labkit.runtime.decoder import TRANSFORMERS, Decoder, is_plain_llama
from labkit.runtime.kv_cache import KVCache, new_capacity
from labkit.runtime.structure import module_of
from labkit.runtime.weight_formats import FORMATS, bf16_fallback_reason, compute_dtype, make_linear, weight_bytes


class RMSNorm(torch.nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` (Zhang and Sennrich 2019), torch's own kernel: float32 inside."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.register_buffer("weight", weight, persistent=False)  # [d_model]
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding (Su et al. 2021): each pair (x_i, x_{i + head_dim/2}) turned by its position's angle,
    in the half-split layout of transformers' Llama. ``x`` ``[batch, heads, seq_len, head_dim]``.

    The pair's new first half is x_i cos - x_{i+half} sin and its second x_{i+half} cos + x_i sin: ``x.roll(half)``
    brings each partner in place and ``sin`` carries the minus sign on its first half (:meth:`Llama.__init__`).
    """
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin)


class Attention(torch.nn.Module):
    """Grouped-query attention: ``n_heads`` query heads share ``n_kv_heads`` key/value heads, read from the cache.

    ``qkv_proj`` is the query, key and value matrices stacked (``[(n_heads + 2 n_kv_heads) head_dim, d_model]``):
    one product per layer reads the input once and launches one kernel where three would (measured with the fused
    gate/up product and the one rotary call below: 2 to 3 ms less per INT8 or INT4 step on a 2-core CPU)."""

    def __init__(self, qkv, o, n_heads: int, n_kv_heads: int, head_dim: int):
        super().__init__()
        self.qkv_proj, self.o_proj = qkv, o
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim

    def forward(self, x, cos, sin, mask, cache: KVCache, layer: int) -> torch.Tensor:
        batch_size, seq_len, _ = x.shape
        n_heads, n_kv_heads = self.n_heads, self.n_kv_heads
        heads = self.qkv_proj(x).view(batch_size, seq_len, n_heads + 2 * n_kv_heads, self.head_dim).transpose(1, 2)
        turned = rotate(heads[:, :n_heads + n_kv_heads], cos, sin)  # queries and keys, turned in one call
        q, k, v = turned[:, :n_heads], turned[:, n_heads:], heads[:, n_heads + n_kv_heads:]
        keys, values = cache.write(layer, k, v)  # [batch, n_kv_heads, cached + seq_len, head_dim]
        # enable_gqa: each key/value head serves n_heads / n_kv_heads query heads, without copying it that often
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        return self.o_proj(y.transpose(1, 2).reshape(batch_size, seq_len, self.n_heads * self.head_dim))


class MLP(torch.nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``, the gate and up matrices stacked into one product."""

    def __init__(self, gate_up, down, intermediate_size: int):
        super().__init__()
        self.gate_up_proj, self.down_proj, self.intermediate_size = gate_up, down, intermediate_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Block(torch.nn.Module):
    def __init__(self, attention: Attention, mlp: MLP, attention_norm: RMSNorm, mlp_norm: RMSNorm):
        super().__init__()
        self.attention, self.mlp, self.attention_norm, self.mlp_norm = attention, mlp, attention_norm, mlp_norm

    def forward(self, x, cos, sin, mask, cache: KVCache, layer: int) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, mask, cache, layer)
        return h + self.mlp(self.mlp_norm(h))


class Llama(torch.nn.Module):
    """A Llama decoder built from a transformers ``LlamaForCausalLM``'s weights, in one weight format.

    ``forward(token_ids, cache)`` runs ``token_ids`` (``[batch, seq_len]``) after what ``cache`` holds, grows the
    cache in place and returns float32 logits ``[batch, keep, vocab]`` for the last ``keep`` positions. ``config``
    is the source model's (so code reading ``lm.model.config`` still works).
    """

    def __init__(self, module: torch.nn.Module, weights: str = "fp32", n_layers: int | None = None):
        super().__init__()
        validation.choice("weights", weights, FORMATS)
        config, body = module.config, module.model
        self.config, self.weights, self.dtype = config, weights, compute_dtype(weights)
        total = len(body.layers)
        self.n_layers = validation.integer("n_layers", total if n_layers is None else n_layers, min=1, max=total)
        n_heads, n_kv_heads = config.num_attention_heads, config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
        self.n_kv_heads, self.head_dim = n_kv_heads, head_dim
        # The embedding lookup reads one row of the loaded table per token (shared, never copied); the head multiplies
        # by the whole matrix, in the chosen format (a packed copy in FP32 where oneDNN packs, else the table itself).
        self.register_buffer("table", body.embed_tokens.weight.detach(), persistent=False)  # [vocab, d_model]
        # INT4 keeps the head in INT8: its rounding errors go straight into every logit (llama.cpp's 4-bit files
        # keep their output matrix at 6 bits for the same reason)
        self.head = make_linear(module.lm_head.weight, "int8" if weights == "int4" else weights)
        def norm(source: torch.nn.Module) -> RMSNorm:
            return RMSNorm(source.weight.detach().to(self.dtype), source.variance_epsilon)

        def linear(*sources: torch.nn.Linear) -> torch.nn.Module:  # one matrix, or several stacked by output rows
            stacked = sources[0].weight if len(sources) == 1 else torch.cat([s.weight for s in sources])
            return make_linear(stacked.detach(), weights)

        self.layers = torch.nn.ModuleList(
            Block(Attention(linear(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
                            linear(layer.self_attn.o_proj), n_heads, n_kv_heads, head_dim),
                  MLP(linear(layer.mlp.gate_proj, layer.mlp.up_proj), linear(layer.mlp.down_proj),
                      config.intermediate_size),
                  norm(layer.input_layernorm), norm(layer.post_attention_layernorm))
            for layer in list(body.layers)[:self.n_layers])
        self.norm = norm(body.norm)
        # The rotary angles of every position, once: position p turns pair i by p * inv_freq[i] (the source model's
        # own inv_freq, so its rope settings carry over), as transformers computes them, in float32.
        rotary = body.rotary_emb
        positions = torch.arange(config.max_position_embeddings, dtype=torch.float32)
        angles = torch.outer(positions, rotary.inv_freq.float())  # [max_positions, head_dim / 2]
        angles = torch.cat([angles, angles], dim=-1)
        scaling = float(getattr(rotary, "attention_scaling", 1.0))
        half = angles.shape[-1] // 2
        signed = torch.cat([-angles[:, :half].sin(), angles[:, half:].sin()], dim=-1)  # rotate()'s minus sign
        self.register_buffer("cos", (angles.cos() * scaling).to(self.dtype), persistent=False)
        self.register_buffer("sin", (signed * scaling).to(self.dtype), persistent=False)

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one decode step reads: every block's matrices and norms, the final norm and the head,
        each once (the embedding table only as the head it is tied to; a step reads one row of it for the lookup,
        and one row of each rotary table)."""
        return weight_bytes(torch.nn.ModuleList([self.layers, self.norm, self.head]))

    def truncated(self, n_layers: int) -> "Llama":
        """The first ``n_layers`` blocks, then the final norm and head, sharing every weight (an early-exit draft)."""
        n_layers = validation.integer("n_layers", n_layers, min=1, max=self.n_layers,
                                      note=f"the decoder has {self.n_layers} blocks")
        draft = copy.copy(self)
        draft._modules = dict(self._modules)  # a new module table: this decoder keeps all its blocks
        draft.layers = torch.nn.ModuleList(list(self.layers)[:n_layers])
        draft.n_layers = n_layers
        return draft

    def new_cache(self, batch_size: int, capacity: int) -> KVCache:
        """An empty static cache for ``batch_size`` sequences of up to ``capacity`` tokens (it grows if needed)."""
        return KVCache(self.n_layers, batch_size, self.n_kv_heads, self.head_dim, capacity, self.dtype,
                       self.cos.device)

    def forward(self, token_ids: torch.Tensor, cache: KVCache, *, keep: int = 1,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None
                ) -> torch.Tensor:
        batch_size, seq_len = token_ids.shape
        start = cache.length
        cache.reserve(seq_len, attention_mask)
        if position_ids is None:
            position_ids = torch.arange(start, start + seq_len, device=token_ids.device).expand(batch_size, -1)
        cos = self.cos[position_ids].unsqueeze(1)  # [batch, 1, seq_len, head_dim]: one angle per position
        sin = self.sin[position_ids].unsqueeze(1)
        mask = cache.attention_mask(seq_len)  # None for one token without padding: it sees every cached key
        x = F.embedding(token_ids, self.table).to(self.dtype)  # [batch, seq_len, d_model]
        for index, block in enumerate(self.layers):
            x = block(x, cos, sin, mask, cache, index)
        cache.advance(seq_len)
        x = self.norm(x[:, seq_len - keep:])
        return self.head(x).float()  # [batch, keep, vocab]


# ---------------------------------------------------------------------------------------------------------------
# Which forward decodes a model: a Decoder chosen once, when it loads, and held on the LoadedModel


class LlamaDecoder(Decoder):
    """labkit's readable forward (:class:`Llama`), for a plain transformers Llama
    (:func:`labkit.runtime.decoder.is_plain_llama`).

    A model that stops being plain after it loaded (hooked by a capture, cast, edited) is not read by it: its
    passes run on transformers' forward, which calls the hooks and reads the edits, until it is plain again.
    """

    name = "labkit"

    def runs_on(self, module: torch.nn.Module) -> Llama | None:
        return shared_decoder(module) if is_plain_llama(module) else None

    def cut(self, module: torch.nn.Module, n_layers: int) -> Llama | None:
        return shared_decoder(module).truncated(n_layers) if is_plain_llama(module) else None

    def in_format(self, lm: Any, weights: str) -> Any:
        """A :class:`Llama` in ``weights`` (FP32: the runtime's own, :func:`shared_decoder`; the others quantized
        once, here); a model that is not a plain Llama gets transformers' formats."""
        validation.choice("weights", weights, FORMATS)
        module = lm.model
        if not is_plain_llama(module):
            return TRANSFORMERS.in_format(lm, weights)
        llama = shared_decoder(module) if weights == "fp32" else Llama(module, weights)
        note = f"labkit's Llama forward, {weights} weights"
        if weights == "bf16" and (reason := bf16_fallback_reason()) is not None:
            note += f" on torch's plain bfloat16 matmul, which repacks each matrix at every call: {reason}"
            print(f"BF16: {note}.")  # a learner comparing formats on such a machine must know its BF16 is not packed
        return dataclasses.replace(lm, model=llama, notes=[*lm.notes, note], decoder=self)


LABKIT = LlamaDecoder()
DECODERS = {decoder.name: decoder for decoder in (LABKIT, TRANSFORMERS)}
FORWARDS = tuple(DECODERS)


def choose_decoder(module: torch.nn.Module) -> Decoder:
    """:data:`LABKIT` for labkit's own :class:`Llama` or a plain transformers Llama, else :data:`TRANSFORMERS`:
    what ``load_model`` holds as the model's ``decoder``."""
    return LABKIT if isinstance(module, Llama) or is_plain_llama(module) else TRANSFORMERS


def choose_forward(module: torch.nn.Module) -> str:
    """The name of :func:`choose_decoder`'s choice, ``"labkit"`` or ``"transformers"`` (a LoadedModel's
    ``forward_name``)."""
    return choose_decoder(module).name


def decoder_of(lm: Any) -> Decoder:
    """The decoder ``lm`` holds; an object holding a module without one (a test's stand-in) gets the decoder
    ``load_model`` would choose for its module."""
    held = getattr(lm, "decoder", None)
    return held if isinstance(held, Decoder) else choose_decoder(module_of(lm))


def with_forward(lm: Any, name: str) -> Any:
    """The same LoadedModel (its module, tokenizer and weights shared) decoding through ``name``'s forward
    (:data:`DECODERS`): ``"transformers"`` always runs; ``"labkit"`` runs where the module is a plain Llama
    (elsewhere transformers' forward still runs: labkit's reads a Llama's weights only)."""
    validation.choice("name", name, FORWARDS)
    if isinstance(lm.model, Llama) and name != LABKIT.name:
        raise ValueError(f"name must be {LABKIT.name!r} for a LoadedModel holding labkit's {lm.model.weights} "
                         f"decoder (only labkit's forward runs it), got {name!r}")
    return dataclasses.replace(lm, decoder=DECODERS[name])


_decoders: "weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple, Llama]]" = weakref.WeakKeyDictionary()
_is_plain_llama = is_plain_llama  # the name tests/conftest.py reads


def _fingerprint(module: torch.nn.Module) -> tuple:
    """Where every weight lives: a reassigned or moved tensor (``.to(device)``, a misaligned copy) changes it."""
    return tuple(p.data_ptr() for p in module.parameters())


def shared_decoder(module: torch.nn.Module) -> Llama:
    """The FP32 :class:`Llama` of a transformers module (built once per module and kept while its weights stay
    where they are: it holds its own packed copy of them, 538 MB for the embedded model)."""
    fingerprint = _fingerprint(module)
    known = _decoders.get(module)
    if known is None or known[0] != fingerprint:
        known = (fingerprint, Llama(module, "fp32"))
        _decoders[module] = known
    return known[1]


def decoder_for(lm: Any, module: torch.nn.Module, cache: Any, use_cache: bool) -> Llama | None:
    """The labkit decoder a pass runs on, or None for transformers' forward.

    A labkit module always runs itself; a labkit cache continues on the decoder that filled it. A new cached pass
    of a LoadedModel runs on what its decoder says (:meth:`Decoder.runs_on`); a bare transformers module and a
    pass without a cache run transformers'.
    """
    if isinstance(module, Llama):
        return module
    if isinstance(cache, KVCache):
        return shared_decoder(module)
    if cache is None and use_cache and not isinstance(lm, torch.nn.Module):
        return decoder_of(lm).runs_on(module)
    return None


def early_exit(lm: Any, n_layers: int) -> Llama | None:
    """labkit's decoder of ``lm`` cut after ``n_layers`` blocks when ``lm`` decodes through it, else None (the
    caller then cuts the transformers module)."""
    module = module_of(lm)
    if isinstance(module, Llama):
        return module.truncated(n_layers)
    return None if isinstance(lm, torch.nn.Module) else decoder_of(lm).cut(module, n_layers)


def decoder(lm: Any, weights: str = "fp32") -> Any:
    """A LoadedModel that decodes in the weight format ``weights`` (``"fp32"``, ``"bf16"``, ``"int8"``,
    ``"int4"``): the same tokenizer and spec; its ``model.weight_bytes`` the bytes a decode step reads.

    The format is the one of ``lm``'s own decoder (:meth:`Decoder.in_format`): a plain Llama on labkit's forward
    decodes on a :class:`Llama` (every pass, cached or not, runs it; FP32 is :func:`shared_decoder`'s); any other
    model, and a Llama put on transformers' forward (:func:`with_forward`), decodes on transformers' forward with
    every linear layer in the format (:func:`labkit.runtime.formatted.in_format`).
    """
    validation.choice("weights", weights, FORMATS)
    module = lm.model
    if isinstance(module, Llama):
        raise TypeError(f"lm must be a LoadedModel of a transformers Llama (as load_model() returns), got one "
                        f"already holding labkit's {module.weights} decoder")
    if not isinstance(module, torch.nn.Module) or not hasattr(module, "config"):
        raise TypeError(f"lm must be a LoadedModel of a transformers causal LM (as load_model() returns), got one "
                        f"holding {type(module).__name__}")
    return decoder_of(lm).in_format(lm, weights)


def run(llama: Llama, token_ids: torch.Tensor, cache: KVCache | None, positions: str | int, use_cache: bool,
        attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None
        ) -> tuple[torch.Tensor, KVCache | None]:
    """``runtime.forward``'s pass on labkit's decoder: (float32 logits as ``positions`` asks, the grown cache).

    ``cache=None`` starts a cache sized by :func:`labkit.runtime.kv_cache.new_capacity`; ``use_cache=False`` runs
    on a throwaway cache of exactly the tokens given and returns None for it.
    """
    batch_size, seq_len = token_ids.shape
    if cache is None:
        cache = llama.new_cache(batch_size, new_capacity(seq_len) if use_cache else seq_len)
    elif not isinstance(cache, KVCache):
        raise TypeError(f"cache must be the KVCache labkit's decoder returned, got {type(cache).__name__} (a cache "
                        "filled by one forward continues on that forward)")
    keep = 1 if positions == "last" else seq_len if positions == "all" else positions
    logits = llama(token_ids, cache, keep=keep, attention_mask=attention_mask, position_ids=position_ids)
    return (logits[:, -1] if positions == "last" else logits), (cache if use_cache else None)
