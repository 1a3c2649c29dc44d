"""Sun et al. (2024), "Massive activations in large language models", repeated on the embedded model.

A massive activation is a residual-stream entry thousands of times larger than the layer's median magnitude. In
SmolLM2-135M they sit on the first token in a few channels (channel 507 reaches about 22,000 against a median of
about 2 at layer 15). They appear at one layer, written by that layer's MLP (its down_proj reads an input of
thousands on that token), and ride the residual stream from there almost unchanged. Sun et al.'s experiment:
at the layer where they appear, set them to zero and the model breaks; set them to their mean over other
sequences and it does not notice; zero as many ordinary entries and nothing happens either. So they are not
information about the text but fixed biases the model relies on (the attention heads use the first token as a
sink), and a quantizer must keep them without letting them set a per-tensor INT8 scale for everything else.

Everything here goes through :func:`labkit.runtime.edit_outputs` (hooks removed on exit; the weights are never
touched), :func:`labkit.runtime.capture` and :func:`labkit.runtime.scoring.score_text`.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

from labkit.core import validation
from labkit.runtime.capture import capture, edit_outputs, layer_names
from labkit.runtime.forward import forward

RATIO = 1000.0  # |x| at least this many times the layer's median |x| (Sun et al. also ask |x| >= 100)
FLOOR = 100.0


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


def residual_stream(lm: Any, token_ids: torch.Tensor) -> list[torch.Tensor]:
    """The residual stream after every block, ``[tokens, channels]`` each, for one sequence (on the CPU)."""
    blocks = layer_names(lm)
    with capture(lm, blocks, what="output") as seen:
        forward(lm, token_ids, use_cache=False)
    return [seen.only(block)[0].float() for block in blocks]


def first_massive(residuals: Sequence[torch.Tensor], ratio: float = RATIO) -> int | None:
    """Index of the first of the residual streams (one per block, in order) holding a massive entry, or None."""
    return next((layer for layer, x in enumerate(residuals) if massive_mask(x, ratio).any()), None)


def first_massive_layer(lm: Any, token_ids: torch.Tensor, ratio: float = RATIO) -> int | None:
    """The first block whose output holds a massive entry, or None when none does."""
    return first_massive(residual_stream(lm, token_ids), ratio)


@contextmanager
def replace_massive(lm: Any, layer: int, values: torch.Tensor | None = None, ratio: float = RATIO,
                    mask: torch.Tensor | None = None) -> Iterator[None]:
    """Inside the block, the output of block ``layer`` has its massive entries replaced: by 0 (``values`` None),
    or channel by channel by ``values`` (``[channels]``, e.g. :func:`massive_means`).

    ``mask`` (``[tokens, channels]``) replaces a fixed set of entries instead of the massive ones: the control
    experiment (as many ordinary entries zeroed).
    """
    blocks = layer_names(lm)
    layer = validation.integer("layer", layer, min=0, max=len(blocks) - 1)

    def edit(_name: str, output: torch.Tensor) -> torch.Tensor:
        if mask is None:
            chosen = massive_mask(output, ratio)
        else:  # the first tokens of the fixed mask (a scoring pass leaves out the last token)
            chosen = mask[:output.shape[-2]].to(output.device).expand_as(output)
        replacement = (torch.zeros_like(output) if values is None
                       else values.to(output.device, output.dtype).expand_as(output))
        return torch.where(chosen, replacement, output)

    with edit_outputs(lm, [blocks[layer]], edit):
        yield


def massive_means(lm: Any, sequences: Sequence[torch.Tensor], layer: int, ratio: float = RATIO) -> torch.Tensor:
    """Per channel, the mean of the massive entries at block ``layer``'s output over ``sequences`` (``[1, n]``
    token ids each); 0 for channels never massive there. Sun et al.'s "set to the mean" values."""
    totals, counts = None, None
    for ids in sequences:
        x = residual_stream(lm, ids)[layer]
        chosen = massive_mask(x, ratio)
        sums, hits = torch.where(chosen, x, 0.0).sum(dim=0), chosen.sum(dim=0)
        totals = sums if totals is None else totals + sums
        counts = hits if counts is None else counts + hits
    if totals is None:
        raise ValueError("sequences must hold at least one sequence of token ids, got none")
    return torch.where(counts > 0, totals / counts.clamp(min=1), 0.0)


@dataclass(frozen=True)
class MassiveAblation:
    """Perplexity of one text with the massive activations as they are, zeroed, set to their mean, and the
    control (as many ordinary entries zeroed), all at the layer where they appear."""

    layer: int
    entries: tuple[tuple[int, int, float], ...]  # (token, channel, value) of the massive entries in the text
    n_tokens: int  # tokens scored (the first is not: nothing predicts it)
    perplexity: float
    zeroed: float
    mean: float
    control: float


def ablate_massive(lm: Any, token_ids: torch.Tensor, calibration: Sequence[torch.Tensor], layer: int | None = None,
                   ratio: float = RATIO, seed: int = 0) -> MassiveAblation:
    """Sun et al.'s experiment on one text (``[n]`` token ids, scored in one window).

    ``calibration``: other sequences (``[1, n]`` each) whose massive entries give the "mean" values. ``layer``:
    default the first layer where this text has a massive entry. The control zeroes as many entries drawn at
    random (seeded) among the ordinary ones of the same layer.
    """
    from labkit.runtime.scoring import score_text

    validation.tensor("token_ids", token_ids, kind="int", ndim=1, shape="[n_tokens]")
    residuals = residual_stream(lm, token_ids[None])  # one pass serves both the layer and its entries
    if layer is None:
        layer = first_massive(residuals, ratio)
        if layer is None:
            raise ValueError(f"token_ids hold no massive activation (|x| >= {ratio:g} x the median) at any layer")
    x = residuals[layer]
    chosen = massive_mask(x, ratio)
    entries = tuple((t, c, float(x[t, c])) for t, c in chosen.nonzero().tolist())
    ordinary = (~chosen).flatten().nonzero().flatten()
    picked = ordinary[torch.randperm(len(ordinary), generator=torch.Generator().manual_seed(seed))[:len(entries)]]
    control = torch.zeros(chosen.numel(), dtype=torch.bool)
    control[picked] = True

    def perplexity() -> float:
        return score_text(lm, token_ids, window=len(token_ids), progress=False).perplexity()

    baseline = perplexity()
    with replace_massive(lm, layer, None, ratio):
        zeroed = perplexity()
    with replace_massive(lm, layer, massive_means(lm, calibration, layer, ratio), ratio):
        mean = perplexity()
    with replace_massive(lm, layer, None, ratio, mask=control.reshape(chosen.shape)):
        control_ppl = perplexity()
    return MassiveAblation(layer, entries, len(token_ids) - 1, baseline, zeroed, mean, control_ppl)
