"""Real models and GPUs as data: ``data/model_presets.json`` and ``data/gpu_presets.json``, each with a source.

Used by the memory lab (and any lab that wants a real model's shape, a real GPU's bandwidth or its peak FLOP/s).
The files ship inside the package as ``labkit.data`` (read through ``labkit.core.resources``).
Names are matched case-insensitively; an unknown name raises ValueError listing the known ones.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from labkit.core.spec import GPUSpec
from labkit.core.memory import GB, GIB, MIB, BlockLayout
from labkit.core.resources import load_json
from labkit.core.spec import ModelSpec
from labkit.core.validation import fail

_SPEC_FIELDS = ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "vocab", "n_params", "d_ff",
                "tied_embeddings")
_OPTIONAL_FIELDS = ("max_position_embeddings",)  # left out of an entry whose config value we could not source
_MEMORY_UNITS = {"GB": GB, "GiB": GIB}


@lru_cache(maxsize=None)
def _load(name: str) -> dict[str, Any]:
    return load_json(name)


def _entry(table: dict[str, Any], name: Any, what: str) -> tuple[str, dict[str, Any]]:
    """Find name (case-insensitive) in a preset table; return the canonical name and its entry."""
    by_lower = {key.lower(): key for key in table}
    if not isinstance(name, str) or name.lower() not in by_lower:
        raise ValueError(f"{what} must be one of {sorted(table)}, got {name!r}")
    key = by_lower[name.lower()]
    return key, table[key]


def model_preset(name: str) -> ModelSpec:
    """A real model's ModelSpec by preset name (see model_presets()).

    >>> spec = model_preset("Llama-3.3-70B")
    >>> spec.n_layers, spec.n_kv_heads, spec.head_dim, spec.max_position_embeddings
    (80, 8, 128, 131072)
    """
    key, entry = _entry(_load("model_presets.json")["models"], name, "name")
    optional = {field: entry[field] for field in _OPTIONAL_FIELDS if field in entry}
    return ModelSpec(name=key, **{field: entry[field] for field in _SPEC_FIELDS}, **optional)


def model_presets() -> dict[str, ModelSpec]:
    """Every model preset, by name.

    >>> "Qwen3-0.6B" in model_presets()
    True
    """
    return {key: model_preset(key) for key in _load("model_presets.json")["models"]}


def model_layout(name: str) -> BlockLayout:
    """The BlockLayout (biases, norms, MLP kind) that makes param_count reproduce a preset's n_params.

    >>> model_layout("Pythia-14M").gated_mlp
    False
    """
    _, entry = _entry(_load("model_presets.json")["models"], name, "name")
    return BlockLayout(**entry["layout"])


def model_source(name: str) -> str:
    """Where a model preset's numbers come from (its config.json on the Hugging Face Hub).

    >>> model_source("SmolLM2-135M")
    'https://huggingface.co/HuggingFaceTB/SmolLM2-135M/blob/main/config.json'
    """
    _, entry = _entry(_load("model_presets.json")["models"], name, "name")
    return entry["source"]


def gpu_preset(name: str) -> GPUSpec:
    """A GPU by preset name: its memory as nvidia-smi reports it, the datasheet's figure beside it, peak bandwidth.

    >>> t4 = gpu_preset("T4")
    >>> t4.memory_bytes, t4.memory_mib, t4.vendor_memory, t4.vendor_memory_bytes, t4.bandwidth_bytes_per_s
    (16106127360, 15360.0, '16 GB GDDR6', 16000000000, 320000000000)
    >>> gpu_preset("A100-80GB").memory_gib
    80.0
    """
    key, entry = _entry(_load("gpu_presets.json")["gpus"], name, "gpu")
    vendor_unit = _MEMORY_UNITS[entry["vendor_memory_unit"]]
    return GPUSpec(
        name=key,
        memory_bytes=entry["memory_mib"] * MIB,
        bandwidth_bytes_per_s=entry["bandwidth_gb_per_s"] * GB,
        vendor_memory=f"{entry['vendor_memory']} {entry['vendor_memory_unit']} {entry['memory_type']}",
        source=entry["source"],
        vendor_memory_bytes=entry["vendor_memory"] * vendor_unit,
        memory_source=entry["memory_mib_source"],
    )


def gpu_presets() -> dict[str, GPUSpec]:
    """Every GPU preset, by name.

    >>> sorted(gpu_presets())[:3]
    ['A100-40GB', 'A100-80GB', 'H100-SXM']
    """
    return {key: gpu_preset(key) for key in _load("gpu_presets.json")["gpus"]}


def gpu_peak_flops(name: str) -> float:
    """A preset GPU's peak dense 16-bit FLOP/s (its datasheet's tensor-core figure, no 2:4 sparsity).

    Only the GPUs whose entry has ``peak_dense_16bit_tflops`` have one; the entry's
    ``peak_dense_16bit_tflops_source`` names the datasheet.

    >>> gpu_peak_flops("a100-80gb")
    312000000000000.0
    """
    peaks = {key: entry["peak_dense_16bit_tflops"] * 1e12 for key, entry in _load("gpu_presets.json")["gpus"].items()
             if "peak_dense_16bit_tflops" in entry}
    by_lower = {key.lower(): key for key in peaks}
    if not isinstance(name, str) or name.lower() not in by_lower:
        raise fail(ValueError if isinstance(name, str) else TypeError, "name", f"one of {sorted(peaks)}", name)
    return peaks[by_lower[name.lower()]]
