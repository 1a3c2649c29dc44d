"""Quantizing activations that have outliers: per token, LLM.int8()'s outlier columns, SmoothQuant's migration.

Layer 1 (core), pure math, no model. LLM.int8()'s mixed-precision decomposition (Dettmers et al. 2022) keeps the
input channels that reach a threshold in float and multiplies the rest in INT8 with per-token and per-output-row
scales; SmoothQuant (Xiao et al. 2023) moves the activations' range into the weights, leaving the product unchanged.
The grids and ``fake_quantize`` they build on are ``labkit.core.quantization``. Used by lab 04.
"""

from __future__ import annotations

import torch

from labkit.core.quantization import _check_input, fake_quantize
from labkit.core.validation import real

LLM_INT8_THRESHOLD = 6.0  # Dettmers et al. 2022, section 3.2: a feature dimension with magnitude >= 6 is an outlier


def per_token_fake_quantize(x: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """Symmetric fake quantization with one scale per token (row) of activations ``[..., channels]``."""
    flat = _check_input(x).reshape(-1, x.shape[-1])
    return fake_quantize(flat, bits, granularity="channel", axis=0).reshape(x.shape)


def outlier_channels(x: torch.Tensor, threshold: float = LLM_INT8_THRESHOLD) -> torch.Tensor:
    """Bool mask ``[channels]``: channels where some token's magnitude reaches the threshold (LLM.int8(), >= 6).

    >>> outlier_channels(torch.tensor([[0.5, -6.0, 5.9], [1.0, 0.0, 2.0]])).tolist()
    [False, True, False]
    """
    threshold = real("threshold", threshold, min=0, min_open=True)
    return (_check_input(x).abs() >= threshold).reshape(-1, x.shape[-1]).any(dim=0)


def fake_quantize_outliers_kept(x: torch.Tensor, threshold: float = LLM_INT8_THRESHOLD, bits: int = 8) -> torch.Tensor:
    """Activations as LLM.int8() computes with them: outlier channels exact, the rest per-token INT8.

    The per-token scales are taken over the non-outlier channels only (the outliers no longer set the range).
    """
    keep = outlier_channels(x, threshold)
    rest = x.masked_fill(keep, 0.0)
    return torch.where(keep, x, per_token_fake_quantize(rest, bits))


def int8_decomposed_matmul(x: torch.Tensor, weight: torch.Tensor,
                           threshold: float = LLM_INT8_THRESHOLD) -> torch.Tensor:
    """LLM.int8()'s matrix multiplication ``x @ weight.T`` with mixed-precision decomposition.

    Input channels (columns of x) with an outlier >= threshold are multiplied in float; the others in INT8
    with vector-wise scales: one per token (row of x) and one per output channel (row of weight), both over
    the non-outlier columns. x: ``[..., in]``, weight: ``[out, in]``; returns ``[..., out]`` in x's dtype.
    """
    keep = outlier_channels(x, threshold)  # [in]
    float_part = x[..., keep] @ weight[:, keep].T
    x_rest, w_rest = x.masked_fill(keep, 0.0), weight.masked_fill(keep, 0.0)
    int_part = per_token_fake_quantize(x_rest) @ fake_quantize(w_rest, 8, granularity="channel", axis=0).T
    return float_part + int_part


# ----------------------------------------------------------------------------------------------------------------
# SmoothQuant: move the activations' range into the weights


def smoothquant_scales(act_absmax: torch.Tensor, weight_absmax: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """Per input channel j: s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) (Xiao et al. 2023, eq. 4).

    ``act_absmax`` and ``weight_absmax`` are ``[in]`` (max over tokens, and over output rows of ``[out, in]``).
    Zeros are raised to 1e-5 first, as the authors' code does, so a silent channel gets a finite scale.

    >>> smoothquant_scales(torch.tensor([16.0, 1.0]), torch.tensor([1.0, 4.0]), 0.5).tolist()
    [4.0, 0.5]
    """
    alpha = real("alpha", alpha, min=0, max=1)
    act, wgt = act_absmax.clamp_min(1e-5), weight_absmax.clamp_min(1e-5)
    return (act.pow(alpha) / wgt.pow(1 - alpha)).clamp_min(1e-5)


def smooth(x: torch.Tensor, weight: torch.Tensor, alpha: float = 0.5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x / s, weight * s, s) with s from :func:`smoothquant_scales`: the product x @ weight.T is unchanged.

    The scales divide the *input* channels of x and multiply the matching *columns* of weight ``[out, in]``.
    """
    scales = smoothquant_scales(x.reshape(-1, x.shape[-1]).abs().amax(dim=0), weight.abs().amax(dim=0), alpha)
    return x / scales, weight * scales, scales
