"""Which forward decodes a loaded model: the :class:`Decoder` interface, chosen once when the model loads.

A :class:`~labkit.runtime.models.LoadedModel` holds one decoder (``lm.decoder``; its ``forward_name`` is the
decoder's ``name``), chosen by :func:`labkit.runtime.llama.choose_decoder` when ``load_model`` builds it and kept by
every copy of it. The forward path asks it, never a global switch: which module a new cached pass runs on
(:meth:`Decoder.runs_on`), what an early-exit draft cuts (:meth:`Decoder.cut`), and what lab 06's weight formats
hold (:meth:`Decoder.in_format`). Two implementations:

* :class:`~labkit.runtime.llama.LlamaDecoder` (``"labkit"``, in :mod:`labkit.runtime.llama`): labkit's readable
  forward with its static KV cache, for a plain Llama checkpoint; its weight formats are its own decoder's.
* :class:`TransformersDecoder` (``"transformers"``, here): transformers' own forward, for every other architecture;
  its weight formats are the model's linear layers replaced (:func:`labkit.runtime.formatted.in_format`).

What this leaves out: the transformers pass itself (``module(token_ids, ...)``) stays in
:func:`labkit.runtime.forward.forward`, which runs it whenever the decoder names no labkit module. Layer 2
(runtime). Used by every lab that runs a model; lab 06 compares the two forwards and the formats.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from typing import Any

import torch

from labkit.core import validation
from labkit.runtime.formatted import in_format
from labkit.runtime.weight_formats import FORMATS


class Decoder(ABC):
    """The forward a loaded model decodes through: asked by the runtime on each pass, chosen once at load."""

    name: str = ""  # what LoadedModel.forward_name reads: "labkit" or "transformers"

    @abstractmethod
    def runs_on(self, module: torch.nn.Module) -> torch.nn.Module | None:
        """The labkit module a new cached pass of ``module`` (a transformers model) runs on, or None when
        transformers' forward runs it."""

    @abstractmethod
    def cut(self, module: torch.nn.Module, n_layers: int) -> torch.nn.Module | None:
        """This forward's decoder of ``module`` cut after ``n_layers`` blocks (an early-exit draft), or None when
        the caller cuts the transformers module itself (:func:`labkit.runtime.drafters.truncated_model`)."""

    @abstractmethod
    def in_format(self, lm: Any, weights: str) -> Any:
        """A LoadedModel decoding ``lm``'s weights in the format ``weights`` (one of ``FORMATS``) on this forward,
        its ``model.weight_bytes`` the bytes a decode step reads."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def __eq__(self, other: object) -> bool:  # one decoder of each kind: two instances of a kind are the same one
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))


class TransformersDecoder(Decoder):
    """transformers' own forward, for every architecture it loads: each pass calls the module itself.

    >>> TRANSFORMERS.runs_on(torch.nn.Linear(2, 2)) is None, TRANSFORMERS.name
    (True, 'transformers')
    """

    name = "transformers"

    def runs_on(self, module: torch.nn.Module) -> None:
        return None

    def cut(self, module: torch.nn.Module, n_layers: int) -> None:
        return None

    def in_format(self, lm: Any, weights: str) -> Any:
        """Every linear layer of a private copy of ``lm``'s module held in ``weights`` (FP32 is the module as
        loaded), decoded by transformers' forward (:func:`labkit.runtime.formatted.in_format`)."""
        validation.choice("weights", weights, FORMATS)
        return dataclasses.replace(in_format(lm, weights), decoder=self)


TRANSFORMERS = TransformersDecoder()


# What labkit's Llama forward reads: a Llama as transformers loaded it
_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
            "mlp.up_proj", "mlp.down_proj")


def _inert(hook: Any) -> bool:
    """A hook that does nothing outside transformers' own forward: transformers 5 installs these on the first call
    with ``output_hidden_states=True`` and never removes them (they act only while its forward collects outputs)."""
    return getattr(hook, "__module__", None) == "transformers.utils.output_capturing"


def is_plain_llama(module: torch.nn.Module) -> bool:
    """A transformers Llama whose layers are as loaded: float32, plain Linears, no hooks (a capture or an edit runs
    through transformers, which calls them), no biases, SiLU."""
    if type(module).__name__ != "LlamaForCausalLM" or module.training:
        return False
    if any(p.dtype != torch.float32 for p in module.parameters()):  # a model cast to BF16 or FP16 runs as cast
        return False
    config = module.config
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False) or config.hidden_act != "silu":
        return False
    if torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks:
        return False
    for child in module.modules():
        if any(not _inert(hook) for hook in (*child._forward_hooks.values(), *child._forward_pre_hooks.values())):
            return False
    return all(type(layer.get_submodule(name)) is torch.nn.Linear
               for layer in module.model.layers for name in _LINEARS)
