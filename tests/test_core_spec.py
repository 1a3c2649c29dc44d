import pytest

from toys import tiny_llama_config
from labkit.core.spec import ATTENTION, ModelSpec, with_attention


def test_from_llama_style_config_reads_explicit_head_dim():
    # Qwen3-0.6B: 16 query heads of width 128 in a 1024-wide model; d_model / n_heads would say 64.
    config = {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
              "num_hidden_layers": 28, "vocab_size": 151936, "intermediate_size": 3072, "tie_word_embeddings": True}
    spec = ModelSpec.from_config(config, name="qwen3")
    assert (spec.head_dim, spec.n_kv_heads, spec.query_per_kv, spec.tied_embeddings) == (128, 8, 2, True)


def test_from_gpt_neox_config_defaults_to_full_multi_head_attention():
    config = {"hidden_size": 128, "num_attention_heads": 4, "num_hidden_layers": 6, "vocab_size": 50304,
              "intermediate_size": 512, "tie_word_embeddings": False}
    spec = ModelSpec.from_config(config)
    assert (spec.n_kv_heads, spec.head_dim, spec.d_ff) == (4, 32, 512)


def test_falcon_multi_query_flag():
    config = {"hidden_size": 4544, "num_attention_heads": 71, "multi_query": True, "num_hidden_layers": 32,
              "vocab_size": 65024}
    assert ModelSpec.from_config(config).n_kv_heads == 1


def test_from_transformers_config_object():
    config = tiny_llama_config(head_dim=None)  # head_dim left for transformers to derive: 64 / 4
    spec = ModelSpec.from_config(config, name="tiny")
    assert (spec.n_layers, spec.d_model, spec.n_heads, spec.n_kv_heads, spec.head_dim) == (2, 64, 4, 2, 16)


@pytest.mark.parametrize("field,value,error", [("n_layers", 0, ValueError), ("head_dim", -1, ValueError),
                                               ("vocab", 2.5, TypeError), ("d_model", True, TypeError)])
def test_rejects_non_positive_or_non_int_sizes(field, value, error):
    kwargs = dict(name="x", n_layers=2, d_model=8, n_heads=4, n_kv_heads=2, head_dim=2, vocab=10)
    kwargs[field] = value
    with pytest.raises(error, match=f"{field} must be an int >= 1, got {value!r}"):
        ModelSpec(**kwargs)


def test_kv_heads_must_divide_query_heads():
    with pytest.raises(ValueError, match=r"n_heads \(9\) must be a multiple of n_kv_heads \(2\)"):
        ModelSpec("x", n_layers=1, d_model=9, n_heads=9, n_kv_heads=2, head_dim=1, vocab=5)


def test_falcon_new_decoder_architecture_reads_its_kv_head_count():
    config = {"model_type": "falcon", "hidden_size": 64, "num_attention_heads": 8, "num_kv_heads": 2,
              "new_decoder_architecture": True, "multi_query": True, "num_hidden_layers": 2, "vocab_size": 10}
    assert ModelSpec.from_config(config).n_kv_heads == 2


def test_empty_name_or_path_falls_back_to_model_type():
    config = {"_name_or_path": "", "model_type": "llama", "hidden_size": 8, "num_attention_heads": 2,
              "num_hidden_layers": 1, "vocab_size": 4}
    assert ModelSpec.from_config(config).name == "llama"


def test_max_position_embeddings_is_optional_and_read_from_either_config_name():
    assert ModelSpec("toy", 1, 8, 2, 1, 4, 10).max_position_embeddings is None
    llama = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100,
             "max_position_embeddings": 2048}
    assert ModelSpec.from_config(llama).max_position_embeddings == 2048
    gpt2 = {"n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 100, "n_positions": 1024}
    assert ModelSpec.from_config(gpt2).max_position_embeddings == 1024
    assert ModelSpec.from_config({k: v for k, v in llama.items() if k != "max_position_embeddings"}
                                 ).max_position_embeddings is None


@pytest.mark.parametrize("value,error", [(0, ValueError), (-1, ValueError), (2048.0, TypeError), ("2048", TypeError)])
def test_max_position_embeddings_must_be_a_positive_int(value, error):
    with pytest.raises(error, match="max_position_embeddings must be"):
        ModelSpec("toy", 1, 8, 2, 1, 4, 10, max_position_embeddings=value)


def test_presets_carry_the_context_limit_where_it_is_sourced():
    from labkit.core.presets import model_preset, model_presets

    # Pythia-14M: Lesson 4.1's "configured maximum sequence length of 2,048 positions"
    assert model_preset("Pythia-14M").max_position_embeddings == 2048
    assert model_preset("Llama-3.3-70B").max_position_embeddings == 131_072
    assert model_preset("Qwen3-0.6B").max_position_embeddings == 40_960
    assert model_preset("Falcon-7B").max_position_embeddings is None  # not sourced: left out, not guessed
    assert all(spec.max_position_embeddings is None or spec.max_position_embeddings >= 2048
               for spec in model_presets().values())


def test_attention_what_ifs_replace_the_kv_heads():
    from labkit.core.presets import model_preset

    llama = model_preset("Llama-3-8B")
    assert [with_attention(llama, a).n_kv_heads for a in ATTENTION] == [8, 32, 8, 1]
    assert with_attention(llama, "GQA") is llama and with_attention(llama, "MHA").n_params is None
    assert with_attention(model_preset("Pythia-14M"), "GQA").n_kv_heads == 1  # 4 heads grouped by 4
    with pytest.raises(ValueError, match=r"attention must be one of \('as built', 'MHA', 'GQA', 'MQA'\), got 'MLA'"):
        with_attention(llama, "MLA")
