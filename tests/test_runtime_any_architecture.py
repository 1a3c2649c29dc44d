"""labkit's runtime on any causal LM (issue #45): next-token scores and the sampling explorer's compute, windowed
scoring sized from the model's context, activation capture by module role and the outlier visualizer's compute, a
timed decode, and speculative decoding with a draft model, on small random models of seven architectures
(``tests/any_models.py``: Llama, Qwen2, Qwen3, Gemma 2, GPT-NeoX, Phi-3, Mistral; Gemma 2 and Mistral slide their
attention over 8 tokens, fewer than the prompts here).

Each model is built in the process from its config (random weights, seeded; no file, no network) with the embedded
model's tokenizer, and wrapped as a LoadedModel. The expectations come from transformers run directly (its logits,
hidden states and ``generate``), from the config (widths, context) or from the vocabularies, never from the code
under test. Greedy paths are compared token for token only where every step's margin is above
``core.distribution.CLEAR_MARGIN`` (a verify pass scores a block at once; see tests/test_runtime_speculative.py).
"""

import pytest
import torch

from any_models import ARCHITECTURES, SLIDING, tiny_config
from labkit import runtime
from labkit.core.distribution import CLEAR_MARGIN
from labkit.core.spec import ModelSpec
from labkit.explorers import outliers as outlier_explorer
from labkit.explorers import sampling as sampling_explorer
from labkit.runtime import drafters
from labkit.runtime import speculative as rs
from labkit.runtime.activations import RESIDUAL, SOURCES, capture_activations, source_linears
from labkit.runtime.generation import greedy_margins
from labkit.runtime.llama import _is_plain_llama
from labkit.runtime.models import LoadedModel
from labkit.runtime.scoring import next_token_scores, score_text, scoring_window
from labkit.runtime.sources import ModelSource
from labkit.runtime.timing import timed_generation

PROMPT = "The lighthouse keeper climbed the spiral stairs every evening to light the lamp for the ships."
LONG_TEXT = " ".join(["Ships passing the rocky coast relied on its beam, and the keeper wrote each night in a log."]
                     * 14)  # about 300 tokens: longer than the models' 256-token context, two windows


def wrap(module, tokenizer, name):
    """A LoadedModel around a module built in the test (kind "hub", not a chat model)."""
    module.eval()
    n_params = sum(p.numel() for p in module.parameters())
    spec = ModelSpec.from_config(module.config, name=name, n_params=n_params)
    source = ModelSource(name=name, title=name, kind="hub", source="built in the test from its config",
                         revision="none", license="none", chat=False)
    return LoadedModel(name, module, tokenizer, spec, source, 0.0, "hub")


HEAD_SCALE = 100.0


def build(model_type, tokenizer, seed):
    """A random small ``model_type`` model, its output head scaled by :data:`HEAD_SCALE`: at the default scale the
    top two logits of a random model lie within a few 1e-4 of each other, too close to compare greedy paths; scaled,
    its greedy choices are clear (the margins are checked) and it is still a causal LM of that architecture."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    module = AutoModelForCausalLM.from_config(tiny_config(model_type, len(tokenizer)))
    with torch.no_grad():
        module.get_output_embeddings().weight.mul_(HEAD_SCALE)
    return wrap(module, tokenizer, f"tiny-{model_type}-{seed}")


@pytest.fixture(scope="module")
def tokenizer(embedded):
    return embedded.tokenizer


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def target(request, tokenizer):
    return build(request.param, tokenizer, seed=0)


@pytest.fixture(scope="module")
def draft(target, tokenizer):
    """A second model of the target's architecture, other weights, the same tokenizer."""
    return build(target.model.config.model_type, tokenizer, seed=1)


@pytest.fixture(scope="module")
def prompt_ids(target):
    token_ids = target.text_ids(PROMPT)
    assert token_ids.shape[1] > 8  # past the sliding window of Gemma 2 and Mistral
    return token_ids


def direct_logits(lm, token_ids):
    """transformers' own forward, no labkit in between: ``[seq_len, vocab]``."""
    with torch.inference_mode():
        return lm.model(token_ids, use_cache=False).logits[0].float()


# ---------------------------------------------------------------------------------------------------------------
# Next-token scores and the sampling explorer


def test_next_token_scores_are_the_models_own_and_the_sampling_explorer_filters_them(target, prompt_ids):
    scores = next_token_scores(target, PROMPT, chat=False, n_show=5)
    expected = direct_logits(target, prompt_ids)[-1]
    assert torch.equal(scores.input_ids, prompt_ids)
    torch.testing.assert_close(scores.next_token_logits, expected, atol=1e-5, rtol=1e-5)
    assert list(scores.top_ids) == torch.topk(expected, 5).indices.tolist()
    view = sampling_explorer.compute(scores, temperature=0.7, top_k=3)
    assert view.vocab == len(target.tokenizer) and view.n_kept == 3
    kept = torch.softmax(expected[list(scores.top_ids[:3])] / 0.7, dim=-1)
    torch.testing.assert_close(torch.tensor(view.sampling_probs[:3]), kept, atol=1e-5, rtol=1e-5)
    assert view.sampling_probs[3:] == (0.0, 0.0)
    with pytest.raises(ValueError, match="not a chat model"):
        next_token_scores(target, PROMPT, chat=True)


# ---------------------------------------------------------------------------------------------------------------
# Scoring a long text in windows sized from the model's context


def test_a_long_text_is_scored_in_windows_no_longer_than_the_context(target):
    context = target.model.config.max_position_embeddings
    token_ids = target.text_ids(LONG_TEXT)[0]
    assert context == 256 and len(token_ids) > context
    scores = score_text(target, token_ids, progress=False)
    assert scores.window == context  # 512 by default, cut to the context
    assert not scores.surprisal_nats[1:].isnan().any() and bool(scores.surprisal_nats[0].isnan())
    # The first window is one pass over the first 256 tokens: transformers' own cross-entropy.
    first = direct_logits(target, token_ids[None, :context])
    expected = torch.nn.functional.cross_entropy(first[:-1], token_ids[1:context], reduction="none")
    torch.testing.assert_close(scores.surprisal_nats[1:context], expected, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match=r"window must be an int in \[1, 256\].*context.*got 512"):
        score_text(target, token_ids, window=512, progress=False)


def test_the_embedded_models_scoring_window_is_unchanged(embedded):
    assert scoring_window(embedded) == 512  # its context is 8,192 tokens: lab 02's numbers stay as they were
    assert scoring_window(embedded, 1024) == 1024


# ---------------------------------------------------------------------------------------------------------------
# Activation capture by module role, and the outlier visualizer


def test_activations_are_captured_by_role_on_each_architecture(target, prompt_ids):
    config = target.model.config
    data = capture_activations(target, PROMPT)
    assert set(data.activations) == set(SOURCES) and data.n_layers == config.num_hidden_layers
    n_tokens = prompt_ids.shape[1]
    linears = source_linears(target)
    blocks = runtime.layer_names(target)
    assert blocks[0] == ("gpt_neox.layers.0" if config.model_type == "gpt_neox" else "model.layers.0")
    for source, tensors in data.activations.items():
        for layer, x in enumerate(tensors):
            if source == RESIDUAL:
                width = config.hidden_size
            else:  # each role reads what its Linear (named per architecture) takes in
                width = target.model.get_submodule(f"{blocks[layer]}.{linears[source]}").in_features
            assert x.shape == (n_tokens, width), (source, layer)
            assert data.weight_absmax[source][layer].shape == (width if source != RESIDUAL else config.hidden_size,)
    # the residual stream after the first block is transformers' own hidden state 1
    with torch.inference_mode():
        hidden = target.model(prompt_ids, output_hidden_states=True, use_cache=False).hidden_states
    torch.testing.assert_close(data.activations[RESIDUAL][0], hidden[1][0].float(), atol=1e-5, rtol=1e-5)
    down_width = config.intermediate_size
    assert data.activations["down_proj input"][0].shape[1] == down_width
    for source in SOURCES:
        view = outlier_explorer.compute(data, layer=1, source=source)
        assert view.tensor.magnitudes.shape[0] == n_tokens
        assert all(len(values) == config.num_hidden_layers for values in view.layers.sqnr.values())


def test_the_roles_are_read_from_each_blocks_layer_names(target):
    linears = source_linears(target)
    expected = {"gpt_neox": ("attention.query_key_value", "mlp.dense_4h_to_h"),
                "phi3": ("self_attn.qkv_proj", "mlp.down_proj")}.get(target.model.config.model_type,
                                                                      ("self_attn.q_proj", "mlp.down_proj"))
    assert (linears["q/k/v_proj input"], linears["down_proj input"]) == expected
    assert list(linears) == list(SOURCES[1:])  # every layer has a known role here: no "linear k" source


def test_a_model_of_unknown_layer_names_is_captured_as_linear_k_and_one_without_blocks_is_refused(tokenizer):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model("gpt2", n_layer=2, n_embd=64, n_head=4, vocab_size=len(tokenizer), n_positions=64)
    gpt2 = wrap(AutoModelForCausalLM.from_config(config), tokenizer, "tiny-gpt2")
    assert runtime.layer_names(gpt2) == ["transformer.h.0", "transformer.h.1"]
    assert source_linears(gpt2) == {"q/k/v_proj input": "attn.c_attn", "o_proj input": "attn.c_proj",
                                    "gate/up_proj input": "mlp.c_fc", "down_proj input": "mlp.c_proj"}
    for block in gpt2.model.transformer.h:  # renamed: no name says what these read any more
        block.attn.mixer_in, block.mlp.expand = block.attn.c_attn, block.mlp.c_fc
        del block.attn.c_attn, block.mlp.c_fc
    renamed = source_linears(gpt2)
    assert renamed == {"o_proj input": "attn.c_proj", "down_proj input": "mlp.c_proj",
                       "linear 1 input (attn.mixer_in)": "attn.mixer_in", "linear 3 input (mlp.expand)": "mlp.expand"}
    # a model with no repeated blocks is refused, saying which lists it has
    flat = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10))
    with pytest.raises(ValueError, match=r"lm must be a model with a ModuleList of its repeated decoder blocks; "
                                         r"Sequential has the ModuleLists none"):
        source_linears(flat)
    holder = torch.nn.Module()
    holder.blocks = torch.nn.ModuleList([torch.nn.LayerNorm(4), torch.nn.LayerNorm(4)])
    with pytest.raises(ValueError, match=r"lm must be a model whose decoder blocks hold linear layers.*blocks.0 is a "
                                         r"LayerNorm"):
        source_linears(holder)
    first, second = torch.nn.Module(), torch.nn.Module()
    first.a, second.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    holder.blocks = torch.nn.ModuleList([first, second])
    with pytest.raises(ValueError, match=r"lm must be a model whose decoder blocks share at least one linear layer's "
                                         r"name, got \"2 blocks with no name in common \(blocks.0: \['a'\], blocks.1: "
                                         r"\['b'\]\)\""):
        source_linears(holder)


# ---------------------------------------------------------------------------------------------------------------
# A timed decode


def test_a_timed_decode_is_transformers_greedy_and_only_llama_takes_labkits_forward(target, prompt_ids):
    run = timed_generation(target, prompt_ids, 4)
    with torch.inference_mode():
        expected = target.model.generate(prompt_ids, attention_mask=torch.ones_like(prompt_ids), do_sample=False,
                                         max_new_tokens=4, pad_token_id=0)[0, prompt_ids.shape[1]:]
    assert_far_from_ties(target, prompt_ids, expected.tolist())
    assert run.new_token_ids[0].tolist() == expected.tolist()
    assert len(run.step_s) == 4
    length = prompt_ids.shape[1]
    assert run.context_lens == (0, length, length + 1, length + 2)
    assert _is_plain_llama(target.model) == (target.model.config.model_type == "llama")


# ---------------------------------------------------------------------------------------------------------------
# Speculative decoding with a draft model


def assert_far_from_ties(lm, token_ids, tokens):
    margins = greedy_margins(lm, token_ids, torch.tensor([tokens]))
    assert float(margins.min()) > CLEAR_MARGIN, margins


N_NEW = 6


@pytest.fixture(scope="module")
def plain(target, prompt_ids):
    tokens = rs.plain_greedy(target, prompt_ids, N_NEW)[0]
    assert_far_from_ties(target, prompt_ids, tokens)
    return tokens


@pytest.mark.parametrize("kind", ["draft model", "the target as its own draft", "early exit", "prompt lookup"])
def test_greedy_speculative_decoding_is_the_targets_greedy_output(target, draft, prompt_ids, plain, kind):
    drafter = {"draft model": lambda: drafters.DraftModel(draft),
               "the target as its own draft": lambda: drafters.DraftModel(target),
               "early exit": lambda: drafters.EarlyExit(1),
               "prompt lookup": lambda: drafters.PromptLookup()}[kind]()
    run = rs.speculative_generate(target, prompt_ids, N_NEW, drafter, gamma=3)
    assert run.new_token_ids == plain
    assert run.target_calls == len(run.accepted_per_round)
    if kind == "the target as its own draft":  # the same model proposes what it then accepts
        assert run.proposed > 0 and run.accepted == run.proposed


def test_a_sampled_round_with_a_draft_model_runs_and_draws_within_the_vocabulary(target, draft, prompt_ids):
    run = rs.speculative_generate(target, prompt_ids, 6, drafters.DraftModel(draft), gamma=2, temperature=1.0,
                                  seed=0)
    assert len(run.new_token_ids) == 6 and all(0 <= t < len(target.tokenizer) for t in run.new_token_ids)


def test_a_sliding_window_models_cache_can_be_cut_back_past_its_window(target, prompt_ids):
    cache = drafters.rollback_cache(target)
    if target.model.config.model_type not in SLIDING:
        assert cache is None  # forward makes its own cache, as before
        return
    _, cache = runtime.forward(target, prompt_ids, cache)
    length = prompt_ids.shape[1]
    runtime.verify(target, cache, prompt_ids[:, -1:], prompt_ids[:, :3])
    runtime.crop(cache, length + 1)
    assert runtime.cache_length(cache) == length + 1


def test_lab07s_step_timings_run_on_each_architecture(target, draft, prompt_ids):
    """The verify pass and the draft step lab 07 times: each crops a cache (past the window for a sliding model)."""
    assert rs.decode_step_s(target, prompt_ids, n_tokens=3, repeats=1) > 0
    assert rs.draft_step_s(target, prompt_ids, drafters.DraftModel(draft), repeats=1) > 0


# ---------------------------------------------------------------------------------------------------------------
# A draft with another vocabulary is refused before any pass


@pytest.fixture(scope="module")
def renamed_tokenizer(tokenizer):
    """The embedded vocabulary with token id 100 renamed (a word-level tokenizer over the same ids)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = dict(tokenizer.get_vocab())
    original = next(token for token, index in vocab.items() if index == 100)
    del vocab[original]
    vocab["<renamed>"] = 100
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<|endoftext|>"), original


def count_passes():
    """A global forward hook counting every module call; remove it with the returned handle."""
    calls = []
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *_: calls.append(1))
    return calls, handle


def test_a_draft_with_another_vocabulary_is_refused_before_running_naming_the_first_token(renamed_tokenizer,
                                                                                           tokenizer):
    renamed, original = renamed_tokenizer
    target = build("qwen2", tokenizer, seed=0)
    draft = build("qwen2", tokenizer, seed=1)
    draft.tokenizer = renamed
    prompt_ids = target.text_ids(PROMPT)
    calls, handle = count_passes()
    try:
        with pytest.raises(ValueError, match=rf"draft must share the target's tokenizer.*token id 100 is "
                                             rf"'<renamed>' where the target's is {original!r}"):
            rs.speculative_generate(target, prompt_ids, 4, drafters.DraftModel(draft), gamma=2)
    finally:
        handle.remove()
    assert calls == []  # refused before a single pass


def test_a_bare_draft_module_is_checked_by_its_vocabulary_size(tokenizer):
    from transformers import AutoModelForCausalLM

    target = build("llama", tokenizer, seed=0)
    torch.manual_seed(1)
    narrow = AutoModelForCausalLM.from_config(tiny_config("llama", 1000)).eval()
    prompt_ids = target.text_ids(PROMPT)
    with pytest.raises(ValueError, match="target's vocabulary size, config.vocab_size 49,152.*got 1,000"):
        rs.speculative_generate(target, prompt_ids, 4, drafters.DraftModel(narrow), gamma=2)
    torch.manual_seed(1)
    same = AutoModelForCausalLM.from_config(tiny_config("llama", len(tokenizer))).eval()
    drafters.check_same_vocabulary(target, same)  # the same size: accepted
    drafters.check_same_vocabulary(target, build("phi3", tokenizer, seed=2))  # any architecture, same tokenizer


# ---------------------------------------------------------------------------------------------------------------
# The two explorers' builders on a base model of another architecture


def test_the_sampling_and_outlier_explorers_open_on_a_base_model_of_another_architecture(tokenizer):
    pytest.importorskip("ipywidgets")
    lm = build("phi3", tokenizer, seed=0)
    sampler = sampling_explorer.sampling_explorer(lm, prompt=PROMPT, n_show=5)
    assert sampler.mode.value == "raw text"  # a base model reads raw text: no chat template to apply
    assert sampler.scores.top_ids == next_token_scores(lm, PROMPT, chat=False, n_show=5).top_ids
    visualizer = outlier_explorer.outlier_explorer(lm, prompt=PROMPT)
    assert visualizer.layer.max == 1 and visualizer.layer.value == 1  # the default layer 15 held to the last
    assert visualizer.view.tensor.layer == 1


# ---------------------------------------------------------------------------------------------------------------
# Lab 06's measurements: batching, decode steps at two contexts, the step profile, the roofline's bytes


def test_lab06s_measurements_run_on_each_architecture(target, prompt_ids):
    from labkit.core.roofline import step_cost
    from labkit.runtime import sweeps
    from labkit.runtime.step_profile import profile_decode

    prompts = prompt_ids.repeat(2, 1)  # [2, prompt_len]: two copies of one prompt, one length
    points = sweeps.batching_sweep(target, prompts, (1, 2), 3, repeats=1, threads=1)
    assert [p.batch_size for p in points] == [1, 2] and all(p.same_as_alone for p in points)
    long_ids = target.text_ids(LONG_TEXT)[:, :40]
    sweep = sweeps.decode_sweep(target, long_ids, [(1, 12), (2, 24)], steps=2, warmup=1, threads=1)
    assert [(p.batch_size, p.context_len) for p in sweep.points] == [(1, 12), (2, 24)]
    assert all(len(p.step_s) == 2 and min(p.step_s) > 0 for p in sweep.points)
    # each timed step starts after the warm-up step: one more cached token than the point's context, then two
    assert sweep.point(2, 24).step_contexts == (25, 26)
    profile = profile_decode(target, prompt_ids, steps=2, threads=1)
    assert profile.matmul_s > 0 and profile.other_s > 0
    # the roofline's decode bytes from the spec against the module's own weights (all but the input embedding, of
    # which a step reads one row): the spec counts Llama's matrices and norms, and the biases and norms of the other
    # families differ by under 1 % at this size (GPT-NeoX most: 0.5 %), less on a real model's wider matrices
    module = target.model
    read = sum(p.numel() * 4 for p in module.parameters()) - module.get_input_embeddings().weight.numel() * 4
    assert step_cost(target.spec, 1, 8).weight_bytes == pytest.approx(read, rel=0.01)
