"""labkit.runtime: one forward pass for every caller, caches that measure, crop and copy, verification equal to
single steps, capture that always cleans up, and a private model copy that leaves the shared one untouched.

Each model-level property runs on a tiny random Llama and on the embedded SmolLM2-135M. The tiny half needs no
model file, so it also checks older transformers: ``PYTHONPATH=<transformers 4.46 here> pytest -k "not embedded"``
(passed with 4.46.3 and 4.57.6, with LABKIT_CACHE pointing elsewhere so the user's model cache is not rebuilt).
"""

import time

import pytest
import torch

from alignment import logits_atol, misaligned_cache, misaligned_model
from toys import Bigram
from labkit import runtime
from labkit.core.sampling import choice_margin
from labkit.runtime.generation import greedy_margins
from labkit.runtime import (
    Forward, StepInfo, cache_bytes, cache_length, capture, copy_cache, crop, decode_one_token, forward, full_logits,
    layer_names, model_copy, prefill, verify,
)

ATOL = 1e-3  # cached and uncached passes sum in different orders; FP32 logits of this model agree far closer


@pytest.fixture(scope="module")
def tiny():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture(params=["tiny", "embedded"])
def lm(request):
    return request.getfixturevalue(request.param)


def _shape(lm):
    """(n_layers, n_kv_heads, head_dim, vocab) of either model."""
    config = runtime.module_of(lm).config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers, config.num_key_value_heads, head_dim, config.vocab_size


def _ids(lm, batch_size, seq_len, seed=0):
    vocab = _shape(lm)[3]
    return torch.randint(0, vocab, (batch_size, seq_len), generator=torch.Generator().manual_seed(seed))


def test_forward_last_is_the_last_row_of_all(lm):
    ids = _ids(lm, 2, 6)
    last = forward(lm, ids, use_cache=False)
    every = forward(lm, ids, positions="all", use_cache=False)
    vocab = _shape(lm)[3]
    assert isinstance(last, Forward) and last.cache is None and every.cache is None
    assert last.logits.shape == (2, vocab) and every.logits.shape == (2, 6, vocab)
    assert last.logits.dtype == every.logits.dtype == torch.float32
    assert torch.allclose(last.logits, every.logits[:, -1], atol=1e-4)
    assert torch.equal(full_logits(lm, ids), every.logits)  # full_logits is that very call: same op, same buffers


def test_cached_decode_equals_full_recompute_and_bytes_follow_the_formula(lm):
    n_layers, n_kv_heads, head_dim, _ = _shape(lm)
    ids = _ids(lm, 2, 5)
    logits, cache = prefill(lm, ids)
    steps = [logits]
    for step in range(1, 4):
        chosen = steps[-1].argmax(dim=-1, keepdim=True)  # [batch, 1]
        ids = torch.cat([ids, chosen], dim=1)
        logits, cache = decode_one_token(lm, chosen, cache)
        steps.append(logits)
        assert cache_length(cache) == 5 + step
        # FP32: 4 bytes per element, keys and values, per sequence of the batch.
        assert cache_bytes(cache) == 2 * n_layers * n_kv_heads * head_dim * (5 + step) * 4 * 2
    reference = full_logits(lm, ids)[:, 4:]  # the outputs that predict tokens 5, 6, 7, 8
    cached = torch.stack(steps, dim=1)  # [batch, 4, vocab]
    assert torch.allclose(cached, reference, atol=ATOL)
    assert torch.equal(cached.argmax(-1), reference.argmax(-1))


def test_crop_then_decode_equals_decoding_directly(lm):
    prompt, rejected, token = _ids(lm, 1, 6), _ids(lm, 1, 3, seed=1), _ids(lm, 1, 1, seed=2)
    _, cache = prefill(lm, prompt)
    forward(lm, rejected, cache, positions="all")  # three draft tokens the target then rejects
    assert cache_length(cache) == 9
    assert crop(cache, 6) is cache and cache_length(cache) == 6
    after_crop = decode_one_token(lm, token, cache).logits
    direct = decode_one_token(lm, token, prefill(lm, prompt).cache).logits
    assert torch.allclose(after_crop, direct, atol=1e-5)
    assert cache_length(crop(cache, 7)) == 7 and cache_length(crop(cache, 0)) == 0


def test_crop_rejects_lengths_outside_the_cache(tiny):
    _, cache = prefill(tiny, _ids(tiny, 1, 4))
    for length in (5, -1):
        with pytest.raises(ValueError, match=r"length must be an int in \[0, 4\] \(the cache holds 4 tokens\), got"):
            crop(cache, length)
    for length in (2.0, True):  # the wrong type is a TypeError, as everywhere in labkit
        with pytest.raises(TypeError, match=r"length must be an int in \[0, 4\]"):
            crop(cache, length)
    with pytest.raises(TypeError, match="DynamicCache"):
        crop([(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2))], 1)


def test_a_copied_cache_is_independent(lm):
    _, cache = prefill(lm, _ids(lm, 1, 5))
    copied = copy_cache(cache)
    before = cache_bytes(copied)
    decode_one_token(lm, _ids(lm, 1, 1, seed=3), cache)
    assert (cache_length(cache), cache_length(copied)) == (6, 5) and cache_bytes(copied) == before
    crop(copied, 2)
    assert cache_length(cache) == 6
    # The copy continues like the original would have: the same values in other buffers (here deliberately
    # misaligned), so the same logits up to float32 reordering and the same greedy token.
    _, fresh = prefill(lm, _ids(lm, 1, 5))
    token = _ids(lm, 1, 1, seed=4)
    from_copy = decode_one_token(lm, token, misaligned_cache(copy_cache(fresh))).logits
    original = decode_one_token(lm, token, fresh).logits
    assert torch.allclose(from_copy, original, rtol=0, atol=logits_atol(lm, original))
    assert float(choice_margin(original, original.argmax(-1)).min()) > 10 * logits_atol(lm, original)
    assert torch.equal(from_copy.argmax(-1), original.argmax(-1))


def test_two_paths_agree_on_misaligned_weights_and_cache(lm):
    """Cached decoding on a copy whose weights and cache sit in misaligned buffers against the loaded model's
    uncached pass: within float32 reordering noise, and the same greedy tokens where no step is a near-tie. (A
    test that only holds at one alignment fails here on every machine, not just on some; tests/alignment.py.)"""
    prompt = _ids(lm, 1, 6)
    moved = misaligned_model(lm)
    logits, cache = prefill(moved, prompt)
    cache, ids, steps = misaligned_cache(cache), prompt, [logits]
    for _ in range(3):
        chosen = steps[-1].argmax(dim=-1, keepdim=True)  # [1, 1]
        ids = torch.cat([ids, chosen], dim=1)
        logits, cache = decode_one_token(moved, chosen, cache)
        steps.append(logits)
    reference = full_logits(lm, ids)[:, prompt.shape[1] - 1:]  # the positions that predicted each step's token
    cached = torch.stack(steps, dim=1)
    atol = logits_atol(lm, reference)
    assert float((cached - reference).abs().max()) <= atol
    assert float(choice_margin(reference, reference.argmax(-1)).min()) > 10 * atol
    assert torch.equal(cached.argmax(-1), reference.argmax(-1))


@pytest.mark.parametrize("k", [0, 3])
def test_verify_equals_k_plus_1_single_steps(lm, k):
    context, drafts = _ids(lm, 2, 6), _ids(lm, 2, k, seed=5)
    _, cache = prefill(lm, context[:, :-1])  # the cache lags the last accepted token, as in a decode loop
    stepwise_cache = misaligned_cache(cache)  # the same values in other (never 64-byte aligned) buffers
    logits, cache = verify(lm, cache, context[:, -1:], drafts)
    assert logits.shape == (2, k + 1, _shape(lm)[3]) and cache_length(cache) == 6 + k
    fed = torch.cat([context[:, -1:], drafts], dim=1)
    steps = torch.stack([decode_one_token(lm, fed[:, i : i + 1], stepwise_cache).logits for i in range(k + 1)], 1)
    assert torch.allclose(logits, steps, atol=ATOL)
    assert torch.equal(logits.argmax(-1), steps.argmax(-1))


def test_verify_then_crop_to_the_accepted_drafts(tiny):
    context, drafts, token = _ids(tiny, 1, 5), _ids(tiny, 1, 4, seed=6), _ids(tiny, 1, 1, seed=7)
    _, cache = prefill(tiny, context[:, :-1])
    before = cache_length(cache)
    verify(tiny, cache, context[:, -1:], drafts)
    crop(cache, before + 1 + 2)  # two drafts accepted
    accepted = torch.cat([context, drafts[:, :2], token], dim=1)
    assert torch.allclose(decode_one_token(tiny, token, cache).logits, full_logits(tiny, accepted)[:, -1], atol=ATOL)


def test_verify_rejects_mismatched_blocks(tiny):
    _, cache = prefill(tiny, _ids(tiny, 2, 4))
    with pytest.raises(ValueError, match="last_ids must be"):
        verify(tiny, cache, _ids(tiny, 2, 2), _ids(tiny, 2, 3))
    with pytest.raises(ValueError, match="draft_ids must be a tensor"):
        verify(tiny, cache, _ids(tiny, 2, 1), _ids(tiny, 1, 3))
    with pytest.raises(TypeError, match="draft_ids must hold integer token ids"):
        verify(tiny, cache, _ids(tiny, 2, 1), _ids(tiny, 2, 3).float())


def test_arguments_are_checked_with_a_clear_message(tiny):
    ids = _ids(tiny, 1, 3)
    with pytest.raises(ValueError, match=r"positions must be one of \['last', 'all'\], got 'first'"):
        forward(tiny, ids, positions="first")
    with pytest.raises(TypeError, match=r"ids must be an integer tensor of shape \[batch, seq_len\].*, got a torch.float32"):
        forward(tiny, ids.float())
    with pytest.raises(ValueError, match=r"ids must be an integer tensor of shape \[batch, seq_len\].*\(3,\)"):
        forward(tiny, ids[0])
    with pytest.raises(ValueError, match=r"ids must be .*, got a torch.int64 tensor of shape \(1, 0\)"):
        forward(tiny, ids[:, :0])
    with pytest.raises(TypeError, match="use_cache must be"):
        forward(tiny, ids, use_cache=1)
    with pytest.raises(ValueError, match="use_cache=False"):
        forward(tiny, ids, prefill(tiny, ids).cache, use_cache=False)
    with pytest.raises(ValueError, match="token_ids must be \\[batch, 1\\]"):
        decode_one_token(tiny, ids, None)
    with pytest.raises(TypeError, match="LoadedModel or a torch.nn.Module"):
        forward("smollm2", ids)


def test_the_device_is_the_models(tiny):
    ids = _ids(tiny, 1, 3)
    assert runtime.model_device(tiny) == torch.device("cpu")
    assert torch.equal(forward(tiny, ids, device="cpu").logits, forward(tiny, ids).logits)  # the same op and buffers
    assert forward(tiny, ids).logits.device == torch.device("cpu")
    with pytest.raises(ValueError, match=r"device is 'meta' but the model's weights are on 'cpu'.*to_device"):
        forward(tiny, ids, device="meta")
    with pytest.raises(ValueError, match="device must be a torch device"):
        forward(tiny, ids, device="gpu please")
    runtime.synchronize("cpu")  # a no-op, callable everywhere


def test_a_module_without_a_cache_still_runs():
    """The generation tests' bigram table: a transformers-style forward that keeps no cache."""

    logits, cache = prefill(Bigram(), torch.tensor([[0], [2]]))
    assert logits.argmax(-1).tolist() == [1, 0] and cache is None and cache_length(cache) == 0


def test_capture_records_the_residual_stream_like_transformers(lm):
    ids = _ids(lm, 1, 5)
    names = layer_names(lm)
    assert len(names) == _shape(lm)[0]
    with capture(lm, names) as seen:
        forward(lm, ids)
    with torch.inference_mode():
        hidden = runtime.module_of(lm)(ids, output_hidden_states=True).hidden_states  # embeddings, then each layer
    for index, name in enumerate(names[:-1]):  # transformers normalizes the last layer's output before returning it
        recorded = seen.only(name)
        assert recorded.device == torch.device("cpu") and not recorded.is_inference()
        # Two calls into the model by different routes (labkit's forward with a cache, transformers' own call
        # without): equal up to float32 reordering, relative to the largest activation (SmolLM2's reach 2e4).
        expected = hidden[index + 1]
        scale = float(expected.abs().max())
        assert torch.allclose(recorded, expected, rtol=0, atol=64 * torch.finfo(torch.float32).eps * scale)


def test_capture_every_linear_input(lm):
    config = runtime.module_of(lm).config
    with capture(lm, lambda name, module: isinstance(module, torch.nn.Linear), what="input") as seen:
        forward(lm, _ids(lm, 1, 4))
    assert len(seen.names) == config.num_hidden_layers * 7 + 1  # q, k, v, o, gate, up, down per layer; the head
    assert seen.only("model.layers.0.self_attn.q_proj").shape == (1, 4, config.hidden_size)
    assert seen.only("model.layers.1.mlp.down_proj").shape == (1, 4, config.intermediate_size)
    assert seen.only("lm_head").shape == (1, 1, config.hidden_size)  # only the last position reaches the head


def test_embedded_massive_activation_in_the_residual_stream(embedded):
    """What the outlier lab shows: channel 507 of the first token's residual stream in the middle layers."""
    with capture(embedded, r"model\.layers\.15") as seen:
        forward(embedded, embedded.chat_ids("Hi"))
    first_token = seen.only("model.layers.15")[0, 0]  # [d_model]
    assert int(first_token.abs().argmax()) == 507 and float(first_token.abs().max()) > 10_000


def _hooks(module):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules())


@pytest.mark.parametrize("what", ["input", "output"])
def test_capture_removes_its_hooks_even_when_the_body_raises(tiny, what):
    before = _hooks(tiny)
    with pytest.raises(RuntimeError, match="learner's bug"):
        with capture(tiny, r"model\.layers\.\d+", what=what) as seen:
            forward(tiny, _ids(tiny, 1, 3))
            assert _hooks(tiny) == before + 2
            raise RuntimeError("learner's bug")
    assert _hooks(tiny) == before
    assert [len(calls) for calls in seen.records.values()] == [1, 1]  # what ran before the error is kept
    with capture(tiny, r"model\.layers\.\d+", what=what) as seen:
        forward(tiny, _ids(tiny, 1, 3))
        forward(tiny, _ids(tiny, 1, 4))
    assert _hooks(tiny) == before and [t.shape[1] for t in seen["model.layers.1"]] == [3, 4]
    with pytest.raises(ValueError, match="called 2 times"):
        seen.only("model.layers.1")


def test_capture_rejects_what_matches_nothing(tiny):
    before = _hooks(tiny)
    with pytest.raises(ValueError, match="matches no module; names look like"):
        with capture(tiny, r"decoder\.\d+"):
            pass
    with pytest.raises(ValueError, match="are not in the model"):
        with capture(tiny, ["model.layers.7"]):
            pass
    with pytest.raises(ValueError, match="what must be one of"):
        with capture(tiny, r"model\.norm", what="weights"):
            pass
    assert _hooks(tiny) == before


def test_a_model_copy_leaves_the_shared_model_pristine(lm):
    shared = runtime.module_of(lm)
    tied = shared.lm_head.weight is shared.model.embed_tokens.weight  # SmolLM2 ties them, the tiny Llama not
    ids = _ids(lm, 1, 4)
    watched = {name: p.detach().clone() for name, p in shared.named_parameters() if name.endswith(
        ("embed_tokens.weight", "layers.0.mlp.down_proj.weight", "layers.1.self_attn.q_proj.weight"))}
    before = forward(lm, ids).logits
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
    assert torch.equal(forward(lm, ids).logits, before)  # the same op on the same (untouched) buffers
    assert not torch.allclose(forward(private, ids).logits, before, atol=1e-2)


def test_a_greedy_loop_on_the_primitives_reports_each_step_and_equals_transformers(lm):
    """The loop generation.generate is built on: prefill, then one decode pass per token, StepInfo per step."""
    chat = hasattr(lm, "chat_ids")
    prompt_ids = lm.chat_ids("What is the capital of France?") if chat else _ids(lm, 2, 5)
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
