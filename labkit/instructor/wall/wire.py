"""Plain data across the grader's sandbox wall: case inputs going in, the learner's answers coming out.

Values (:func:`to_plain`, :func:`from_plain`) and one call's outcome (:func:`outcome_to_plain`,
:func:`outcome_from_plain`); the frames that carry them and the signature that tells the grader's own answering
step from anything else in the learner's kernel are the handshake's (:mod:`labkit.instructor.wall.protocol`).

Everything is JSON. A tensor travels as its dtype, shape and raw bytes (base64); a tuple, a dict with keys that
are not strings, and the few labkit objects an exercise hands the learner (a ``ModelSpec``, a ``ScriptedClock``,
a ``StepCounter`` ...) travel as tagged objects. Decoding builds only plain values: ``torch.Tensor`` (never a
subclass), numbers, strings, lists, tuples, dicts, and instances of the classes named in :data:`OBJECTS`, filled
field by field (no constructor, no pickle, so no code of the sender's runs). Anything else the learner returns
becomes an :class:`Unsupported` stand-in that compares equal to nothing.

    >>> import torch
    >>> decode(encode((torch.tensor([1.5, -2.0]), {"k": 3}, None)))
    (tensor([ 1.5000, -2.0000]), {'k': 3}, None)

Layer 5 (instructor tools).
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

MAX_DEPTH = 20  # nesting deeper than this is not plain data
MAX_TENSOR_BYTES = 64 * 2**20
# torch is imported where a tensor is met, not with this module: the worker only frames messages, and importing
# torch there would cost it seconds at every start.
_DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")


def _dtypes() -> dict[str, Any]:
    import torch

    return {name: getattr(torch, name) for name in _DTYPE_NAMES}


def _objects() -> dict[str, tuple[type, tuple[str, ...]]]:
    """The labkit classes a case may hand the learner: name -> (class, fields that stand for the embedded model
    and travel as None, so the worker uses its own copy)."""
    from labkit.core.spec import ModelSpec
    from labkit.core.timing import ScriptedClock, ScriptedSteps
    from labkit.runtime.step_counter import StepCounter
    from labkit.runtime.scoring import ScoringModel

    return {"ModelSpec": (ModelSpec, ()), "ScriptedClock": (ScriptedClock, ()), "ScriptedSteps": (ScriptedSteps, ()),
            "StepCounter": (StepCounter, ("_lm",)), "ScoringModel": (ScoringModel, ("lm",))}


def case_classes() -> list[type]:
    """The labkit classes whose instances a case may hand the learner (their methods are the learner's to call)."""
    return [klass for klass, _ in _objects().values()]


class Unsupported:
    """What arrives for a returned value that is not plain data: it names the type and equals nothing."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<a {self.type_name}, not plain data>"


class WireError(ValueError):
    """Data that is not what the wire carries (malformed, too deep, an unknown tag)."""


def encode(value: Any, *, objects: bool = False) -> str:
    """``value`` as JSON text; labkit objects of :data:`OBJECTS` only with ``objects`` (case inputs)."""
    return json.dumps(to_plain(value, objects=objects))


def to_plain(value: Any, *, objects: bool = False, _depth: int = 0, _memo: dict | None = None) -> Any:
    """``value`` as JSON-ready data. Never raises: what cannot be carried becomes an ``unsupported`` tag."""
    memo = {} if _memo is None else _memo
    if _depth > MAX_DEPTH:
        return {"__unsupported__": "value nested too deeply"}
    try:
        return _to_plain(value, objects, _depth, memo)
    except Exception as error:  # noqa: BLE001 - a hostile object's methods may raise anything
        return {"__unsupported__": f"{type(value).__name__} ({type(error).__name__} while reading it)"}


def _to_plain(value: Any, objects: bool, depth: int, memo: dict) -> Any:
    kind = type(value)
    if value is None or kind in (bool, str):
        return value
    if kind is int:
        return value if abs(value) < 2**63 else {"__bigint__": str(value)}
    if kind is float:
        return value if value == value and abs(value) != float("inf") else {"__float__": repr(value)}
    torch = sys.modules.get("torch")  # no tensor can exist before torch is imported
    if torch is not None and isinstance(value, torch.Tensor):
        # Read through torch.Tensor's own methods: a subclass's overrides take no part.
        plain = torch.Tensor.as_subclass(value, torch.Tensor).detach().cpu().contiguous()
        dtype = str(plain.dtype).removeprefix("torch.")
        if dtype not in _DTYPE_NAMES:
            return {"__unsupported__": f"tensor of dtype {dtype}"}
        raw = plain.reshape(-1).view(torch.uint8).numpy().tobytes()  # any shape, 0-d included; bool is one byte
        if len(raw) > MAX_TENSOR_BYTES:
            return {"__unsupported__": f"tensor of {len(raw):,} bytes"}
        return {"__tensor__": dtype, "shape": list(plain.shape), "data": base64.b64encode(raw).decode()}
    if kind in (list, tuple):
        items = [to_plain(item, objects=objects, _depth=depth + 1, _memo=memo) for item in value]
        return items if kind is list else {"__tuple__": items}
    if kind is dict:
        if all(type(key) is str and not key.startswith("__") for key in value):
            return {key: to_plain(item, objects=objects, _depth=depth + 1, _memo=memo) for key, item in value.items()}
        return {"__dict__": [[to_plain(k, objects=objects, _depth=depth + 1, _memo=memo),
                              to_plain(v, objects=objects, _depth=depth + 1, _memo=memo)] for k, v in value.items()]}
    if objects:
        for name, (klass, stand_ins) in _objects().items():
            if kind is klass:
                if id(value) in memo:
                    return {"__ref__": memo[id(value)]}
                memo[id(value)] = len(memo)
                fields = {key: (None if key in stand_ins else item) for key, item in vars(value).items()
                          if not key.startswith("_kept")}
                return {"__object__": name, "id": memo[id(value)],
                        "fields": to_plain(fields, objects=True, _depth=depth + 1, _memo=memo)}
    return {"__unsupported__": kind.__name__}


def decode(text: str | bytes, *, objects: bool = False) -> Any:
    """The value :func:`encode` wrote. Raises :class:`WireError` on anything else."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise WireError(f"not JSON: {type(error).__name__}") from None
    return from_plain(data, objects=objects)


def from_plain(data: Any, *, objects: bool = False, _depth: int = 0, _memo: dict | None = None) -> Any:
    memo = {} if _memo is None else _memo
    if _depth > MAX_DEPTH + 2:
        raise WireError("nested too deeply")
    kind = type(data)
    if data is None or kind in (bool, int, float, str):
        return data
    if kind is list:
        return [from_plain(item, objects=objects, _depth=_depth + 1, _memo=memo) for item in data]
    if kind is not dict:
        raise WireError(f"unexpected {kind.__name__}")
    inner = dict(objects=objects, _depth=_depth + 1, _memo=memo)
    if "__tensor__" in data:
        return _tensor(data)
    if "__tuple__" in data:
        return tuple(from_plain(item, **inner) for item in _list(data["__tuple__"]))
    if "__dict__" in data:
        pairs = _list(data["__dict__"])
        return {_key(from_plain(k, **inner)): from_plain(v, **inner) for k, v in (_pair(p) for p in pairs)}
    if "__float__" in data:
        text = data["__float__"]
        if text not in ("nan", "inf", "-inf"):
            raise WireError(f"not a special float: {text!r}")
        return float(text)
    if "__bigint__" in data:
        text = str(data["__bigint__"])
        if len(text) > 400 or not text.lstrip("-").isdigit():
            raise WireError("not an integer")
        return int(text)
    if "__unsupported__" in data:
        return Unsupported(str(data["__unsupported__"])[:200])
    if "__ref__" in data:
        if not objects or data["__ref__"] not in memo:
            raise WireError("a reference to an unknown object")
        return memo[data["__ref__"]]
    if "__object__" in data:
        if not objects or data["__object__"] not in _objects():
            raise WireError(f"an object of a kind the wire does not carry: {str(data['__object__'])[:60]!r}")
        klass, _ = _objects()[data["__object__"]]
        instance = klass.__new__(klass)
        memo[data.get("id")] = instance
        fields = from_plain(data.get("fields", {}), **inner)
        if not isinstance(fields, dict):
            raise WireError("an object's fields must be a dict")
        instance.__dict__.update(fields)
        if data["__object__"] == "ScoringModel":
            from collections import OrderedDict

            instance._kept = OrderedDict()
        return instance
    if any(key.startswith("__") for key in data):
        raise WireError(f"unknown tag in {sorted(data)[:3]}")
    return {key: from_plain(item, **inner) for key, item in data.items()}


def _list(value: Any) -> list:
    if type(value) is not list:
        raise WireError("expected a list")
    return value


def _pair(value: Any) -> tuple[Any, Any]:
    if type(value) is not list or len(value) != 2:
        raise WireError("expected a [key, value] pair")
    return value[0], value[1]


def _key(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        raise WireError("a dict key that cannot be hashed") from None
    return value


def _tensor(data: dict) -> Any:
    import torch

    dtype = _dtypes().get(data["__tensor__"]) if isinstance(data["__tensor__"], str) else None
    shape = data.get("shape")
    if dtype is None or type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape):
        raise WireError("a malformed tensor")
    try:
        raw = base64.b64decode(str(data.get("data", "")), validate=True)
    except ValueError:
        raise WireError("a tensor whose bytes are not base64") from None
    numel = 1
    for n in shape:
        numel *= n
    item = torch.empty((), dtype=dtype).element_size() if dtype != torch.bool else 1
    if len(raw) != numel * item or len(raw) > MAX_TENSOR_BYTES:
        raise WireError("a tensor whose bytes do not match its shape")
    if dtype == torch.bool:
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone().to(torch.bool).reshape(shape) if raw else (
            torch.empty(shape, dtype=torch.bool))
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).clone().reshape(shape)


# --------------------------------------------------------------------------------------------------------------
# One call's outcome (what the worker reports per case) and back


def outcome_to_plain(outcome: Any, value: Any, flood_chars: int) -> dict[str, Any]:
    """One call of the learner's function (a :class:`labkit.exercises.calling.Outcome`) as plain data."""
    from labkit.exercises.calling import learner_frame

    data: dict[str, Any] = {"printed": outcome.printed[: flood_chars + 1], "timed_out": outcome.timed_out,
                            "forbidden": outcome.called_forbidden, "mutated": outcome.mutated}
    if outcome.error is not None:
        error = outcome.error
        frame = learner_frame(error.__traceback__)
        data["error"] = [type(error).__name__, (str(error).strip().splitlines() or [""])[0][:500]]
        data["where"] = f"in {frame.name}: {frame.line}" if frame is not None and frame.line else None
    else:
        data["value"] = to_plain(value)
    return data


def outcome_from_plain(data: Any) -> Any:
    """The :class:`~labkit.exercises.calling.Outcome` rebuilt from :func:`outcome_to_plain`'s data; anything
    malformed is an error, never a pass."""
    from labkit.exercises.calling import FLOOD_CHARS, Outcome
    from labkit.exercises.checking import ReportedError

    outcome = Outcome()
    if not isinstance(data, dict):
        outcome.error = ReportedError("NoAnswer", "the grader got no answer for this case (the run stopped)")
        return outcome
    outcome.printed = str(data.get("printed") or "")[: FLOOD_CHARS + 1]
    outcome.timed_out = data.get("timed_out") is True
    outcome.called_forbidden = str(data["forbidden"])[:200] if data.get("forbidden") else None
    outcome.mutated = str(data["mutated"])[:300] if data.get("mutated") else None
    if "error" in data:
        error = data["error"] if isinstance(data["error"], list) and len(data["error"]) == 2 else ["Error", ""]
        name, message = str(error[0])[:80], str(error[1])[:500]
        outcome.error = NotImplementedError(message) if name == "NotImplementedError" else ReportedError(name, message)
        outcome.where = str(data["where"])[:300] if data.get("where") else None
        return outcome
    try:
        outcome.value = from_plain(data.get("value"))
    except (WireError, RecursionError, ValueError, TypeError) as error:
        outcome.error = ReportedError("UnreadableAnswer", f"the answer could not be read back: {error}")
    return outcome
