"""The population sweep's steps (issue #49): what labkit's labs do to a learner's model, run on one small model.

``run_steps`` takes a model type, builds a target and a draft of it small (``any_models.build_small``), saves the
target with the embedded model's tokenizer to a folder and loads it back with ``load_model(folder)`` as a learner
would, then runs each step in order and returns the name of the first step that fails with its error, or None.
Each step asserts against an independent expectation: transformers' own logits, the model's config, the real
cache's bytes, the FP32 logits, labkit's plain greedy loop.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from any_models import build_small
from labkit import runtime
from labkit.core.distribution import CLEAR_MARGIN
from labkit.core.memory import kv_cache_bytes
from labkit.runtime import drafters
from labkit.runtime import speculative as rs
from labkit.runtime.cache import cache_bytes
from labkit.runtime.generation import greedy_margins

PROMPT = "The lighthouse keeper climbed the spiral stairs every evening to light the lamp."
N_NEW = 4
# The distance of each format's logits from FP32's, relative to FP32's largest |logit|: the bounds stated for the
# embedded model (tests/test_runtime_llama.py's FORMAT_BOUNDS), and bytes a step reads at most, as a share of FP32's.
FORMAT_DISTANCE = {"bf16": 0.10, "int8": 0.15, "int4": 0.80}
FORMAT_BYTES = {"bf16": 1 / 1.99, "int8": 1 / 3.2, "int4": 1 / 3.2}  # labkit's Llama keeps an INT4 head in INT8
STEPS = ("load", "next-token scores", "sampling explorer", "outlier capture", "memory explorer", "formats",
         "decode timing", "speculative round")


class StepFailed(Exception):
    def __init__(self, step: str, error: BaseException):
        super().__init__(f"{step}: {type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}")
        self.step = step


def _direct_logits(module, token_ids):
    with torch.inference_mode():
        return module(token_ids, use_cache=False).logits[0, -1].float()


def run_steps(model_type: str, tokenizer, folder: Path, timings: dict[str, float] | None = None) -> None:
    """Every step on ``model_type``; raises :class:`StepFailed` at the first that fails (``NotBuildable`` before)."""
    from labkit.explorers import memory_models
    from labkit.explorers import sampling as sampling_explorer
    from labkit.runtime.activations import RESIDUAL, capture_activations
    from labkit.runtime.llama import decoder
    from labkit.runtime.models import load_model
    from labkit.runtime.scoring import next_token_scores
    from labkit.runtime.timing import timed_generation

    timings = {} if timings is None else timings
    target_module = build_small(model_type, len(tokenizer), seed=0)
    draft_module = build_small(model_type, len(tokenizer), seed=1)
    state: dict = {}

    def step(name):
        def wrapper(function):
            start = time.perf_counter()
            try:
                function()
            except Exception as error:  # noqa: BLE001 - the sweep records each step's failure
                raise StepFailed(name, error) from error
            timings[name] = timings.get(name, 0.0) + time.perf_counter() - start
        return wrapper

    @step("load")
    def _():
        target_module.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
        lm = load_model(str(folder))
        state["lm"], state["token_ids"] = lm, lm.text_ids(PROMPT)
        assert type(lm.model).__name__ == type(target_module).__name__

    lm, token_ids = state["lm"], state["token_ids"]

    @step("next-token scores")
    def _():
        scores = next_token_scores(lm, PROMPT, chat=False, n_show=5)
        expected = _direct_logits(target_module, token_ids)
        torch.testing.assert_close(scores.next_token_logits, expected, atol=1e-3, rtol=1e-4)
        state["scores"] = scores

    @step("sampling explorer")
    def _():
        view = sampling_explorer.compute(state["scores"], temperature=0.7, top_k=3)
        assert view.n_kept == 3 and abs(sum(view.sampling_probs) - 1) < 1e-5

    @step("outlier capture")
    def _():
        data = capture_activations(lm, PROMPT)
        assert data.n_layers == len(runtime.layer_names(lm)) >= 1 and len(data.activations) >= 2
        assert all(x.shape[0] == token_ids.shape[1] for xs in data.activations.values() for x in xs)
        assert data.activations[RESIDUAL][0].shape[1] == lm.model.get_input_embeddings().weight.shape[1]

    @step("memory explorer")
    def _():
        sized = memory_models.read_model(str(folder))
        _, cache = runtime.prefill(lm, token_ids)
        measured = cache_bytes(cache)
        predicted = kv_cache_bytes(sized.spec, 1, token_ids.shape[1], "fp32")
        assert measured > 0 and predicted == measured, f"predicted {predicted:,} B, the real cache holds {measured:,} B"

    @step("formats")
    def _():
        reference = runtime.full_logits(lm, token_ids)
        fp32_bytes = decoder(lm, "fp32").model.weight_bytes
        for weights, distance in FORMAT_DISTANCE.items():
            variant = decoder(lm, weights)
            ours = runtime.full_logits(variant, token_ids)
            assert float((ours - reference).abs().max()) <= distance * float(reference.abs().max()), weights
            assert variant.model.weight_bytes <= FORMAT_BYTES[weights] * fp32_bytes, weights

    @step("decode timing")
    def _():
        run = timed_generation(lm, token_ids, N_NEW)
        plain = rs.plain_greedy(lm, token_ids, N_NEW)[0]
        assert run.new_token_ids[0].tolist() == plain and len(run.step_s) == N_NEW
        assert float(greedy_margins(lm, token_ids, torch.tensor([plain])).min()) > CLEAR_MARGIN
        state["plain"] = plain

    @step("speculative round")
    def _():
        run = rs.speculative_generate(lm, token_ids, N_NEW, drafters.DraftModel(draft_module), gamma=2)
        assert run.new_token_ids == state["plain"]
