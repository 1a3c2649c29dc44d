"""What lab 04's outlier visualizer shows, computed from one capture (layer 3, explorers): the tensor at a layer
(its magnitudes, largest channels and tokens, per-tensor and per-token INT8 errors), the channels reaching an
LLM.int8() threshold, SmoothQuant's migration at strength alpha, and the median token's SQNR at every layer.

Each view is a frozen dataclass from :mod:`labkit.core.quantization` applied to the captured tensors
(:class:`labkit.runtime.activations.OutlierData`); the visualizer (:mod:`labkit.explorers.outliers`) combines them
in ``compute`` and keeps each one until its own inputs move.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from labkit.core.outlier_schemes import (fake_quantize_outliers_kept, outlier_channels, per_token_fake_quantize,
                                         smoothquant_scales)
from labkit.core.quantization import fake_quantize, relative_error, sqnr_db, token_sqnr_db
from labkit.runtime.activations import RESIDUAL, OutlierData

N_LISTED = 5


@dataclass(frozen=True)
class TensorView:
    """The tensor at one layer and source: magnitudes, where they peak, and the two threshold-free errors."""

    layer: int
    source: str
    magnitudes: np.ndarray  # |activation| [tokens, channels], float32
    largest: float
    median: float
    top_channels: tuple[tuple[int, float, int], ...]  # (channel, max |x|, at token), largest first
    top_tokens: tuple[tuple[int, str, float], ...]  # (token index, text, max |x|), largest first
    errors: dict[str, tuple[float, float]]  # scheme -> (relative error, SQNR dB)


@dataclass(frozen=True)
class ThresholdView:
    threshold: float
    outlier_channels: tuple[int, ...]  # channels where some token reaches the threshold
    error: tuple[float, float]  # outliers kept in float, the rest per-token INT8: (relative error, SQNR dB)


@dataclass(frozen=True)
class SmoothingView:
    alpha: float
    act_range: tuple[np.ndarray, np.ndarray]  # max |X_j| before, after smoothing [channels of the Linear's input]
    weight_range: tuple[np.ndarray, np.ndarray]  # max |W_j| before, after


@dataclass(frozen=True)
class LayersView:
    """The median token's SQNR (dB) under each INT8 scheme at every layer, for one source and threshold."""

    source: str
    threshold: float
    sqnr: dict[str, np.ndarray]  # scheme -> [n_layers]: the median token's SQNR (dB)


@dataclass(frozen=True)
class OutlierView:
    """What the visualizer shows for one setting: the parts, each recomputed only when its inputs move."""

    tensor: TensorView
    threshold: ThresholdView
    smoothing: SmoothingView
    layers: LayersView


def tensor_view(data: OutlierData, layer: int, source: str = RESIDUAL) -> TensorView:
    x = data.activations[source][layer]  # [tokens, channels]
    magnitudes = x.abs()
    per_channel, at_token = magnitudes.max(dim=0)
    per_token = magnitudes.amax(dim=1)
    channels = torch.topk(per_channel, min(N_LISTED, len(per_channel))).indices.tolist()
    tokens = torch.topk(per_token, min(N_LISTED, len(per_token))).indices.tolist()
    reconstructions = {"per-tensor INT8": fake_quantize(x, 8), "per-token INT8": per_token_fake_quantize(x, 8)}
    return TensorView(
        layer=layer, source=source, magnitudes=magnitudes.numpy(), largest=float(per_channel.max()),
        median=float(magnitudes.median()),
        top_channels=tuple((c, float(per_channel[c]), int(at_token[c])) for c in channels),
        top_tokens=tuple((t, data.token_texts[t], float(per_token[t])) for t in tokens),
        errors={name: (relative_error(x, x_hat), sqnr_db(x, x_hat)) for name, x_hat in reconstructions.items()})


def threshold_view(data: OutlierData, layer: int, source: str, threshold: float) -> ThresholdView:
    x = data.activations[source][layer]
    kept = fake_quantize_outliers_kept(x, threshold, 8)
    return ThresholdView(threshold, tuple(torch.nonzero(outlier_channels(x, threshold)).flatten().tolist()),
                         (relative_error(x, kept), sqnr_db(x, kept)))


def smoothing_view(data: OutlierData, layer: int, source: str, alpha: float) -> SmoothingView:
    linear_input = data.activations[data.residual_reader if source == RESIDUAL else source][layer]
    act_before = linear_input.abs().amax(dim=0)
    weight_before = data.weight_absmax[source][layer]
    scales = smoothquant_scales(act_before, weight_before, alpha)
    return SmoothingView(alpha, (act_before.numpy(), (act_before / scales).numpy()),
                         (weight_before.numpy(), (weight_before * scales).numpy()))


SCHEMES = ("per-tensor INT8", "per-token INT8", "outliers kept + per-token INT8")


def median_token_sqnr(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """The SQNR (dB) of the median token: what a typical token keeps (a tensor-wide SQNR is set by the outlier)."""
    return float(token_sqnr_db(x, x_hat).median())


def threshold_free_sqnr(data: OutlierData, source: str) -> dict[str, np.ndarray]:
    """Per-tensor and per-token INT8, the median token's SQNR (dB) at every layer (computed once per source)."""
    xs = data.activations[source]
    return {SCHEMES[0]: np.array([median_token_sqnr(x, fake_quantize(x, 8)) for x in xs]),
            SCHEMES[1]: np.array([median_token_sqnr(x, per_token_fake_quantize(x, 8)) for x in xs])}


def outliers_kept_sqnr(data: OutlierData, source: str, threshold: float) -> np.ndarray:
    """The median token's SQNR (dB) at every layer with the channels reaching ``threshold`` kept in float."""
    return np.array([median_token_sqnr(x, fake_quantize_outliers_kept(x, threshold, 8))
                     for x in data.activations[source]])


def layers_view(data: OutlierData, source: str, threshold: float) -> LayersView:
    """The three schemes' SQNR at every layer."""
    return LayersView(source, threshold, {**threshold_free_sqnr(data, source),
                                          SCHEMES[2]: outliers_kept_sqnr(data, source, threshold)})
