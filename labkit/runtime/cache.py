"""KV caches as the runtime hands them out: tokens held, bytes measured, cropped back, copied.

``DynamicCache.crop(n)`` with ``n < 0`` removes ``-n`` tokens in every transformers version (5.x accepts nothing
else); 4.57+/5.x caches have ``.layers``, 4.46 caches and legacy tuples iterate as (key, value) per layer.
"""

from __future__ import annotations

import copy
from typing import Any, Iterator

import torch

from labkit.core import validation


def _layer_tensors(cache: Any) -> Iterator[torch.Tensor]:
    """Every key and value tensor of a cache: 4.57+/5.x ``.layers``, 4.46 ``DynamicCache`` or legacy tuples."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        pairs = ((getattr(layer, "keys", None), getattr(layer, "values", None)) for layer in layers)
    else:
        try:
            pairs = iter(cache)  # 4.46 DynamicCache and the legacy format both yield (key, value) per layer
        except TypeError:
            raise TypeError(f"cache must be a transformers Cache or a sequence of (key, value), got "
                            f"{type(cache).__name__}") from None
    for pair in pairs:
        yield from (tensor for tensor in pair if isinstance(tensor, torch.Tensor))


def cache_length(cache: Any) -> int:
    """Tokens a cache holds per sequence (0 for None).

    >>> cache_length([(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))])  # [batch, n_kv_heads, seq_len, head_dim]
    3
    """
    if cache is None:
        return 0
    if hasattr(cache, "get_seq_length"):
        return int(cache.get_seq_length())
    first = next(_layer_tensors(cache), None)
    return 0 if first is None else int(first.shape[-2])


def cache_bytes(cache: Any) -> int:
    """Bytes held by the key and value tensors of a cache, as measured (storage of the tensors, not a formula).

    >>> cache_bytes([(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))])  # 2 x 24 FP32 values
    192
    """
    return 0 if cache is None else sum(t.numel() * t.element_size() for t in _layer_tensors(cache))


def crop(cache: Any, length: int) -> Any:
    """Keep the first ``length`` tokens of a cache, in place (drops rejected draft tokens); returns the cache."""
    current = cache_length(cache)
    length = validation.integer("length", length, min=0, max=current, note=f"the cache holds {current} tokens")
    if not hasattr(cache, "crop"):
        raise TypeError(f"cache must be a transformers DynamicCache (it has crop), got {type(cache).__name__}")
    if length < current:
        # A negative count removes that many tokens in every transformers version; 5.x refuses a target length.
        with torch.inference_mode():
            cache.crop(length - current)
    return cache


def copy_cache(cache: Any) -> Any:
    """An independent deep copy: growing or cropping either one leaves the other as it was."""
    return copy.deepcopy(cache)


