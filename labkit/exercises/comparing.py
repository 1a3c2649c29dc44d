"""Comparing a learner's answer with labkit's: the one comparison every check makes, and how close, in words.

:func:`compare` says why an answer does not match the reference (None when it does): tensors within ``rtol`` /
``atol`` with the largest failing difference named, numbers within the same tolerances, anything else by
:func:`same`. :func:`is_number` is what a numeric prediction must be; :func:`tolerance_words` and
:func:`distance_words` put a tolerance and a prediction's distance from the truth into words for a verdict.
``labkit.exercises.checking`` judges with these; ``labkit.exercises.calling`` uses :func:`same` to notice a
learner's function that changed its arguments.

Layer 4 (exercises): imports the core, never widgets.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from labkit.exercises.definitions import Exercise


def is_number(value: Any) -> bool:
    """A real number, not a bool: what a numeric prediction must be.

    >>> is_number(3), is_number(2.5), is_number(True), is_number("3")
    (True, True, False, False)
    """
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def same(a: Any, b: Any) -> bool:
    """Whether two values are the same: tensors of one shape and dtype with equal entries (NaN equal to NaN),
    sequences and dicts item by item, anything else by ``==`` (NaN equal to NaN; by identity when ``==`` breaks).

    >>> same(torch.tensor([1.0, math.nan]), torch.tensor([1.0, math.nan])), same((1, [2.0]), [1, (2.0,)])
    (True, True)
    >>> same(torch.tensor([1.0]), torch.tensor([1.0], dtype=torch.float64))
    False
    """
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.nan_to_num(), b.nan_to_num())
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    try:
        return bool(a == b) or (isinstance(a, float) and math.isnan(a) and math.isnan(b))
    except Exception:  # noqa: BLE001 - objects whose == misbehaves are compared by identity
        return a is b


def _entry(value: float, other: float) -> str:
    """A number in a difference; -inf against a finite number is a removed token against a kept one."""
    if value == -math.inf and math.isfinite(other):
        return "-inf (removed)"
    if math.isfinite(value) and other == -math.inf:
        return f"{value:.6g} (kept)"
    return f"{value:.6g}"


def compare(expected: Any, got: Any, rtol: float, atol: float) -> str | None:
    """Why ``got`` does not match ``expected`` (None when it does), within the given tolerances.

    The difference shown is the largest among the entries that fail ``isclose`` (equal infinities are equal).

    >>> compare(torch.tensor([0.5, 0.5]), torch.tensor([0.5, 0.5]), 1e-5, 1e-6) is None
    True
    >>> compare(torch.tensor([0.5, 0.5]), [0.5, 0.5], 1e-5, 1e-6)
    'expected a torch.Tensor, got list'
    >>> compare(torch.tensor([-math.inf, 2.0, 2.0]), torch.tensor([-math.inf, 2.0, 1.0]), 1e-5, 1e-6)
    'largest difference at index (2,): expected 2, got 1 (tolerance rtol=1e-05, atol=1e-06)'
    """
    if isinstance(expected, torch.Tensor):
        if got is None:
            return "your function returned None (is a `return` missing?)"
        if not isinstance(got, torch.Tensor):
            return f"expected a torch.Tensor, got {type(got).__name__}"
        if got.shape != expected.shape:
            return f"expected shape {tuple(expected.shape)}, got shape {tuple(got.shape)}"
        if not got.is_floating_point() and expected.is_floating_point():
            return f"expected a floating-point tensor, got dtype {got.dtype}"
        got64, expected64 = got.detach().double(), expected.detach().double()
        close = torch.isclose(got64, expected64, rtol=rtol, atol=atol, equal_nan=True)
        if bool(close.all()):
            return None
        # inf - inf is nan: a failing entry with no finite difference counts as infinitely far
        distance = (got64 - expected64).abs().nan_to_num(nan=math.inf, posinf=math.inf).masked_fill(close, -1.0)
        worst = int(distance.flatten().argmax())
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), expected.shape))
        wanted, answered = expected64.flatten()[worst].item(), got64.flatten()[worst].item()
        return (f"largest difference at index {index}: expected {_entry(wanted, answered)}, "
                f"got {_entry(answered, wanted)} (tolerance rtol={rtol:g}, atol={atol:g})")
    if isinstance(expected, float):
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            return f"expected a number, got {type(got).__name__}"
        return None if math.isclose(got, expected, rel_tol=rtol, abs_tol=atol) else f"expected {expected:.6g}, got {got!r}"
    return None if same(expected, got) else f"expected {expected!r}, got {got!r}"


def tolerance_words(exercise: Exercise) -> str:
    """How close counts as close, in words.

    >>> from labkit.exercises.definitions import prediction
    >>> tolerance_words(prediction("zz.x", "X", "x", lambda: 1.0, asked="", hint="", rtol=0.5))
    'within a factor of two'
    """
    rtol, atol = exercise.rtol, exercise.atol
    if rtol == 0.5 and not atol:
        return "within a factor of two"
    parts = ([f"within {rtol:.0%}" if rtol >= 0.01 else f"within a relative {rtol:g}"] if rtol else []) + (
        [f"within ±{atol:.2g}"] if atol else [])
    return " or ".join(parts) if parts else "exactly"


def distance_words(truth: Any, value: Any) -> str:
    """How far a prediction is from the truth, in words.

    >>> distance_words(162, 120), distance_words(4.0, 12.5), distance_words(5, 6), distance_words("b", "b")
    ('26% too low', 'off by 3.1x (too high)', '1 too high', 'right')
    """
    if hasattr(truth, "distance_words"):
        return truth.distance_words(value)
    if not (is_number(truth) and is_number(value)):
        return "right" if same(truth, value) else "not the answer"
    if value == truth:
        return "exactly right"
    direction = "too high" if value > truth else "too low"
    if isinstance(truth, int) and float(value).is_integer() and abs(value - truth) <= 3:
        return f"{abs(int(value) - truth)} {direction}"
    if truth == 0 or value / truth <= 0:
        return f"off by {abs(value - truth):.3g} ({direction})"
    ratio = value / truth
    if ratio >= 2 or ratio <= 0.5:
        return f"off by {max(ratio, 1 / ratio):.1f}x ({direction})"
    return f"{abs(ratio - 1):.0%} {direction}"
