"""The two passes of a KV-cached generation loop, handed out one by one, counted and capped (layer 2, runtime).

A learner who writes the loop by hand (lab 06) calls ``prefill`` once and ``decode_one_token`` once per further
token; :class:`StepCounter` runs those passes on the model and counts them, so a check can say "identical tokens to
``labkit.runtime.generation.generate``, and exactly n - 1 decode calls", and stop a loop that re-feeds the prefix.
"""

from __future__ import annotations

from typing import Any

import torch

from labkit.core import validation
from labkit.runtime.forward import forward
from labkit.runtime.models import load_model


class StepCounter:
    """The two passes of a KV-cached generation loop on one model, counted (and capped) for an exercise.

    ``prefill(token_ids)`` runs the prompt ``[batch, prompt_len]`` once and returns ``(logits, cache)`` with every prompt
    position's logits, ``[batch, prompt_len, vocab]``, as a model's forward pass gives them (the caller picks the
    position that predicts the next token); ``decode_one_token(token_ids, cache)`` feeds one new token per sequence
    (``[batch, 1]``) after the cached prefix and returns ``(logits [batch, 1, vocab], cache)``. ``prefill_calls`` and
    ``decode_calls`` count the passes run; ``max_prefill_calls`` / ``max_decode_calls`` (None: no cap) make a pass
    beyond the cap raise, with a message that says why. ``lm=None`` uses the embedded model, loaded at first use.

    A deep copy shares the model and starts its counts from 0 (a checker hands each call a fresh counter); two
    counters are equal when they share the model and the caps.
    """

    def __init__(self, lm: Any = None, *, max_prefill_calls: int | None = None,
                 max_decode_calls: int | None = None) -> None:
        self._lm = lm
        self.max_prefill_calls = validation.integer("max_prefill_calls", max_prefill_calls, min=0, optional=True)
        self.max_decode_calls = validation.integer("max_decode_calls", max_decode_calls, min=0, optional=True)
        self.prefill_calls = 0
        self.decode_calls = 0

    def _model(self) -> Any:
        if self._lm is not None:
            return self._lm
        return load_model(progress=False)  # loaded once per process, then reused

    def prefill(self, token_ids: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Run the prompt once: (every position's logits ``[batch, prompt_len, vocab]``, a new cache)."""
        if self.max_prefill_calls is not None and self.prefill_calls >= self.max_prefill_calls:
            raise RuntimeError(f"prefill ran {self.prefill_calls + 1} times, at most {self.max_prefill_calls} "
                               "allowed: the prompt is prefilled once, then each step feeds only the newest "
                               "token to decode_one_token (the cache holds everything before it)")
        self.prefill_calls += 1
        with torch.inference_mode():
            logits, cache = forward(self._model(), token_ids, positions="all")
        return logits, cache

    def decode_one_token(self, token_ids: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
        """Feed one new token per sequence, ``[batch, 1]``: (its logits ``[batch, 1, vocab]``, the grown cache)."""
        if cache is None:
            raise ValueError("decode_one_token needs the cache that prefill returned: call prefill first")
        if not isinstance(token_ids, torch.Tensor) or token_ids.ndim != 2 or token_ids.shape[1] != 1:
            shape = tuple(token_ids.shape) if isinstance(token_ids, torch.Tensor) else type(token_ids).__name__
            raise ValueError(f"decode_one_token takes only the newest token, shape [batch, 1], got {shape}: the "
                             "cache already holds the prefix, so re-feeding it repeats its work (and its tokens)")
        if self.max_decode_calls is not None and self.decode_calls >= self.max_decode_calls:
            raise RuntimeError(f"decode_one_token ran {self.decode_calls + 1} times, at most "
                               f"{self.max_decode_calls} needed: the prefill's logits already choose the first new "
                               "token, so n new tokens take n - 1 decode calls, and none after the end token")
        self.decode_calls += 1
        with torch.inference_mode():
            logits, cache = forward(self._model(), token_ids, cache, positions="all")
        return logits, cache

    def __deepcopy__(self, memo: dict) -> "StepCounter":
        return StepCounter(self._lm, max_prefill_calls=self.max_prefill_calls, max_decode_calls=self.max_decode_calls)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, StepCounter) and other._lm is self._lm
                and (other.max_prefill_calls, other.max_decode_calls) == (self.max_prefill_calls,
                                                                          self.max_decode_calls))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        def calls(count: int, cap: int | None) -> str:
            return f"{count}" if cap is None else f"{count} of at most {cap}"

        return (f"StepCounter(prefill calls {calls(self.prefill_calls, self.max_prefill_calls)}, "
                f"decode calls {calls(self.decode_calls, self.max_decode_calls)})")
