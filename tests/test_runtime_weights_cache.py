"""labkit.runtime.weights_cache: the verified on-disk cache, on a synthetic few-KB packaged model.

Everything a learner's machine goes through runs for real here (the manifest, checksums, the atomic rename, the
reload, the repair), on a tiny tied Llama "packaged" like the embedded model: a stand-in GGUF file inside an
installed-looking package. Only reading that file (dequantizing, the slow step on the real model) is replaced by
the tiny model and tokenizer. tests/test_runtime_models.py checks the real cache once.
"""

import json
import os

import pytest
import torch

from toys import WORDS, tiny_llama, tiny_tokenizer
from labkit.runtime import models, weights_cache
from labkit.runtime.models import ModelSource, load_model
from labkit.runtime.weights_cache import cache_problem

# A tied Llama of about 4,800 parameters: its safetensors file is about 19 KB.
TINY = dict(vocab_size=len(WORDS), hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
            head_dim=8, tie_word_embeddings=True)


@pytest.fixture
def packaged(tmp_path, monkeypatch):
    """A tiny packaged model under a fresh LABKIT_CACHE: (source, the module its GGUF "holds", the cache directory)."""
    site = tmp_path / "site"
    package = site / "tiny_gguf_model"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "tiny.gguf").write_bytes(b"GGUF" + bytes(60))  # only its size enters the manifest
    dist_info = site / "tiny_gguf_model-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-gguf-model\nVersion: 0.1\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
    source = ModelSource(name="tiny", title="Tiny", kind="gguf-package", source="made by this test",
                         revision="tiny-gguf-model==0.1", license="none", package="tiny-gguf-model",
                         module="tiny_gguf_model", filename="tiny.gguf")
    module, tokenizer = tiny_llama(**TINY), tiny_tokenizer()
    monkeypatch.setattr(models, "known_models", lambda: {"tiny": source})
    monkeypatch.setattr(weights_cache, "dequantize_gguf", lambda gguf: module)
    monkeypatch.setattr(weights_cache, "gguf_tokenizer", lambda gguf: tokenizer)
    return source, module, weights_cache.cache_dir(source)


@pytest.fixture
def cached(packaged):
    """The tiny model converted once: (source, its module, the cache directory, the header a load expects)."""
    source, module, directory = packaged
    assert load_model("tiny", reuse=False, progress=False).origin == "converted"
    return source, module, directory, weights_cache.expected_header(source, models.gguf_path(source))


def _assert_same_weights(lm, module):
    loaded = lm.model.state_dict()
    for name, tensor in module.state_dict().items():
        assert torch.equal(tensor, loaded[name]), name  # safetensors stores the float32 bits as they are


def test_first_load_converts_once_then_loads_the_verified_cache(packaged):
    source, module, directory = packaged
    first = load_model("tiny", reuse=False, progress=False)
    assert (first.origin, first.notes) == ("converted", [])  # no cache before: nothing to report
    _assert_same_weights(first, module)
    assert first.tokenizer("the cat sat")["input_ids"] == [2, 3, 4]
    assert sorted(os.listdir(directory.parent)) == ["tiny"]  # no staging directory left beside it
    again = load_model("tiny", reuse=False, progress=False)
    assert (again.origin, again.notes) == ("cache", [])
    _assert_same_weights(again, module)
    assert again.model.lm_head.weight.data_ptr() == again.model.model.embed_tokens.weight.data_ptr()  # re-tied


def test_intact_cache_passes_verification(cached):
    _, _, directory, header = cached
    assert header["source_package"] == "tiny-gguf-model==0.1" and header["source_bytes"] == 64
    assert cache_problem(directory, header) is None


def test_corrupted_byte_is_detected(cached):
    _, _, directory, header = cached
    path = directory / "model.safetensors"
    middle = path.stat().st_size // 2  # inside the tensor data, past the header
    with open(path, "r+b") as handle:
        handle.seek(middle)
        byte = handle.read(1)
        handle.seek(middle)
        handle.write(bytes([byte[0] ^ 0xFF]))
    assert "does not match its checksum" in cache_problem(directory, header)


def test_a_file_whose_stat_is_unchanged_is_not_read_again_and_any_write_is_seen(cached, monkeypatch):
    # The digests are read once; a later check compares each file's stat with verified.json instead (0.9 s less for
    # every process that loads the embedded model). A flipped byte with its modification time set back still
    # moves the file's change time, which utime cannot set back: the digest is read again and the flip found.
    _, _, directory, header = cached
    assert cache_problem(directory, header) is None
    recorded = json.loads((directory / weights_cache.VERIFIED).read_text())
    assert sorted(recorded) == sorted(json.loads((directory / "manifest.json").read_text())["files"])
    read, digest = [], weights_cache._digest
    monkeypatch.setattr(weights_cache, "_digest", lambda path: read.append(path.name) or digest(path))
    assert cache_problem(directory, header) is None and read == []
    path = directory / "model.safetensors"
    before = path.stat()
    with open(path, "r+b") as handle:
        handle.seek(before.st_size // 2)
        byte = handle.read(1)
        handle.seek(before.st_size // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_mtime_ns == before.st_mtime_ns and path.stat().st_size == before.st_size
    assert "does not match its checksum" in cache_problem(directory, header)
    assert read == ["model.safetensors"]


def test_truncation_missing_manifest_and_version_change_are_detected(cached):
    _, _, directory, header = cached
    assert f"made with transformers='{header['transformers']}', this is '0.0.1'" in cache_problem(
        directory, {**header, "transformers": "0.0.1"})
    later = header["cache_format"] + 1
    assert f"made with cache_format={later - 1}, this is {later}" in cache_problem(directory, {**header, "cache_format": later})
    _truncate(directory / "tokenizer.json")
    assert "truncated" in cache_problem(directory, header)
    (directory / "manifest.json").unlink()
    assert "no manifest" in cache_problem(directory, header)


def _truncate(path):
    size = path.stat().st_size
    with open(path, "r+b") as handle:
        handle.truncate(size // 2)
    return True


def test_killed_conversion_leaves_no_half_cache_then_a_damaged_cache_is_rebuilt(cached, monkeypatch, capsys):
    _, module, directory, _ = cached
    _truncate(directory / "model.safetensors")
    before = sorted(p.name for p in directory.parent.iterdir())
    capsys.readouterr()

    import safetensors.torch

    real_save = safetensors.torch.save_file

    def save_then_die(state, filename, *args, **kwargs):
        with open(filename, "wb") as handle:
            handle.write(b"half a file")
        raise KeyboardInterrupt  # what a learner pressing stop looks like

    monkeypatch.setattr(safetensors.torch, "save_file", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        load_model("tiny", reuse=False, progress=False)
    # No staging directory is left, and the old (damaged) cache was not replaced by a half-written one.
    assert sorted(p.name for p in directory.parent.iterdir()) == before
    assert "manifest.json" in os.listdir(directory)

    monkeypatch.setattr(safetensors.torch, "save_file", real_save)
    rebuilt = load_model("tiny", reuse=False, progress=False)
    assert rebuilt.origin == "converted"
    assert "Rebuilding the model cache" in capsys.readouterr().out
    assert "truncated" in rebuilt.notes[0]
    _assert_same_weights(rebuilt, module)
    again = load_model("tiny", reuse=False, progress=False)
    assert again.origin == "cache" and again.notes == []


def test_cache_file_is_readable_by_every_transformers_version(cached):
    # transformers 4.x needs the "format" metadata and the tied matrix under the embedding's own name.
    from safetensors import safe_open

    _, _, directory, _ = cached
    with safe_open(str(directory / "model.safetensors"), framework="pt") as handle:
        assert handle.metadata() == {"format": "pt"}
        names = set(handle.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names


def test_a_cache_that_passes_its_manifest_but_does_not_load_is_rebuilt(cached, capsys):
    # A weight missing from the file (as a format-1 cache was for transformers 4.x: its embedding was stored only
    # under lm_head.weight); the manifest's checksums match, since they were made from the same file.
    import safetensors.torch

    _, module, directory, _ = cached
    path = directory / "model.safetensors"
    state = safetensors.torch.load_file(str(path))
    del state["model.layers.0.mlp.down_proj.weight"]
    safetensors.torch.save_file(state, str(path), metadata={"format": "pt"})
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["files"]["model.safetensors"] = {"bytes": path.stat().st_size, "blake2b": weights_cache._digest(path)}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    assert cache_problem(directory, manifest["header"]) is None  # the manifest alone cannot tell
    capsys.readouterr()

    rebuilt = load_model("tiny", reuse=False, progress=False)
    assert rebuilt.origin == "converted"
    assert "did not load" in capsys.readouterr().out and "did not load" in rebuilt.notes[0]
    _assert_same_weights(rebuilt, module)


def test_clear_cache_removes_every_model_cache(cached):
    _, _, directory, _ = cached
    assert weights_cache.clear_cache() == directory.parent and not directory.parent.exists()


def test_ensuring_the_cache_builds_or_repairs_it_and_loads_nothing(packaged, monkeypatch, capsys):
    # What the grader does before each submission: the cache the wall shows read-only, checked without a load.
    source, module, directory = packaged
    loaded = []
    monkeypatch.setattr(weights_cache, "_load_cache", lambda path: loaded.append(path))
    assert models.ensure_model_cache("tiny", progress=False) == directory
    assert cache_problem(directory, weights_cache.expected_header(source, models.gguf_path(source))) is None
    _truncate(directory / "model.safetensors")
    capsys.readouterr()
    assert models.ensure_model_cache("tiny", progress=False) == directory
    said = capsys.readouterr().out
    assert "Rebuilding the model cache" in said and "truncated" in said
    assert cache_problem(directory, weights_cache.expected_header(source, models.gguf_path(source))) is None
    assert loaded == []  # converted and verified, never loaded
    # Verified once per process: the checksums are read again only when a file changed.
    read, digest = [], weights_cache._digest
    monkeypatch.setattr(weights_cache, "_digest", lambda path: read.append(path.name) or digest(path))
    models.ensure_model_cache("tiny", progress=False)
    assert read == []
    _truncate(directory / "model.safetensors")
    capsys.readouterr()
    models.ensure_model_cache("tiny", progress=False)
    assert "model.safetensors" in read and "truncated" in capsys.readouterr().out
    assert cache_problem(directory, weights_cache.expected_header(source, models.gguf_path(source))) is None
    with pytest.raises(ValueError, match=r"name must be a packaged model of known_models\(\) \(\['tiny'\]\), got 'gpt2'"):
        models.ensure_model_cache("gpt2")


def test_a_gguf_files_metadata_is_parsed_once_while_transformers_reads_it_and_gguf_py_is_left_as_it_was(tmp_path):
    import gguf

    path = tmp_path / "few.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_token_list([f"t{i}" for i in range(50)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    original = (gguf.GGUFReader, gguf.get_tensor_name_map)
    llama = gguf.MODEL_ARCH.LLAMA
    with weights_cache.gguf_parsed_once():
        kept = gguf.GGUFReader  # as a module that imported it meanwhile would hold it
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first  # transformers' second and third reads: the same parse
        assert first.fields["llama.block_count"].contents() == 2
        assert gguf.get_tensor_name_map(llama, 2) is gguf.get_tensor_name_map(llama, 2)
        assert gguf.get_tensor_name_map(llama, 3) is not gguf.get_tensor_name_map(llama, 2)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == original
    after = kept(path)  # past the context, a kept reference parses anew each time, as gguf-py does
    assert isinstance(after, original[0]) and after is not first and kept(path) is not after
