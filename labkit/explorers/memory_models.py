"""The models the KV-cache explorer (lab 05) sizes: a preset, a Hugging Face Hub id or a config.json path.

:func:`read_model` reads a model's config alone (a hub id downloads config.json, a few kilobytes, never the
weights, through the runtime's one reader of a model's identity, :mod:`labkit.runtime.sources`; offline it needs a
cached copy or a path) into a ModelSpec and the block layout its weights are counted
with, completed by transformers' config class where the installed transformers knows it (its defaults: Mistral's
window, Gemma's tied embeddings). The explorer itself is :mod:`labkit.explorers.memory`. Left out: a revision other
than the hub's main branch, and configs that need ``trust_remote_code`` (read as written, noted).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.core.configs import expert_param_count
from labkit.core.memory import LLAMA, BlockLayout
from labkit.core.presets import model_layout, model_preset, model_presets, model_source
from labkit.core.spec import ModelSpec
from labkit.runtime.sources import HubUnreachableError, ModelUnavailableError, describe, hub_config_path, is_hub_id


# Block layouts (biases, norms, MLP kind) by a config's model_type, as transformers builds each family; checked
# against the parameters of a built model for every test architecture (tests/test_core_spec_any_config.py).
LAYOUTS = {
    "gpt_neox": BlockLayout(gated_mlp=False, linear_bias=True, norm_bias=True),
    "qwen2": BlockLayout(qkv_bias=True),
    "qwen3": BlockLayout(qk_norm=True),
    "gemma2": BlockLayout(norms_per_layer=4),  # a norm before and after attention and the MLP
    "gemma3_text": BlockLayout(norms_per_layer=4, qk_norm=True),
    "gemma3": BlockLayout(norms_per_layer=4, qk_norm=True),
    **{family: LLAMA for family in ("llama", "mistral", "phi3", "mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3")},
}


@dataclass(frozen=True)
class SizedModel:
    """A model as the explorer sizes it: its spec, its block layout and where its numbers come from."""

    spec: ModelSpec
    layout: BlockLayout
    source: str  # a preset's config URL, the hub id's config.json or the path read
    note: str = ""  # what the count assumes, shown under the arithmetic ("" when nothing)


def _hub_config(repo_id: str) -> Path:
    """config.json of a hub repository, read by the runtime's one reader of hub configs
    (:func:`labkit.runtime.sources.hub_config_path`: the local hub cache first, then the hub; never the weights)."""
    instead = "or pass the path of a config.json instead: memory_explorer('path/to/config.json')"
    try:
        return Path(hub_config_path(describe(repo_id)))
    except HubUnreachableError as error:
        raise ValueError(f"no network and {repo_id}'s config.json is not in the Hugging Face cache ({error.reason}): "
                         f"connect once, {instead}") from None
    except ModelUnavailableError as error:
        raise ValueError(f"{error}; {instead}") from None


def _config_of(path: Path) -> tuple[dict[str, Any], str]:
    """The config as transformers would complete it (its class's defaults, e.g. Mistral's window, Gemma's tied
    embeddings), or as written when the installed transformers does not know its model_type."""
    written = json.loads(path.read_text())
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(str(path)).to_dict(), ""
    except Exception as error:  # noqa: BLE001 - an unknown model_type, a config its class rejects: read as written
        return written, f"read as written (transformers could not complete it: {str(error).splitlines()[0]})"


@functools.lru_cache(maxsize=32)
def read_model(preset: str) -> SizedModel:
    """The model a name stands for: a preset (``model_presets()``), a hub id or a config.json path (or its folder).

    A hub id downloads config.json alone, once (the Hugging Face cache keeps it for offline use); read once per
    process, since ``compute`` asks again on every slider move.
    """
    if not isinstance(preset, str) or not preset:
        raise TypeError(f"preset must be a preset's name, a hub id or a config.json path (a str), got {preset!r}")
    if preset.lower() in {name.lower() for name in model_presets()}:
        return SizedModel(model_preset(preset), model_layout(preset), model_source(preset))
    path = Path(preset).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        name = path.parent.name or preset
    elif path.suffix == ".json" or preset.startswith((".", "/", "~")) or not is_hub_id(preset):
        raise ValueError(f"preset must be one of {sorted(model_presets())}, a hub id such as 'Qwen/Qwen3-32B' or "
                         f"the path of a config.json, got {preset!r} (no such preset or file)")
    else:
        path, name = _hub_config(preset), preset
    config, note = _config_of(path)
    spec = ModelSpec.from_config(config, name=name)
    if spec.kv_uncounted is not None:
        raise ValueError(f"{name}'s KV cache is not counted: {spec.kv_uncounted}")
    if spec.n_params is None:
        expert_param_count(config)  # experts laid out in a way labkit does not count: refused, with the reason
    model_type = config.get("model_type")
    notes = [note]
    if spec.n_params is None and model_type not in LAYOUTS:
        notes.append(f"weights counted with Llama's block layout ({model_type!r} is not one labkit has checked)")
    if "vision_config" in config or "audio_config" in config:
        notes.append("the text model alone is counted: its vision or audio encoder's weights are left out")
    note = "; ".join(filter(None, notes))
    return SizedModel(spec, LAYOUTS.get(model_type, LLAMA), str(path), note)
