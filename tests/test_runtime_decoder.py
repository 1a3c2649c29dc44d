"""labkit.runtime.decoder: one Decoder a loaded model holds, chosen when it loads, and asked by every pass.

The two implementations (labkit's Llama forward, transformers' forward) are told apart by what they do: the cache a
pass returns (labkit's static ``KVCache`` or transformers' ``DynamicCache``), the module a format is held in, the
module an early-exit draft is. A stand-in decoder shows the forward path asks the held decoder and nothing else.
"""

import dataclasses

import pytest
import torch

from toys import random_token_ids, tiny_llama, tiny_tokenizer
from labkit import runtime
from labkit.runtime import formatted, llama
from labkit.runtime.decoder import TRANSFORMERS, Decoder, TransformersDecoder, is_plain_llama
from labkit.runtime.drafters import EarlyExit
from labkit.runtime.kv_cache import KVCache

from any_models import save_tiny_model
from test_runtime_any_architecture import wrap


@pytest.fixture
def tiny_lm():
    return wrap(tiny_llama(), tiny_tokenizer(), "tiny-llama")


def test_load_model_chooses_the_decoder_once_from_the_checkpoint(tmp_path):
    from labkit.runtime.models import load_model

    tokenizer = tiny_tokenizer()
    loaded = {model_type: load_model(str(save_tiny_model(model_type, tmp_path / model_type, tokenizer)), reuse=False)
              for model_type in ("llama", "gpt_neox", "qwen2")}
    assert loaded["llama"].decoder is llama.LABKIT and loaded["llama"].forward_name == "labkit"
    for model_type in ("gpt_neox", "qwen2"):  # a Qwen2 is Llama-shaped, but its q/k/v carry biases
        assert loaded[model_type].decoder is TRANSFORMERS and loaded[model_type].forward_name == "transformers"


def test_a_loaded_model_built_without_a_decoder_gets_the_one_load_would_choose(tiny_lm):
    assert tiny_lm.decoder is llama.LABKIT  # wrap() passes none
    cast = wrap(tiny_llama().to(torch.bfloat16), tiny_tokenizer(), "cast")
    assert not is_plain_llama(cast.model) and cast.decoder is TRANSFORMERS


def test_with_forward_swaps_the_decoder_and_shares_the_module(tiny_lm):
    token_ids = random_token_ids(tiny_lm, 1, 5)
    theirs = llama.with_forward(tiny_lm, "transformers")
    assert theirs.decoder is TRANSFORMERS and theirs.forward_name == "transformers"
    assert theirs.model is tiny_lm.model and tiny_lm.decoder is llama.LABKIT  # shared, the original unchanged
    assert isinstance(runtime.prefill(tiny_lm, token_ids).cache, KVCache)
    assert not isinstance(runtime.prefill(theirs, token_ids).cache, KVCache)  # transformers' DynamicCache
    back = llama.with_forward(theirs, "labkit")
    assert back.decoder is llama.LABKIT and isinstance(runtime.prefill(back, token_ids).cache, KVCache)
    with pytest.raises(ValueError, match="name must be one of .*'labkit', 'transformers'.*got 'vllm'"):
        llama.with_forward(tiny_lm, "vllm")
    int8 = llama.decoder(tiny_lm, "int8")
    with pytest.raises(ValueError, match="name must be 'labkit' for a LoadedModel holding labkit's int8 decoder"):
        llama.with_forward(int8, "transformers")


def test_labkits_decoder_reads_only_a_plain_llama():
    from transformers import AutoModelForCausalLM
    from any_models import tiny_config

    gpt_neox = AutoModelForCausalLM.from_config(tiny_config("gpt_neox", 100)).eval()
    on_labkit = llama.with_forward(wrap(gpt_neox, tiny_tokenizer(), "neox"), "labkit")  # asked for, not readable
    assert llama.LABKIT.runs_on(gpt_neox) is None and llama.LABKIT.cut(gpt_neox, 1) is None
    assert not isinstance(runtime.prefill(on_labkit, torch.tensor([[5, 6, 7, 8]])).cache, KVCache)
    module = tiny_llama()
    assert isinstance(llama.LABKIT.runs_on(module), llama.Llama) and llama.LABKIT.cut(module, 1).n_layers == 1
    assert TRANSFORMERS.runs_on(module) is None and TRANSFORMERS.cut(module, 1) is None


def test_the_forward_path_asks_the_held_decoder():
    """A decoder of the test's own, running every new cached pass on an INT8 Llama: the runtime's passes follow it;
    a pass without a cache runs transformers' forward without asking it."""

    class Int8Decoder(TransformersDecoder):
        name = "int8 for the test"
        asked = 0

        def runs_on(self, module):
            Int8Decoder.asked += 1
            return int8

    module = tiny_llama()
    int8 = llama.Llama(module, "int8")
    lm = dataclasses.replace(wrap(module, tiny_tokenizer(), "tiny"), decoder=Int8Decoder())
    token_ids = random_token_ids(module, 1, 6)
    logits, cache = runtime.prefill(lm, token_ids)
    assert isinstance(cache, KVCache) and Int8Decoder.asked == 1 and lm.forward_name == "int8 for the test"
    assert torch.equal(logits, int8(token_ids, int8.new_cache(1, 8))[:, -1])  # the same module, the same input
    with torch.inference_mode():
        transformers_logits = module(token_ids).logits.float()
    assert torch.equal(runtime.full_logits(lm, token_ids), transformers_logits) and Int8Decoder.asked == 1
    runtime.prefill(lm, token_ids[:, :3])
    assert Int8Decoder.asked == 2


def test_weight_formats_follow_the_decoder(tiny_lm):
    on_labkit = llama.decoder(tiny_lm, "int8")
    assert isinstance(on_labkit.model, llama.Llama) and on_labkit.model.weights == "int8"
    assert on_labkit.decoder is llama.LABKIT and on_labkit.forward_name == "labkit"
    on_transformers = llama.decoder(llama.with_forward(tiny_lm, "transformers"), "int8")
    assert type(on_transformers.model).__name__ == "LlamaForCausalLM" and on_transformers.decoder is TRANSFORMERS
    layers = [c for c in on_transformers.model.modules() if isinstance(c, formatted.FormatLinear)]
    assert len(layers) == 2 * 7 + 1  # seven projections in each of two blocks, and the head
    assert not any(isinstance(c, formatted.FormatLinear) for c in tiny_lm.model.modules())  # a private copy
    # the same INT8 codes of the same weights, run by two forwards: near each other, both near FP32
    token_ids = random_token_ids(tiny_lm, 1, 6)
    reference = runtime.full_logits(tiny_lm, token_ids)
    for variant in (on_labkit, on_transformers):
        assert (runtime.full_logits(variant, token_ids) - reference).abs().max() <= 0.15 * reference.abs().max()
    assert on_labkit.model.weight_bytes == on_transformers.model.weight_bytes  # two countings of the same bytes


def test_an_early_exit_draft_is_rebuilt_when_the_decoder_changes(tiny_lm):
    drafter = EarlyExit(n_layers=1)
    token_ids = random_token_ids(tiny_lm, 1, 4)
    drafter.reset(tiny_lm, token_ids)
    assert isinstance(drafter.module, llama.Llama) and drafter.module.n_layers == 1
    drafter.reset(llama.with_forward(tiny_lm, "transformers"), token_ids)
    assert type(drafter.module).__name__ == "LlamaForCausalLM" and len(drafter.module.model.layers) == 1


def test_the_interface_is_abstract_and_one_decoder_of_each_kind():
    with pytest.raises(TypeError, match="abstract"):
        Decoder()
    assert TransformersDecoder() == TRANSFORMERS != llama.LABKIT and repr(llama.LABKIT) == "LlamaDecoder('labkit')"
    assert len({TRANSFORMERS, TransformersDecoder(), llama.LABKIT}) == 2
    assert llama.DECODERS == {"labkit": llama.LABKIT, "transformers": TRANSFORMERS}
