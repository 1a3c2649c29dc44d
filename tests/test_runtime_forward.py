"""labkit.runtime.forward: one forward pass for every caller, the two passes of a decode loop, verification equal
to single steps, the device, and a private model copy that leaves the shared one untouched.

Each model-level property runs on a tiny random Llama and on the embedded SmolLM2-135M. The tiny half needs no
model file, so it also checks older transformers: ``PYTHONPATH=<transformers 4.46 here> pytest -k "not embedded"``
(passed with 4.46.3 and 4.57.6, with LABKIT_CACHE pointing elsewhere so the user's model cache is not rebuilt).
"""

import time

import pytest
import torch

from alignment import logits_atol, misaligned_cache, misaligned_model
from toys import Bigram, random_token_ids, shape_of
from labkit import runtime
from labkit.core.distribution import choice_margin
from labkit.runtime import (
    Forward, StepInfo, cache_bytes, cache_length, crop, decode_one_token, forward, full_logits, model_copy, prefill,
    verify,
)
from labkit.runtime.generation import greedy_margins

ATOL = 1e-3  # cached and uncached passes sum in different orders; FP32 logits of this model agree far closer


def test_forward_last_is_the_last_row_of_all(lm):
    token_ids = random_token_ids(lm, 2, 6)
    last = forward(lm, token_ids, use_cache=False)
    every = forward(lm, token_ids, positions="all", use_cache=False)
    vocab = shape_of(lm)[3]
    assert isinstance(last, Forward) and last.cache is None and every.cache is None
    assert last.logits.shape == (2, vocab) and every.logits.shape == (2, 6, vocab)
    assert last.logits.dtype == every.logits.dtype == torch.float32
    assert torch.allclose(last.logits, every.logits[:, -1], atol=1e-4)
    assert torch.equal(full_logits(lm, token_ids), every.logits)  # full_logits is that very call: same op, same buffers


def test_cached_decode_equals_full_recompute_and_bytes_follow_the_formula(lm):
    n_layers, n_kv_heads, head_dim, _ = shape_of(lm)
    token_ids = random_token_ids(lm, 2, 5)
    logits, cache = prefill(lm, token_ids)
    steps = [logits]
    for step in range(1, 4):
        chosen = steps[-1].argmax(dim=-1, keepdim=True)  # [batch, 1]
        token_ids = torch.cat([token_ids, chosen], dim=1)
        logits, cache = decode_one_token(lm, chosen, cache)
        steps.append(logits)
        assert cache_length(cache) == 5 + step
        # FP32: 4 bytes per element, keys and values, per sequence of the batch.
        assert cache_bytes(cache) == 2 * n_layers * n_kv_heads * head_dim * (5 + step) * 4 * 2
    reference = full_logits(lm, token_ids)[:, 4:]  # the outputs that predict tokens 5, 6, 7, 8
    cached = torch.stack(steps, dim=1)  # [batch, 4, vocab]
    assert torch.allclose(cached, reference, atol=ATOL)
    assert torch.equal(cached.argmax(-1), reference.argmax(-1))


def test_two_paths_agree_on_misaligned_weights_and_cache(lm):
    """Cached decoding on a copy whose weights and cache sit in misaligned buffers against the loaded model's
    uncached pass: within float32 reordering noise, and the same greedy tokens where no step is a near-tie. (A
    test that only holds at one alignment fails here on every machine, not just on some; tests/alignment.py.)"""
    prompt = random_token_ids(lm, 1, 6)
    moved = misaligned_model(lm)
    logits, cache = prefill(moved, prompt)
    cache, token_ids, steps = misaligned_cache(cache), prompt, [logits]
    for _ in range(3):
        chosen = steps[-1].argmax(dim=-1, keepdim=True)  # [1, 1]
        token_ids = torch.cat([token_ids, chosen], dim=1)
        logits, cache = decode_one_token(moved, chosen, cache)
        steps.append(logits)
    reference = full_logits(lm, token_ids)[:, prompt.shape[1] - 1:]  # the positions that predicted each step's token
    cached = torch.stack(steps, dim=1)
    atol = logits_atol(lm, reference)
    assert float((cached - reference).abs().max()) <= atol
    assert float(choice_margin(reference, reference.argmax(-1)).min()) > 10 * atol
    assert torch.equal(cached.argmax(-1), reference.argmax(-1))


@pytest.mark.parametrize("k", [0, 3])
def test_verify_equals_k_plus_1_single_steps(lm, k):
    context, drafts = random_token_ids(lm, 2, 6), random_token_ids(lm, 2, k, seed=5)
    _, cache = prefill(lm, context[:, :-1])  # the cache lags the last accepted token, as in a decode loop
    stepwise_cache = misaligned_cache(cache)  # the same values in other (never 64-byte aligned) buffers
    logits, cache = verify(lm, cache, context[:, -1:], drafts)
    assert logits.shape == (2, k + 1, shape_of(lm)[3]) and cache_length(cache) == 6 + k
    fed = torch.cat([context[:, -1:], drafts], dim=1)
    steps = torch.stack([decode_one_token(lm, fed[:, i : i + 1], stepwise_cache).logits for i in range(k + 1)], 1)
    assert torch.allclose(logits, steps, atol=ATOL)
    assert torch.equal(logits.argmax(-1), steps.argmax(-1))


def test_verify_then_crop_to_the_accepted_drafts(tiny):
    context, drafts = random_token_ids(tiny, 1, 5), random_token_ids(tiny, 1, 4, seed=6)
    token = random_token_ids(tiny, 1, 1, seed=7)
    _, cache = prefill(tiny, context[:, :-1])
    before = cache_length(cache)
    verify(tiny, cache, context[:, -1:], drafts)
    crop(cache, before + 1 + 2)  # two drafts accepted
    accepted = torch.cat([context, drafts[:, :2], token], dim=1)
    assert torch.allclose(decode_one_token(tiny, token, cache).logits, full_logits(tiny, accepted)[:, -1], atol=ATOL)


def test_verify_rejects_mismatched_blocks(tiny):
    _, cache = prefill(tiny, random_token_ids(tiny, 2, 4))
    with pytest.raises(ValueError, match="last_ids must be"):
        verify(tiny, cache, random_token_ids(tiny, 2, 2), random_token_ids(tiny, 2, 3))
    with pytest.raises(ValueError, match="draft_ids must be a tensor"):
        verify(tiny, cache, random_token_ids(tiny, 2, 1), random_token_ids(tiny, 1, 3))
    with pytest.raises(TypeError, match="draft_ids must hold integer token ids"):
        verify(tiny, cache, random_token_ids(tiny, 2, 1), random_token_ids(tiny, 2, 3).float())


def test_arguments_are_checked_with_a_clear_message(tiny):
    token_ids = random_token_ids(tiny, 1, 3)
    with pytest.raises(ValueError, match=r"positions must be one of \['last', 'all'\], got 'first'"):
        forward(tiny, token_ids, positions="first")
    with pytest.raises(TypeError, match=r"ids must be an integer tensor of shape \[batch, seq_len\].*, got a torch.float32"):
        forward(tiny, token_ids.float())
    with pytest.raises(ValueError, match=r"ids must be an integer tensor of shape \[batch, seq_len\].*\(3,\)"):
        forward(tiny, token_ids[0])
    with pytest.raises(ValueError, match=r"ids must be .*, got a torch.int64 tensor of shape \(1, 0\)"):
        forward(tiny, token_ids[:, :0])
    with pytest.raises(TypeError, match="use_cache must be"):
        forward(tiny, token_ids, use_cache=1)
    with pytest.raises(ValueError, match="use_cache=False"):
        forward(tiny, token_ids, prefill(tiny, token_ids).cache, use_cache=False)
    with pytest.raises(ValueError, match="token_ids must be \\[batch, 1\\]"):
        decode_one_token(tiny, token_ids, None)
    with pytest.raises(TypeError, match="LoadedModel or a torch.nn.Module"):
        forward("smollm2", token_ids)


def test_the_device_is_the_models(tiny):
    token_ids = random_token_ids(tiny, 1, 3)
    assert runtime.model_device(tiny) == torch.device("cpu")
    # The same op on the same buffers:
    assert torch.equal(forward(tiny, token_ids, device="cpu").logits, forward(tiny, token_ids).logits)
    assert forward(tiny, token_ids).logits.device == torch.device("cpu")
    with pytest.raises(ValueError, match=r"device is 'meta' but the model's weights are on 'cpu'.*to_device"):
        forward(tiny, token_ids, device="meta")
    with pytest.raises(ValueError, match="device must be a torch device"):
        forward(tiny, token_ids, device="gpu please")
    runtime.synchronize("cpu")  # a no-op, callable everywhere


def test_a_module_without_a_cache_still_runs():
    """The generation tests' bigram table: a transformers-style forward that keeps no cache."""

    logits, cache = prefill(Bigram(), torch.tensor([[0], [2]]))
    assert logits.argmax(-1).tolist() == [1, 0] and cache is None and cache_length(cache) == 0


def test_a_model_copy_leaves_the_shared_model_pristine(lm):
    shared = runtime.module_of(lm)
    tied = shared.lm_head.weight is shared.model.embed_tokens.weight  # SmolLM2 ties them, the tiny Llama not
    token_ids = random_token_ids(lm, 1, 4)
    watched = {name: p.detach().clone() for name, p in shared.named_parameters() if name.endswith(
        ("embed_tokens.weight", "layers.0.mlp.down_proj.weight", "layers.1.self_attn.q_proj.weight"))}
    before = forward(lm, token_ids).logits
    private = model_copy(lm)
    copied = runtime.module_of(private)
    assert copied is not shared and getattr(private, "tokenizer", None) is getattr(lm, "tokenizer", None)
    with torch.no_grad():  # what a learner does to the copy: prune a matrix, quantize the embeddings coarsely
        copied.model.layers[0].mlp.down_proj.weight.zero_()
        copied.model.embed_tokens.weight.copy_(copied.model.embed_tokens.weight.round())
    assert (copied.lm_head.weight is copied.model.embed_tokens.weight) == tied  # tying survives the copy
    parameters = dict(shared.named_parameters())
    for name, original in watched.items():
        assert torch.equal(parameters[name], original), name
    assert torch.equal(forward(lm, token_ids).logits, before)  # the same op on the same (untouched) buffers
    assert not torch.allclose(forward(private, token_ids).logits, before, atol=1e-2)


def test_a_greedy_loop_on_the_primitives_reports_each_step_and_equals_transformers(lm):
    """The loop generation.generate is built on: prefill, then one decode pass per token, StepInfo per step."""
    chat = hasattr(lm, "chat_ids")
    prompt_ids = lm.chat_ids("What is the capital of France?") if chat else random_token_ids(lm, 2, 5)
    n_new, reports = 6, []
    token_ids, cache = prompt_ids, None
    for step in range(n_new):
        started = time.perf_counter()
        if step == 0:
            logits, cache = prefill(lm, token_ids)
        else:
            logits, cache = decode_one_token(lm, token_ids[:, -1:], cache)
        chosen = logits.argmax(dim=-1)  # [batch]
        runtime.synchronize(chosen.device)
        reports.append(StepInfo(step, chosen.cpu(), time.perf_counter() - started, cache_length(cache)))
        token_ids = torch.cat([token_ids, chosen.unsqueeze(1)], dim=1)
    with torch.inference_mode():
        reference = runtime.module_of(lm).generate(prompt_ids, attention_mask=torch.ones_like(prompt_ids),
                                                   do_sample=False, max_new_tokens=n_new, pad_token_id=0)
    # Token identity across two implementations holds only away from near-ties: every step's margin is far above
    # the float32 noise between them.
    new_token_ids = token_ids[:, prompt_ids.shape[1]:]
    margins = greedy_margins(lm, prompt_ids, new_token_ids)
    assert float(margins.min()) > 10 * logits_atol(lm, full_logits(lm, token_ids)), margins
    assert torch.equal(token_ids, reference)
    assert [r.cache_length for r in reports] == [prompt_ids.shape[1] + step for step in range(n_new)]
    assert [r.phase for r in reports[:2]] == ["prefill", "decode"] and all(r.step_s > 0 for r in reports)
    if chat:
        assert "Paris" in lm.tokenizer.decode(torch.cat([r.token_ids for r in reports]))
