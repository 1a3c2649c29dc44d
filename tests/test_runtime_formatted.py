"""Any causal LM in a weight format (labkit.runtime.formatted): a small GPT-2 (its linear layers are transformers'
Conv1D, stored transposed, with biases) whose every linear layer is held in BF16, INT8 or INT4 and run by
transformers' forward. The bytes are worked out from the layers' shapes; the logits are held to the distances of
FP32 that tests/test_runtime_llama.py states for labkit's Llama decoder."""

import pytest
import torch

from labkit import runtime
from labkit.runtime import formatted, llama
from labkit.runtime.structure import is_linear, linear_weight

from test_runtime_any_architecture import PROMPT, wrap
from test_runtime_llama import FORMAT_BOUNDS

N_EMBD, N_LAYERS, N_POSITIONS = 64, 2, 64


@pytest.fixture(scope="module")
def gpt2(embedded):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model("gpt2", n_layer=N_LAYERS, n_embd=N_EMBD, n_head=4, n_positions=N_POSITIONS,
                                  vocab_size=len(embedded.tokenizer))
    return wrap(AutoModelForCausalLM.from_config(config), embedded.tokenizer, "tiny-gpt2")


def linear_shapes(module):
    """(out, in, has bias) of every linear layer, the tied head included."""
    return [(*linear_weight(child).shape, child.bias is not None) for child in module.modules() if is_linear(child)]


def expected_bytes(module, weights):
    """What one step reads, from the shapes: each linear layer in its format plus its bias, every other parameter
    but the two embedding tables (token and position: a step reads one row of each)."""
    vocab = module.config.vocab_size
    other = sum(p.numel() for name, p in module.named_parameters() if ".ln_" in name or name.endswith("ln_f.weight")
                or name.endswith("ln_f.bias"))
    size = 4 if weights == "fp32" else 2
    total = other * size
    for out, inp, bias in linear_shapes(module):
        codes = {"fp32": out * inp * 4, "bf16": out * inp * 2, "int8": out * inp + out * 2,
                 "int4": out * inp // 2 + (inp // 32) * out * 2 * 2}[weights]
        total += codes + (out * size if bias else 0)
    assert linear_shapes(module)[-1] == (vocab, N_EMBD, False)  # the head, tied to the token table
    return total


@pytest.mark.parametrize("weights", ["fp32", "bf16", "int8", "int4"])
def test_every_linear_layer_of_a_gpt2_is_held_in_the_format_and_its_logits_stay_near_fp32s(gpt2, weights):
    variant = llama.decoder(gpt2, weights)
    assert variant.model.weight_bytes == expected_bytes(gpt2.model, weights)
    if weights != "fp32":
        layers = [child for child in variant.model.modules() if isinstance(child, formatted.FormatLinear)]
        assert len(layers) == 4 * N_LAYERS + 1 and not any(is_linear(c) for c in variant.model.modules())
        assert gpt2.model.transformer.h[0].attn.c_attn.weight.dtype == torch.float32  # the original is untouched
    prompt_ids = gpt2.text_ids(PROMPT)
    reference = runtime.full_logits(gpt2, prompt_ids)
    ours = runtime.full_logits(variant, prompt_ids)
    relative = FORMAT_BOUNDS.get(weights, (0.0,))[0]
    assert (ours - reference).abs().max() <= relative * reference.abs().max()
    if weights == "int8":  # the dequantized matrix of the first layer is the INT8 grid of the original's rows
        inner = variant.model.transformer.h[0].attn.c_attn.inner
        original = linear_weight(gpt2.model.transformer.h[0].attn.c_attn).float()
        step = original.abs().amax(dim=1, keepdim=True) / 127
        assert ((inner.dequantized() - original).abs() <= 0.51 * step + 1e-6).all()


def test_a_model_already_in_a_format_is_refused(gpt2):
    with pytest.raises(TypeError, match="lm must be a LoadedModel as load_model.. returns it, got one already "
                                        "holding GPT2LMHeadModel in a weight format"):
        llama.decoder(llama.decoder(gpt2, "int8"), "int4")
