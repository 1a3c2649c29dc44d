"""Any model sized from its config alone: ModelSpec.from_config on real configs too large to build (a 70B Llama,
DeepSeek-V3's multi-latent attention and experts, sliding-window families), what it refuses, and the memory
explorer reading a config.json path or a hub id (config.json alone; offline without a cached copy: one line).

Every expected number is worked out here from the formula, with the config's own numbers; none is copied from
the code's output. The configs are the published config.json files' architecture fields (huggingface.co/<id>).
"""

import json

import pytest
import torch

from any_models import ARCHITECTURES, tiny_config
from labkit.core.memory import kv_bytes_per_token, kv_cache_bytes, param_count
from labkit.core.spec import ModelSpec, expert_param_count, sliding_layers, with_attention
from labkit.explorers.memory import compute, memory_explorer
from labkit.explorers.memory_models import read_model

# meta-llama/Meta-Llama-3-70B
LLAMA_70B = {"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
             "num_key_value_heads": 8, "num_hidden_layers": 80, "vocab_size": 128256, "rms_norm_eps": 1e-5,
             "max_position_embeddings": 8192, "tie_word_embeddings": False}
# deepseek-ai/DeepSeek-V3 (its config sets no head_dim; transformers' DeepseekV3Config sets it to qk_rope_head_dim)
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
               "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
               "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
               "qk_nope_head_dim": 128, "v_head_dim": 128, "n_routed_experts": 256, "n_shared_experts": 1,
               "num_experts_per_tok": 8, "first_k_dense_replace": 3, "n_group": 8, "topk_group": 4,
               "vocab_size": 129280, "max_position_embeddings": 163840, "tie_word_embeddings": False}
# google/gemma-2-9b: no layer_types; transformers' Gemma2Config alternates, layer 0 sliding
GEMMA2_9B = {"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 256, "num_hidden_layers": 42, "vocab_size": 256000,
             "sliding_window": 4096, "max_position_embeddings": 8192, "query_pre_attn_scalar": 256}


def test_a_70b_config_is_read_and_sized_by_hand(tmp_path):
    spec = ModelSpec.from_config(LLAMA_70B)
    assert (spec.n_layers, spec.n_kv_heads, spec.head_dim, spec.sliding_window) == (80, 8, 8192 // 64, None)
    # eq. 8.3: 2 (K, V) x B x T x L x H_kv x d_h x 2 B (BF16)
    assert kv_cache_bytes(spec, 4, 8192, "bf16") == 2 * 4 * 8192 * 80 * 8 * 128 * 2 == 10 * 2**30
    assert kv_cache_bytes(spec, 4, 8192, "bf16", tp=8) == 2 * 4 * 8192 * 80 * 1 * 128 * 2  # one KV head per GPU
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_70B))
    view = compute(str(tmp_path / "config.json"), "H100-SXM", batch_size=4, seq_len=8192, tp=4)
    n_params = (2 * 128256 * 8192 + 8192  # embeddings, head, final norm
                + 80 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192))  # q,o k,v mlp norms
    assert n_params == 70_553_706_496  # the published count of Llama-3-70B (safetensors index)
    per_gpu = (2 * -(-128256 // 4) * 8192 + 8192
               + 80 * (2 * 8192 * 8192 // 4 + 2 * 8192 * 2 * 128 + 3 * 8192 * 28672 // 4 + 2 * 8192))
    assert view.error is None and view.budget.weights_bytes == 2 * per_gpu
    assert view.budget.kv_cache_bytes == 2 * 4 * 8192 * 80 * 2 * 128 * 2
    assert "2 x B 4 x T 8,192 x L 80 x H_kv 2 (of 8, over 4 GPUs) x d_h 128 x 2 B" in view.steps[1]


def test_deepseek_v3_caches_its_latent_and_counts_its_experts(tmp_path):
    spec = ModelSpec.from_config({**DEEPSEEK_V3, "head_dim": 64})  # as transformers' config object writes it
    assert spec.latent_attention and (spec.kv_lora_rank, spec.qk_rope_head_dim) == (512, 64)
    assert (spec.head_dim, spec.n_kv_heads) == (128 + 64, 128)  # a query/key head, not the config's head_dim
    # One latent (512) and one rotary key (64) per token and layer, the same on every tensor-parallel GPU, where
    # 128 heads of 192-wide keys and 128-wide values would take 128 x (192 + 128) = 40,960 values.
    assert kv_bytes_per_token(spec, "bf16") == 61 * (512 + 64) * 2 == 70_272
    assert kv_cache_bytes(spec, 2, 32768, "bf16", tp=8) == 2 * 32768 * 61 * 576 * 2
    d, heads, layers = 7168, 128, 61
    attention = (d * 1536 + 1536 + 1536 * heads * 192  # q down, its norm, q up
                 + d * (512 + 64) + 512 + 512 * heads * (128 + 128) + heads * 128 * d)  # kv down, norm, kv up, o
    dense, moe = 3 * d * 18432, 256 * 3 * d * 2048 + 256 * d + 1 * 3 * d * 2048  # experts, router, shared expert
    n_params = 2 * 129280 * d + d + layers * (attention + 2 * d) + 3 * dense + (layers - 3) * moe
    assert spec.n_params == expert_param_count(DEEPSEEK_V3) == n_params
    assert round(n_params / 1e9) == 671  # the paper's 671B total parameters (arXiv:2412.19437)
    (tmp_path / "config.json").write_text(json.dumps(DEEPSEEK_V3))
    view = compute(str(tmp_path), "H100-SXM", weight_fmt="fp8", batch_size=1, seq_len=32768)
    assert view.budget.kv_cache_bytes == 32768 * 61 * 576 * 2 and view.budget.weights_bytes == n_params
    assert "L 61 x (latent 512 + rotary key 64, multi-latent attention) = 576 x 2 B" in view.steps[1]
    for setting in ({"tp": 2}, {"attention": "MQA"}):  # counted as built, on one GPU: refused with the reason
        assert "counted as built on one GPU only" in compute(str(tmp_path), "H100-SXM", **setting).error
    with pytest.raises(ValueError, match="caches one latent per token"):
        with_attention(spec, "GQA")


def test_sliding_window_layers_by_family():
    gemma2 = ModelSpec.from_config(GEMMA2_9B)
    assert (gemma2.sliding_window, gemma2.n_sliding_layers) == (4096, 21)
    # 21 full layers keep all 32,768 tokens, 21 sliding ones the last 4,095: 2 x 8 x 256 values x 2 B each
    assert kv_cache_bytes(gemma2, 1, 32768) == (21 * 32768 + 21 * 4095) * 2 * 8 * 256 * 2
    assert kv_cache_bytes(gemma2, 1, 4000) == 42 * 4000 * 2 * 8 * 256 * 2  # below the window nothing is dropped
    mistral = {"model_type": "mistral", "num_hidden_layers": 32, "sliding_window": 4096}  # Mistral-7B-v0.1
    qwen25 = {"model_type": "qwen2", "num_hidden_layers": 28, "sliding_window": 131072, "use_sliding_window": False,
              "max_window_layers": 28}  # Qwen2.5-7B: the window is written but off
    assert sliding_layers(mistral, 32) == (4096, 32) and sliding_layers(qwen25, 28) == (None, 0)
    assert sliding_layers({**qwen25, "use_sliding_window": True, "max_window_layers": 20}, 28) == (131072, 8)
    gemma3 = {"model_type": "gemma3_text", "sliding_window": 1024}  # Gemma 3: five sliding layers, then a full one
    assert sliding_layers(gemma3, 62) == (1024, 62 - 62 // 6)
    listed = {"sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 12}  # gpt-oss
    assert sliding_layers(listed, 24) == (128, 12)
    multimodal = ModelSpec.from_config({"model_type": "gemma3", "text_config": {**GEMMA2_9B,
                                                                               "model_type": "gemma3_text"}})
    assert (multimodal.n_layers, multimodal.n_sliding_layers) == (42, 42 - 42 // 6)


@pytest.mark.parametrize("extra,message", [
    ({"layer_types": ["linear_attention", "full_attention"]}, r"layer_types has \['linear_attention'\]"),
    ({"layer_types": ["full_attention"]}, "lists 1 layers, num_hidden_layers is 2"),
    ({"layer_types": ["sliding_attention", "chunked_attention"], "attention_chunk_size": 8192}, "one window size"),
    ({"num_kv_shared_layers": 1}, "reuse another layer's KV cache"),
    ({"layers_block_type": ["mamba", "attention"]}, "state-space"),
    ({"index_head_dim": 128}, "indexer caches keys"),
    ({"use_bidirectional_attention": True}, "not a causal LM"),
])
def test_what_cannot_be_counted_is_refused_with_the_reason(extra, message, tmp_path):
    # The spec is read (a loader may still run the model), and every KV count refuses it with the reason.
    config = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
              "vocab_size": 10, "intermediate_size": 128, "sliding_window": 8, **extra}
    spec = ModelSpec.from_config(config, name="odd")
    assert spec.n_layers == 2 and spec.kv_uncounted
    for count in (lambda: kv_cache_bytes(spec, 1, 10), lambda: kv_bytes_per_token(spec)):
        with pytest.raises(ValueError, match="odd's KV cache is not counted: .*" + message):
            count()
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="KV cache is not counted: .*" + message):
        read_model(str(tmp_path / "config.json"))


def test_a_latent_config_without_its_rotary_width_is_refused():
    config = {"model_type": "deepseek_v3", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
              "vocab_size": 10, "kv_lora_rank": 16}
    with pytest.raises(ValueError, match=r"has kv_lora_rank \(multi-latent attention\) but no \['qk_rope_head_dim',"):
        ModelSpec.from_config(config)


def test_experts_laid_out_otherwise_are_not_counted_and_the_explorer_says_why(tmp_path):
    # Qwen2-MoE adds a gated shared expert: expert_param_count does not follow it. The spec carries no count (its
    # KV cache is still sized), and the explorer refuses the model rather than count its weights as dense.
    config = {"model_type": "qwen2_moe", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
              "num_hidden_layers": 2, "vocab_size": 10, "intermediate_size": 128, "num_experts": 4,
              "moe_intermediate_size": 8}
    spec = ModelSpec.from_config(config)
    assert spec.n_params is None and kv_cache_bytes(spec, 1, 10, "fp32") == 2 * 10 * 2 * 4 * 16 * 4
    with pytest.raises(ValueError, match="'qwen2_moe' has experts or latent attention laid out in a way labkit"):
        expert_param_count(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="'qwen2_moe' has experts or latent attention laid out in a way labkit"):
        read_model(str(tmp_path / "config.json"))


def test_a_window_is_given_with_its_layers():
    base = dict(name="x", n_layers=2, d_model=8, n_heads=2, n_kv_heads=1, head_dim=4, vocab=10)
    with pytest.raises(ValueError, match="must be given together"):
        ModelSpec(**base, sliding_window=8)
    with pytest.raises(ValueError, match=r"sliding_window must be an int >= 2 \(tokens, the new one included\), got 1"):
        ModelSpec(**base, sliding_window=1, n_sliding_layers=1)
    with pytest.raises(ValueError, match="n_sliding_layers must be an int in"):
        ModelSpec(**base, sliding_window=8, n_sliding_layers=3)


def test_every_test_architecture_s_weights_are_counted_from_its_saved_config(tmp_path):
    # The explorer's block layout by model_type, against the parameters transformers really builds.
    from transformers import AutoModelForCausalLM

    for model_type in ARCHITECTURES:
        torch.manual_seed(0)
        module = AutoModelForCausalLM.from_config(tiny_config(model_type, 97))
        module.config.save_pretrained(tmp_path / model_type)
        sized = read_model(str(tmp_path / model_type / "config.json"))
        assert sized.note == "" and sized.spec.name == model_type
        assert param_count(sized.spec, sized.layout) == sum(p.numel() for p in module.parameters()), model_type


def test_a_hub_id_downloads_config_json_alone(tmp_path, monkeypatch):
    import huggingface_hub

    asked = []

    def fake_download(repo_id, filename, **kwargs):
        asked.append((repo_id, filename))
        (tmp_path / "config.json").write_text(json.dumps(GEMMA2_9B))
        return str(tmp_path / "config.json")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    read_model.cache_clear()
    view = compute("google/gemma-2-9b", "A100-80GB", batch_size=1, seq_len=8192)
    assert asked == [("google/gemma-2-9b", "config.json")] and view.spec.name == "google/gemma-2-9b"
    assert view.budget.kv_cache_bytes == (21 * 8192 + 21 * 4095) * 2 * 8 * 256 * 2
    assert "L_full 21 x T 8,192 + L_sliding 21 x min(T, window 4,096 - 1) 4,095" in view.steps[1]
    compute("google/gemma-2-9b", "T4")
    assert len(asked) == 1  # read once per process
    read_model.cache_clear()


def test_offline_and_not_cached_says_so_in_one_line(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    read_model.cache_clear()
    with pytest.raises(ValueError) as error:
        memory_explorer("Qwen/Qwen3-32B")
    message = str(error.value)
    assert "\n" not in message and message.startswith("no network and Qwen/Qwen3-32B's config.json is not in the")
    assert "memory_explorer('path/to/config.json')" in message
    with pytest.raises(ValueError, match="a hub id such as 'Qwen/Qwen3-32B' or the path of a config.json, got 'nope"):
        read_model("nope.json")


def test_the_widget_opens_on_a_config_path(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(GEMMA2_9B))
    path = str(tmp_path / "config.json")
    shown = memory_explorer(path, "H100-SXM")
    assert shown.controls["preset"].value == path and "Llama-3-8B" in shown.controls["preset"].options
    assert "L_sliding 21" in shown.text.value
    shown.controls["preset"].value = "Llama-3-8B"  # the presets stay one click away
    assert "L_sliding" not in shown.text.value and read_model(path).spec.n_sliding_layers == 21


def test_a_model_whose_every_layer_slides_stops_growing_past_its_window(tmp_path):
    # mistralai/Mistral-7B-v0.1: every layer keeps its last 4,095 tokens. With the prefill in chunks nothing grows
    # past the window, so the longest context is the model's own limit (the search must not double forever).
    config = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
              "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 32000, "sliding_window": 4096,
              "max_position_embeddings": 32768, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    views = [compute(str(tmp_path), "A100-80GB", batch_size=4, seq_len=16384, prefill_chunk=chunk)
             for chunk in (0, 8192)]
    assert all(view.budget.kv_cache_bytes == 2 * 4 * 4095 * 32 * 8 * 128 * 2 for view in views)
    assert views[1].max_seq == 32768 and views[0].max_seq > 32768  # one pass: the activations still grow


def test_a_multimodal_config_is_sized_by_its_text_model_and_says_so(tmp_path):
    # google/gemma-3-27b-it: the text model's numbers under text_config, a vision tower beside it.
    text = {"model_type": "gemma3_text", "hidden_size": 5376, "intermediate_size": 21504, "num_attention_heads": 32,
            "num_key_value_heads": 16, "head_dim": 128, "num_hidden_layers": 62, "vocab_size": 262208,
            "sliding_window": 1024, "query_pre_attn_scalar": 168}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3", "text_config": text,
                                                      "vision_config": {"model_type": "siglip_vision_model"}}))
    sized = read_model(str(tmp_path / "config.json"))
    assert (sized.spec.n_layers, sized.spec.n_sliding_layers, sized.spec.sliding_window) == (62, 62 - 10, 1024)
    assert "vision or audio encoder's weights are left out" in sized.note
    # 10 full layers keep 32,768 tokens, 52 sliding ones 1,023: x 2 (K, V) x 16 heads x 128 x 2 B
    assert kv_cache_bytes(sized.spec, 1, 32768) == (10 * 32768 + 52 * 1023) * 2 * 16 * 128 * 2


def test_latent_attention_of_a_family_not_checked_against_its_cache_is_refused():
    # MiniCPM3 has DeepSeek's latent attention; what its transformers cache holds has not been measured here.
    config = {**DEEPSEEK_V3, "model_type": "minicpm3"}
    spec = ModelSpec.from_config(config, name="minicpm3-like")
    assert spec.latent_attention and spec.n_params is None
    with pytest.raises(ValueError, match=r"multi-latent attention of 'minicpm3': .* checked for \['deepseek_v2', "):
        kv_cache_bytes(spec, 1, 10)


def test_the_mlp_width_is_read_from_each_familys_field_or_its_default():
    from labkit.core.memory import param_count
    from labkit.core.spec import ModelSpec

    gpt2 = {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_inner": None, "vocab_size": 50257}
    assert ModelSpec.from_config(gpt2).d_ff == 3072  # openai-community/gpt2's config.json: n_inner null, 4 x 768
    opt = {"model_type": "opt", "hidden_size": 768, "num_attention_heads": 12, "num_hidden_layers": 12,
           "ffn_dim": 3072, "vocab_size": 50272}
    assert ModelSpec.from_config(opt).d_ff == 3072
    falcon = {"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 32,
              "vocab_size": 65024}  # tiiuae/falcon-7b's config.json has no ffn_hidden_size: 4 x 4544
    assert ModelSpec.from_config(falcon).d_ff == 18176
    unknown = {"model_type": "made_up", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
               "vocab_size": 100}
    spec = ModelSpec.from_config(unknown)
    assert spec.d_ff is None
    with pytest.raises(ValueError, match="needs the MLP width, and its config has none of intermediate_size, "
                                         "ffn_hidden_size, n_inner, ffn_dim, decoder_ffn_dim"):
        param_count(spec)
