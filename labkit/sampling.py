"""From logits to a sampling distribution: temperature first (more filters arrive with the sampling lab).

Shapes: ``logits`` is ``[vocab]`` or ``[batch, vocab]``; every function works on the last dimension and returns
a new tensor (the input is never modified).

Temperature rule, written down once: for ``T > 0`` the logits are divided by ``T``. ``T == 0`` is *greedy*, by
an explicit rule rather than a tiny clamp: the first maximal logit of each row keeps value 0 and every other
entry becomes ``-inf``, so the softmax is a one-hot on the argmax (the first index wins a tie).

Used by lab 00 (the warm-up exercise) and lab 01.
"""

from __future__ import annotations

import math
import numbers

import torch


def _check_logits(logits: torch.Tensor) -> None:
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.ndim not in (1, 2) or logits.shape[-1] == 0:
        raise ValueError(f"logits must have shape [vocab] or [batch, vocab] with vocab >= 1, got {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a floating-point tensor, got dtype {logits.dtype}")
    if torch.isnan(logits).any():
        raise ValueError("logits contain NaN; a NaN score has no place in a ranking")


def _check_temperature(temperature: float) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a real number >= 0, got {temperature!r}")
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number >= 0 (0 means greedy), got {temperature!r}")


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Divide logits by ``temperature``; at 0, keep only the first argmax of each row (greedy).

    >>> apply_temperature(torch.tensor([2.0, 1.0]), 0.5)
    tensor([4., 2.])
    >>> apply_temperature(torch.tensor([1.0, 3.0, 3.0]), 0)
    tensor([-inf, 0., -inf])
    """
    _check_logits(logits)
    _check_temperature(temperature)
    if temperature > 0:
        return logits / temperature
    # Greedy: argmax returns the first maximal index, which is the tie rule we promise.
    greedy = torch.full_like(logits, -math.inf)
    return greedy.scatter(-1, logits.argmax(dim=-1, keepdim=True), 0.0)


def softmax_with_temperature(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Probabilities ``exp(z_i / T) / sum_j exp(z_j / T)`` over the last dimension (one-hot at ``T == 0``).

    The lesson's worked example: logits ``log 8, log 4, log 2, log 1`` give ``(8, 4, 2, 1) / 15`` at ``T = 1``
    and ``(64, 16, 4, 1) / 85`` at ``T = 1/2``.

    >>> logits = torch.tensor([8.0, 4.0, 2.0, 1.0], dtype=torch.float64).log()
    >>> (softmax_with_temperature(logits, 1.0) * 15).round(decimals=6)
    tensor([8., 4., 2., 1.], dtype=torch.float64)
    >>> (softmax_with_temperature(logits, 0.5) * 85).round(decimals=6)
    tensor([64., 16.,  4.,  1.], dtype=torch.float64)
    """
    # torch.softmax subtracts the row maximum before exponentiating, so large logits do not overflow.
    return torch.softmax(apply_temperature(logits, temperature), dim=-1)
