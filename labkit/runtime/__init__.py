"""Layer 2, the runtime: the only code that runs a model (forward passes, KV caches, draft verification,
activation capture, copies), loading the models, and the loops built on it (generation, scoring a text).

In reading order: :func:`forward` is one pass (logits in float32 and the updated cache); :func:`prefill` and
:func:`decode_one_token` are the two passes of a generation loop, and :class:`StepInfo` is what such a loop
reports after each step; :func:`verify` scores k draft tokens in one pass (speculative decoding); the cache
helpers measure (:func:`cache_length`, :func:`cache_bytes`), cut back (:func:`crop`) and copy
(:func:`copy_cache`) a cache; :func:`capture` records chosen modules' inputs or outputs and
:func:`edit_outputs` replaces them for an intervention; :func:`model_copy`
gives a private model to quantize or prune while the shared one stays as loaded.

Modules: ``forward`` (passes, device, copies), ``cache``, ``capture``, ``sources`` (where a model comes from),
``models`` (loading it), ``weights_cache`` (the verified on-disk cache), ``generation`` (the token-by-token loop
with a per-step callback), ``step_counter`` (that loop's passes counted, for a loop written by hand) and
``scoring`` (a long text in windows); the README's Layout table names the rest. The names below are the runtime's
API, importable from ``labkit.runtime`` itself.

Every function takes a ``LoadedModel`` or a bare torch module. Token ids are ``[batch, seq_len]`` and go to the
model's device; results stay there (nothing here assumes CPU). Passes run under ``torch.inference_mode()``, so
the logits and cache tensors returned are inference tensors: read them, or ``.clone()`` before editing in place.

transformers versions (source read: 4.46.3, 4.57.6, 5.24.0). 5.x names the cache ``cache`` as argument and as
output field; 4.x names it ``past_key_values``. 4.46 hands back a legacy tuple of (key, value) pairs unless it
was given a ``Cache``, so :func:`forward` always gives it one. ``DynamicCache.crop(n)`` with ``n < 0`` removes
``-n`` tokens in every version (5.x accepts nothing else). The last-position shortcut is ``logits_to_keep``
(``num_logits_to_keep`` in 4.46).

A batch of prompts of different lengths is left-padded, with an attention mask and position ids
(:func:`forward`'s ``attention_mask`` and ``position_ids``; ``batching`` builds them); labkit's Llama forward decodes
on a static cache allocated once (``kv_cache``); any architecture is read by its structure (``structure``: the
blocks and linear layers activation capture and the weight formats work on). Left out: quantized KV caches, one
model spread over several devices. Used by every lab that runs the model (00 to 07).
"""

from labkit.runtime.cache import cache_bytes, cache_length, copy_cache, crop
from labkit.runtime.capture import Capture, capture, edit_outputs, layer_names
from labkit.runtime.forward import (POSITIONS, Forward, StepInfo, decode_one_token, forward, full_logits, model_copy,
                                    model_device, module_of, prefill, synchronize, to_device, verify)

__all__ = ["POSITIONS", "Capture", "Forward", "StepInfo", "cache_bytes", "cache_length", "capture", "copy_cache",
           "crop", "decode_one_token", "edit_outputs", "forward", "full_logits", "layer_names", "model_copy", "model_device",
           "module_of", "prefill", "synchronize", "to_device", "verify"]
