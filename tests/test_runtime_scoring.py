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


def _small_score():
    from labkit.core.loss import TextScore

    token_ids = torch.tensor([5, 6, 7, 8])
    surprisal = torch.tensor([math.nan, 1.5, 0.25, 3.0])
    truncated = {"top-k 50": torch.tensor([math.nan, -1.0, -math.inf, -2.0])}
    return TextScore(token_ids, surprisal, torch.tensor([math.nan, 2.0, 1.0, 4.0]), torch.tensor([-1, 0, 3, 1]),
                     {0.5: surprisal * 2, 1.5: surprisal / 2}, truncated, window=4, stride=2)


def test_kept_scores_read_back_bit_for_bit_and_only_for_their_tokens(tmp_path):
    from labkit.runtime.scoring import _load_scores, _save_scores

    scores, path = _small_score(), tmp_path / "scores" / "eval_text-test.pt"
    assert _load_scores(path, scores.token_ids) is None  # nothing kept yet
    _save_scores(path, scores)
    back = _load_scores(path, scores.token_ids)
    for name in ("token_ids", "surprisal_nats", "entropy_nats", "rank"):
        assert torch.equal(getattr(back, name).nan_to_num(), getattr(scores, name).nan_to_num())
    assert back.surprisal_at.keys() == scores.surprisal_at.keys() and (back.window, back.stride) == (4, 2)
    kept, original = back.truncated_log_probs["top-k 50"], scores.truncated_log_probs["top-k 50"]
    assert torch.equal(kept.nan_to_num(), original.nan_to_num())
    assert _load_scores(path, torch.tensor([5, 6, 7, 9])) is None  # another text: scored afresh
    path.write_bytes(b"not a torch file")
    assert _load_scores(path, scores.token_ids) is None  # a damaged file is ignored
    assert list(path.parent.glob("*.tmp")) == []  # the temporary file was renamed, not left behind


def test_the_scores_key_follows_the_settings_and_needs_a_verified_cache(embedded, monkeypatch):
    from types import SimpleNamespace

    from labkit.runtime import scoring

    token_ids = torch.tensor([1, 2, 3])
    key = scoring._scores_key(embedded, token_ids)
    if key is None:
        pytest.skip(f"the embedded model was not loaded from its verified cache (origin {embedded.origin!r})")
    assert scoring._scores_key(embedded, token_ids) == key
    assert scoring._scores_key(embedded, torch.tensor([1, 2, 4])) != key
    monkeypatch.setattr(scoring, "STRIDE", scoring.STRIDE // 2)
    assert scoring._scores_key(embedded, token_ids) != key
    assert scoring._scores_key(SimpleNamespace(source=embedded.source, origin="hub"), token_ids) is None


def test_the_eval_text_is_cut_and_scored_by_the_model_it_is_given():
    from toys import tiny_llama, tiny_tokenizer

    from labkit.core.loss import scored_spans
    from labkit.core.spec import ModelSpec
    from labkit.core.texts import load_eval_text
    from labkit.runtime.models import LoadedModel
    from labkit.runtime.scoring import eval_text_scores
    from labkit.runtime.sources import ModelSource

    module, tokenizer = tiny_llama(max_position_embeddings=256), tiny_tokenizer()
    source = ModelSource(name="tiny", title="tiny", kind="hub", source="built in the test", revision="none",
                         license="none", chat=False)
    lm = LoadedModel("tiny", module, tokenizer, ModelSpec.from_config(module.config, name="tiny", n_params=0),
                     source, 0.0, "hub")
    corpus, scores = eval_text_scores(lm)
    # the word-level tokenizer's ids, section by section: the first section's first words, its span's length
    story = load_eval_text()[0].text
    assert corpus.token_ids[:5].tolist() == tokenizer(story, add_special_tokens=False)["input_ids"][:5]
    assert corpus.spans["story"] == (0, len(tokenizer(story + "\n\n", add_special_tokens=False)["input_ids"]))
    assert torch.equal(scores.token_ids, corpus.token_ids) and scored_spans(corpus, scores) == corpus.spans
    assert (scores.window, scores.stride) == (256, 128)  # cut to the model's 256-token context, stride half
    # the first window's tokens against transformers' own loss on them
    first = corpus.token_ids[:256].unsqueeze(0)
    with torch.inference_mode():
        transformers_loss = module(first, labels=first).loss.item()
    assert scores.mean_nll(1, 256) == pytest.approx(transformers_loss, rel=1e-5)
