"""labkit.runtime.cache: caches that measure, crop and copy.

Each model-level property runs on a tiny random Llama and on the embedded SmolLM2-135M. The tiny half needs no
model file, so it also checks older transformers: ``PYTHONPATH=<transformers 4.46 here> pytest -k "not embedded"``
(passed with 4.46.3 and 4.57.6, with LABKIT_CACHE pointing elsewhere so the user's model cache is not rebuilt).
"""

import pytest
import torch

from alignment import logits_atol, misaligned_cache
from toys import random_token_ids
from labkit.core.distribution import choice_margin
from labkit.runtime import cache_bytes, cache_length, copy_cache, crop, decode_one_token, forward, prefill


def test_crop_then_decode_equals_decoding_directly(lm):
    prompt, rejected = random_token_ids(lm, 1, 6), random_token_ids(lm, 1, 3, seed=1)
    token = random_token_ids(lm, 1, 1, seed=2)
    _, cache = prefill(lm, prompt)
    forward(lm, rejected, cache, positions="all")  # three draft tokens the target then rejects
    assert cache_length(cache) == 9
    assert crop(cache, 6) is cache and cache_length(cache) == 6
    after_crop = decode_one_token(lm, token, cache).logits
    direct = decode_one_token(lm, token, prefill(lm, prompt).cache).logits
    assert torch.allclose(after_crop, direct, atol=1e-5)
    assert cache_length(crop(cache, 7)) == 7 and cache_length(crop(cache, 0)) == 0


def test_crop_rejects_lengths_outside_the_cache(tiny):
    _, cache = prefill(tiny, random_token_ids(tiny, 1, 4))
    for length in (5, -1):
        with pytest.raises(ValueError, match=r"length must be an int in \[0, 4\] \(the cache holds 4 tokens\), got"):
            crop(cache, length)
    for length in (2.0, True):  # the wrong type is a TypeError, as everywhere in labkit
        with pytest.raises(TypeError, match=r"length must be an int in \[0, 4\]"):
            crop(cache, length)
    with pytest.raises(TypeError, match="DynamicCache"):
        crop([(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2))], 1)


def test_a_copied_cache_is_independent(lm):
    _, cache = prefill(lm, random_token_ids(lm, 1, 5))
    copied = copy_cache(cache)
    before = cache_bytes(copied)
    decode_one_token(lm, random_token_ids(lm, 1, 1, seed=3), cache)
    assert (cache_length(cache), cache_length(copied)) == (6, 5) and cache_bytes(copied) == before
    crop(copied, 2)
    assert cache_length(cache) == 6
    # The copy continues like the original would have: the same values in other buffers (here deliberately
    # misaligned), so the same logits up to float32 reordering and the same greedy token.
    _, fresh = prefill(lm, random_token_ids(lm, 1, 5))
    token = random_token_ids(lm, 1, 1, seed=4)
    from_copy = decode_one_token(lm, token, misaligned_cache(copy_cache(fresh))).logits
    original = decode_one_token(lm, token, fresh).logits
    assert torch.allclose(from_copy, original, rtol=0, atol=logits_atol(lm, original))
    assert float(choice_margin(original, original.argmax(-1)).min()) > 10 * logits_atol(lm, original)
    assert torch.equal(from_copy.argmax(-1), original.argmax(-1))
