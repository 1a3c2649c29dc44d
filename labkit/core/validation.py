"""Argument checks at labkit's public edge, one shape for every module.

The rule, written down once: a value of the wrong *type* raises ``TypeError``; a value of the right type but
outside what is accepted raises ``ValueError``. Both messages read the same way, naming the argument, what is
accepted and the value received (its ``repr``, shortened when long)::

    temperature must be a real number >= 0 (0 means greedy), got '1'

Each helper returns the value it accepted (an ``int`` or a ``float`` for numbers), so a caller can write
``top_k = integer("top_k", top_k, min=0)``. Checks that read a whole tensor's values (NaN, ranges of token ids)
stay with the module that knows which pass it already makes; :func:`tensor` checks only type, dtype and shape.

Used by every core module (sampling, loss, memory, budget, paging, spec) and by generation.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import Any, Sequence

import torch

_MAX_SHOWN = 80  # characters of a received value's repr kept in a message


def shown(value: Any) -> str:
    """The received value as a message shows it: its ``repr``, cut to about 80 characters.

    A tensor is described by dtype and shape (its repr could be megabytes).

    >>> shown("1"), shown(2.5)
    ("'1'", '2.5')
    >>> shown(torch.zeros(2, 3))
    'a torch.float32 tensor of shape (2, 3)'
    """
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def fail(error: type[Exception], name: str, accepted: str, value: Any) -> Exception:
    """The error every helper raises: ``"<name> must be <accepted>, got <value>"``.

    >>> fail(ValueError, "top_k", "an int >= 0", -1)
    ValueError('top_k must be an int >= 0, got -1')
    """
    return error(f"{name} must be {accepted}, got {shown(value)}")


def _bounds(min: float | None, max: float | None, min_open: bool, max_open: bool) -> str:
    if min is not None and max is not None:
        return f" in {'(' if min_open else '['}{min:g}, {max:g}{')' if max_open else ']'}"
    if min is not None:
        return f" {'>' if min_open else '>='} {min:g}"
    if max is not None:
        return f" {'<' if max_open else '<='} {max:g}"
    return ""


def _inside(value: float, min: float | None, max: float | None, min_open: bool, max_open: bool) -> bool:
    above = min is None or (value > min if min_open else value >= min)
    below = max is None or (value < max if max_open else value <= max)
    return above and below


def _accepted(kind: str, bounds: str, note: str, optional: bool) -> str:
    return kind + bounds + (f" ({note})" if note else "") + (" or None" if optional else "")


def real(name: str, value: Any, *, min: float | None = None, max: float | None = None, min_open: bool = False,
         max_open: bool = False, finite: bool = True, note: str = "", optional: bool = False) -> float | None:
    """A real number (int, float or numpy scalar; not a bool) within the bounds, returned as a float.

    ``min_open`` / ``max_open`` exclude the bound itself; ``finite`` rejects inf (NaN is never accepted);
    ``note`` is said in parentheses after the range; ``optional`` also accepts None.

    >>> real("top_p", 0.9, min=0, max=1, min_open=True)
    0.9
    >>> real("temperature", "1", min=0, note="0 means greedy")
    Traceback (most recent call last):
    ...
    TypeError: temperature must be a real number >= 0 (0 means greedy), got '1'
    >>> real("top_p", 0, min=0, max=1, min_open=True, note="1 switches it off")
    Traceback (most recent call last):
    ...
    ValueError: top_p must be a real number in (0, 1] (1 switches it off), got 0
    """
    accepted = _accepted("a real number", _bounds(min, max, min_open, max_open), note, optional)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise fail(TypeError, name, accepted, value)
    number = float(value)
    if math.isnan(number) or (finite and math.isinf(number)) or not _inside(number, min, max, min_open, max_open):
        raise fail(ValueError, name, accepted, value)
    return number


def integer(name: str, value: Any, *, min: int | None = None, max: int | None = None, note: str = "",
            optional: bool = False) -> int | None:
    """An int (or numpy integer; not a bool, not a float like ``2.0``) within ``[min, max]``, returned as an int.

    >>> integer("batch_size", 16, min=0)
    16
    >>> integer("block_size", 0, min=1)
    Traceback (most recent call last):
    ...
    ValueError: block_size must be an int >= 1, got 0
    >>> integer("seed", 1.5, optional=True)
    Traceback (most recent call last):
    ...
    TypeError: seed must be an int or None, got 1.5
    """
    accepted = _accepted("an int", _bounds(min, max, False, False), note, optional)
    if value is None and optional:
        return None
    if isinstance(value, bool):
        raise fail(TypeError, name, accepted, value)
    try:
        number = operator.index(value)
    except TypeError:
        raise fail(TypeError, name, accepted, value) from None
    if not _inside(number, min, max, False, False):
        raise fail(ValueError, name, accepted, value)
    return number


def boolean(name: str, value: Any) -> bool:
    """A bool (``True`` or ``False``; 0 and 1 are not accepted).

    >>> boolean("gated_mlp", "yes")
    Traceback (most recent call last):
    ...
    TypeError: gated_mlp must be a bool, got 'yes'
    """
    if not isinstance(value, bool):
        raise fail(TypeError, name, "a bool", value)
    return value


def choice(name: str, value: Any, options: Sequence[Any]) -> Any:
    """One of ``options``, returned as given; a value of another type than every option is a TypeError.

    >>> choice("order", "filters_first", ("temperature_first", "filters_first"))
    'filters_first'
    >>> choice("policy", "buddy", ("contiguous", "paged"))
    Traceback (most recent call last):
    ...
    ValueError: policy must be one of ['contiguous', 'paged'], got 'buddy'
    """
    accepted = f"one of {list(options)!r}"
    if any(type(value) is type(option) for option in options):
        if value in options:
            return value
        raise fail(ValueError, name, accepted, value)
    raise fail(TypeError, name, accepted, value)


def instance(name: str, value: Any, cls: type | tuple[type, ...], what: str) -> Any:
    """An instance of ``cls``; ``what`` says it for the message (e.g. ``"a labkit.core.spec.ModelSpec"``).

    >>> instance("layout", "llama", dict, "a BlockLayout")
    Traceback (most recent call last):
    ...
    TypeError: layout must be a BlockLayout, got 'llama'
    """
    if not isinstance(value, cls):
        raise fail(TypeError, name, what, value)
    return value


_KINDS = {"float": "a floating-point tensor", "int": "an integer tensor", None: "a torch.Tensor"}


def tensor(name: str, value: Any, *, kind: str | None = None, ndim: int | tuple[int, ...] | None = None,
           shape: str = "", nonempty: bool = False) -> torch.Tensor:
    """A ``torch.Tensor`` of a dtype ``kind`` (``"float"``, ``"int"``: integer, not bool) and dimension count.

    Type and dtype are TypeErrors; the number of dimensions and emptiness (``nonempty``: the last dimension has
    at least one entry) are ValueErrors. ``shape`` names the accepted shapes for the message. Only metadata is
    read: no pass over the values.

    >>> tensor("logits", torch.zeros(3), kind="float", ndim=(1, 2), shape="[vocab] or [batch, vocab]").shape
    torch.Size([3])
    >>> tensor("targets", torch.zeros(3), kind="int")
    Traceback (most recent call last):
    ...
    TypeError: targets must be an integer tensor, got a torch.float32 tensor of shape (3,)
    >>> tensor("logits", torch.zeros(2, 2, 2), kind="float", ndim=(1, 2), shape="[vocab] or [batch, vocab]")
    Traceback (most recent call last):
    ...
    ValueError: logits must be a floating-point tensor of shape [vocab] or [batch, vocab], got a torch.float32 tensor of shape (2, 2, 2)
    """
    accepted = _KINDS[kind] + (f" of shape {shape}" if shape else "")
    if ndim is not None and not shape:
        accepted += f" with {ndim if isinstance(ndim, int) else ' or '.join(map(str, ndim))} dimensions"
    if nonempty:
        accepted += " with at least one entry"
    if not isinstance(value, torch.Tensor):
        raise fail(TypeError, name, accepted, value)
    if kind == "float" and not value.is_floating_point():
        raise fail(TypeError, name, accepted, value)
    if kind == "int" and (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool):
        raise fail(TypeError, name, accepted, value)
    dims = (ndim,) if isinstance(ndim, int) else ndim
    if dims is not None and value.ndim not in dims:
        raise fail(ValueError, name, accepted, value)
    if nonempty and (value.ndim == 0 or value.shape[-1] == 0):
        raise fail(ValueError, name, accepted, value)
    return value
