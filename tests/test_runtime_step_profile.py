"""labkit.runtime.step_profile: a decode step's CPU time split into the weight matmuls and the rest."""

import pytest

from toys import random_token_ids, tiny_llama
from labkit.runtime import llama
from labkit.runtime.step_profile import MATMUL_OPS, profile_decode


class Loaded:
    def __init__(self, module):
        self.model = module


@pytest.mark.parametrize("forward", ["labkit", "transformers"])
def test_a_step_splits_into_matmuls_and_the_rest(forward):
    lm = Loaded(tiny_llama())
    lm.decoder = llama.DECODERS[forward]  # as a LoadedModel holds it (llama.with_forward)
    profile = profile_decode(lm, random_token_ids(lm.model, 1, 5), steps=3, threads=1)
    assert profile.matmul_s > 0 and profile.other_s > 0 and 0 < profile.matmul_share < 1
    assert profile.step_s == pytest.approx(profile.matmul_s + profile.other_s)
    # 2 blocks x 4 products (labkit's stacked QKV and gate/up) or 7 (transformers') + the head, each one operator
    # call or more
    assert profile.ops_per_step >= 9 and profile.steps == 3 and profile.threads == 1
    assert "aten::mm" in MATMUL_OPS
    # the largest operators, largest first, none taking more than the whole step, with calls per step
    assert len(profile.top) == 8 and all(a.self_s >= b.self_s for a, b in zip(profile.top, profile.top[1:]))
    assert sum(op.self_s for op in profile.top) <= profile.step_s * (1 + 1e-9)
    assert all(op.calls > 0 for op in profile.top)


def test_the_top_operators_of_an_int8_step_include_its_kernel_called_once_per_product():
    import torch

    decoder = llama.Llama(tiny_llama(), "int8")
    profile = profile_decode(Loaded(decoder), random_token_ids(decoder, 1, 5), steps=2, threads=1, top=1000)
    calls = {op.name: op.calls for op in profile.top}
    assert calls["aten::_weight_int8pack_mm"] == 2 * 4 + 1  # two blocks of four products, and the head
    with pytest.raises(ValueError, match="top must be"):
        profile_decode(Loaded(decoder), torch.tensor([[1, 2]]), top=-1)


def test_each_weight_format_runs_its_own_kernel():
    from torch.profiler import ProfilerActivity, profile
    import torch

    module = tiny_llama()
    token_ids = random_token_ids(module, 1, 4)
    for weights, kernel in [("int8", "aten::_weight_int8pack_mm"), ("int4", "aten::_weight_int4pack_mm_for_cpu")]:
        decoder = llama.Llama(module, weights)
        with profile(activities=[ProfilerActivity.CPU]) as profiled, torch.inference_mode():
            decoder(token_ids, decoder.new_cache(1, 8))
        assert kernel in {event.key for event in profiled.key_averages()}, weights
