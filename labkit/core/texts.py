"""The evaluation text written for this project (``data/eval_text.md``): its genre sections, and their tokens.

The file is Markdown: a comment block and a title, then one ``## <genre>: <title>`` heading per section. A
section's text is the body under its heading. Tokenizing section by section keeps exact token spans per genre;
the concatenated ids are what the model reads, so each section is predicted with the sections before it as
context (the lab's windows permitting).

Used by lab 02 (perplexity per genre) and lab 04 (what quantization does to perplexity).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from labkit.core.resources import data_path

EVAL_TEXT = "eval_text.md"
SEPARATOR = "\n\n"  # appended to every section but the last, so sections read as paragraphs
_HEADING = re.compile(r"^## (?P<genre>[a-z]+): (?P<title>.+)$")


@dataclass(frozen=True)
class Section:
    genre: str  # one word, e.g. "story", "code"
    title: str
    text: str


def parse_sections(markdown: str) -> tuple[Section, ...]:
    """Split the evaluation text's Markdown into sections (everything before the first heading is skipped).

    >>> parse_sections("# Title\\n\\n## poem: Frost\\n\\nCold.\\n\\n## code: Hi\\nprint(1)\\n")
    (Section(genre='poem', title='Frost', text='Cold.'), Section(genre='code', title='Hi', text='print(1)'))
    """
    sections: list[Section] = []
    heading: re.Match | None = None
    body: list[str] = []
    for line in markdown.splitlines():
        match = _HEADING.match(line)
        if match:
            if heading is not None:
                sections.append(Section(heading["genre"], heading["title"], "\n".join(body).strip("\n")))
            heading, body = match, []
        elif heading is not None:
            body.append(line)
    if heading is not None:
        sections.append(Section(heading["genre"], heading["title"], "\n".join(body).strip("\n")))
    if not sections:
        raise ValueError("the text has no '## <genre>: <title>' heading, so no section")
    return tuple(sections)


def load_eval_text() -> tuple[Section, ...]:
    """The sections of the evaluation text shipped with labkit, in file order.

    >>> [section.genre for section in load_eval_text()]
    ['story', 'encyclopedia', 'recipe', 'dialogue', 'code', 'poem', 'news']
    """
    return parse_sections(data_path(EVAL_TEXT).read_text(encoding="utf-8"))


@dataclass(frozen=True)
class TokenizedText:
    """A text's token ids, with the token span of every section."""

    token_ids: torch.Tensor  # [n_tokens]
    spans: dict[str, tuple[int, int]]  # genre -> (start, end) token positions, end exclusive
    sections: tuple[Section, ...]

    @property
    def n_tokens(self) -> int:
        return int(self.token_ids.numel())


def tokenize_sections(tokenizer: Any, sections: tuple[Section, ...]) -> TokenizedText:
    """Tokenize each section (with the paragraph separator after it) and concatenate the ids."""
    pieces: list[torch.Tensor] = []
    spans: dict[str, tuple[int, int]] = {}
    start = 0
    for number, section in enumerate(sections):
        if section.genre in spans:
            raise ValueError(f"genre {section.genre!r} appears twice; genres must be unique")
        text = section.text + (SEPARATOR if number < len(sections) - 1 else "")
        ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
        pieces.append(ids)
        spans[section.genre] = (start, start + len(ids))
        start += len(ids)
    return TokenizedText(torch.cat(pieces), spans, sections)
