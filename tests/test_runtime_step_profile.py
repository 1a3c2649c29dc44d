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
    with llama.use_forward(forward):
        profile = profile_decode(lm, random_token_ids(lm.model, 1, 5), steps=3, threads=1)
    assert profile.matmul_s > 0 and profile.other_s > 0 and 0 < profile.matmul_share < 1
    assert profile.step_s == pytest.approx(profile.matmul_s + profile.other_s)
    # 2 blocks x 7 projections + the head: at least 15 matmuls, each one operator call or more
    assert profile.ops_per_step >= 15 and profile.steps == 3 and profile.threads == 1
    assert "aten::mm" in MATMUL_OPS


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
