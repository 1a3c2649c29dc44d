"""Scoring a long text with a model: one forward pass per window, every token's surprisal, entropy and rank.

The arithmetic (alignment, surprisal, the window rule, :class:`labkit.core.loss.TextScore`) is the core's
``labkit.core.loss``; this module only runs the passes, through ``labkit.runtime`` like every model call.

Used by lab 02 (perplexity of the evaluation text) and lab 04 (what quantization costs in perplexity).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from labkit.core.loss import TextScore, Window, score_windows, token_surprisal, truncated_log_probs
from labkit.runtime import full_logits
from labkit.core.validation import real, tensor


def _pass_logits(model: Any, token_ids: torch.Tensor, piece: Window, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [n_targets, vocab], targets [n_targets]) of one window, in float32, where the model runs."""
    inputs = token_ids[piece.input_start : piece.input_end].unsqueeze(0)  # [1, seq_len]
    logits = full_logits(model, inputs, device=device)[0]  # [seq_len, vocab]
    first = piece.targets_start - 1 - piece.input_start  # the output that predicts targets_start
    return logits[first:], token_ids[piece.targets_start : piece.input_end + 1].to(logits.device)


def score_text(model: Any, token_ids: torch.Tensor, window: int = 512, stride: int | None = None, *,
               temperatures: tuple[float, ...] = (), truncations: dict[str, dict] | None = None,
               progress: bool = True, device: Any = None) -> TextScore:
    """Score every token of a text (from position 1) with a causal LM, in windows (:func:`score_windows`).

    One forward pass per window; from its logits are derived the surprisal, the entropy and the rank of each
    target, its surprisal at each of ``temperatures``, and its log-probability under each named sampling
    setting in ``truncations`` (keyword arguments of ``labkit.core.sampling.sampling_probs``; ``-inf`` where cut).

    token_ids: ``[n_tokens]``. ``model``: a LoadedModel or a transformers causal LM. The statistics are computed
    where the model runs (``device``, default its own) and returned on the CPU.
    """
    from tqdm.auto import tqdm

    tensor("token_ids", token_ids, kind="int", ndim=1, shape="[n_tokens]")
    for index, temperature in enumerate(temperatures):
        real(f"temperatures[{index}]", temperature, min=0, min_open=True)
    truncations = dict(truncations or {})
    n_tokens = int(token_ids.numel())

    def unscored(dtype=torch.float32, value=math.nan):
        return torch.full((n_tokens,), value, dtype=dtype)

    surprisal, entropies, ranks = unscored(), unscored(), unscored(torch.long, -1)
    at_temperature = {t: unscored() for t in temperatures}
    truncated = {name: unscored() for name in truncations}
    passes = score_windows(n_tokens, window, stride)
    with torch.inference_mode():
        for piece in tqdm(passes, desc="scoring windows", unit="window", disable=not progress):
            logits, targets = _pass_logits(model, token_ids, piece, device)
            span = slice(piece.targets_start, piece.input_end + 1)
            log_probs = torch.log_softmax(logits, dim=-1)  # [n, vocab]
            surprisal[span] = -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1).cpu()
            # Entropy -sum p log p in float32 (no softmax underflows to a NaN term: log_probs stay finite).
            entropies[span] = -(log_probs.exp() * log_probs).sum(dim=-1).cpu()
            target_logits = logits.gather(-1, targets.unsqueeze(-1))  # [n, 1]
            ranks[span] = (logits > target_logits).sum(dim=-1).cpu()
            for temperature in temperatures:
                at_temperature[temperature][span] = token_surprisal(logits / temperature, targets).cpu()
            for name, settings in truncations.items():
                truncated[name][span] = truncated_log_probs(logits, targets, **settings).cpu()
    return TextScore(token_ids, surprisal, entropies, ranks, at_temperature, truncated, window,
                     window if stride is None else stride)
