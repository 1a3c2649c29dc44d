"""The architecture numbers every lab shares, read from a transformers config.

One vocabulary for the whole workbook (docs/DESIGN.md, "One name per kind of thing"): ``n_layers, d_model, n_heads,
n_kv_heads, head_dim, vocab``. ``head_dim`` is always read or given explicitly, never assumed to be
``d_model // n_heads``: some models (Qwen3, Gemma) break that rule, and a KV-cache estimate built on the assumption
is wrong for them.

A config is read for what its KV cache holds, too: layers that attend to a sliding window of tokens only
(Mistral's ``sliding_window`` on every layer; Gemma 2 and 3 alternating sliding and full layers; newer configs
list ``layer_types``) and multi-latent attention (DeepSeek V2/V3: one compressed latent per token instead of
per-head keys and values). What the config describes and this reading does not count (layers that are not
attention, caches shared across layers, an indexer's keys) is written in ``kv_uncounted``, and every KV count of
``labkit.core.memory`` refuses such a spec with that reason, never guesses.

:class:`GPUSpec` stands beside it: a device's memory as the driver reports it (nvidia-smi's total, in bytes), the
vendor's printed figure beside it, and its peak bandwidth (GB and GiB are defined once, in ``labkit.core.resources``).

Used by lab 00 (the model card) and the memory and timing labs (presets of real models and GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from labkit.core.resources import GB, GIB
from labkit.core.validation import integer


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of a decoder-only transformer, as the labs count it.

    >>> spec = ModelSpec("toy", n_layers=2, d_model=8, n_heads=4, n_kv_heads=2, head_dim=2, vocab=10)
    >>> spec.query_per_kv
    2
    """

    name: str  # a label for tables and plots
    n_layers: int  # transformer blocks, each with its own KV cache
    d_model: int  # width of the residual stream
    n_heads: int  # query heads per attention layer
    n_kv_heads: int  # key/value heads per layer (== n_heads for MHA, 1 for MQA)
    head_dim: int  # width of one head; not always d_model // n_heads
    vocab: int  # rows of the embedding matrix
    n_params: int | None = None  # exact count when known (from a loaded model or the publisher)
    d_ff: int | None = None  # width of the feed-forward hidden layer, when known
    tied_embeddings: bool = False  # input embedding and output head share one matrix
    max_position_embeddings: int | None = None  # the configured context limit in tokens, when known
    sliding_window: int | None = None  # tokens a sliding layer attends to, its own included (None: none slides)
    n_sliding_layers: int = 0  # of the n_layers, those that attend to the last sliding_window tokens only
    kv_lora_rank: int | None = None  # multi-latent attention: width of the key/value latent cached per token
    qk_rope_head_dim: int | None = None  # multi-latent attention: width of the rotary key cached beside it
    kv_uncounted: str | None = None  # why this model's KV cache cannot be counted (None: it can)

    def __post_init__(self) -> None:
        for field in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "vocab"):
            integer(field, getattr(self, field), min=1)
        for field in ("max_position_embeddings", "kv_lora_rank", "qk_rope_head_dim"):
            if getattr(self, field) is not None:
                integer(field, getattr(self, field), min=1)
        integer("n_sliding_layers", self.n_sliding_layers, min=0, max=self.n_layers,
                note=f"layers of the {self.n_layers}")
        if (self.sliding_window is None) != (self.n_sliding_layers == 0):
            raise ValueError(f"sliding_window ({self.sliding_window}) and n_sliding_layers ({self.n_sliding_layers}) "
                             "must be given together: a window needs layers that slide it, and the reverse")
        if self.sliding_window is not None:
            # transformers' DynamicSlidingWindowLayer keeps the last window - 1 tokens; a window of 1 would keep all.
            integer("sliding_window", self.sliding_window, min=2, note="tokens, the new one included")
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise ValueError(f"kv_lora_rank ({self.kv_lora_rank}) and qk_rope_head_dim ({self.qk_rope_head_dim}) "
                             "must be given together: multi-latent attention caches both per token")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads}): "
                "each key/value head serves a whole group of query heads"
            )

    @property
    def query_per_kv(self) -> int:
        """Query heads sharing one key/value head (1 = MHA, n_heads = MQA)."""
        return self.n_heads // self.n_kv_heads

    @property
    def latent_attention(self) -> bool:
        """True for multi-latent attention (DeepSeek V2/V3): one latent per token, not per-head keys and values."""
        return self.kv_lora_rank is not None

    @classmethod
    def from_config(cls, config: Any, name: str | None = None, n_params: int | None = None) -> "ModelSpec":
        """Read a spec from a transformers config (or a plain dict with the same keys, such as a config.json).

        Handles the field names of Llama/Mistral/Qwen (``num_hidden_layers``...), GPT-NeoX and Falcon, a
        multimodal config's ``text_config``, sliding windows (:func:`sliding_layers`) and multi-latent attention
        (DeepSeek V2/V3: ``head_dim`` is the query/key head width ``qk_nope_head_dim + qk_rope_head_dim``, and the
        cache holds ``kv_lora_rank + qk_rope_head_dim`` values per token and layer, see
        ``labkit.core.memory.kv_values_per_token``). The context limit is ``max_position_embeddings`` (GPT-2's
        ``n_positions``), None when the config has none. ``n_params`` is counted from the config for a mixture of
        experts or multi-latent attention (:func:`expert_param_count`), which a dense block layout cannot count;
        it stays None when expert_param_count refuses the layout (call it to read why).

        >>> spec = ModelSpec.from_config({"model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32,
        ...     "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 32000, "sliding_window": 4096})
        >>> spec.head_dim, spec.sliding_window, spec.n_sliding_layers
        (128, 4096, 32)
        """
        cfg: Mapping[str, Any] = config if isinstance(config, Mapping) else config.to_dict()
        text = cfg.get("text_config")
        if isinstance(text, Mapping) and not any(k in cfg for k in ("num_hidden_layers", "n_layer")):
            cfg = {"_name_or_path": cfg.get("_name_or_path"), **text}  # Gemma 3 and other multimodal configs

        def first(*keys: str, default: Any = None) -> Any:
            for key in keys:
                if cfg.get(key) not in (None, ""):
                    return cfg[key]
            return default

        d_model = first("hidden_size", "d_model", "n_embd")
        n_heads = first("num_attention_heads", "n_head", "n_heads")
        n_layers = first("num_hidden_layers", "n_layer", "n_layers")
        if d_model is None or n_heads is None or n_layers is None:
            raise ValueError(f"config has no hidden size, head count or layer count: keys are {sorted(cfg)}")
        uncounted = _uncounted(cfg)
        if cfg.get("model_type") == "falcon" or "multi_query" in cfg:
            # Falcon's own rule (modeling_falcon): the new decoder architecture reads num_kv_heads; the original
            # one (Falcon-7B) has a single KV head when multi_query is set, whatever num_kv_heads says.
            if cfg.get("new_decoder_architecture"):
                n_kv_heads = first("num_kv_heads", default=n_heads)
            else:
                n_kv_heads = 1 if cfg.get("multi_query") else n_heads
        else:
            n_kv_heads = first("num_key_value_heads", "num_kv_heads", "n_head_kv", default=n_heads)
        head_dim = first("head_dim", default=d_model // n_heads)
        latent: dict[str, Any] = {}
        if cfg.get("kv_lora_rank") is not None:
            # DeepSeek's configs (and transformers' DeepseekV3Config) set head_dim to qk_rope_head_dim: not the
            # width a head attends with. Every query head has its own key, rebuilt from the latent: n_kv_heads
            # = n_heads in the attention, while the cache holds the latent alone.
            missing = [key for key in ("qk_rope_head_dim", "qk_nope_head_dim") if cfg.get(key) is None]
            if missing:
                raise ValueError(f"config has kv_lora_rank (multi-latent attention) but no {missing}")
            latent = {"kv_lora_rank": cfg["kv_lora_rank"], "qk_rope_head_dim": cfg["qk_rope_head_dim"]}
            head_dim, n_kv_heads = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"], n_heads
        sliding_window, n_sliding = None, 0
        if uncounted is None:
            try:
                sliding_window, n_sliding = sliding_layers(cfg, n_layers)
            except ValueError as error:  # a layer kind not counted: the spec is read, its KV cache refused
                uncounted = str(error)
        return cls(
            name=name or first("_name_or_path", "model_type", default="model"),
            n_layers=n_layers,
            d_model=d_model,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            vocab=first("vocab_size"),
            n_params=n_params if n_params is not None else _counted_params(cfg),
            d_ff=first("intermediate_size", "ffn_hidden_size", "n_inner"),
            tied_embeddings=bool(first("tie_word_embeddings", default=False)),
            max_position_embeddings=first("max_position_embeddings", "n_positions"),
            sliding_window=sliding_window,
            n_sliding_layers=n_sliding,
            kv_uncounted=uncounted,
            **latent,
        )


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


def _uncounted(cfg: Mapping[str, Any]) -> str | None:
    """Why a config's KV cache cannot be counted, or None."""
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


def _counted_params(config: Mapping[str, Any]) -> int | None:
    try:
        return expert_param_count(config)
    except ValueError:  # experts laid out in a way not followed: the spec carries no count, the caller asks why
        return None


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


# The attention what-ifs of the memory lab: the model as built, or its KV heads as MHA, GQA or MQA would have them.
ATTENTION = ("as built", "MHA", "GQA", "MQA")


def with_attention(spec: ModelSpec, attention: str) -> ModelSpec:
    """The spec with its KV heads replaced by an attention what-if; n_params cleared when the shape changes.

    GQA keeps a GQA model as built; for an MHA or MQA model it groups query heads by 4 (n_heads / 4 KV heads).

    >>> spec = ModelSpec("8B-like", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, head_dim=128, vocab=128256)
    >>> [with_attention(spec, a).n_kv_heads for a in ATTENTION]
    [8, 32, 8, 1]
    """
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {ATTENTION}, got {attention!r}")
    if spec.latent_attention and attention != "as built":
        raise ValueError(f"attention what-if {attention!r}: {spec.name} caches one latent per token (multi-latent "
                         "attention), not key/value heads; only 'as built' applies")
    as_built = 1 < spec.n_kv_heads < spec.n_heads
    if attention == "as built" or (attention == "GQA" and as_built):
        return spec
    if attention == "GQA" and spec.n_heads % 4:
        raise ValueError(f"GQA what-if: {spec.n_heads} query heads cannot be grouped by 4")
    n_kv_heads = {"MHA": spec.n_heads, "MQA": 1, "GQA": spec.n_heads // 4}[attention]
    if n_kv_heads == spec.n_kv_heads:
        return spec
    # The k/v projections change size with the KV heads, so the published count no longer applies.
    return replace(spec, n_kv_heads=n_kv_heads, n_params=None)


@dataclass(frozen=True)
class GPUSpec:
    """One GPU's memory (as the driver reports it) and peak bandwidth (as its vendor states it).

    ``memory_bytes`` is the capacity a program can see: nvidia-smi's total, in MiB (2**20 bytes), times 2**20.
    A datasheet's "80 GB" is kept apart in ``vendor_memory`` / ``vendor_memory_bytes``: HBM cards expose about
    80 GiB (85.9 GB) for it, so reading the datasheet as 80 * 10**9 bytes understates them by about 7%.

    >>> GPUSpec("invented", memory_bytes=8 * GIB).memory_gib
    8.0
    >>> a100 = GPUSpec("A100-80GB", memory_bytes=81_920 * 2**20, vendor_memory_bytes=80 * GB)
    >>> a100.memory_gb, round(a100.memory_bytes / a100.vendor_memory_bytes - 1, 4)
    (85.89934592, 0.0737)
    """

    name: str  # a label for tables
    memory_bytes: int  # device memory a program sees: nvidia-smi's total (MiB) x 2**20
    bandwidth_bytes_per_s: float | None = None  # peak memory bandwidth (vendors quote decimal GB/s)
    vendor_memory: str = ""  # the figure as printed on the datasheet, e.g. "80 GB HBM2e"
    source: str = ""  # where the datasheet figures (bandwidth, vendor_memory) come from
    vendor_memory_bytes: int | None = None  # the datasheet's figure read literally (80 GB = 80 * 10**9 bytes)
    memory_source: str = ""  # where memory_bytes comes from (an nvidia-smi reading)

    def __post_init__(self) -> None:
        integer("memory_bytes", self.memory_bytes, min=1)
        if self.vendor_memory_bytes is not None:
            integer("vendor_memory_bytes", self.vendor_memory_bytes, min=1)

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB

    @property
    def memory_gb(self) -> float:
        return self.memory_bytes / GB

    @property
    def memory_mib(self) -> float:
        """The capacity in MiB, as nvidia-smi prints it."""
        return self.memory_bytes / 2**20
