"""The verified on-disk cache of a packaged model's weights (layer 2, runtime): written once, checked on every load.

The embedded model ships as a Q4_1 GGUF file. transformers can read that file directly, but it dequantizes every
tensor on every load (about 20-30 s here). So the first load converts once to safetensors under ``cache_root()``
and later loads memory-map that (well under a second, plus a checksum pass when a file changed).

The cache is trusted only when its manifest matches: same cache format, labkit and transformers versions, the
same source package, and every file's size and BLAKE2b digest. Anything else (a killed conversion, a truncated
or edited file, an upgrade) is reported and rebuilt, never loaded. A digest is read again only when the file's
stat (size, inode, modification and change times) differs from when its digest last matched (``verified.json``,
as git's index skips rehashing a file whose stat it recorded): a write, a copy or a replaced file moves the change
time, which ``utime`` cannot set back, so a later process skips the 0.9 s read of the weights. The conversion is
written to a temporary directory and moved into place only when complete, so an interrupted run leaves no half
cache.

Where a model comes from (the package, the hub, ``data/models.json``) is ``labkit.runtime.sources``, loading it
``labkit.runtime.models``; this module only converts, verifies, repairs and clears. Used through ``load_model()``
by every lab that runs the embedded model.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from labkit.core.resources import cache_root
from labkit.runtime.sources import ModelSource

# Bump when the cache layout changes; older caches are rebuilt. 2: safetensors "format" metadata and the tied
# embedding stored under its embedding name (transformers 4.x refused format 1 or left the matrix on "meta").
CACHE_FORMAT = 2
MANIFEST = "manifest.json"
VERIFIED = "verified.json"  # file name -> its stat when its digest last matched the manifest


def cache_dir(source: ModelSource) -> Path:
    """Directory holding the converted cache of a packaged model."""
    return cache_root() / "models" / source.name


def expected_header(source: ModelSource, gguf: Path) -> dict[str, Any]:
    """What a cache's manifest must record to be trusted: format, versions, and the GGUF file it came from.
    transformers' version is read from its installed metadata (the same string as ``transformers.__version__``):
    a process that only checks the cache, as a grading worker does, does not import it (0.45 s)."""
    from labkit import __version__

    return {
        "cache_format": CACHE_FORMAT,
        "labkit": __version__,
        "transformers": importlib.metadata.version("transformers"),
        "source_package": f"{source.package}=={importlib.metadata.version(source.package)}",
        "source_file": source.filename,
        "source_bytes": gguf.stat().st_size,
    }


def _digest(path: Path) -> str:
    # BLAKE2b: the fastest cryptographic hash in the standard library here (about 0.6 s for the 538 MB file).
    hasher = hashlib.blake2b(digest_size=32)
    with open(path, "rb") as handle:
        while chunk := handle.read(16 * 2**20):
            hasher.update(chunk)
    return hasher.hexdigest()


def _stat(path: Path) -> list[int]:
    """What any change to a file's bytes changes: its size, inode, modification and change times (ns)."""
    status = path.stat()
    return [status.st_size, status.st_ino, status.st_mtime_ns, status.st_ctime_ns]


def cache_problem(directory: Path, expected_header: dict[str, Any]) -> str | None:
    """Why a cache directory must not be loaded, or None when it is complete and intact; then it also records
    each file's stat in ``verified.json`` (where the cache is writable), so the next check skips unchanged files."""
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
    try:
        verified = json.loads((directory / VERIFIED).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        verified = {}
    seen = {}
    for name, recorded in files.items():
        path = directory / name
        if not path.is_file():
            return f"cache file {name} is missing"
        if path.stat().st_size != recorded["bytes"]:
            return f"cache file {name} has {path.stat().st_size:,} bytes, expected {recorded['bytes']:,} (truncated?)"
        seen[name] = _stat(path)  # before the read: a write during it makes the next process read again
        if verified.get(name) != seen[name] and _digest(path) != recorded["blake2b"]:
            return f"cache file {name} does not match its checksum (corrupted)"
    if seen != verified:
        staged = directory / f".{VERIFIED}-{uuid.uuid4().hex[:8]}"
        try:  # a read-only cache (the grader's wall shows it so) is read again next time
            staged.write_text(json.dumps(seen), encoding="utf-8")
            os.replace(staged, directory / VERIFIED)
        except OSError:
            with contextlib.suppress(OSError):
                staged.unlink(missing_ok=True)
    return None


@contextlib.contextmanager
def gguf_parsed_once():
    """While it lasts, transformers' reads of a GGUF file (its config, tokenizer and weights are three) share one
    parse of the file's metadata, and its tensor-name table is built once per architecture, not once per module.

    Written here because transformers asks gguf-py anew each time: on a 2 GHz AMD EPYC (Zen 1), under a profiler,
    loading the embedded GGUF took 70 s, 34 s of them in three parses of the same 49,152-token vocabulary and 397
    copies of one table; unprofiled, the first load (the conversion to the cache) went from 46 s to 24 s.
    transformers imports ``GGUFReader`` and ``get_tensor_name_map`` from the ``gguf`` package when it calls them, so
    replacing them there for the duration reaches it; both only read (the reader memory-maps the file read-only).
    Outside the context (or where a transformers imported them earlier) they behave exactly as gguf-py's own.
    """
    import gguf

    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    shared: dict[Any, Any] | None = {}

    def once(make):
        def made(first, *args, **kwargs):
            if shared is None:  # a reference kept past the context: plain gguf-py
                return make(first, *args, **kwargs)
            key = (make, os.fspath(first) if isinstance(first, (str, os.PathLike)) else first, args,
                   tuple(sorted(kwargs.items())))
            if key not in shared:
                shared[key] = make(first, *args, **kwargs)
            return shared[key]
        return made

    gguf.GGUFReader, gguf.get_tensor_name_map = once(reader_class), once(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map
        shared = None


def gguf_tokenizer(gguf: Path):
    """The tokenizer stored in a GGUF file, as transformers reads it."""
    import transformers

    with quiet_transformers():
        return transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)


def dequantize_gguf(gguf: Path):
    """The module of a GGUF file with every weight dequantized to FP32, as transformers reads it (the slow step)."""
    import transformers

    with quiet_transformers():
        return transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)


def _weights_to_save(module) -> dict:
    """The state dict to write: a tied output matrix is stored once, under the embedding's name.

    transformers re-ties ``lm_head.weight`` to the embedding on load; a file that holds the matrix only under
    ``lm_head.weight`` (what safetensors' ``save_model`` picks) leaves the embedding unloaded in transformers 4.x.
    """
    state = dict(module.state_dict())
    embedding = module.get_input_embeddings()
    embedding_name = next(f"{name}.weight" for name, child in module.named_modules() if child is embedding)
    shared = embedding.weight.data_ptr()  # state_dict() gives new tensor objects: compare storage, not identity
    return {name: tensor.contiguous() for name, tensor in state.items()
            if name == embedding_name or tensor.data_ptr() != shared}


def _convert_to_cache(source: ModelSource, gguf: Path, header: dict[str, Any], progress: bool) -> None:
    """Dequantize the GGUF once and write config, tokenizer and safetensors weights atomically."""
    import safetensors.torch
    from tqdm.auto import tqdm

    target = cache_dir(source)
    target.parent.mkdir(parents=True, exist_ok=True)
    steps = tqdm(total=4, desc=f"Converting {source.title} (once)", disable=not progress, unit="step")
    # Build beside the target so the final rename stays on one filesystem (rename is atomic there).
    staging = Path(tempfile.mkdtemp(prefix=f".{source.name}-", dir=target.parent))
    try:
        with gguf_parsed_once():
            steps.set_postfix_str("reading tokenizer")
            tokenizer = gguf_tokenizer(gguf)
            steps.update()
            steps.set_postfix_str("dequantizing weights")
            module = dequantize_gguf(gguf)
            steps.update()
        steps.set_postfix_str("writing safetensors")
        config = module.config.to_dict()
        config.pop("quantization_config", None)  # the cache holds plain FP32 tensors, not a GGUF-quantized model
        (staging / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        # "format": "pt" is the metadata transformers 4.x demands of a safetensors file.
        safetensors.torch.save_file(_weights_to_save(module), str(staging / "model.safetensors"),
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


_VERIFIED: dict[Path, tuple] = {}  # directory -> (its files' signature, the header) when this process verified it


def _stat_signature(directory: Path) -> tuple:
    """What changes when a cache file is replaced, written or truncated: each file's name and :func:`_stat`."""
    try:
        return tuple(sorted((p.name, *_stat(p)) for p in directory.iterdir()))
    except OSError:
        return ()


def _repair(source: ModelSource, gguf: Path, header: dict[str, Any], progress: bool) -> tuple[bool, str | None]:
    """Convert the GGUF into the cache when the manifest or a checksum says the cache is missing or damaged:
    (whether it was converted, the note printed when an existing cache was rebuilt)."""
    directory = cache_dir(source)
    problem = cache_problem(directory, header)
    if problem is None:
        return False, None
    note = f"Rebuilding the model cache at {directory}: {problem}." if directory.exists() else None
    if note:
        print(note)
    _convert_to_cache(source, gguf, header, progress)
    return True, note


def ensure_cached(source: ModelSource, gguf: Path, progress: bool) -> Path:
    """The cache directory of a packaged model, converted (or repaired) first when its manifest or a checksum says
    so, without loading it: for a process that only hands the cache to others (the grader's wall shows it read-only
    to each submission), which need not spend the seconds and the half gigabyte a load takes. Verified once per
    process: the checksums are read again only when a file changed."""
    header = expected_header(source, gguf)
    directory = cache_dir(source)
    if _VERIFIED.get(directory) != (_stat_signature(directory), header):
        _repair(source, gguf, header, progress)
        _VERIFIED[directory] = (_stat_signature(directory), header)
    return directory


def load_verified(source: ModelSource, gguf: Path, progress: bool):
    """``(module, tokenizer, origin, notes)`` of a packaged model from its cache, converting or repairing it first.

    ``origin`` is "cache", or "converted" when the cache was (re)written by this call; ``notes`` says why it was
    rebuilt (each note is printed too). A cache that passes its manifest but does not load is rebuilt once.
    """
    header = expected_header(source, gguf)
    directory = cache_dir(source)
    converted, note = _repair(source, gguf, header, progress)
    notes: list[str] = [note] if note else []
    origin = "converted" if converted else "cache"
    try:
        module, tokenizer = _load_cache(directory)
    except Exception as error:  # noqa: BLE001 - a cache that passes its manifest but does not load is rebuilt once
        if origin == "converted":
            raise
        notes.append(f"Rebuilding the model cache at {directory}: it did not load ({type(error).__name__}: "
                     f"{str(error).splitlines()[0] if str(error) else ''}).")
        print(notes[-1])
        _convert_to_cache(source, gguf, header, progress)
        module, tokenizer = _load_cache(directory)
        origin = "converted"
    return module, tokenizer, origin, notes


def _load_cache(directory: Path):
    """Module and tokenizer from a verified cache directory; an error when any parameter was left unloaded."""
    import transformers

    with quiet_transformers():
        module, info = transformers.AutoModelForCausalLM.from_pretrained(directory, local_files_only=True,
                                                                         output_loading_info=True)
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
    # A weight missing from the file is left on "meta" (transformers 4.x) or initialized at random (5.x).
    unloaded = sorted(set(info.get("missing_keys", ())) | {
        name for name, parameter in module.named_parameters() if parameter.device.type == "meta"})
    if unloaded:
        raise RuntimeError(f"{len(unloaded)} weights were not loaded from the cache file, e.g. {unloaded[0]}")
    return module, tokenizer


class quiet_transformers:
    """Silence transformers' logging and progress bars inside a block (the GGUF path warns about things we handle).

    transformers 4.x draws its GGUF progress bar with tqdm directly, ignoring its own progress-bar switch; that
    module's ``tqdm`` is replaced by a pass-through for the block (labkit shows its own bar of the conversion).
    Also used by ``labkit.runtime.models`` around hub loads.
    """

    def __enter__(self):
        import transformers

        self._level = transformers.logging.get_verbosity()
        self._bars = transformers.utils.logging.is_progress_bar_enabled()
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
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
