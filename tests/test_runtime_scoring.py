"""labkit.runtime.scoring: a long text scored in windows (lab 02), one prompt's next-token scores (lab 01's
sampling explorer reads them)."""

import math

import pytest
import torch

from labkit.core.loss import align_next_token, token_surprisal
from labkit.runtime import full_logits
from labkit.runtime.scoring import next_token_scores, score_text


def test_next_token_scores_validates():
    lm = object()  # the arguments are checked before the model is touched
    with pytest.raises(ValueError, match="prompt"):
        next_token_scores(lm, "")
    with pytest.raises(ValueError, match="n_show"):
        next_token_scores(lm, "hi", n_show=0)


def test_next_token_scores_on_the_real_model(embedded):
    scores = next_token_scores(embedded, "Give me a name for a cat.", n_show=5)
    assert len(scores.top_texts) == 5 and scores.next_token_logits.shape == (embedded.spec.vocab,)
    assert torch.equal(scores.input_ids, embedded.chat_ids("Give me a name for a cat."))


def test_windowed_scores_match_one_full_pass(embedded):
    text = "Rinse the lentils, then warm the oil and soften the onion for ten minutes."
    token_ids = embedded.text_ids(text)[0]  # [seq_len]
    full = token_surprisal(*align_next_token(full_logits(embedded, token_ids[None])[0], token_ids))
    # A window as long as the text is exactly one full pass; shorter windows see less context.
    whole = score_text(embedded, token_ids, window=len(token_ids), progress=False, temperatures=(1.0, 2.0),
                       truncations={"top-k 1": dict(top_k=1)})
    assert torch.allclose(whole.surprisal_nats[1:], full, atol=1e-4)
    assert torch.allclose(whole.surprisal_at[1.0], whole.surprisal_nats, equal_nan=True)
    assert math.isnan(whole.surprisal_nats[0]) and whole.rank[0] == -1
    # top-k 1 keeps only the model's first choice: every other target becomes impossible.
    cut = whole.truncated_log_probs["top-k 1"][1:] == -math.inf
    assert torch.equal(cut, whole.rank[1:] > 0)
    windowed = score_text(embedded, token_ids, window=6, stride=3, progress=False)
    assert windowed.surprisal_nats[1:6].tolist() == pytest.approx(full[:5].tolist(), abs=1e-4)
    # two passes of different lengths: they agree within float32 rounding (as the surprisals above), not bit for bit
    assert whole.perplexity() == pytest.approx(math.exp(full.double().mean().item()), rel=1e-4)
