"""labkit.core.loss: hand cases, properties, and agreement with torch and transformers."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.core.course import lesson_logits
from labkit.core.loss import (align_next_token, cross_entropy, perplexity, perplexity_from_nll, score_windows,
                         token_surprisal, truncated_log_probs)
from labkit.runtime import full_logits
from labkit.core.sampling import sampling_probs

LOG_8421 = lesson_logits(torch.float64)


# --- hand-computed cases --------------------------------------------------------------------------------------

def test_uniform_guess_costs_log_vocab():
    logits, targets = torch.zeros(5, 8), torch.tensor([0, 1, 2, 3, 7])
    assert cross_entropy(logits, targets).item() == pytest.approx(math.log(8))
    assert cross_entropy(logits, targets, unit="bits").item() == pytest.approx(3.0)
    assert perplexity(logits, targets).item() == pytest.approx(8.0)


def test_the_lesson_distribution():
    # p = (8, 4, 2, 1) / 15: surprisal of the last token is log2 15 bits.
    surprisal = token_surprisal(LOG_8421.repeat(4, 1), torch.tensor([0, 1, 2, 3]), unit="bits")
    assert surprisal.tolist() == pytest.approx([math.log2(15 / 8), math.log2(15 / 4), math.log2(15 / 2), math.log2(15)])
    # Perplexity is the geometric mean of 1/p: (15/8 * 15/4 * 15/2 * 15) ** (1/4).
    expected = (15 / 8 * 15 / 4 * 15 / 2 * 15) ** 0.25
    assert perplexity(LOG_8421.repeat(4, 1), torch.tensor([0, 1, 2, 3])).item() == pytest.approx(expected)


def test_perplexity_from_nll_in_both_units():
    assert perplexity_from_nll(1.0) == pytest.approx(math.e)
    assert perplexity_from_nll(3.0, unit="bits") == 8.0
    assert perplexity_from_nll(torch.tensor(math.log(5.0))).item() == pytest.approx(5.0)


def test_large_logits_do_not_overflow():
    logits = torch.tensor([[1000.0, 999.0], [-1000.0, 1000.0]])
    assert torch.isfinite(cross_entropy(logits, torch.tensor([1, 0])))


def test_alignment_shifts_targets_by_one():
    logits = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    shifted_logits, targets = align_next_token(logits, ids)
    assert torch.equal(shifted_logits, logits[:, :-1]) and torch.equal(targets, ids[:, 1:])


@pytest.mark.parametrize("bad, error", [
    (dict(logits=torch.zeros(3), targets=torch.tensor(0)), ValueError),
    (dict(logits=torch.zeros(3, 4), targets=torch.tensor([0, 1])), ValueError),
    (dict(logits=torch.zeros(2, 4), targets=torch.tensor([0, 4])), ValueError),
    (dict(logits=torch.zeros(2, 4), targets=torch.tensor([0.0, 1.0])), TypeError),
    (dict(logits=torch.zeros(2, 4, dtype=torch.long), targets=torch.tensor([0, 1])), TypeError),
    (dict(logits=torch.zeros(0, 4), targets=torch.zeros(0, dtype=torch.long)), ValueError),
    (dict(logits=torch.zeros(2, 4), targets=torch.tensor([0, 1]), unit="decibans"), ValueError),
])
def test_bad_arguments_are_named(bad, error):
    with pytest.raises(error):
        cross_entropy(**bad)


# --- properties -------------------------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(seq_len=st.integers(1, 10), vocab=st.integers(2, 30), scale=st.floats(0.1, 20), seed=st.integers(0, 2**16))
def test_agrees_with_torch_and_is_bounded(seq_len, vocab, scale, seed):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(seq_len, vocab, generator=generator, dtype=torch.float64) * scale
    targets = torch.randint(0, vocab, (seq_len,), generator=generator)
    loss = cross_entropy(logits, targets)
    assert torch.allclose(loss, F.cross_entropy(logits, targets))
    assert loss >= 0
    # Perplexity is at least 1 and the bits/nats conversion is exact.
    assert perplexity(logits, targets) >= 1 - 1e-12
    assert torch.allclose(cross_entropy(logits, targets, unit="bits") * math.log(2), loss)


@settings(max_examples=30, deadline=None)
@given(n_tokens=st.integers(2, 60), window=st.integers(1, 20), data=st.data())
def test_windows_score_every_token_once_within_the_window(n_tokens, window, data):
    stride = data.draw(st.integers(1, window))
    windows = score_windows(n_tokens, window, stride)
    scored = [t for w in windows for t in range(w.targets_start, w.input_end + 1)]
    assert scored == list(range(1, n_tokens))
    for w in windows:
        assert 0 <= w.input_start < w.targets_start <= w.input_end < n_tokens
        assert w.input_end - w.input_start <= window
        assert w.context >= min(w.targets_start, window - stride + 1)


def test_window_arguments_are_validated():
    for bad in [dict(n_tokens=1), dict(n_tokens=10, window=0), dict(n_tokens=10, window=4, stride=5)]:
        with pytest.raises(ValueError):
            score_windows(**bad)


# --- truncation: a cut token has probability 0 ------------------------------------------------------------------

def test_truncated_log_probs_follow_sampling_probs():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=generator) * 3
    targets = torch.randint(0, 50, (6,), generator=generator)
    for setting in [dict(top_k=5), dict(top_p=0.8), dict(min_p=0.1), dict(temperature=0.7, top_p=0.9),
                    dict(temperature=0.0)]:
        expected = sampling_probs(logits, **setting).gather(-1, targets[:, None])[:, 0]
        got = truncated_log_probs(logits, targets, **setting).exp()
        assert torch.allclose(got, expected, atol=1e-6), setting
    assert truncated_log_probs(LOG_8421[None], torch.tensor([3]), top_p=0.75).item() == -math.inf
    assert truncated_log_probs(LOG_8421[None], torch.tensor([1]), top_p=0.75).item() == pytest.approx(math.log(4 / 12))


# --- the embedded model ----------------------------------------------------------------------------------------

def test_agrees_with_the_loss_transformers_returns(embedded):
    token_ids = embedded.text_ids("The tide comes in twice a day, pulled by the Moon.")  # [1, seq_len]
    with torch.inference_mode():
        # transformers' own shift-and-average, the independent check
        reference = embedded.model(token_ids, labels=token_ids).loss
    loss = cross_entropy(*align_next_token(full_logits(embedded, token_ids), token_ids))
    assert loss.item() == pytest.approx(reference.item(), rel=1e-5)


def test_scored_spans_refuses_another_tokenizers_scores():
    from types import SimpleNamespace

    from labkit.core.loss import TextScore, scored_spans

    corpus = SimpleNamespace(token_ids=torch.tensor([5, 6, 7, 8]), spans={"poem": (0, 2), "code": (2, 4)})

    def scored(token_ids):
        n_tokens = len(token_ids)
        return TextScore(torch.tensor(token_ids), torch.zeros(n_tokens), torch.zeros(n_tokens),
                         torch.zeros(n_tokens, dtype=torch.long))

    assert scored_spans(corpus, scored([5, 6, 7, 8])) == {"poem": (0, 2), "code": (2, 4)}
    # the same text cut by another tokenizer: other ids at the same positions, or more of them
    with pytest.raises(ValueError) as other_ids:
        scored_spans(corpus, scored([5, 6, 9, 8]))
    assert str(other_ids.value).startswith("scores must have scored corpus's own tokens (scores.token_ids equal to "
                                           "corpus.token_ids")
    assert str(other_ids.value).endswith("got 4 token ids against corpus's 4, the first different at position 2 "
                                         "(scores 9, corpus 7)")
    with pytest.raises(ValueError, match="got 5 token ids against corpus's 4, the first 4 alike"):
        scored_spans(corpus, scored([5, 6, 7, 8, 3]))
