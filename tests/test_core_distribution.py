"""labkit.core.distribution: what the filters left (tokens kept, their mass), entropy, and a greedy choice's margin."""

import math

import pytest
import torch

from labkit.core.course import lesson_logits
from labkit.core.distribution import CLEAR_MARGIN, choice_margin, entropy_bits, kept_count, kept_mass
from labkit.core.sampling import sampling_probs, top_k_filter, top_p_filter

# The lesson's four-token vocabulary A, B, C, D with logits log 8, log 4, log 2, log 1.
LESSON = lesson_logits(torch.float64)


def test_what_the_lessons_filters_keep():
    assert kept_count(top_p_filter(LESSON, 0.75)).item() == 2
    assert kept_mass(LESSON, top_p_filter(LESSON, 0.75)).item() == pytest.approx(0.8, abs=1e-12)  # 12 / 15
    assert kept_count(top_k_filter(LESSON, 3)).item() == 3
    assert kept_mass(LESSON, top_k_filter(LESSON, 3)).item() == pytest.approx(14 / 15, abs=1e-12)
    assert kept_mass(LESSON, LESSON).item() == pytest.approx(1.0, abs=1e-12)


def test_kept_counts_and_mass_are_per_row():
    rows = torch.stack([LESSON, LESSON.flip(0)])
    filtered = top_k_filter(rows, 1)
    assert kept_count(filtered).tolist() == [1, 1]
    assert kept_mass(rows, filtered).tolist() == pytest.approx([8 / 15, 8 / 15], abs=1e-12)


def test_entropy_in_bits():
    assert entropy_bits(torch.tensor([0.25] * 4)).item() == pytest.approx(2.0)
    assert entropy_bits(sampling_probs(LESSON, temperature=0)).item() == 0.0
    expected = -sum(p * math.log2(p) for p in (8 / 15, 4 / 15, 2 / 15, 1 / 15))
    assert entropy_bits(sampling_probs(LESSON)).item() == pytest.approx(expected, abs=1e-12)


def test_choice_margin_is_the_lead_over_the_best_other_token():
    logits = torch.tensor([[1.0, 3.0, 2.5], [4.0, 4.0, 0.0], [0.0, 1.0, 5.0]])
    margins = choice_margin(logits, torch.tensor([1, 0, 0]))
    assert margins.tolist() == [0.5, 0.0, -5.0]  # a unique argmax, a tie, another token ahead
    assert choice_margin(LESSON, torch.tensor(0)).item() == pytest.approx(math.log(2), abs=1e-12)
    assert 0 < CLEAR_MARGIN < 1


@pytest.mark.parametrize("token_ids", [torch.tensor([0, 1]), torch.tensor([[0]])])
def test_choice_margin_names_a_wrong_shape(token_ids):
    with pytest.raises(ValueError, match="token_ids"):
        choice_margin(torch.zeros(3, 4), token_ids)
