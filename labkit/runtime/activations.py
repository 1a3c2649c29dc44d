"""Lab 04's model side: the embedded model's activations, captured once, and Sun et al.'s massive activations.

:func:`capture_activations` runs the model once on a prompt and keeps, per layer, the residual stream after every
block and the input of every kind of Linear (:class:`OutlierData`, what the outlier visualizer in
``labkit.explorers.outliers`` shows); :func:`input_maxima` and :func:`massive_activations` read those tensors.

Sun et al. (2024), "Massive activations in large language models", repeated on the embedded model. A massive
activation (:func:`labkit.core.outliers.massive_mask`, the one definition) is a residual-stream entry thousands
of times larger than the layer's median magnitude. In SmolLM2-135M they sit on the first token in a few channels
(channel 507 reaches about 22,000 against a median of about 2 at layer 15). They appear at one layer, written by
that layer's MLP (its down_proj reads an input of thousands on that token), and ride the residual stream from
there almost unchanged. Sun et al.'s experiment: at the layer where they appear, set them to zero and the model
breaks; set them to their mean over other sequences and it does not notice; zero as many ordinary entries and
nothing happens either. So they are not information about the text but fixed biases the model relies on (the
attention heads use the first token as a sink), and a quantizer must keep them without letting them set a
per-tensor INT8 scale for everything else.

Any causal LM is captured the same way, by its structure (:mod:`labkit.runtime.structure`): the blocks are its
``ModuleList`` of one entry per layer, and every linear layer of a block (``nn.Linear`` or transformers' ``Conv1D``)
has its input captured in the one pass. A layer whose name says which input it reads is shown under that role (the
q/k/v projection's input, o_proj's, gate/up's, down_proj's, in Llama's words: GPT-2's ``c_attn`` reads what q reads,
GPT-NeoX's ``dense_4h_to_h`` what down_proj reads); any other is shown as "linear k input" with its name. A layer
not run once over every token of the pass (a mixture-of-experts' experts, which see only the tokens routed to them)
is left out. A model is refused only when no block or no linear layer can be found, saying what was found.

Layer 2 (runtime). Everything here goes through :func:`labkit.runtime.edit_outputs` (hooks removed on exit; the
weights are never touched), :func:`labkit.runtime.capture` and :func:`labkit.runtime.scoring.score_text`.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

from labkit.core import validation
from labkit.core.outliers import RATIO, massive_mask
from labkit.runtime.capture import capture, edit_outputs
from labkit.runtime.forward import forward
from labkit.runtime.structure import (DOWN, GATE_UP, O, QKV, block_linears, describe_block, layer_names,
                                      linear_weight, module_of, role)

RESIDUAL = "residual stream"
# The four roles the visualizer names, in the order a block reads them (structure.ROLE_NAMES says which layer has
# which); the residual stream is read at the decoder block's output.
ROLES = (QKV, O, GATE_UP, DOWN)
SOURCES = (RESIDUAL, *ROLES)  # what the embedded model (and any model whose layers' names are known) shows


def source_linears(lm: Any) -> dict[str, str]:
    """Each linear layer of a decoder block, by the source it is shown as: ``{source: name inside the block}``.

    The roles first (the first layer of each role in the block's module order: k and v read what q reads), then
    every layer of no known role as ``"linear k input (name)"``, k its place among the block's linear layers. Read
    from the first block; a source whose layer is missing from another block is left out. Refused when the blocks
    hold no linear layer.
    """
    blocks = layer_names(lm)
    per_block = [block_linears(lm, block) for block in blocks]
    if not any(per_block):
        raise validation.fail(ValueError, "lm", "a model whose decoder blocks hold linear layers (torch.nn.Linear or "
                              "transformers' Conv1D)", describe_block(lm, blocks[0]))
    found: dict[str, str] = {}
    for index, name in enumerate(per_block[0]):
        known = role(name)
        source = known if known is not None else f"linear {index} input ({name})"
        found.setdefault(source, name)
    everywhere = set.intersection(*(set(names) for names in per_block))
    ordered = [source for source in ROLES if source in found] + [source for source in found if source not in ROLES]
    kept = {source: found[source] for source in ordered if found[source] in everywhere}
    if not kept:
        raise validation.fail(ValueError, "lm", "a model whose decoder blocks share at least one linear layer's name",
                              f"{len(blocks)} blocks with no name in common ({blocks[0]}: {per_block[0][:4]}, "
                              f"{blocks[-1]}: {per_block[-1][:4]})")
    return kept


@dataclass
class OutlierData:
    """One prompt's activations, captured once: per source, one ``[tokens, channels]`` tensor per layer."""

    prompt: str
    token_texts: tuple[str, ...]
    activations: dict[str, list[torch.Tensor]]  # source -> [n_layers] of [tokens, channels]
    weight_absmax: dict[str, list[torch.Tensor]]  # source -> [n_layers] of max |W_j| per input channel [in]
    massive_layer: int | None = None  # the first layer whose residual stream holds a massive activation
    zeroed_at: int | None = None  # captured with the massive activations zeroed at this layer's output
    residual_reader: str = QKV  # the Linear input standing in for the residual stream (the first a block reads)
    linear_names: dict[str, str] = dataclasses.field(default_factory=dict)  # source -> its layer's name in a block

    @property
    def linear_inputs(self) -> tuple[str, ...]:
        """The sources that are some linear layer's input (what W8A8 and LLM.int8() quantize), in capture order."""
        return tuple(source for source in self.activations if source != RESIDUAL)

    @property
    def n_layers(self) -> int:
        return len(self.activations[RESIDUAL])


def capture_activations(lm: Any, prompt: str, zero_massive_at: int | None = None) -> OutlierData:
    """Run the model once on the prompt's plain-text tokens and keep what the outlier visualizer shows.

    ``zero_massive_at``: a layer whose output has its massive activations zeroed during the pass (Sun et al.'s
    intervention; :func:`replace_massive`).
    """
    if zero_massive_at is not None:
        with replace_massive(lm, zero_massive_at):
            return dataclasses.replace(capture_activations(lm, prompt), zeroed_at=zero_massive_at)
    token_ids = lm.text_ids(prompt)  # [1, seq_len]
    roles = source_linears(lm)  # before any pass: a model whose structure cannot be read is refused first
    blocks = layer_names(lm)
    n_tokens = token_ids.shape[1]
    linears = {source: [f"{block}.{suffix}" for block in blocks] for source, suffix in roles.items()}
    names = [name for group in linears.values() for name in group]
    with capture(lm, blocks, what="output") as outputs, capture(lm, names, what="input") as inputs:
        forward(lm, token_ids, use_cache=False)
    activations = {RESIDUAL: [outputs.only(block)[0].float() for block in blocks]}
    module = module_of(lm)
    weight_absmax: dict[str, list[torch.Tensor]] = {}
    for source, group in linears.items():
        calls = [inputs[name] for name in group]
        # one call over every token, in every block (an expert sees only its routed tokens, or none)
        if any(len(seen) != 1 or seen[0].reshape(-1, seen[0].shape[-1]).shape[0] != n_tokens for seen in calls):
            continue
        activations[source] = [seen[0].reshape(n_tokens, -1).float() for seen in calls]
        weight_absmax[source] = [linear_weight(module.get_submodule(name)).detach().abs().amax(dim=0).float().cpu()
                                 for name in group]
    if len(activations) == 1:
        raise validation.fail(ValueError, "lm", "a model whose linear layers each run once over every token of a "
                              "pass", f"{describe_block(lm, blocks[0])}, none of whose linear layers does")
    reader = QKV if QKV in weight_absmax else next(iter(weight_absmax))
    weight_absmax[RESIDUAL] = weight_absmax[reader]
    texts = tuple(lm.tokenizer.decode([int(i)]) for i in token_ids[0])
    return OutlierData(prompt, texts, activations, weight_absmax, first_massive(activations[RESIDUAL]),
                       residual_reader=reader, linear_names=dict(roles))


def input_maxima(data: OutlierData, layers: Any) -> dict[str, list[float]]:
    """The largest |x| of each captured tensor at each of ``layers``: ``{source: [max |x| per layer]}``, the Linear
    inputs first, then the residual stream (no Linear's input, for comparison)."""
    layers = [int(layer) for layer in layers]
    return {source: [float(data.activations[source][layer].abs().max()) for layer in layers]
            for source in (*data.linear_inputs, RESIDUAL)}


def massive_activations(data: OutlierData, ratio: float = RATIO) -> list[dict[str, Any]]:
    """The massive entries of every layer's residual stream (:func:`labkit.core.outliers.massive_mask`), layer by
    layer, each with its token, value and layer median (Sun et al. 2024 use a ratio of 100; a larger ratio keeps
    the list short)."""
    found = []
    for layer, x in enumerate(data.activations[RESIDUAL]):
        magnitudes = x.abs()
        median = float(magnitudes.median())
        for token, channel in massive_mask(x, ratio).nonzero().tolist():
            found.append(dict(layer=layer, channel=channel, token=token, text=data.token_texts[token],
                              value=float(x[token, channel]), median=median,
                              times_median=float(magnitudes[token, channel]) / median))
    return found


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
    for token_ids in sequences:
        x = residual_stream(lm, token_ids)[layer]
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
