"""What counts as an outlier activation: the one definition of a massive activation (layer 1, pure math).

A massive activation (Sun, Chen, Kolter and Liu 2024, "Massive activations in large language models") is a
residual-stream entry thousands of times larger than the typical entry of its sequence: here, at least
:data:`RATIO` times the median |x| of its own sequence (all tokens and channels) and at least :data:`FLOOR` in
magnitude (Sun et al.'s absolute floor). Lab 04 lists them (:func:`labkit.runtime.activations.massive_activations`),
finds the layer where they appear and zeroes them there (:mod:`labkit.runtime.activations`). The outlier
channels of LLM.int8() (a fixed threshold on a Linear's input) are
:func:`labkit.core.outlier_schemes.outlier_channels`.
"""

from __future__ import annotations

import torch

from labkit.core import validation

RATIO = 1000.0  # |x| at least this many times the median |x| of its sequence (Sun et al. use 100; 1000 lists fewer)
FLOOR = 100.0  # and |x| at least this (Sun et al.'s absolute floor)


def massive_mask(x: torch.Tensor, ratio: float = RATIO, floor: float = FLOOR) -> torch.Tensor:
    """Bool mask of the massive entries of residual-stream activations ``[..., tokens, channels]``.

    An entry is massive when ``|x| >= ratio * median |x|`` of its own sequence (all tokens and channels) and
    ``|x| >= floor``.

    >>> x = torch.ones(1, 3, 4); x[0, 0, 2] = -5000.0
    >>> massive_mask(x).nonzero().tolist()
    [[0, 0, 2]]
    """
    ratio = validation.real("ratio", ratio, min=1)
    floor = validation.real("floor", floor, min=0)
    magnitudes = x.abs().float()
    flat = magnitudes.reshape(-1, *magnitudes.shape[-2:]) if magnitudes.dim() > 2 else magnitudes[None]
    median = flat.flatten(1).median(dim=1).values.reshape(-1, 1, 1)
    return ((flat >= ratio * median) & (flat >= floor)).reshape(x.shape)
