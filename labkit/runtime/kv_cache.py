"""The static KV cache of labkit's Llama forward: allocated once, written in place, never concatenated.

Each layer's keys and values live in one tensor ``[batch, n_kv_heads, capacity, head_dim]`` allocated up front (as
gpt-fast's ``KVCache`` does); a step writes its new rows at ``length`` and attends to the first ``length + seq_len``
rows, a view. So a decode step allocates no cache memory, where a growing cache (transformers' ``DynamicCache``)
concatenates a new tensor per layer per token. When a sequence outgrows ``capacity`` the cache doubles, once,
copying what it holds (rare: every doubling covers as many tokens as all before it).

It answers the same questions as transformers' cache, so ``runtime.cache_length``, ``cache_bytes``, ``crop`` and
``copy_cache`` work on it unchanged: ``get_seq_length()``, ``crop(n)`` (a negative ``n`` drops ``-n`` tokens,
transformers' convention), ``layers`` (each with ``keys`` and ``values``: views of the tokens held, so
``cache_bytes`` measures what the tokens occupy, not the reserve), ``batch_repeat_interleave``.

Left-padded batches: the caller's ``attention_mask`` (1 for a real token, 0 for padding) is kept beside the keys, and
:meth:`attention_mask` hides padding from every query; a padding query still sees itself, so no softmax row is empty.
Layer: runtime. Used by :mod:`labkit.runtime.llama`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

CAPACITY_STEP = 256  # a new cache holds the prompt and at least this many tokens more, rounded up to a multiple


@dataclass(frozen=True)
class CachedLayer:
    keys: torch.Tensor  # [batch, n_kv_heads, length, head_dim], a view of the tokens held
    values: torch.Tensor


class KVCache:
    """Keys and values of ``n_layers`` layers for ``batch_size`` sequences, ``capacity`` tokens reserved."""

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        shape = (batch_size, n_kv_heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.real: torch.Tensor | None = None  # [batch, capacity] bool, False at padding; None: no padding
        self.length = 0  # tokens held per sequence
        self._new = 0  # tokens of the pass in progress (written layer by layer, counted at advance)

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    @property
    def batch_size(self) -> int:
        return self.keys[0].shape[0]

    def reserve(self, seq_len: int, attention_mask: torch.Tensor | None = None) -> None:
        """Make room for ``seq_len`` new tokens (doubling if needed) and record the pass's padding, if any
        (``attention_mask`` ``[batch, length + seq_len]``, 1 for a real token)."""
        total = self.length + seq_len
        if total > self.capacity:
            capacity = max(2 * self.capacity, total)
            for tensors in (self.keys, self.values):
                for index, old in enumerate(tensors):
                    grown = old.new_zeros((*old.shape[:2], capacity, old.shape[3]))
                    grown[:, :, :self.length] = old[:, :, :self.length]
                    tensors[index] = grown
            if self.real is not None:
                grown_real = self.real.new_ones((self.batch_size, capacity))
                grown_real[:, :self.length] = self.real[:, :self.length]
                self.real = grown_real
        if attention_mask is not None:
            if tuple(attention_mask.shape) != (self.batch_size, total):
                raise ValueError(f"attention_mask must be [batch, cached + seq_len] = [{self.batch_size}, {total}], "
                                 f"got {tuple(attention_mask.shape)}")
            if self.real is None:
                self.real = torch.ones((self.batch_size, self.capacity), dtype=torch.bool,
                                       device=self.keys[0].device)
            self.real[:, :total] = attention_mask.to(self.real.device).bool()
        self._new = seq_len

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store one layer's new ``keys``/``values`` ``[batch, n_kv_heads, seq_len, head_dim]`` after what it holds;
        return every key and value to attend to, ``[batch, n_kv_heads, length + seq_len, head_dim]`` (views)."""
        start, end = self.length, self.length + keys.shape[2]
        self.keys[layer].narrow(2, start, end - start).copy_(keys)
        self.values[layer].narrow(2, start, end - start).copy_(values)
        return self.keys[layer].narrow(2, 0, end), self.values[layer].narrow(2, 0, end)

    def attention_mask(self, seq_len: int) -> torch.Tensor | None:
        """Which keys each new query sees, ``[batch or 1, 1, seq_len, length + seq_len]`` bool; None when every
        query sees every key (one new token, no padding). Query i sits at position ``length + i``: it sees keys up
        to its own (causal) and, in a padded batch, no padding other than itself."""
        total = self.length + seq_len
        if seq_len == 1 and self.real is None:
            return None
        device = self.keys[0].device
        query_at = torch.arange(self.length, total, device=device)[:, None]  # [seq_len, 1]
        key_at = torch.arange(total, device=device)[None, :]  # [1, total]
        mask = (key_at <= query_at)[None, None]  # [1, 1, seq_len, total]
        if self.real is not None:
            mask = (mask & self.real[:, None, None, :total]) | (key_at == query_at)[None, None]
        return mask

    def advance(self, seq_len: int) -> None:
        """The pass has written every layer: the cache now holds ``seq_len`` more tokens."""
        self.length += seq_len
        self._new = 0

    # The questions runtime.cache asks of transformers' caches --------------------------------------------------

    def get_seq_length(self, layer: int = 0) -> int:
        return self.length

    def crop(self, n: int) -> None:
        """Keep the first ``n`` tokens (``n < 0``: drop the last ``-n``), as ``DynamicCache.crop`` does. Nothing is
        moved: the rows beyond are overwritten by the next pass."""
        self.length = self.length + n if n < 0 else min(n, self.length)

    @property
    def layers(self) -> list[CachedLayer]:
        return [CachedLayer(k[:, :, :self.length], v[:, :, :self.length]) for k, v in zip(self.keys, self.values)]

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Each sequence ``repeats`` times in a row (a batch of copies of one prefix), in place."""
        self.keys = [k.repeat_interleave(repeats, dim=0) for k in self.keys]
        self.values = [v.repeat_interleave(repeats, dim=0) for v in self.values]
        if self.real is not None:
            self.real = self.real.repeat_interleave(repeats, dim=0)

    def __repr__(self) -> str:
        return (f"KVCache({len(self.keys)} layers, batch {self.batch_size}, {self.length} of {self.capacity} tokens, "
                f"{self.keys[0].dtype})")


def new_capacity(seq_len: int) -> int:
    """Tokens a new cache reserves for a first pass of ``seq_len`` tokens.

    >>> new_capacity(10), new_capacity(256), new_capacity(300)
    (512, 512, 768)
    """
    return -(-(seq_len + CAPACITY_STEP) // CAPACITY_STEP) * CAPACITY_STEP
