"""The bytes of a weights file: a safetensors file's header, and Pythia's file rebuilt from its shape.

Layer 1 (core), pure math, no model. ``read_safetensors_header`` parses the 8-byte length and JSON table of a
safetensors file; ``gpt_neox_tensor_shapes`` lists every tensor a GPT-NeoX (Pythia) checkpoint stores, and
``safetensors_bytes`` writes a file of zeros of those shapes with the safetensors library. Used by the memory lab;
the counts of weights and KV cache are ``labkit.core.memory``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.core.spec import ModelSpec
from labkit.core.validation import choice, instance


def _spec(spec: Any) -> ModelSpec:
    return instance("spec", spec, ModelSpec, "a labkit.core.spec.ModelSpec")


@dataclass(frozen=True)
class SafetensorsHeader:
    """What the front of a safetensors file says: its length field, the JSON table, and the payload after it."""

    table_bytes: int  # n: the little-endian uint64 at the start of the file, the JSON table's length
    tensors: dict[str, dict[str, Any]]  # name -> {"dtype", "shape", "data_offsets": [begin, end]} (payload-relative)
    metadata: dict[str, str]  # the table's optional "__metadata__" entry (e.g. {"format": "pt"})
    data_bytes: int  # what follows the header: every tensor's bytes, back to back

    @property
    def header_bytes(self) -> int:
        """The whole header: the 8-byte length field plus the JSON table (file size - data_bytes)."""
        return 8 + self.table_bytes


def read_safetensors_header(data: bytes) -> SafetensorsHeader:
    """Parse a whole safetensors file held in memory: 8 bytes of little-endian length n, n bytes of JSON, payload.

    The format (huggingface/safetensors, docs/safetensors.md): the JSON maps each tensor's name to its dtype,
    shape and [begin, end) offsets into the payload, plus an optional "__metadata__" of strings; the library pads
    the JSON with spaces to a multiple of 8 bytes. Checked here: the length fits the file, the table is a JSON
    object, and the offsets tile the payload exactly.

    >>> import json, struct
    >>> table = json.dumps({"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    >>> header = read_safetensors_header(struct.pack("<Q", len(table)) + table + bytes(4))
    >>> header.table_bytes, header.header_bytes, header.data_bytes, list(header.tensors)
    (61, 69, 4, ['w'])
    """
    import json
    import struct

    instance("data", data, (bytes, bytearray, memoryview), "bytes (a whole safetensors file)")
    data = bytes(data)
    if len(data) < 8:
        raise ValueError(f"a safetensors file starts with an 8-byte length; got {len(data)} bytes")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError(f"the length field says the JSON table has {n:,} bytes, but only {len(data) - 8:,} follow")
    try:
        table = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"the {n:,} bytes after the length field are not a JSON table: {error}") from None
    if not isinstance(table, dict):
        raise ValueError(f"the JSON table must be an object, got {type(table).__name__}")
    metadata = table.pop("__metadata__", None) or {}
    payload = len(data) - 8 - n
    spans = sorted(tuple(entry["data_offsets"]) for entry in table.values())
    end = 0
    for begin, stop in spans:
        if begin != end or stop < begin:
            raise ValueError(f"tensor offsets must tile the payload: a tensor starts at {begin:,}, expected {end:,}")
        end = stop
    if end != payload:
        raise ValueError(f"the tensors end at byte {end:,} of the payload, but {payload:,} bytes follow the header")
    return SafetensorsHeader(table_bytes=n, tensors=table, metadata=metadata, data_bytes=payload)


def gpt_neox_tensor_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every tensor a GPT-NeoX checkpoint (Pythia) stores, by the name in its file, with its shape.

    The names are those transformers 4 saved (Pythia's files on the Hub use them); transformers 5 calls the output
    matrix lm_head instead of embed_out and renames it when it loads an old file. GPT-NeoX fuses q, k and v into one
    query_key_value matrix of 3 x d_model rows, has biases on every projection
    and LayerNorms with weight and bias, and an untied output matrix (embed_out). Full multi-head attention only.

    >>> spec = ModelSpec("toy", n_layers=1, d_model=4, n_heads=2, n_kv_heads=2, head_dim=2, vocab=10, d_ff=16)
    >>> shapes = gpt_neox_tensor_shapes(spec)
    >>> len(shapes), shapes["gpt_neox.layers.0.attention.query_key_value.weight"], shapes["embed_out.weight"]
    (16, (12, 4), (10, 4))
    """
    spec = _spec(spec)
    if spec.d_ff is None or spec.n_kv_heads != spec.n_heads or spec.tied_embeddings:
        raise ValueError(f"a GPT-NeoX spec has d_ff, n_kv_heads == n_heads and untied embeddings; got {spec}")
    d, ff = spec.d_model, spec.d_ff
    shapes: dict[str, tuple[int, ...]] = {"gpt_neox.embed_in.weight": (spec.vocab, d)}
    for i in range(spec.n_layers):
        layer = f"gpt_neox.layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            shapes[f"{layer}{norm}.weight"] = shapes[f"{layer}{norm}.bias"] = (d,)
        for name, rows, cols in [("attention.query_key_value", 3 * spec.n_heads * spec.head_dim, d),
                                 ("attention.dense", d, spec.n_heads * spec.head_dim),
                                 ("mlp.dense_h_to_4h", ff, d), ("mlp.dense_4h_to_h", d, ff)]:
            shapes[f"{layer}{name}.weight"], shapes[f"{layer}{name}.bias"] = (rows, cols), (rows,)
    shapes["gpt_neox.final_layer_norm.weight"] = shapes["gpt_neox.final_layer_norm.bias"] = (d,)
    shapes["embed_out.weight"] = (spec.vocab, d)
    return shapes


_SAFETENSORS_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def safetensors_bytes(shapes: dict[str, tuple[int, ...]], fmt: str = "fp16",
                      metadata: dict[str, str] | None = None) -> bytes:
    """A safetensors file in memory holding zero tensors of these names and shapes, written by the safetensors library.

    The bytes are what ``safetensors.torch.save`` writes (the same call ``save_pretrained`` makes); the values are
    zeros because only the sizes matter here. metadata goes into the header's "__metadata__" (transformers writes
    {"format": "pt"}).

    >>> data = safetensors_bytes({"w": (2, 3)}, "fp16", {"format": "pt"})
    >>> header = read_safetensors_header(data)
    >>> header.data_bytes, header.tensors["w"]["shape"], header.metadata, header.header_bytes % 8
    (12, [2, 3], {'format': 'pt'}, 0)
    """
    import torch
    from safetensors.torch import save

    if fmt not in _SAFETENSORS_DTYPES:
        choice("fmt", fmt, sorted(_SAFETENSORS_DTYPES))
    dtype = getattr(torch, _SAFETENSORS_DTYPES[fmt])
    return save({name: torch.zeros(shape, dtype=dtype) for name, shape in shapes.items()}, metadata=metadata)
