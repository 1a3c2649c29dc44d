"""labkit.runtime.step_counter: a hand-written loop's passes, counted and capped, the same tokens as generate."""

from copy import deepcopy

import pytest
import torch

from labkit.runtime.generation import generate
from labkit.runtime.step_counter import StepCounter


@pytest.fixture(scope="module")
def prompt_ids(embedded):
    return embedded.chat_ids("Write one sentence about the moon.")  # [1, prompt_len]


def test_a_step_counter_counts_caps_and_matches_generate(embedded, prompt_ids):
    counter = StepCounter(embedded, max_prefill_calls=1, max_decode_calls=2)
    logits, cache = counter.prefill(prompt_ids)
    assert logits.shape == (1, prompt_ids.shape[1], embedded.spec.vocab)  # every prompt position
    chosen = [logits[:, -1].argmax(dim=-1, keepdim=True)]
    for _ in range(2):
        logits, cache = counter.decode_one_token(chosen[-1], cache)
        assert logits.shape == (1, 1, embedded.spec.vocab)
        chosen.append(logits[:, -1].argmax(dim=-1, keepdim=True))
    assert torch.cat(chosen, dim=1).tolist() == generate(embedded, prompt_ids, 3).new_token_ids.tolist()
    assert (counter.prefill_calls, counter.decode_calls) == (1, 2)
    with pytest.raises(RuntimeError, match="n new tokens take n - 1 decode calls"):
        counter.decode_one_token(chosen[-1], cache)
    with pytest.raises(RuntimeError, match="the prompt is prefilled once"):
        counter.prefill(prompt_ids)
    fresh = deepcopy(counter)
    assert fresh == counter and fresh.decode_calls == 0 and fresh._lm is embedded  # the model is shared
    with pytest.raises(ValueError, match="takes only the newest token"):
        fresh.decode_one_token(prompt_ids, cache)
    with pytest.raises(ValueError, match="call prefill first"):
        fresh.decode_one_token(chosen[-1], None)
    assert "decode calls 0 of at most 2" in repr(fresh)
