"""Activation capture: record chosen modules' inputs or outputs during forward passes, hooks always removed.

The decoder blocks and the linear layers in each are found from the module tree (``labkit.runtime.structure``);
what lab 04 keeps of them is ``labkit.runtime.activations``'s. Layer 2 (runtime).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

import torch

from labkit.core import validation
from labkit.runtime.structure import layer_names, module_of  # layer_names: re-exported for callers

WHAT = ("input", "output")


def _select(module: torch.nn.Module, modules: Any) -> dict[str, torch.nn.Module]:
    named = {name: child for name, child in module.named_modules() if name}
    examples = f"names look like {list(named)[::max(1, len(named) // 4)][:4]} (all: model.named_modules())"
    if isinstance(modules, str):
        pattern = re.compile(modules)
        chosen = {name: child for name, child in named.items() if pattern.fullmatch(name)}
    elif callable(modules):
        chosen = {name: child for name, child in named.items() if modules(name, child)}
    elif isinstance(modules, Iterable):
        names = list(modules)
        unknown = [name for name in names if name not in named]
        if unknown:
            raise ValueError(f"modules names {unknown[:3]} are not in the model; {examples}")
        chosen = {name: named[name] for name in names}
    else:
        raise TypeError(f"modules must be a regular expression, a predicate (name, module) -> bool or a list of "
                        f"names, got {type(modules).__name__}")
    if not chosen:
        raise ValueError(f"modules {modules!r} matches no module; {examples}")
    return chosen


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    items = value.values() if isinstance(value, Mapping) else value if isinstance(value, (tuple, list)) else ()
    return next((item for item in items if isinstance(item, torch.Tensor)), None)


def _keep(records: list[torch.Tensor], value: Any) -> None:
    tensor = _first_tensor(value)
    if tensor is not None:
        # A plain CPU copy (not an inference tensor): the learner may edit it, and the pass may reuse its buffer.
        with torch.inference_mode(False):
            records.append(tensor.detach().to("cpu", copy=True))


@dataclasses.dataclass
class Capture:
    """Tensors recorded by :func:`capture`: for each module name, one CPU tensor per call, in call order."""

    what: str  # "input" (the first tensor argument) or "output" (the first tensor of the result)
    records: dict[str, list[torch.Tensor]]

    @property
    def names(self) -> list[str]:
        return list(self.records)

    def __getitem__(self, name: str) -> list[torch.Tensor]:
        return self.records[name]

    def only(self, name: str) -> torch.Tensor:
        """The one tensor of a module called exactly once (one forward pass)."""
        calls = self.records[name]
        if len(calls) != 1:
            raise ValueError(f"{name} was called {len(calls)} times; read capture[{name!r}] for every call")
        return calls[0]


@contextmanager
def capture(lm: Any, modules: Any, *, what: str = "output") -> Iterator[Capture]:
    """Record the inputs or outputs of chosen modules for the passes run inside the ``with`` block.

    ``modules``: a regular expression matched against whole module names (``r"model\\.layers\\.\\d+"``), a
    predicate ``(name, module) -> bool`` (``lambda name, m: isinstance(m, torch.nn.Linear)``: the tensors that
    weight quantization multiplies), or a list of names (:func:`layer_names`). The hooks are removed on exit,
    also when the block raises.

    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
    >>> with capture(net, ["0"]) as seen:
    ...     _ = net(torch.ones(1, 2))
    >>> seen.only("0").shape, len(net[0]._forward_hooks)
    (torch.Size([1, 3]), 0)
    """
    if what not in WHAT:
        validation.choice("what", what, WHAT)
    chosen = _select(module_of(lm), modules)
    captured = Capture(what, {name: [] for name in chosen})
    handles = []
    try:
        for name, child in chosen.items():
            records = captured.records[name]
            if what == "output":
                handles.append(child.register_forward_hook(lambda _m, _a, out, r=records: _keep(r, out)))
            else:  # 5.x passes a decoder layer's hidden states positionally, others may pass them by keyword
                hook = lambda _m, args, kwargs, r=records: _keep(r, args if args else kwargs)  # noqa: E731
                handles.append(child.register_forward_pre_hook(hook, with_kwargs=True))
        yield captured
    finally:
        for handle in handles:
            handle.remove()




def _replace_first_tensor(value: Any, new: torch.Tensor) -> Any:
    if isinstance(value, torch.Tensor):
        return new
    if isinstance(value, tuple) and value and isinstance(value[0], torch.Tensor):
        return (new, *value[1:])
    raise TypeError(f"cannot edit an output of type {type(value).__name__} (a tensor or a tuple led by one)")


@contextmanager
def edit_outputs(lm: Any, modules: Any, edit: Callable[[str, torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """Replace chosen modules' outputs during the passes run inside the ``with`` block (an intervention).

    ``edit(name, output) -> new output`` gets each call's output tensor (a decoder block's: the residual stream
    ``[batch, tokens, d_model]``) and returns the tensor the rest of the model sees; it must not change its shape.
    ``modules`` selects as in :func:`capture`. The hooks are removed on exit, also when the block raises, so the
    model is as it was: nothing in its weights changes.

    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    >>> with edit_outputs(net, ["0"], lambda name, out: torch.zeros_like(out)):
    ...     net(torch.ones(1, 2)).tolist()
    [[0.0, 0.0]]
    >>> len(net[0]._forward_hooks)
    0
    """
    if not callable(edit):
        raise TypeError(f"edit must be a function (name, output) -> output, got {type(edit).__name__}")
    chosen = _select(module_of(lm), modules)

    def hook(name: str, output: Any) -> Any:
        old = _first_tensor(output)
        new = edit(name, old)
        if not isinstance(new, torch.Tensor) or new.shape != old.shape:
            raise ValueError(f"edit must return a tensor of the output's shape {tuple(old.shape)} for {name}, got "
                             f"{tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__}")
        return _replace_first_tensor(output, new)

    handles = []
    try:
        for name, child in chosen.items():
            handles.append(child.register_forward_hook(lambda _m, _a, out, n=name: hook(n, out)))
        yield
    finally:
        for handle in handles:
            handle.remove()
