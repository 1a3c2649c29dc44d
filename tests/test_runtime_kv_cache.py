"""labkit.runtime.kv_cache: the static cache, by hand: written in place, grown by doubling without losing a row,
cropped without moving anything, masks that hide the future and the padding, and the questions runtime.cache asks."""

import copy

import pytest
import torch

from labkit import runtime
from labkit.runtime.kv_cache import KVCache, new_capacity


def filled(seq_len, batch_size=2, capacity=4, n_layers=2):
    """A cache holding ``seq_len`` tokens whose key and value rows are their positions (layer l adds 100 l)."""
    cache = KVCache(n_layers, batch_size, 1, 3, capacity)
    cache.reserve(seq_len)
    for layer in range(n_layers):
        rows = torch.arange(seq_len, dtype=torch.float32)[None, None, :, None].expand(batch_size, 1, seq_len, 3)
        cache.write(layer, rows + 100 * layer, -(rows + 100 * layer))
    cache.advance(seq_len)
    return cache


def test_a_pass_writes_after_what_is_held_and_sees_every_row():
    cache = filled(3)
    cache.reserve(1)
    keys, values = cache.write(0, torch.full((2, 1, 1, 3), 7.0), torch.full((2, 1, 1, 3), -7.0))
    assert keys.shape == (2, 1, 4, 3) and keys[0, 0, :, 0].tolist() == [0.0, 1.0, 2.0, 7.0]
    assert values[1, 0, -1, 0] == -7.0
    assert keys.data_ptr() == cache.keys[0].data_ptr()  # a view of the reserved tensor: nothing was copied


def test_growing_doubles_the_reserve_and_keeps_every_row():
    cache = filled(3, capacity=4)
    cache.reserve(2)  # 5 tokens > 4 reserved
    assert cache.capacity == 8 and cache.length == 3
    assert cache.keys[1][0, 0, :3, 0].tolist() == [100.0, 101.0, 102.0]
    assert new_capacity(1) == 512 and new_capacity(256) == 512 and new_capacity(257) == 768


def test_crop_keeps_a_prefix_like_dynamic_cache_and_copies_are_independent():
    cache = filled(4, capacity=8)
    twin = runtime.copy_cache(cache)
    runtime.crop(cache, 2)  # runtime.crop calls crop(-2): drop two
    assert runtime.cache_length(cache) == 2 and runtime.cache_length(twin) == 4
    cache.crop(1)  # a non-negative n keeps n tokens
    assert cache.length == 1
    with pytest.raises(ValueError, match="length"):
        runtime.crop(cache, 3)


def test_bytes_count_the_tokens_held_not_the_reserve():
    cache = filled(3, batch_size=2, capacity=64)
    # keys and values x 2 layers x batch 2 x 1 head x 3 tokens x width 3 x 4 bytes
    assert runtime.cache_bytes(cache) == 2 * 2 * 2 * 1 * 3 * 3 * 4
    assert cache.layers[0].keys.shape == (2, 1, 3, 3)


def test_masks_hide_the_future_and_the_padding_but_never_a_whole_row():
    cache = KVCache(1, 2, 1, 2, 8)
    cache.reserve(3, torch.tensor([[1, 1, 1], [0, 0, 1]]))
    mask = cache.attention_mask(3)[:, 0]  # [batch, query, key]
    assert mask[0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    # the second row's two padding tokens: each sees only itself; its real token sees only itself
    assert mask[1].tolist() == [[True, False, False], [False, True, False], [False, False, True]]
    cache.advance(3)
    cache.reserve(1, torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]]))
    assert cache.attention_mask(1)[:, 0, 0].tolist() == [[True] * 4, [False, False, True, True]]
    plain = filled(2, batch_size=1, capacity=8)
    plain.reserve(1)
    assert plain.attention_mask(1) is None  # one new token, no padding: it sees every cached key
    with pytest.raises(ValueError, match="attention_mask must be"):
        cache.reserve(1, torch.ones(2, 2))


def test_a_batch_of_copies_of_one_prefix():
    cache = filled(3, batch_size=1, capacity=8)
    cache.batch_repeat_interleave(3)
    assert cache.batch_size == 3 and torch.equal(cache.keys[0][2], cache.keys[0][0])
    assert "3 of 8 tokens" in repr(copy.deepcopy(cache))
