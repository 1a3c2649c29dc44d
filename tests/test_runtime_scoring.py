"""labkit.runtime.scoring: one prompt's next-token scores (lab 01's sampling explorer reads them)."""

import pytest
import torch

from labkit.runtime.scoring import next_token_scores


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
