"""labkit.runtime.quantize.linear_inputs: one Linear's input over a text, the pass stopped at that Linear."""

import pytest
import torch

from labkit import runtime
from labkit.runtime.quantize import linear_inputs

NAME = "model.layers.3.self_attn.q_proj"


def test_equals_the_input_a_whole_pass_captures_and_leaves_no_hook(embedded):
    ids = embedded.text_ids("The history of science is a story of measurement and surprise.")
    with runtime.capture(embedded, [NAME], what="input") as seen:
        runtime.forward(embedded, ids, use_cache=False)
    whole = seen.only(NAME)[0]
    early = linear_inputs(embedded, NAME, ids[0])
    assert early.shape == whole.shape == (ids.shape[1], 576) and early.dtype == torch.float32
    assert torch.allclose(early, whole, rtol=1e-5, atol=1e-5)  # the same computation up to there
    assert not early.is_inference()
    module = runtime.module_of(embedded)
    assert not any(m._forward_pre_hooks for m in module.modules())


def test_later_blocks_are_not_run(embedded):
    later = "model.layers.4"
    with runtime.capture(embedded, [later], what="output") as seen:
        linear_inputs(embedded, NAME, embedded.text_ids("Hello there")[0])
    assert seen[later] == []


def test_arguments(embedded):
    with pytest.raises(ValueError, match="name must be the name of a torch.nn.Linear"):
        linear_inputs(embedded, "model.layers.3", torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="token_ids must be a non-empty 1-D tensor"):
        linear_inputs(embedded, NAME, torch.tensor([[1, 2]]))
