"""labkit.runtime.capture: recording chosen modules' inputs or outputs, and always cleaning up.

Each model-level property runs on a tiny random Llama and on the embedded SmolLM2-135M. The tiny half needs no
model file, so it also checks older transformers: ``PYTHONPATH=<transformers 4.46 here> pytest -k "not embedded"``
(passed with 4.46.3 and 4.57.6, with LABKIT_CACHE pointing elsewhere so the user's model cache is not rebuilt).
"""

import pytest
import torch

from toys import random_token_ids, shape_of
from labkit import runtime
from labkit.runtime import capture, forward, layer_names


def test_capture_records_the_residual_stream_like_transformers(lm):
    token_ids = random_token_ids(lm, 1, 5)
    names = layer_names(lm)
    assert len(names) == shape_of(lm)[0]
    with capture(lm, names) as seen:
        forward(lm, token_ids)
    with torch.inference_mode():
        # embeddings, then each layer
        hidden = runtime.module_of(lm)(token_ids, output_hidden_states=True).hidden_states
    for index, name in enumerate(names[:-1]):  # transformers normalizes the last layer's output before returning it
        recorded = seen.only(name)
        assert recorded.device == torch.device("cpu") and not recorded.is_inference()
        # Two calls into the model by different routes (labkit's forward with a cache, transformers' own call
        # without): equal up to float32 reordering, relative to the largest activation (SmolLM2's reach 2e4).
        expected = hidden[index + 1]
        scale = float(expected.abs().max())
        assert torch.allclose(recorded, expected, rtol=0, atol=64 * torch.finfo(torch.float32).eps * scale)


def test_capture_every_linear_input(lm):
    config = runtime.module_of(lm).config
    with capture(lm, lambda name, module: isinstance(module, torch.nn.Linear), what="input") as seen:
        forward(lm, random_token_ids(lm, 1, 4))
    assert len(seen.names) == config.num_hidden_layers * 7 + 1  # q, k, v, o, gate, up, down per layer; the head
    assert seen.only("model.layers.0.self_attn.q_proj").shape == (1, 4, config.hidden_size)
    assert seen.only("model.layers.1.mlp.down_proj").shape == (1, 4, config.intermediate_size)
    assert seen.only("lm_head").shape == (1, 1, config.hidden_size)  # only the last position reaches the head


def test_embedded_massive_activation_in_the_residual_stream(embedded):
    """What the outlier lab shows: channel 507 of the first token's residual stream in the middle layers."""
    with capture(embedded, r"model\.layers\.15") as seen:
        forward(embedded, embedded.chat_ids("Hi"))
    first_token = seen.only("model.layers.15")[0, 0]  # [d_model]
    assert int(first_token.abs().argmax()) == 507 and float(first_token.abs().max()) > 10_000


def _hooks(module):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules())


@pytest.mark.parametrize("what", ["input", "output"])
def test_capture_removes_its_hooks_even_when_the_body_raises(tiny, what):
    before = _hooks(tiny)
    with pytest.raises(RuntimeError, match="learner's bug"):
        with capture(tiny, r"model\.layers\.\d+", what=what) as seen:
            forward(tiny, random_token_ids(tiny, 1, 3))
            assert _hooks(tiny) == before + 2
            raise RuntimeError("learner's bug")
    assert _hooks(tiny) == before
    assert [len(calls) for calls in seen.records.values()] == [1, 1]  # what ran before the error is kept
    with capture(tiny, r"model\.layers\.\d+", what=what) as seen:
        forward(tiny, random_token_ids(tiny, 1, 3))
        forward(tiny, random_token_ids(tiny, 1, 4))
    assert _hooks(tiny) == before and [t.shape[1] for t in seen["model.layers.1"]] == [3, 4]
    with pytest.raises(ValueError, match="called 2 times"):
        seen.only("model.layers.1")


def test_capture_rejects_what_matches_nothing(tiny):
    before = _hooks(tiny)
    with pytest.raises(ValueError, match="matches no module; names look like"):
        with capture(tiny, r"decoder\.\d+"):
            pass
    with pytest.raises(ValueError, match="are not in the model"):
        with capture(tiny, ["model.layers.7"]):
            pass
    with pytest.raises(ValueError, match="what must be one of"):
        with capture(tiny, r"model\.norm", what="weights"):
            pass
    assert _hooks(tiny) == before
