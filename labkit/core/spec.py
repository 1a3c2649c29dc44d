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

from labkit.core.configs import expert_param_count, sliding_layers, uncounted_reason
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
        multimodal config's ``text_config``, sliding windows (``labkit.core.configs.sliding_layers``) and
        multi-latent attention (DeepSeek V2/V3: ``head_dim`` is the query/key head width ``qk_nope_head_dim +
        qk_rope_head_dim``, and the cache holds ``kv_lora_rank + qk_rope_head_dim`` values per token and layer,
        see ``labkit.core.memory.kv_values_per_token``). The context limit is ``max_position_embeddings`` (GPT-2's
        ``n_positions``), None when the config has none. ``n_params`` is counted from the config for a mixture of
        experts or multi-latent attention (``labkit.core.configs.expert_param_count``), which a dense block layout
        cannot count; it stays None when expert_param_count refuses the layout (call it to read why).

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
        uncounted = uncounted_reason(cfg)
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
            if cfg.get("model_type") not in LATENT_CACHES and uncounted is None:
                uncounted = (f"multi-latent attention of {cfg.get('model_type')!r}: what its transformers cache holds "
                             f"is checked for {list(LATENT_CACHES)} only")
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
            d_ff=mlp_width(cfg, d_model),
            tied_embeddings=bool(first("tie_word_embeddings", default=False)),
            max_position_embeddings=first("max_position_embeddings", "n_positions"),
            sliding_window=sliding_window,
            n_sliding_layers=n_sliding,
            kv_uncounted=uncounted,
            **latent,
        )


# Where each family writes its MLP's width (Llama's intermediate_size, Falcon's ffn_hidden_size, GPT-2's n_inner,
# OPT's ffn_dim), and the families whose MLP is 4 x d_model when the field is unset or absent: GPT-2, GPT-J,
# GPT-Neo and CodeGen leave n_inner None for it (their modeling: inner_dim = n_inner or 4 * hidden_size), Falcon its
# ffn_hidden_size, and BLOOM has no field at all (BloomMLP: 4 * hidden_size).
MLP_WIDTH_FIELDS = ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim", "decoder_ffn_dim")
FOUR_TIMES_WIDTH = ("gpt2", "gptj", "gpt_neo", "codegen", "falcon", "bloom", "gpt_bigcode")


def mlp_width(cfg: Mapping[str, Any], d_model: int) -> int | None:
    """The MLP's hidden width from a config (:data:`MLP_WIDTH_FIELDS`), the family's 4 x ``d_model`` default
    where it has one (:data:`FOUR_TIMES_WIDTH`), else None.

    >>> mlp_width({"model_type": "gpt2", "n_inner": None}, 768), mlp_width({"ffn_dim": 3072}, 768)
    (3072, 3072)
    """
    for key in MLP_WIDTH_FIELDS:
        if isinstance(cfg.get(key), int):
            return cfg[key]
    return 4 * d_model if cfg.get("model_type") in FOUR_TIMES_WIDTH else None


# Latent-attention families whose transformers cache holds the latent and the rotary key alone (modeling_deepseek_v2
# and _v3, 5.x: cache.update(latent, rotary key); tests/test_kv_prediction_any_model.py measures both).
LATENT_CACHES = ("deepseek_v2", "deepseek_v3")


def _counted_params(config: Mapping[str, Any]) -> int | None:
    try:
        return expert_param_count(config)
    except ValueError:  # experts laid out in a way not followed: the spec carries no count, the caller asks why
        return None


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
