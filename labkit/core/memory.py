"""How many bytes a model stores at inference: its weights and its KV cache, counted exactly.

Used by the memory lab. Every size is an int number of bytes unless the name says otherwise (``*_gb``,
``*_gib``). GB (10**9: vendors' memory sizes and GB/s) and GiB (2**30: what nvidia-smi and torch.cuda
report) are defined once, in ``labkit.core.resources``, and re-exported here. Equation numbers are those of the
course's chapter on inference: (8.2) about 12 d^2 parameters per block, (8.3) KV bytes = 2 x B x T x L x H_kv x d_h x b.

Weights and KV cache are exact counts of the stored payload (the tests check them against transformers'
real tensors), sliding-window layers and multi-latent attention included (``ModelSpec.from_config`` reads them
and refuses what it cannot count). Left out: cross-layer KV sharing, vocabulary padding and the scales of a
quantized KV cache. The front of a weights file (a safetensors header, Pythia's file rebuilt from its shape) is
``labkit.core.weights_file``. One GPU's whole budget (activation and workspace estimates, what fits, the largest batch
or context) is ``labkit.core.budget``; presets of real models and GPUs ``labkit.core.presets``; paged KV allocation
``labkit.core.paging``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.core.resources import GB, GIB, MIB  # defined once for the whole workbook
from labkit.core.spec import ModelSpec
from labkit.core.validation import boolean, choice, instance, integer, real


# Bits per stored value. INT4 packs two values per byte; quantization scales are counted separately.
FORMAT_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4}


def _spec(spec: Any) -> ModelSpec:
    return instance("spec", spec, ModelSpec, "a labkit.core.spec.ModelSpec")


def format_bits(fmt: Any, name: str = "fmt") -> int:
    """Bits per stored value of a format name (case-insensitive), validated; name is the caller's argument.

    >>> format_bits("BF16"), format_bits("int4", "kv_dtype")
    (16, 4)
    """
    if not isinstance(fmt, str) or fmt.lower() not in FORMAT_BITS:
        choice(name, fmt, sorted(FORMAT_BITS))  # not a known name (any case): raises the shared message
    return FORMAT_BITS[fmt.lower()]


def to_gb(n_bytes: float) -> float:
    """Bytes to decimal gigabytes (10**9).

    >>> to_gb(8_589_934_592)
    8.589934592
    """
    real("n_bytes", n_bytes, finite=False)
    return n_bytes / GB


def to_gib(n_bytes: float) -> float:
    """Bytes to binary gibibytes (2**30).

    >>> to_gib(8_589_934_592)
    8.0
    """
    real("n_bytes", n_bytes, finite=False)
    return n_bytes / GIB


def bytes_per_value(fmt: str) -> float:
    """Bytes one stored value takes in a format (case-insensitive name).

    >>> bytes_per_value("bf16"), bytes_per_value("int4")
    (2.0, 0.5)
    """
    return format_bits(fmt) / 8


def stored_bytes(n_values: int, fmt: str, group_size: int | None = None, scale_bytes: int = 2) -> int:
    """Bytes to store n_values in fmt, plus scale_bytes per group of group_size values when given.

    The count is rounded up twice on purpose: a trailing half-byte of INT4 still takes a byte, and a last,
    partial group still needs its own scale (ceil(n_values / group_size) scales). Real kernels group along
    each row; the two agree when the row length is a multiple of group_size, as in every preset.
    scale_bytes is the per-group metadata (an FP16 scale is 2; add 2 more if the scheme keeps a zero-point).

    >>> stored_bytes(2**20, "int4", group_size=64) / MIB  # 0.5 MiB of codes + 16,384 two-byte scales
    0.53125
    """
    n_values, bits = integer("n_values", n_values, min=0), format_bits(fmt)
    payload = -(-n_values * bits // 8)
    if group_size is None:
        return payload
    n_groups = -(-n_values // integer("group_size", group_size, min=1))
    return payload + n_groups * integer("scale_bytes", scale_bytes, min=0)


@dataclass(frozen=True)
class BlockLayout:
    """What a block stores beyond ModelSpec's numbers; the defaults are Llama's (also Mistral, SmolLM2)."""

    gated_mlp: bool = True  # SwiGLU gate, up and down matrices; False: up and down only (GPT-NeoX, Falcon)
    linear_bias: bool = False  # every projection in the block has a bias (GPT-NeoX)
    norm_bias: bool = False  # LayerNorm with weight and bias; False: RMSNorm, weight only
    norms_per_layer: int = 2  # Falcon-7B's parallel attention+MLP block has a single input norm
    qk_norm: bool = False  # Qwen3: an RMSNorm of width head_dim on queries and on keys
    qkv_bias: bool = False  # Qwen2: the q, k and v projections (only they) have a bias

    def __post_init__(self) -> None:
        for name in ("gated_mlp", "linear_bias", "norm_bias", "qk_norm", "qkv_bias"):
            boolean(name, getattr(self, name))
        integer("norms_per_layer", self.norms_per_layer, min=0)


LLAMA = BlockLayout()


def kv_heads_per_rank(spec: ModelSpec, tp: int = 1) -> int:
    """KV heads one of tp tensor-parallel ranks holds.

    Query heads are split evenly, so tp must divide n_heads. When tp <= n_kv_heads it must divide them too;
    when tp > n_kv_heads each rank keeps one KV head and every KV head is copied to tp // n_kv_heads ranks,
    as vLLM's QKVParallelLinear does (tp must then be a multiple of n_kv_heads).

    >>> spec = ModelSpec("toy", n_layers=1, d_model=8, n_heads=8, n_kv_heads=2, head_dim=1, vocab=10)
    >>> kv_heads_per_rank(spec, 2), kv_heads_per_rank(spec, 8)
    (1, 1)
    """
    spec, tp = _spec(spec), integer("tp", tp, min=1)
    if spec.n_heads % tp:
        raise ValueError(f"tp must divide n_heads ({spec.n_heads}) so every rank gets whole heads, got {tp}")
    if tp <= spec.n_kv_heads:
        if spec.n_kv_heads % tp:
            raise ValueError(f"tp must divide n_kv_heads ({spec.n_kv_heads}) or be a multiple of it, got {tp}")
        return spec.n_kv_heads // tp
    if tp % spec.n_kv_heads:
        raise ValueError(f"tp above n_kv_heads ({spec.n_kv_heads}) must be a multiple of it, got {tp}")
    return 1


def check_shardable(spec: ModelSpec, layout: BlockLayout, tp: int) -> int:
    """Validate what a per-rank architecture count needs (layout, d_ff, tp); return this rank's KV heads.

    >>> spec = ModelSpec("toy", n_layers=1, d_model=4, n_heads=2, n_kv_heads=1, head_dim=2, vocab=10, d_ff=8)
    >>> check_shardable(spec, LLAMA, tp=2)
    1
    """
    kv_heads = kv_heads_per_rank(spec, tp)
    instance("layout", layout, BlockLayout, "a BlockLayout")
    if spec.d_ff is None:
        raise ValueError(f"spec.d_ff is None for {spec.name!r}: this count needs the MLP width, and its config has "
                         "none of intermediate_size, ffn_hidden_size, n_inner, ffn_dim, decoder_ffn_dim")
    if spec.d_ff % tp:
        raise ValueError(f"tp must divide d_ff ({spec.d_ff}), got {tp}")
    return kv_heads


def param_breakdown(spec: ModelSpec, layout: BlockLayout = LLAMA, tp: int = 1) -> dict[str, int]:
    """Parameters by part that one of tp ranks holds, counted from the architecture.

    Sharded Megatron-style: embeddings and head by vocabulary rows (ceil(vocab / tp) each), q/o by query
    heads, k/v by KV heads (copied when tp > n_kv_heads), MLP by d_ff. Replicated on every rank: norms and
    the biases of the o and down projections, whose outputs are summed across ranks.

    >>> spec = ModelSpec("toy", n_layers=1, d_model=4, n_heads=2, n_kv_heads=1, head_dim=2, vocab=10, d_ff=8)
    >>> param_breakdown(spec)  # q,o 4x4; k,v 4x2; gate,up,down 4x8; two norms + final norm of 4
    {'embeddings': 40, 'attention': 48, 'mlp': 96, 'norms': 12, 'lm_head': 40}
    """
    kv_heads = check_shardable(spec, layout, tp)
    d, ff = spec.d_model, spec.d_ff // tp
    q_width = spec.n_heads // tp * spec.head_dim  # this rank's query heads: q's output, o's input
    kv_width = kv_heads * spec.head_dim
    n_mlp = 3 if layout.gated_mlp else 2
    attention = 2 * d * q_width + 2 * d * kv_width + layout.linear_bias * (q_width + 2 * kv_width + d)
    attention += layout.qkv_bias * (q_width + 2 * kv_width)
    mlp = n_mlp * d * ff + layout.linear_bias * ((n_mlp - 1) * ff + d)
    norm = d * (2 if layout.norm_bias else 1)
    per_layer_norms = layout.norms_per_layer * norm + layout.qk_norm * 2 * spec.head_dim
    rows = -(-spec.vocab // tp)
    return {
        "embeddings": rows * d,
        "attention": spec.n_layers * attention,
        "mlp": spec.n_layers * mlp,
        "norms": spec.n_layers * per_layer_norms + norm,  # + the final norm before the head
        "lm_head": 0 if spec.tied_embeddings else rows * d,
    }


def param_count(spec: ModelSpec, layout: BlockLayout = LLAMA, tp: int = 1) -> int:
    """Parameters one of tp ranks holds (the whole model at tp=1), counted from the architecture.

    >>> spec = ModelSpec("SmolLM2-135M", n_layers=30, d_model=576, n_heads=9, n_kv_heads=3, head_dim=64,
    ...                  vocab=49152, d_ff=1536, tied_embeddings=True)
    >>> param_count(spec)  # 49152*576 + 30*(2*576*576 + 2*576*192 + 3*576*1536 + 2*576) + 576
    134515008
    """
    return sum(param_breakdown(spec, layout, tp).values())


def params_12d2(spec: ModelSpec, include_embeddings: bool = False) -> int:
    """The rule of thumb of eq. 8.2: 12 d_model^2 per block (4 d^2 attention + 8 d^2 MLP), times n_layers.

    >>> spec = ModelSpec("d4096", n_layers=1, d_model=4096, n_heads=32, n_kv_heads=32, head_dim=128, vocab=1)
    >>> params_12d2(spec)
    201326592
    """
    spec = _spec(spec)
    blocks = 12 * spec.d_model**2 * spec.n_layers
    if not include_embeddings:
        return blocks
    return blocks + spec.vocab * spec.d_model * (1 if spec.tied_embeddings else 2)


def weights_count(spec: ModelSpec, tp: int = 1, layout: BlockLayout = LLAMA) -> int:
    """How many weights one of tp ranks stores: spec.n_params at tp=1 when known, else param_count's share.

    At tp > 1 the share comes from param_count, which must then reproduce spec.n_params (pass the model's
    layout).

    >>> spec = ModelSpec("toy", n_layers=1, d_model=4, n_heads=2, n_kv_heads=1, head_dim=2, vocab=10,
    ...                  n_params=1000)
    >>> weights_count(spec)
    1000
    """
    spec, tp = _spec(spec), integer("tp", tp, min=1)
    if tp == 1 and spec.n_params is not None:
        return spec.n_params
    if spec.n_params is not None and param_count(spec, layout) != spec.n_params:
        raise ValueError(
            f"layout={layout} counts {param_count(spec, layout):,} parameters but spec.n_params is "
            f"{spec.n_params:,}: pass the model's layout (labkit.core.presets.model_layout for a preset)"
        )
    return param_count(spec, layout, tp)


def weights_bytes(spec: ModelSpec, fmt: str = "bf16", group_size: int | None = None, scale_bytes: int = 2,
                  *, tp: int = 1, layout: BlockLayout = LLAMA) -> int:
    """Bytes of the weights one of tp ranks stores in fmt, with one scale per group when group_size is given.

    The count is :func:`weights_count` (spec.n_params at tp=1 when known, else param_count's share).

    >>> spec = ModelSpec("toy", n_layers=1, d_model=4, n_heads=2, n_kv_heads=1, head_dim=2, vocab=10,
    ...                  n_params=1000)
    >>> weights_bytes(spec, "int4"), weights_bytes(spec, "int4", group_size=100)  # 500 + 10 scales of 2 B
    (500, 520)
    """
    return stored_bytes(weights_count(spec, tp, layout), fmt, group_size, scale_bytes)


def kv_values_per_token(spec: ModelSpec, tp: int = 1) -> int:
    """Values one token adds to one layer's KV cache on one of tp ranks: 2 (K and V) x KV heads x head_dim.

    Multi-latent attention (DeepSeek V2/V3, arXiv:2405.04434 section 2.1) caches instead one latent of
    kv_lora_rank values and one rotary key of qk_rope_head_dim values, shared by every head; tensor-parallel
    ranks each hold all of it (vLLM replicates the latent). transformers 5.x caches exactly these two tensors
    (modeling_deepseek_v3: the latent as the "key", the rotary key as the "value", one head each) and rebuilds
    the per-head keys and values from them at every step: 576 values per token and layer for DeepSeek-V3, where
    its 128 heads of 192-wide keys and 128-wide values would take 40,960.

    >>> spec = ModelSpec("8B-like", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, head_dim=128, vocab=1)
    >>> kv_values_per_token(spec), kv_values_per_token(spec, tp=4)
    (2048, 512)
    """
    spec = _spec(spec)
    if spec.kv_uncounted is not None:
        raise ValueError(f"{spec.name}'s KV cache is not counted: {spec.kv_uncounted}")
    if spec.latent_attention:
        integer("tp", tp, min=1)
        return spec.kv_lora_rank + spec.qk_rope_head_dim
    # head_dim and n_kv_heads, never d_model / n_heads: that is the MHA-only shortcut the seeds got wrong.
    return 2 * kv_heads_per_rank(spec, tp) * spec.head_dim


def kv_bytes_per_token(spec: ModelSpec, kv_dtype: str = "bf16", tp: int = 1) -> int:
    """KV-cache bytes one token adds on one of tp ranks while every layer keeps it: n_layers x
    :func:`kv_values_per_token` x b (2 x n_layers x KV heads x head_dim x b without multi-latent attention).

    A sliding layer stops keeping tokens past its window: :func:`kv_cache_bytes` counts that.

    >>> spec = ModelSpec("8B-like", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, head_dim=128, vocab=1)
    >>> kv_bytes_per_token(spec, "fp16")  # 2 * 32 * 8 * 128 * 2 = 128 KiB
    131072
    """
    n_values = spec.n_layers * kv_values_per_token(spec, tp)
    return -(-n_values * format_bits(kv_dtype, "kv_dtype") // 8)  # INT4: a last half byte takes a byte


def cached_tokens(spec: ModelSpec, seq_len: int) -> tuple[int, int]:
    """(tokens a full layer holds, tokens a sliding layer holds) after seq_len tokens went through the model.

    A sliding layer attends to its last sliding_window tokens, the new one included, so between steps it keeps
    sliding_window - 1 of them: transformers' DynamicSlidingWindowLayer (5.x) slices its keys to
    ``[-sliding_window + 1:]`` after every update (during a pass the whole prompt's keys exist for a moment).
    A static cache (StaticSlidingWindowLayer) allocates sliding_window slots instead, a paged engine whole
    blocks covering the window, and a cache with past recording on (to roll back rejected draft tokens) holds the
    whole pass until it is cropped.

    >>> spec = ModelSpec("toy", n_layers=2, d_model=8, n_heads=2, n_kv_heads=1, head_dim=4, vocab=10,
    ...                  sliding_window=8, n_sliding_layers=1)
    >>> cached_tokens(spec, 5), cached_tokens(spec, 20)
    ((5, 5), (20, 7))
    """
    spec, seq_len = _spec(spec), integer("seq_len", seq_len, min=0)
    if spec.sliding_window is None:
        return seq_len, seq_len
    return seq_len, min(seq_len, spec.sliding_window - 1)


def kv_cache_bytes(spec: ModelSpec, batch_size: int, seq_len: int, kv_dtype: str = "bf16", tp: int = 1) -> int:
    """KV-cache bytes (eq. 8.3) for batch_size sequences of seq_len tokens, on one of tp ranks, as held between
    steps: 2 x B x T x L x H_kv x d_h x b, with T capped at sliding_window - 1 on the n_sliding_layers that slide
    (:func:`cached_tokens`) and 2 x H_kv x d_h replaced by the latent under multi-latent attention
    (:func:`kv_values_per_token`).

    >>> spec = ModelSpec("8B-like", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, head_dim=128, vocab=1)
    >>> kv_cache_bytes(spec, batch_size=16, seq_len=4096, kv_dtype="fp16") / GIB  # the worked example
    8.0
    """
    batch_size, seq_len = integer("batch_size", batch_size, min=0), integer("seq_len", seq_len, min=0)
    full_tokens, sliding_tokens = cached_tokens(spec, seq_len)
    layer_tokens = (spec.n_layers - spec.n_sliding_layers) * full_tokens + spec.n_sliding_layers * sliding_tokens
    n_values = batch_size * layer_tokens * kv_values_per_token(spec, tp)
    return -(-n_values * format_bits(kv_dtype, "kv_dtype") // 8)


@dataclass(frozen=True)
class Sparse24Bytes:
    """Storage of a matrix pruned to 2:4 sparsity, part by part, in bytes."""

    values_bytes: int  # the kept half of the values
    metadata_bytes: int  # a 2-bit position (0-3) for every kept value
    dense_bytes: int  # the same matrix stored densely, for comparison

    @property
    def total_bytes(self) -> int:
        return self.values_bytes + self.metadata_bytes


def sparse_2_4_bytes(rows: int, cols: int, fmt: str = "bf16") -> Sparse24Bytes:
    """Bytes of a rows x cols matrix in the 2:4 compressed format: half the values plus 2-bit indices.

    Every group of four consecutive values along a row keeps two, each with a 2-bit index of its position,
    the layout of NVIDIA's Ampere sparse tensor cores for 16-bit types (A100 whitepaper, "fine-grained
    structured sparsity"; Mishra et al. 2021, arXiv:2104.08378). The same 2 bits are charged for any fmt.

    >>> sparse_2_4_bytes(4096, 4096).total_bytes  # 8,388,608 x 2 B + 8,388,608 x 2 bit
    18874368
    """
    rows, cols = integer("rows", rows, min=1), integer("cols", cols, min=4)
    if cols % 4:
        raise ValueError(f"cols must be a multiple of 4 (groups of four along a row), got {cols}")
    kept = rows * cols // 2
    return Sparse24Bytes(stored_bytes(kept, fmt), kept * 2 // 8, stored_bytes(rows * cols, fmt))
