"""A private, quantized copy of a model: weight and/or activation schemes on its decoder Linear layers.

:func:`quantized_model` is a context manager. It copies the model (:func:`labkit.runtime.model_copy`),
replaces each chosen ``torch.nn.Linear`` of the copy by a :class:`QuantizedLinear` that computes with
fake-quantized weights and activations (labkit.core.quantization, labkit.core.outlier_schemes), and yields the copy. There is nothing to
restore on exit: the shared model was never touched (a test compares every tensor of it before and after).

What is simulated: the numbers a quantized kernel would compute with (fake quantization in float32), not its
speed or its packed storage. By default only the Linear layers inside the decoder blocks are quantized; the
embedding and the tied output matrix stay as loaded (quantizing the output head would also change the embedding
they share). Activations are quantized dynamically (the scales come from each call's own input); SmoothQuant's
per-channel scales come from a calibration pass of the *shared* model over ``calibration_ids``.

:func:`linear_inputs` captures one Linear's input over a text (GPTQ's calibration and held-out inputs), stopping
the pass at that Linear.

Used by lab 04 (the perplexity table, GPTQ's calibration). Left out: static activation scales, KV-cache
quantization, real integer kernels.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from labkit.core.outlier_schemes import (LLM_INT8_THRESHOLD, int8_decomposed_matmul, per_token_fake_quantize,
                                         smoothquant_scales)
from labkit.core.quantization import GRANULARITIES, SCHEMES, fake_quantize
from labkit.core.validation import choice, fail, instance, integer, real
from labkit.runtime.capture import capture, layer_names
from labkit.runtime.forward import model_copy, module_of

ACTIVATION_GRANULARITIES = ("tensor", "token", "outliers")


@dataclass(frozen=True)
class WeightScheme:
    """How each weight matrix ``[out, in]`` is stored: bits, scheme, and one scale per tensor/row/group."""

    bits: int = 8
    scheme: str = "symmetric"  # or "affine" (MinMaxObserver's rule)
    granularity: str = "channel"  # "tensor", "channel" (per output row) or "group" (along the input dimension)
    group_size: int | None = None  # with granularity "group"

    def __post_init__(self) -> None:
        integer("bits", self.bits, min=2, max=16)
        if self.scheme not in SCHEMES:
            choice("scheme", self.scheme, SCHEMES)
        if self.granularity not in GRANULARITIES:
            choice("granularity", self.granularity, GRANULARITIES)

    @property
    def label(self) -> str:
        size = f" g{self.group_size}" if self.granularity == "group" else ""
        return f"W{self.bits} {self.granularity}{size}"


@dataclass(frozen=True)
class ActivationScheme:
    """How each Linear's input is quantized at run time (symmetric, dynamic)."""

    bits: int = 8
    granularity: str = "tensor"  # "tensor", "token" (one scale per token) or "outliers" (LLM.int8()'s decomposition)
    threshold: float = LLM_INT8_THRESHOLD  # with "outliers": input channels with a magnitude >= this stay in float
    smooth_alpha: float | None = None  # SmoothQuant's migration strength; needs calibration_ids

    def __post_init__(self) -> None:
        integer("bits", self.bits, min=2, max=16)
        if self.granularity not in ACTIVATION_GRANULARITIES:
            choice("granularity", self.granularity, ACTIVATION_GRANULARITIES)
        real("threshold", self.threshold, min=0, min_open=True)
        real("smooth_alpha", self.smooth_alpha, min=0, max=1, optional=True)
        if self.granularity == "outliers" and self.bits != 8:
            raise fail(ValueError, "bits", "8 with granularity 'outliers' (LLM.int8())", self.bits)

    @property
    def label(self) -> str:
        smooth = f" SmoothQuant a={self.smooth_alpha:g}" if self.smooth_alpha is not None else ""
        return f"A{self.bits} per-{self.granularity}{smooth}"


class QuantizedLinear(torch.nn.Module):
    """A Linear layer computing with fake-quantized weights and (optionally) fake-quantized inputs.

    With SmoothQuant the input is divided by per-channel scales and the weight's columns were multiplied by
    them before the weight was quantized; a real deployment folds the division into the preceding norm.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, activations: ActivationScheme | None,
                 smooth_scales: torch.Tensor | None = None):
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)  # [out, in], already fake-quantized
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.activations = activations
        self.register_buffer("smooth_scales", smooth_scales)
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.smooth_scales is not None:
            x = x / self.smooth_scales
        scheme = self.activations
        if scheme is None:
            out = torch.nn.functional.linear(x, self.weight)
        elif scheme.granularity == "outliers":
            out = int8_decomposed_matmul(x, self.weight, scheme.threshold)
        elif scheme.granularity == "token":
            out = torch.nn.functional.linear(per_token_fake_quantize(x, scheme.bits), self.weight)
        else:
            out = torch.nn.functional.linear(fake_quantize(x, scheme.bits), self.weight)
        return out if self.bias is None else out + self.bias


def decoder_linear_names(lm: Any) -> list[str]:
    """Names of the Linear layers inside the decoder blocks (attention and MLP projections), in order."""
    blocks = tuple(f"{name}." for name in layer_names(lm))
    return [name for name, child in module_of(lm).named_modules()
            if isinstance(child, torch.nn.Linear) and name.startswith(blocks)]


def input_absmax(lm: Any, token_ids: torch.Tensor, names: list[str]) -> dict[str, torch.Tensor]:
    """max |input| per input channel of each named module over one pass on token_ids: ``{name: [in]}``."""
    from labkit.runtime.forward import forward

    with capture(lm, names, what="input") as seen:
        forward(lm, token_ids, use_cache=False)
    return {name: torch.stack([t.reshape(-1, t.shape[-1]).abs().amax(dim=0) for t in seen[name]]).amax(dim=0)
            for name in names}


class _Reached(Exception):
    """Raised by :func:`linear_inputs`' hook to end a pass once the Linear it wants has been called."""


def linear_inputs(lm: Any, name: str, token_ids: torch.Tensor) -> torch.Tensor:
    """The input of the Linear ``name`` over one pass on ``token_ids`` ``[n]``: ``[n, in]`` float32 on the CPU.

    The pass stops when that Linear is reached (nothing later can change its input), so capturing layer 3's
    q_proj input costs about 4 of the embedded model's 30 blocks. The model is left as it was: no cache, and the
    hook is removed also when the pass is cut short.
    """
    from labkit.runtime.forward import forward

    ids = torch.as_tensor(token_ids)
    if ids.ndim != 1 or ids.is_floating_point() or ids.numel() == 0:
        raise fail(ValueError, "token_ids", "a non-empty 1-D tensor of integer token ids [n]", token_ids)
    modules = dict(module_of(lm).named_modules())
    if not isinstance(modules.get(name), torch.nn.Linear):
        raise fail(ValueError, "name", "the name of a torch.nn.Linear of the model (decoder_linear_names(lm))", name)
    seen: list[torch.Tensor] = []

    def stop(_module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        with torch.inference_mode(False):  # a plain tensor the caller may edit, not an inference tensor
            seen.append(args[0].detach().to("cpu", dtype=torch.float32, copy=True))
        raise _Reached

    handle = modules[name].register_forward_pre_hook(stop)
    try:
        forward(lm, ids[None], use_cache=False)
    except _Reached:
        pass
    finally:
        handle.remove()
    if not seen:
        raise ValueError(f"{name} was not called by a forward pass")
    return seen[0].reshape(-1, seen[0].shape[-1])


def quantize_linear(linear: torch.nn.Linear, weights: WeightScheme | None, activations: ActivationScheme | None,
                    act_absmax: torch.Tensor | None = None) -> QuantizedLinear:
    """One Linear's replacement (its tensors are copied; the Linear itself is left as it was)."""
    weight = linear.weight.detach().clone()
    smooth_scales = None
    if activations is not None and activations.smooth_alpha is not None:
        act_absmax = act_absmax.to(weight.device)
        smooth_scales = smoothquant_scales(act_absmax, weight.abs().amax(dim=0), activations.smooth_alpha)
        weight = weight * smooth_scales  # columns: the scales act on input channels
    if weights is not None:
        weight = fake_quantize(weight, weights.bits, weights.scheme, weights.granularity, weights.group_size, axis=0)
    elif activations is not None and activations.granularity != "outliers":
        weight = fake_quantize(weight, 8, granularity="channel", axis=0)  # W8A8: weights per output channel
    return QuantizedLinear(weight, linear.bias, activations, smooth_scales)


@contextmanager
def quantized_model(lm: Any, weights: WeightScheme | None = None, activations: ActivationScheme | None = None,
                    *, names: list[str] | None = None, calibration_ids: torch.Tensor | None = None) -> Iterator[Any]:
    """A private copy of ``lm`` whose decoder Linear layers (or ``names``) compute under the given schemes.

    With ``activations`` and no ``weights`` the weights are INT8 per output channel (W8A8), except for the
    "outliers" scheme, which quantizes the non-outlier columns of each weight row itself (LLM.int8()).
    SmoothQuant (``activations.smooth_alpha``) needs ``calibration_ids`` ``[1, seq_len]``. The copy is yielded;
    the shared model is never modified, so leaving the block restores nothing.
    """
    if weights is not None:
        instance("weights", weights, WeightScheme, "a WeightScheme or None")
    if activations is not None:
        instance("activations", activations, ActivationScheme, "an ActivationScheme or None")
    if weights is not None and activations is not None and activations.granularity == "outliers":
        raise fail(ValueError, "weights", "None with activations 'outliers' (LLM.int8() keeps outlier columns "
                   "in float and quantizes the rest itself)", weights)
    names = decoder_linear_names(lm) if names is None else list(names)
    absmax: dict[str, torch.Tensor] = {}
    if activations is not None and activations.smooth_alpha is not None:
        if calibration_ids is None:
            raise fail(ValueError, "calibration_ids", "token ids [1, seq_len] when smooth_alpha is set", None)
        absmax = input_absmax(lm, calibration_ids, names)
    private = model_copy(lm)
    module = module_of(private)
    for name in names:
        parent_name, _, child_name = name.rpartition(".")
        parent = module.get_submodule(parent_name)
        replacement = quantize_linear(getattr(parent, child_name), weights, activations, absmax.get(name))
        setattr(parent, child_name, replacement)
    try:
        yield private
    finally:
        del private, module  # the copy's memory goes back once the caller drops its reference too
