"""Where a model comes from and whether this machine can run it (layer 2, runtime), read before any weight is.

A :class:`ModelSource` says what kind a model is and where it lives: a known model of ``data/models.json`` by its
short name (the embedded GGUF file shipped in a PyPI package, or Pythia-14M, a hub repository pinned to a commit),
or what a learner names (issue #45): a hub id (``"Qwen/Qwen2.5-0.5B-Instruct"``), a local folder in transformers'
layout, or a local ``.gguf`` file. :func:`describe` tells them apart; :func:`model_config` reads the architecture
alone (a hub id downloads its ``config.json``, a few kilobytes, and nothing else; a GGUF file's header is read,
not its tensors); :func:`check_runnable` refuses, in one line, what the runtime cannot run: an architecture the
installed transformers does not know, a folder without safetensors weights, a model larger than the memory this
machine has (estimated from the config with ``labkit.core.memory``'s parameter arithmetic, before a byte of
weights is read).

Loading is ``labkit.runtime.models``, the embedded model's on-disk cache ``labkit.runtime.weights_cache``; both
read a :class:`ModelSource`, neither is imported here. Left out: remote code (``trust_remote_code`` stays off),
pickled ``.bin`` weights, and models sharded over several GGUF files.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import re
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from labkit.core import memory, validation
from labkit.core.resources import GIB, load_json
from labkit.core.spec import ModelSpec

EMBEDDED = "smollm2-135m"
FP32_BYTES = 4  # labkit runs every loaded model in float32, as the embedded model's cache holds it


class ModelUnavailableError(RuntimeError):
    """A model cannot be loaded here; the message says why and what to do instead, in one line."""


class HubUnreachableError(ModelUnavailableError):
    """A hub file is not cached here and the hub cannot be reached now (``reason`` says why)."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: a known model (one entry of ``data/models.json``) or one a learner named."""

    name: str  # what load_model() was given: a short name, a hub id, or a resolved local path
    title: str  # the publisher's name for it (a hub id's repository name, a folder's or a file's name)
    kind: str  # "gguf-package", "hub" (known, pinned), "hub-id", "folder" or "gguf-file"
    source: str  # human-readable provenance
    revision: str  # pinned package version or hub commit; a hub id's revision (default "main"), its commit once
    # loaded from the local hub cache; "local" for a folder or a file
    license: str
    chat: bool = False  # has a chat template (instruction-tuned)
    package: str | None = None  # PyPI distribution holding the file ("gguf-package")
    module: str | None = None  # importable top-level name of that distribution
    filename: str | None = None  # file inside the package, or the GGUF file's name ("gguf-file")
    repo_id: str | None = None  # hub repository ("hub", "hub-id")
    path: str | None = None  # the local folder or GGUF file, resolved ("folder", "gguf-file")


def known_models() -> dict[str, ModelSource]:
    """The models labkit knows by short name.

    >>> sorted(known_models())
    ['pythia-14m', 'smollm2-135m']
    """
    entries = load_json("models.json")
    return {name: ModelSource(name=name, **entry) for name, entry in entries.items() if not name.startswith("_")}


# ---------------------------------------------------------------------------------------------------------------
# What the learner named

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # "owner/name", as the hub spells repository ids
# Well-known repositories the Hub once served under a bare name and now under their owner's (the Hub redirects the
# old name; labkit takes ids as "owner/name" only, so it names the full one rather than guess).
BARE_HUB_NAMES = {name: f"openai-community/{name}" for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl",
                                                                  "openai-gpt")}
BARE_HUB_NAMES.update({"distilgpt2": "distilbert/distilgpt2", "ctrl": "Salesforce/ctrl",
                       "xlnet-base-cased": "xlnet/xlnet-base-cased", "opt-125m": "facebook/opt-125m",
                       "pythia-160m": "EleutherAI/pythia-160m", "bloom-560m": "bigscience/bloom-560m"})
_NOT_RECORDED = "not recorded by labkit: see the model's card"


def describe(name: Any, revision: Any = None, short_names: tuple[str, ...] = ()) -> ModelSource:
    """The source of a hub id, an existing local folder or an existing ``.gguf`` file (a short name is not one).

    An existing path wins over a hub id of the same spelling, as in transformers.

    >>> describe("Qwen/Qwen2.5-0.5B-Instruct").kind, describe("Qwen/Qwen2.5-0.5B-Instruct", "v1").revision
    ('hub-id', 'v1')
    """
    accepted = (f"a hub id ('owner/name'), a folder in transformers' layout, a .gguf file or one of "
                f"{sorted(short_names)}")
    if not isinstance(name, (str, os.PathLike)):
        raise validation.fail(TypeError, "name", accepted, name)
    if isinstance(name, str) and not name.strip():  # Path("") is the current folder: never what was meant
        raise validation.fail(ValueError, "name", accepted, name)
    if revision is not None and not isinstance(revision, str):
        raise validation.fail(TypeError, "revision", "a str (a hub branch, tag or commit) or None", revision)
    path = Path(name).expanduser()
    if path.exists():
        if revision is not None:
            raise ValueError(f"revision applies to a hub id, not to the local {path} (got revision={revision!r})")
        resolved = path.resolve()
        if resolved.is_dir():
            return ModelSource(name=str(resolved), title=resolved.name, kind="folder", revision="local",
                               source=f"the local folder {resolved}", license=_NOT_RECORDED, path=str(resolved))
        if resolved.suffix.lower() == ".gguf":
            return ModelSource(name=str(resolved), title=resolved.stem, kind="gguf-file", revision="local",
                               source=f"the local GGUF file {resolved}", license=_NOT_RECORDED,
                               filename=resolved.name, path=str(resolved))
        raise ValueError(f"name must be a folder in transformers' layout or a .gguf file, got the file {str(name)!r}")
    text = os.fspath(name)
    if isinstance(name, str) and _HUB_ID.fullmatch(text) and not text.lower().endswith(".gguf"):
        return ModelSource(name=text, title=text.split("/")[-1], kind="hub-id", revision=revision or "main",
                           source=f"{text} on the Hugging Face Hub (safetensors weights)", license=_NOT_RECORDED,
                           repo_id=text)
    if not isinstance(name, str) or text.startswith((".", "/", "~")) or os.sep in text or text.endswith(".gguf"):
        raise ValueError(f"name {text!r} is no existing folder or file (looked in {Path.cwd()})")
    full = BARE_HUB_NAMES.get(text.lower())
    if full is not None:
        raise ValueError(f"name {text!r} is the old bare hub id of {full!r}, the repository's full id today: "
                         f"load_model({full!r})")
    # A bare word is most likely a mistyped short name: those are named first.
    raise ValueError(f"{validation.fail(ValueError, 'name', f'one of {sorted(short_names)}', name)} (or a hub id "
                     "'owner/name', a folder in transformers' layout, a .gguf file)")


# ---------------------------------------------------------------------------------------------------------------
# The architecture, read alone: a config.json (downloaded by itself for a hub id) or a GGUF file's header


def hub_reachable(timeout_s: float = 3.0) -> str | None:
    """None when the hub endpoint accepts a connection, else the reason it does not."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout_s).close()
    except OSError as error:
        return f"{url.hostname}:{port} is unreachable ({error})"
    return None


def fetch_command(source: ModelSource) -> str:
    """The shell command that downloads a hub model into the local hub cache (huggingface_hub's ``hf`` CLI)."""
    pinned = f" --revision {source.revision}" if source.revision not in ("main", None) else ""
    return f"hf download {source.repo_id}{pinned}"


def offline_error(source: ModelSource, reason: str) -> HubUnreachableError:
    """A hub model that is not cached here and cannot be downloaded now: what would fetch it, and the fallback."""
    return HubUnreachableError(
        f"{source.repo_id}@{source.revision[:12]} is not in the local hub cache and the hub cannot be reached "
        f"({reason}): where there is a network (Colab has one) run `{fetch_command(source)}` (older huggingface_hub: "
        f"`huggingface-cli download {source.repo_id}`) or load it once, then it loads offline; "
        f'or use the embedded model, which needs no network: load_model("{EMBEDDED}").', reason
    )


def model_config(source: ModelSource) -> dict[str, Any]:
    """The architecture of a learner's model as a dict, read without its weights.

    A folder's ``config.json``; a hub id's ``config.json`` alone (from the local hub cache, else downloaded when the
    hub is reachable); a GGUF file's ``model_type`` and exact ``n_params`` from its header.
    """
    if source.kind == "gguf-file":
        model_type, n_params = gguf_header(Path(source.path))
        return {"model_type": model_type, "n_params": n_params}
    if source.kind == "folder":
        path = Path(source.path) / "config.json"
        if not path.is_file():
            raise ModelUnavailableError(f"the folder {source.path} has no config.json, so it is not a model in "
                                        "transformers' layout (save_pretrained writes one)")
    else:
        path = hub_config_path(source)
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except ValueError as error:
        raise ModelUnavailableError(f"{path} is not readable JSON ({error})") from None


def is_hub_id(name: str) -> bool:
    """``name`` is spelled as a hub repository id, ``"owner/name"``.

    >>> is_hub_id("Qwen/Qwen3-32B"), is_hub_id("gpt2"), is_hub_id("./config.json")
    (True, False, False)
    """
    return bool(_HUB_ID.fullmatch(name))


def hub_config_path(source: ModelSource) -> str:
    """The local path of a hub model's config.json, downloading that one file if it is not cached (the one reader
    of a hub config: ``load_model`` and the memory explorer both call it)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    revision = None if source.revision == "main" else source.revision
    try:
        return hf_hub_download(source.repo_id, "config.json", revision=revision, local_files_only=True)
    except (LocalEntryNotFoundError, OSError, ValueError):
        pass  # not cached: ask the hub, once, quickly
    reason = hub_reachable()
    if reason is not None:
        raise offline_error(source, reason)
    try:
        return hf_hub_download(source.repo_id, "config.json", revision=revision)
    except GatedRepoError:
        raise ModelUnavailableError(f"{source.repo_id} is gated: accept its terms on the hub and log in with "
                                    "`hf auth login`, then load it again") from None
    except RepositoryNotFoundError:
        raise ModelUnavailableError(f"{source.repo_id} is not a model on the hub (or it is private: log in with "
                                    "`hf auth login`)") from None
    except RevisionNotFoundError:
        raise ModelUnavailableError(f"{source.repo_id} has no revision {source.revision!r}") from None
    except EntryNotFoundError:
        raise ModelUnavailableError(f"{source.repo_id} has no config.json, so it is not a model in transformers' "
                                    "layout (a repository of GGUF files: download one and pass its path)") from None


def cached_commit(source: ModelSource) -> str | None:
    """The hub commit a hub model's revision resolves to in the local hub cache (its snapshot folder), else None."""
    from huggingface_hub import try_to_load_from_cache

    revision = None if source.revision == "main" else source.revision
    found = try_to_load_from_cache(source.repo_id, "config.json", revision=revision)
    return Path(found).parent.name if isinstance(found, str) else None


# GGUF value types (the specification: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): fixed sizes,
# 8 = string, 9 = array
_GGUF_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_header(path: Path) -> tuple[str, int]:
    """``(architecture, n_params)`` of a GGUF file, from its header: the metadata and the tensors' shapes.

    Hand-read because gguf's own ``GGUFReader`` turns every metadata value (49,152 tokenizer strings here) into
    numpy views: 7-9 s on the embedded model's file, against well under a second for this walk.
    """
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            raise ModelUnavailableError(f"{path} is not a GGUF file (its first bytes are {bytes(data[:4])!r})")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
        if version < 2:
            raise ModelUnavailableError(f"{path} is a GGUF file of version {version}; transformers reads 2 and 3")
        offset, architecture = 24, None

        def string(at: int) -> tuple[str, int]:
            (length,) = struct.unpack_from("<Q", data, at)
            return data[at + 8: at + 8 + length].decode("utf-8", "replace"), at + 8 + length

        def skip(kind: int, at: int) -> int:
            if kind in _GGUF_SCALARS:
                return at + _GGUF_SCALARS[kind]
            if kind == 8:
                return string(at)[1]
            element, count = struct.unpack_from("<IQ", data, at)
            at += 12
            if element in _GGUF_SCALARS:
                return at + count * _GGUF_SCALARS[element]
            for _ in range(count):
                at = skip(element, at)
            return at

        for _ in range(n_kv):
            key, offset = string(offset)
            (kind,) = struct.unpack_from("<I", data, offset)
            if key == "general.architecture" and kind == 8:
                architecture = string(offset + 4)[0]
            offset = skip(kind, offset + 4)
        n_params = 0
        for _ in range(n_tensors):
            offset = string(offset)[1]
            (n_dims,) = struct.unpack_from("<I", data, offset)
            n_params += math.prod(struct.unpack_from(f"<{n_dims}Q", data, offset + 4))
            offset += 4 + 8 * n_dims + 4 + 8  # the shape, then the tensor's type and its data offset
    if architecture is None:
        raise ModelUnavailableError(f"{path} names no general.architecture in its metadata")
    return architecture, n_params


# ---------------------------------------------------------------------------------------------------------------
# Can this machine run it: the architecture, the weights' format, the memory


def check_runnable(source: ModelSource, config: dict[str, Any]) -> int:
    """The estimated FP32 bytes of a learner's model's weights, or one line saying why it cannot run here."""
    import transformers

    model_type = config.get("model_type")
    if source.kind == "gguf-file":
        try:
            from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
        except ImportError:  # an older transformers without the list: its loader says what it cannot read
            GGUF_SUPPORTED_ARCHITECTURES = (model_type,)
        if model_type not in GGUF_SUPPORTED_ARCHITECTURES:
            readable = ", ".join(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))
            raise ModelUnavailableError(
                f"{source.title}: transformers {transformers.__version__} cannot read GGUF files of architecture "
                f"{model_type!r} (it reads {readable})")
    else:
        _check_architecture(source, config, transformers)
    if source.kind == "folder":
        _check_safetensors(Path(source.path))
    n_params = config["n_params"] if source.kind == "gguf-file" else estimated_params(config)
    needed = n_params * FP32_BYTES
    free = available_memory_bytes()
    if free is not None and needed > free:
        raise ModelUnavailableError(
            f"{source.title} needs about {_bytes(needed)} for its weights in FP32 ({_count(n_params)} parameters "
            f"x 4 bytes, {'from its GGUF header' if source.kind == 'gguf-file' else 'estimated from its config'}), "
            f"more than the {_bytes(free)} of memory available here: {_smaller(source, free)}")
    return needed


def _check_architecture(source: ModelSource, config: dict[str, Any], transformers) -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type, version = config.get("model_type"), transformers.__version__
    if not model_type:
        raise ModelUnavailableError(f"{source.title}: its config.json names no model_type, so transformers cannot "
                                    "tell its architecture")
    if model_type not in CONFIG_MAPPING_NAMES:
        remote = " and labkit runs no remote code (trust_remote_code=False)" if "auto_map" in config else ""
        raise ModelUnavailableError(
            f"{source.title}: the architecture model_type={model_type!r} is not known to the installed transformers "
            f"{version}{remote}; a newer transformers may know it (pip install -U transformers)")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelUnavailableError(f"{source.title}: model_type={model_type!r} is not a causal language model in "
                                    f"transformers {version} (it has no AutoModelForCausalLM class)")


def _check_safetensors(folder: Path) -> None:
    if any(folder.glob("*.safetensors")):
        return
    found = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack"))
    raise ModelUnavailableError(
        f"the folder {folder} has no safetensors weights ({'found ' + ', '.join(found) if found else 'no weights'}): "
        "labkit loads safetensors only, since a pickled .bin file can run code when it is loaded; save the model "
        "with save_pretrained(folder) (safetensors by default) where you trust the file, or download its "
        "safetensors version")


def estimated_params(config: dict[str, Any]) -> int:
    """Parameters of a model from its config, for the memory check.

    A mixture of experts or multi-latent attention is counted as ``ModelSpec.from_config`` counts it
    (``labkit.core.configs.expert_param_count``); a dense model by ``labkit.core.memory.param_count`` at Llama's
    block (GPT-NeoX's ungated MLP, biases and LayerNorms when the config says so), an estimate for the other
    layouts (biases, extra norms). Experts laid out in a way core does not count are estimated as every expert at
    ``moe_intermediate_size`` (else d_ff), routers left out.

    >>> estimated_params({"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30,
    ...                   "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
    ...                   "intermediate_size": 1536, "tie_word_embeddings": True})  # SmolLM2-135M, exactly
    134515008
    """
    spec = ModelSpec.from_config(config)
    if spec.n_params is not None:
        return spec.n_params
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    if spec.d_ff is None:
        return memory.params_12d2(spec, include_embeddings=True)
    neox = text.get("model_type", config.get("model_type")) == "gpt_neox"
    layout = memory.BlockLayout(gated_mlp=not neox, linear_bias=neox, norm_bias=neox)
    parts = memory.param_breakdown(spec, layout)
    experts = int(text.get("num_local_experts") or text.get("num_experts") or text.get("n_routed_experts") or 1)
    if experts == 1:
        return sum(parts.values())
    expert_ff = text.get("moe_intermediate_size") or spec.d_ff  # experts narrower than d_ff (Qwen3-MoE, DeepSeek)
    return sum(parts.values()) + parts["mlp"] * (experts * expert_ff - spec.d_ff) // spec.d_ff


def available_memory_bytes() -> int | None:
    """Memory this machine can give a new allocation without swapping: Linux's MemAvailable, else psutil's, else
    None (then no model is refused for its size)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the kernel writes kB, meaning KiB
    except OSError:
        pass
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def _smaller(source: ModelSource, free: int) -> str:
    """A smaller model to try: a smaller size of the same family when the name carries a size, and the embedded one."""
    fits = _count(free // FP32_BYTES)
    size = re.search(r"(?<![\w.])(\d+(?:\.\d+)?)[BbMm](?![\w])", source.title.replace("-", " ").replace("_", " "))
    family = f"a size of {source.title} below {size.group(0)}, " if size else "a smaller model, "
    return (f"try {family}up to about {fits} parameters fit here, or the embedded SmolLM2-135M-Instruct "
            f'(load_model("{EMBEDDED}"))')


def _bytes(n_bytes: int) -> str:
    """``"262.8 GiB"``, or MiB below a tenth of a GiB."""
    return f"{n_bytes / GIB:.1f} GiB" if n_bytes >= GIB / 10 else f"{n_bytes / 2**20:.1f} MiB"


def _count(n_params: int) -> str:
    """``"70.55B"`` (10^9, as model names count), or millions below a billion.

    >>> _count(70_553_706_496), _count(134_515_008)
    ('70.55B', '134.5M')
    """
    return f"{n_params / 1e9:.2f}B" if n_params >= 1e9 else f"{n_params / 1e6:.1f}M"
