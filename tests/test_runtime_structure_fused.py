"""labkit.runtime.structure.fused_parts: a fused projection's parts, held against the family's own forward.

Each family is built tiny from its config (random weights, no download). Its forward runs once with a hook on the
fused layer (what the layer wrote) and a record of the query, key and value its attention code made from that: the
tensors handed to transformers' attention function (a registered attention implementation that records and then
runs SDPA), or what the family's own split method returned (Falcon's ``_split_heads``, BLOOM's ``_reshape``). The
rotary models run at position 0 (``position_ids`` all zero: cos 1 and sin 0, so the turn returns q and k exactly),
so every part is compared with ``torch.equal``: the same values, read from the same output. A part recomputed from
the split weight is another order of operations: ``allclose`` at 1e-5 (float32 sums over 32 inputs of order one).
"""

import pytest
import torch

from labkit.runtime.structure import fused_parts, linear_weight

VOCAB, WIDTH, HEADS, HEAD_DIM = 50, 32, 4, 8
RECORD = "labkit_test_record"
RECORDED: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (query, key, value) of each attention call
TOKENS = torch.tensor([[3, 14, 15, 9, 26], [5, 35, 8, 9, 7]])  # [batch 2, seq_len 5]
AT_ZERO = {"position_ids": torch.zeros_like(TOKENS)}


def _recording_attention(module, query, key, value, attention_mask, **kwargs):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    RECORDED.append((query, key, value))  # [batch, heads, seq_len, head_dim] each
    return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, **kwargs)


def build(model_type, record=True, **settings):
    """A tiny random ``model_type`` model, one block; with ``record`` its attention calls are recorded."""
    from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM

    AttentionInterface.register(RECORD, _recording_attention)
    config = AutoConfig.for_model(model_type, vocab_size=VOCAB, bos_token_id=0, eos_token_id=1, **settings)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, **({"attn_implementation": RECORD} if record else {})).eval()


def run(model, layer, **kwargs):
    """(the fused layer's input, its output) in one forward of the model over TOKENS."""
    seen = {}
    handle = model.get_submodule(layer).register_forward_hook(
        lambda _, inputs, output: seen.update(input=inputs[0], output=output))
    RECORDED.clear()
    with torch.no_grad():
        model(TOKENS, **kwargs)
    handle.remove()
    return seen["input"], seen["output"]


def heads(part, n_heads):
    """``[batch, seq_len, n_heads * head_dim]`` -> ``[batch, n_heads, seq_len, head_dim]``, as attention takes it."""
    return part.unflatten(-1, (n_heads, -1)).transpose(1, 2)


def assert_weight_split_computes_each_part(model, layer, parts, x, output):
    linear = model.get_submodule(layer)
    weights = parts.split_weight(linear)
    biases = parts.split(linear.bias) if linear.bias is not None else {}
    for name, part in parts.split(output).items():
        with torch.no_grad():
            recomputed = torch.nn.functional.linear(x, weights[name], biases.get(name))
        assert torch.allclose(recomputed, part, rtol=0, atol=1e-5), name


def assert_matches_attention(model, layer, n_kv_heads, **kwargs):
    x, output = run(model, layer, **kwargs)
    parts = fused_parts(model, layer)
    [(query, key, value)] = RECORDED
    split = parts.split(output)
    assert torch.equal(heads(split["q"], HEADS), query)
    assert torch.equal(heads(split["k"], n_kv_heads), key) and torch.equal(heads(split["v"], n_kv_heads), value)
    assert_weight_split_computes_each_part(model, layer, parts, x, output)
    return parts


def test_gpt2_c_attn_is_q_then_k_then_v():
    model = build("gpt2", n_layer=1, n_embd=WIDTH, n_head=HEADS, n_positions=32)
    parts = assert_matches_attention(model, "transformer.h.0.attn.c_attn", HEADS)
    assert parts.rows["k"].tolist() == list(range(32, 64))  # [q 0..31 | k 32..63 | v 64..95]: split(d_model)
    assert linear_weight(model.get_submodule("transformer.h.0.attn.c_attn")).shape[0] == 3 * WIDTH


@pytest.mark.parametrize("multi_query", [True, False])
def test_gpt_bigcode_c_attn_in_both_layouts(multi_query):
    model = build("gpt_bigcode", n_layer=1, n_embd=WIDTH, n_head=HEADS, n_positions=32, multi_query=multi_query)
    parts = assert_matches_attention(model, "transformer.h.0.attn.c_attn", 1 if multi_query else HEADS)
    # one key head after every query head, or [q, k, v] of each head in turn
    assert parts.rows["k"][:3].tolist() == ([32, 33, 34] if multi_query else [8, 9, 10])


def test_gpt_neox_query_key_value_is_interleaved_head_by_head():
    model = build("gpt_neox", num_hidden_layers=1, hidden_size=WIDTH, num_attention_heads=HEADS,
                  intermediate_size=64)
    parts = assert_matches_attention(model, "gpt_neox.layers.0.attention.query_key_value", HEADS, **AT_ZERO)
    assert parts.rows["v"][HEAD_DIM - 1:HEAD_DIM + 1].tolist() == [23, 40]  # head 0's last v row, head 1's first
    assert parts.layout == "per head: [q, k, v]"


def test_persimmon_query_key_value_is_interleaved_head_by_head():
    model = build("persimmon", num_hidden_layers=1, hidden_size=WIDTH, num_attention_heads=HEADS,
                  intermediate_size=64, qk_layernorm=False)  # its QK norm would change q and k after the split
    assert_matches_attention(model, "model.layers.0.self_attn.query_key_value", HEADS, **AT_ZERO)


def test_phi3_qkv_proj_with_fewer_key_value_heads():
    model = build("phi3", num_hidden_layers=1, hidden_size=WIDTH, num_attention_heads=HEADS, num_key_value_heads=2,
                  intermediate_size=64, pad_token_id=None)
    parts = assert_matches_attention(model, "model.layers.0.self_attn.qkv_proj", 2, **AT_ZERO)
    assert [len(rows) for rows in parts.rows.values()] == [32, 16, 16]


@pytest.mark.parametrize("model_type", ["phi3", "glm", "glm4"])
def test_gate_up_proj_is_gate_then_up(model_type):
    model = build(model_type, record=False, num_hidden_layers=1, hidden_size=WIDTH, num_attention_heads=HEADS,
                  num_key_value_heads=2, intermediate_size=64, pad_token_id=None)
    layer = "model.layers.0.mlp.gate_up_proj"
    seen = {}
    down = model.get_submodule("model.layers.0.mlp.down_proj")
    handle = down.register_forward_pre_hook(lambda _, inputs: seen.update(hidden=inputs[0]))
    x, output = run(model, layer)
    handle.remove()
    parts = fused_parts(model, layer)
    split = parts.split(output)
    gate, up = output.chunk(2, dim=-1)  # the MLP's forward's own split
    assert torch.equal(split["gate"], gate) and torch.equal(split["up"], up) and len(gate[0, 0]) == 64
    mlp = model.get_submodule("model.layers.0.mlp")
    # what down_proj read, from the parts: the same elementwise operations on the same values (a contiguous copy
    # here, a strided view there: maybe another kernel, so within a few float32 roundings)
    assert torch.allclose(split["up"] * mlp.activation_fn(split["gate"]), seen["hidden"], rtol=1e-6, atol=0)
    assert_weight_split_computes_each_part(model, layer, parts, x, output)


def falcon(**settings):
    """A tiny Falcon whose ``_split_heads`` (its own split, the method its forward calls) records what it returns."""
    model = build("falcon", record=False, num_hidden_layers=1, hidden_size=WIDTH, num_attention_heads=HEADS,
                  **settings)
    attention = model.transformer.h[0].self_attention
    split_heads = attention._split_heads

    def recording(fused):
        RECORDED.append(split_heads(fused))  # [batch, seq_len, heads, head_dim] each
        return RECORDED[-1]

    attention._split_heads = recording
    return model


def test_falcon_new_architecture_is_grouped_by_key_value_head():
    model = falcon(new_decoder_architecture=True, num_kv_heads=2)
    layer = "transformer.h.0.self_attention.query_key_value"
    x, output = run(model, layer, **AT_ZERO)
    parts = fused_parts(model, layer)
    # two groups of 32 rows: two query heads (16 rows), one key head, one value head
    assert parts.rows["q"].tolist() == list(range(0, 16)) + list(range(32, 48))
    assert parts.rows["k"].tolist() == list(range(16, 24)) + list(range(48, 56))
    assert parts.rows["v"].tolist() == list(range(24, 32)) + list(range(56, 64))
    [(query, key, value)] = RECORDED
    split = {name: part.unflatten(-1, (-1, HEAD_DIM)) for name, part in parts.split(output).items()}
    assert torch.equal(split["q"], query)
    # Falcon hands each query head its group's key and value (broadcast): head h reads group h // 2
    assert torch.equal(split["k"].repeat_interleave(2, dim=2), key)
    assert torch.equal(split["v"].repeat_interleave(2, dim=2), value)
    assert_weight_split_computes_each_part(model, layer, parts, x, output)


@pytest.mark.parametrize("multi_query", [True, False])
def test_falcon_old_architecture_multi_query_or_per_head(multi_query):
    model = falcon(new_decoder_architecture=False, multi_query=multi_query)
    layer = "transformer.h.0.self_attention.query_key_value"
    x, output = run(model, layer, **AT_ZERO)
    parts = fused_parts(model, layer)
    [(query, key, value)] = RECORDED
    split = {name: part.unflatten(-1, (-1, HEAD_DIM)) for name, part in parts.split(output).items()}
    assert torch.equal(split["q"], query) and torch.equal(split["k"], key) and torch.equal(split["v"], value)
    assert key.shape[2] == (1 if multi_query else HEADS)
    assert parts.layout == ("[q of every head | one k | one v]" if multi_query else "per head: [q, k, v]")
    assert_weight_split_computes_each_part(model, layer, parts, x, output)


def test_bloom_query_key_value_is_interleaved_head_by_head():
    model = build("bloom", record=False, n_layer=1, hidden_size=WIDTH, n_head=HEADS)
    attention = model.transformer.h[0].self_attention
    reshape = attention._reshape
    attention._reshape = lambda fused: RECORDED.append(reshape(fused)) or RECORDED[-1]  # [batch, heads, seq, dim]
    layer = "transformer.h.0.self_attention.query_key_value"
    x, output = run(model, layer)
    parts = fused_parts(model, layer)
    [(query, key, value)] = RECORDED
    split = parts.split(output)
    assert torch.equal(heads(split["q"], HEADS), query) and torch.equal(heads(split["k"], HEADS), key)
    assert torch.equal(heads(split["v"], HEADS), value)
    assert_weight_split_computes_each_part(model, layer, parts, x, output)


# ---------------------------------------------------------------------------------------------------------------
# What is refused


class Unread(torch.nn.Module):
    """A fused q/k/v layer in a class whose forward labkit has not read."""

    def __init__(self):
        super().__init__()
        self.qkv_proj = torch.nn.Linear(4, 12)


def test_a_layout_labkit_has_not_read_is_refused_not_guessed():
    from transformers import LlamaConfig, LlamaForCausalLM

    net = torch.nn.Module()
    net.attn = Unread()
    with pytest.raises(ValueError, match=r"got 'attn.qkv_proj': Unread.qkv_proj, 12 outputs, in an order labkit "
                                         r"does not know"):
        fused_parts(net, "attn.qkv_proj")
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=HEADS))
    with pytest.raises(ValueError, match="LlamaAttention.q_proj, 32 outputs"):  # not fused: nothing to split
        fused_parts(llama, "model.layers.0.self_attn.q_proj")
    with pytest.raises(ValueError, match="layer must name a linear layer of the model, got 'model.layers.0.mlp', "
                                         "a LlamaMLP"):
        fused_parts(llama, "model.layers.0.mlp")
    with pytest.raises(ValueError, match="got 'model.layers.7.mlp.up_proj'"):
        fused_parts(llama, "model.layers.7.mlp.up_proj")


def test_a_config_that_disagrees_with_the_layer_is_refused():
    model = build("phi3", record=False, num_hidden_layers=1, hidden_size=WIDTH, num_attention_heads=HEADS,
                  num_key_value_heads=2, intermediate_size=64, pad_token_id=None)
    model.config.num_key_value_heads = 4  # the layer was built for 2
    with pytest.raises(ValueError, match=r"has 64 outputs, but its config gives its parts \{'q': 32, 'k': 32, "
                                         r"'v': 32\} \(96 in all\)"):
        fused_parts(model, "model.layers.0.self_attn.qkv_proj")
