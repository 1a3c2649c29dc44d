"""Forward passes: one pass, prefill, one decode step, every position's logits, verification of draft tokens,
the model's device, and a private copy of the model. The only code that calls a model.

transformers versions (source read: 4.46.3, 4.57.6, 5.24.0). 5.x names the cache ``cache`` as argument and as
output field; 4.x names it ``past_key_values``. 4.46 hands back a legacy tuple of (key, value) pairs unless it
was given a ``Cache``, so :func:`forward` always gives it one. The last-position shortcut is ``logits_to_keep``
(``num_logits_to_keep`` in 4.46).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import sys
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from labkit.core import validation
from labkit.runtime.llama import decoder_for, run
from labkit.runtime.structure import module_of  # where the other runtime modules have long imported it from

POSITIONS = ("last", "all")


class Forward(NamedTuple):
    """What one forward pass returns; unpacks as ``logits, cache = forward(...)``."""

    logits: torch.Tensor  # float32, [batch, vocab] for positions="last", [batch, seq_len, vocab] for "all"
    cache: Any  # the updated transformers Cache (the one passed in, grown in place); None without a cache


# ---------------------------------------------------------------------------------------------------------------
# The model and its device


def model_device(lm: Any) -> torch.device:
    """Where the model's weights are (the device its passes run on).

    >>> model_device(torch.nn.Linear(2, 2))
    device(type='cpu')
    """
    module = module_of(lm)
    for tensor in module.parameters():
        return tensor.device
    for tensor in module.buffers():
        return tensor.device
    return torch.device("cpu")  # a module without tensors computes wherever its inputs are


def _as_device(device: Any) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be a torch device or a name such as 'cpu' or 'cuda', got {device!r}") from None


def _check_device(module: torch.nn.Module, device: Any) -> torch.device:
    """The model's device; a ``device`` named by the caller must be that one (models are moved explicitly)."""
    home = model_device(module)
    if device is None:
        return home
    wanted = _as_device(device)
    if wanted.type != home.type or (wanted.index is not None and wanted.index != (home.index or 0)):
        raise ValueError(f"device is {str(wanted)!r} but the model's weights are on {str(home)!r}; move the model "
                         f"once with to_device(lm, {str(wanted)!r}) or take model_copy(lm, device={str(wanted)!r})")
    return home


def to_device(lm: Any, device: Any) -> Any:
    """Move the model's weights to ``device`` in place (every later pass runs there); returns ``lm``."""
    module_of(lm).to(_as_device(device))
    return lm


def synchronize(device: Any) -> None:
    """Wait until the device has finished its queued work: a GPU runs asynchronously, so a wall time taken
    without this measures only the launch of the kernels. A no-op on CPU."""
    device = _as_device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


# ---------------------------------------------------------------------------------------------------------------
# Forward passes


@functools.lru_cache(maxsize=None)
def _forward_parameters(module_type: type) -> frozenset[str]:
    return frozenset(inspect.signature(module_type.forward).parameters)


def _new_cache(module: torch.nn.Module) -> Any:
    """An empty DynamicCache for a transformers model (None for other modules: they bring their own)."""
    transformers = sys.modules.get("transformers")  # a transformers model means transformers is imported
    if transformers is None or not isinstance(module, transformers.PreTrainedModel):
        return None
    from transformers import DynamicCache

    config = module.config

    # config tells 4.57+ which layers slide; 4.46's DynamicCache takes none.
    takes_config = "config" in inspect.signature(DynamicCache).parameters
    return DynamicCache(config=config) if takes_config else DynamicCache()


def rollback_cache(lm: Any) -> Any:
    """An empty transformers cache that can be cut back past a sliding window, for a model whose attention slides
    (Mistral, Gemma 2); None for any other model (its first pass makes its own cache, as before).

    A sliding layer keeps only its last ``sliding_window - 1`` keys, so rejected drafts past the window could not be
    cropped away; with past recording on (transformers' ``activate_past_recording``, what its assisted generation
    turns on) it keeps them until the next crop. 4.46's cache has no sliding layers: None there too.
    """
    cache = _new_cache(module_of(lm))  # None for labkit's own decoder or a module that brings its own cache
    if cache is None or not hasattr(cache, "activate_past_recording") or not any(
            getattr(layer, "is_sliding", False) for layer in getattr(cache, "layers", ())):
        return None
    cache.activate_past_recording()
    return cache


def _output_cache(output: Any) -> Any:
    for key in ("cache", "past_key_values"):  # renamed in transformers 5
        value = output.get(key) if isinstance(output, Mapping) else getattr(output, key, None)
        if value is not None:
            return value
    return None


def _check_ids(ids: Any, name: str) -> None:
    validation.tensor(name, ids, kind="int", ndim=2, shape="[batch, seq_len]", nonempty=True)
    if ids.shape[0] == 0:
        raise validation.fail(ValueError, name, "an integer tensor of shape [batch, seq_len] with batch >= 1", ids)


def forward(lm: Any, token_ids: torch.Tensor, cache: Any = None, *, positions: str | int = "last",
            use_cache: bool = True, device: Any = None, attention_mask: torch.Tensor | None = None,
            position_ids: torch.Tensor | None = None) -> Forward:
    """One forward pass over ``token_ids`` (``[batch, seq_len]``) after what ``cache`` holds.

    ``positions="last"`` returns the next-token logits ``[batch, vocab]`` (the vocabulary projection runs for
    the last position only when the model allows); ``"all"`` returns every position's ``[batch, seq_len, vocab]``;
    an int ``n`` the last ``n`` positions' ``[batch, n, vocab]`` (a prefill that also verifies drafts).
    ``cache=None`` starts a new cache; a cache passed in is grown in place and returned. ``use_cache=False``
    keeps no cache (scoring a text in one pass). ``device`` defaults to the model's and, when given, must be it.
    A batch of prompts of different lengths is left-padded: ``attention_mask`` (``[batch, cached + seq_len]``, 1
    for a real token, 0 for padding) hides the padding and ``position_ids`` (``[batch, seq_len]``) numbers each
    sequence's real tokens from 0 (:func:`labkit.runtime.batching.generate_requests` builds both).
    """
    module = module_of(lm)
    _check_ids(token_ids, "token_ids")
    if isinstance(positions, int) and not isinstance(positions, bool):
        validation.integer("positions", positions, min=1, max=token_ids.shape[1], note="the last n positions")
    elif positions not in POSITIONS:
        validation.choice("positions", positions, POSITIONS)
    validation.boolean("use_cache", use_cache)
    if cache is not None and not use_cache:
        raise ValueError("cache was given with use_cache=False; pass use_cache=True to continue from it")
    home = _check_device(module, device)
    parameters = _forward_parameters(type(module))
    kwargs: dict[str, Any] = {"use_cache": use_cache}
    for name, tensor in (("attention_mask", attention_mask), ("position_ids", position_ids)):
        if tensor is not None:
            validation.tensor(name, tensor, kind="int", ndim=2, shape="[batch, tokens]")
            if tensor.shape[0] != token_ids.shape[0]:
                raise ValueError(f"{name} must have one row per sequence ({token_ids.shape[0]}), got shape "
                                 f"{tuple(tensor.shape)}")
            kwargs[name] = tensor.to(home)
    decoder = decoder_for(lm, module, cache, use_cache)  # labkit's Llama forward, or None for transformers'
    if decoder is not None:
        with torch.inference_mode():
            return Forward(*run(decoder, token_ids.to(home), cache, positions, use_cache, _on(attention_mask, home),
                                _on(position_ids, home)))
    if use_cache:
        keyword = "cache" if "cache" in parameters else "past_key_values"
        kwargs[keyword] = cache if cache is not None else _new_cache(module)
    if positions != "all":
        keep = next((name for name in ("logits_to_keep", "num_logits_to_keep") if name in parameters), None)
        if keep is not None:
            kwargs[keep] = 1 if positions == "last" else positions
    with torch.inference_mode():
        output = module(token_ids.to(home), **kwargs)
        logits = output.logits  # [batch, seq_len (or 1), vocab]
        if positions == "last":
            logits = logits[:, -1, :]
        elif positions != "all":
            logits = logits[:, -positions:, :]
        return Forward(logits.float(), _output_cache(output) if use_cache else None)


def _on(tensor: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(device)


def prefill(lm: Any, token_ids: torch.Tensor, *, device: Any = None) -> Forward:
    """Run the prompt ``[batch, prompt_len]`` once: (last position's logits ``[batch, vocab]``, a new cache)."""
    return forward(lm, token_ids, positions="last", device=device)


def decode_one_token(lm: Any, token_ids: torch.Tensor, cache: Any, *, device: Any = None) -> Forward:
    """Feed one token per sequence (``[batch, 1]``) after the cached prefix: (next logits ``[batch, vocab]``, cache)."""
    _check_ids(token_ids, "token_ids")
    if token_ids.shape[1] != 1:
        raise ValueError(f"token_ids must be [batch, 1] (one new token per sequence), got {tuple(token_ids.shape)}")
    return forward(lm, token_ids, cache, positions="last", device=device)


def full_logits(lm: Any, token_ids: torch.Tensor, *, device: Any = None) -> torch.Tensor:
    """Logits of every position without a cache, ``[batch, seq_len, vocab]`` (the reference the cache must match)."""
    return forward(lm, token_ids, positions="all", use_cache=False, device=device).logits


def verify(lm: Any, cache: Any, last_ids: torch.Tensor, draft_ids: torch.Tensor, *, device: Any = None) -> Forward:
    """Score k draft tokens in one pass: the k + 1 next-token logits ``[batch, k + 1, vocab]`` and the cache.

    ``cache`` holds the accepted text except its last token, ``last_ids`` (``[batch, 1]``: chosen, not fed yet,
    as in a decode loop); ``draft_ids`` (``[batch, k]``, k >= 0) are the proposal. Row ``i`` of the logits is
    the distribution after ``last, draft_1 .. draft_i``: row 0 judges draft_1, row k gives the bonus token when
    every draft is accepted. The cache then holds all k + 1 tokens; after accepting n drafts, cut it back with
    ``crop(cache, length_before + 1 + n)`` (Leviathan et al. 2023, Algorithm 1; gpt-fast does the same).
    """
    _check_ids(last_ids, "last_ids")
    if last_ids.shape[1] != 1:
        raise ValueError(f"last_ids must be [batch, 1] (the last accepted token), got {tuple(last_ids.shape)}")
    if not isinstance(draft_ids, torch.Tensor) or draft_ids.ndim != 2 or draft_ids.shape[0] != last_ids.shape[0]:
        shape = tuple(draft_ids.shape) if isinstance(draft_ids, torch.Tensor) else type(draft_ids).__name__
        raise ValueError(f"draft_ids must be a tensor [batch, k] with batch {last_ids.shape[0]} like last_ids, "
                         f"got {shape}")
    if draft_ids.is_floating_point() or draft_ids.is_complex() or draft_ids.dtype == torch.bool:
        raise TypeError(f"draft_ids must hold integer token ids, got dtype {draft_ids.dtype}")
    block = torch.cat([last_ids, draft_ids.to(last_ids.device, last_ids.dtype)], dim=1)  # [batch, k + 1]
    return forward(lm, block, cache, positions="all", device=device)


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """What a generation loop reports after each step (the per-step callback's argument)."""

    step: int  # 0 is the prefill that produced the first new token; then one decode pass per token
    token_ids: torch.Tensor  # [batch] on CPU: the tokens chosen at this step
    step_s: float  # wall time of the step: forward pass and choice, device synchronized
    cache_length: int  # tokens the cache holds after the step (the chosen tokens are not fed yet)

    @property
    def phase(self) -> str:
        """``"prefill"`` for step 0, else ``"decode"``."""
        return "prefill" if self.step == 0 else "decode"


# ---------------------------------------------------------------------------------------------------------------
# A private copy of the model


def model_copy(lm: Any, *, device: Any = None) -> Any:
    """An independent deep copy of a model (a LoadedModel or a module) to quantize or prune; the original stays
    as loaded. Tied matrices stay tied inside the copy (deepcopy copies a shared tensor once).

    >>> shared = torch.nn.Linear(2, 2)
    >>> private = model_copy(shared)
    >>> _ = private.weight.data.zero_()
    >>> bool(shared.weight.abs().sum() > 0)
    True
    """
    module = module_of(lm)
    copied = copy.deepcopy(module).eval()
    if device is not None:
        copied.to(_as_device(device))
    if isinstance(lm, torch.nn.Module):
        return copied
    return dataclasses.replace(lm, model=copied, notes=[*lm.notes, "a private copy; the shared model is unchanged"])
