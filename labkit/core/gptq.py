"""GPTQ and its baseline, round-to-nearest: quantizing a Linear layer's weights column by column.

Layer 1 (core), pure math, no model. GPTQ (Frantar, Ashkboos, Hoefler and Alistarh, ICLR 2023, arXiv:2210.17323),
written column by column as its Algorithm 1 without the lazy-batch speed-up, with the reference code's optional
"act-order" (columns by descending Hessian diagonal); each column's rounding error is pushed onto the columns not yet
quantized. The grids, ``QuantizedTensor`` and the error measures are ``labkit.core.quantization``. Used by lab 04.
"""

from __future__ import annotations

import torch

from labkit.core.quantization import (QuantizedTensor, _check_group_size, _codes, _symmetric_scale, code_range,
                                      minmax_qparams, quantize, relative_error)
from labkit.core.validation import fail, instance, real


def gptq_column_order(inputs: torch.Tensor, act_order: bool = False) -> torch.Tensor:
    """The order in which GPTQ quantizes the columns of a weight ``[out, in]``: int64 ``[in]``.

    Algorithm 1 of the paper goes left to right (``0, 1, 2, ...``). The reference code's ``--act-order``
    (IST-DASLab/gptq, ``gptq.py``: ``torch.argsort(torch.diag(H), descending=True)``) takes the columns by
    *descending* diagonal of H = 2 X^T X first: diag(H)_j = 2 sum_t x_tj^2, so the first columns are those
    multiplied by the largest inputs, whose rounding errors cost the layer output most -- the hardest columns,
    quantized while the most columns remain to absorb their error. Ties keep index order (a stable sort).

    >>> gptq_column_order(torch.tensor([[1.0, 3.0, 0.0], [1.0, 0.0, 2.0]]), act_order=True).tolist()  # diag 4, 18, 8
    [1, 2, 0]
    >>> gptq_column_order(torch.ones(2, 3)).tolist()
    [0, 1, 2]
    """
    instance("inputs", inputs, torch.Tensor, "a floating torch.Tensor [n_samples, in]")
    if inputs.ndim != 2:
        raise fail(ValueError, "inputs", "2-D [n_samples, in]", inputs)
    if not act_order:
        return torch.arange(inputs.shape[1])
    diagonal = 2 * (inputs.double() ** 2).sum(dim=0)  # diag(2 X^T X), without forming H
    return torch.sort(diagonal, descending=True, stable=True).indices


def gptq(weight: torch.Tensor, inputs: torch.Tensor, bits: int = 4, group_size: int | None = None,
         damp: float = 0.01, scheme: str = "symmetric", act_order: bool = False) -> QuantizedTensor:
    """GPTQ on one Linear layer: quantize the columns of ``weight [out, in]`` one at a time, pushing each
    column's rounding error onto the columns not yet quantized through the inverse Hessian of the inputs.

    ``inputs``: calibration activations ``[n_samples, in]``. The layer objective ||W X^T - Q(W) X^T||^2 has the
    Hessian H = 2 X^T X; ``damp`` adds damp x mean(diag H) to the diagonal (the paper's 1 %), so the Cholesky
    factorization exists. With fewer samples than inputs (n_samples < in) H is singular before damping: GPTQ
    then fits the calibration inputs far better than any other input (lab 04 measures it).

    ``act_order``: quantize the columns in :func:`gptq_column_order`'s descending-diagonal order instead of left
    to right. A group's scale is then set from the group's (updated) weights when its first column comes up,
    so the groups stay contiguous in the stored layout (the reference code's ``static_groups`` keeps the layout
    too, with scales from the original weights).

    Returns the same QuantizedTensor layout as ``quantize(weight, bits, scheme, "group", group_size)``, or
    ``"channel"`` per output row when group_size is None. Computed in float64.
    """
    instance("weight", weight, torch.Tensor, "a floating torch.Tensor [out, in]")
    instance("inputs", inputs, torch.Tensor, "a floating torch.Tensor [n_samples, in]")
    if weight.ndim != 2:
        raise fail(ValueError, "weight", "2-D [out, in]", weight)
    if inputs.ndim != 2 or inputs.shape[1] != weight.shape[1]:
        raise fail(ValueError, "inputs", f"2-D [n_samples, {weight.shape[1]}]", inputs)
    damp = real("damp", damp, min=0, min_open=True)
    instance("act_order", act_order, bool, "True or False")
    q_min, q_max = code_range(bits, scheme)
    n_in = weight.shape[1]
    if group_size is not None:
        group_size = _check_group_size(weight, group_size)
    order = gptq_column_order(inputs, act_order)
    X = inputs.double()[:, order]  # columns in the order they are quantized
    W = weight.double()[:, order]  # a copy, updated in place as errors are pushed right
    H = 2 * X.T @ X  # [in, in]
    dead = torch.diagonal(H) == 0  # an input channel never active: its weights cannot matter
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    H += damp * torch.diagonal(H).mean() * torch.eye(n_in, dtype=H.dtype)
    # Upper Cholesky factor of H^-1: row k holds what quantizing the k-th column does to the later ones (eq. 3
    # of the paper, with the rows of H^-1 for already-quantized columns eliminated).
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)

    width = group_size or n_in
    n_groups = n_in // width
    position = torch.argsort(order)  # position[j]: where column j sits in the quantization order
    scales = torch.empty(weight.shape[0], n_groups, 1, dtype=torch.float64)
    zeros = torch.zeros(weight.shape[0], n_groups, 1, dtype=torch.int64)
    ready = [False] * n_groups
    codes = torch.empty(weight.shape, dtype=torch.int64)
    for k in range(n_in):
        column_index = int(order[k])
        g = column_index // width
        if not ready[g]:  # the group's scales from its weights as updated so far (none of them quantized yet)
            block = W[:, position[g * width:(g + 1) * width]]
            if scheme == "symmetric":
                scales[:, g] = _symmetric_scale(block.abs().amax(dim=1, keepdim=True), q_max)
            else:
                scales[:, g], zeros[:, g] = minmax_qparams(block.amin(1, keepdim=True), block.amax(1, keepdim=True),
                                                           q_min, q_max)
            ready[g] = True
        column = W[:, k]
        codes[:, column_index] = _codes(column, scales[:, g, 0], zeros[:, g, 0], q_min, q_max)
        quantized = (codes[:, column_index] - zeros[:, g, 0]) * scales[:, g, 0]
        error = (column - quantized) / U[k, k]
        W[:, k + 1:] -= torch.outer(error, U[k, k + 1:])  # error feedback onto the columns still to do
    scales = scales.to(weight.dtype)
    if group_size is None:
        return QuantizedTensor(codes, scales[:, 0], zeros[:, 0], bits, scheme, "channel", None, 0)
    return QuantizedTensor(codes, scales, zeros, bits, scheme, "group", group_size, None)


def layer_output_error(weight: torch.Tensor, weight_hat: torch.Tensor, inputs: torch.Tensor) -> float:
    """||X W^T - X W_hat^T|| / ||X W^T||: the layer-output error GPTQ minimizes, relative, in float64."""
    X = inputs.double()
    return relative_error(X @ weight.double().T, X @ weight_hat.double().T)


def round_to_nearest(weight: torch.Tensor, bits: int = 4, group_size: int | None = None,
                     scheme: str = "symmetric") -> QuantizedTensor:
    """Plain round-to-nearest with GPTQ's layout (per output row, or per group): the baseline it is beaten against."""
    if group_size is None:
        return quantize(weight, bits, scheme, "channel", axis=0)
    return quantize(weight, bits, scheme, "group", group_size)
