"""labkit.core.texts: the evaluation text's sections, parsed and tokenized."""

import pytest

from labkit.core.resources import data_path
from labkit.core.texts import load_eval_text, parse_sections, tokenize_sections


def test_sections_parse_and_skip_the_header():
    sections = parse_sections("<!-- note -->\n# T\n\n## story: A\n\nOne.\n\nTwo.\n\n## code: B\nx = 1\n")
    assert [(s.genre, s.title, s.text) for s in sections] == [("story", "A", "One.\n\nTwo."), ("code", "B", "x = 1")]
    with pytest.raises(ValueError):
        parse_sections("no headings")


def test_eval_text_has_seven_genres_and_over_2000_tokens(embedded):
    text = tokenize_sections(embedded.tokenizer, load_eval_text())
    assert len(text.spans) >= 7 and text.n_tokens >= 2000
    starts_ends = list(text.spans.values())
    assert starts_ends[0][0] == 0 and starts_ends[-1][1] == text.n_tokens
    assert all(a[1] == b[0] for a, b in zip(starts_ends, starts_ends[1:]))  # contiguous, no gap
    assert "written for this project" in data_path("eval_text.md").read_text(encoding="utf-8").lower()
