"""labkit.runtime.quantize on the course's perplexity costs: lab 04's stated figures, within what processors do.

A quantized model's perplexity is not float noise away from one machine's: a last-bit difference in a Linear's
input (another processor's matmul or softmax kernel) can move a value to the next step of the INT8 grid. So lab 04
checks no quantized perplexity in a notebook output; this test holds its stated figures within tolerances taken
from what another processor's kernels did to them. Measured with the foreign profile (tests/cpu_profiles.py) on
an AMD EPYC against its native kernels, over 512 tokens: the weight-only rows did not move, the activation rows
moved by 0.5 (per token) to 1.9 (per tensor) percentage points; an Intel Xeon moved per token's interval across 0.
Each tolerance is about four times the move seen.
"""

import pytest
import torch

from labkit.core.texts import load_eval_text, tokenize_sections
from labkit.core.uncertainty import comparison_word, delta_ppl_interval
from labkit.runtime.quantize import ActivationScheme, WeightScheme, quantized_model
from labkit.runtime.scoring import score_text

N_TOKENS = 512  # lab 04's window
# (weights, activations, lab 04's stated ΔPPL in %, tolerance in percentage points)
STATED = {
    "W8 per channel": (WeightScheme(8), None, 0.5, 1.0),
    "W8A8 per token": (None, ActivationScheme(8, "token"), 1.5, 2.0),
    "W8A8 per tensor": (None, ActivationScheme(8, "tensor"), 117.5, 8.0),
}


@pytest.fixture(scope="module")
def eval_ids(embedded):
    return tokenize_sections(embedded.tokenizer, load_eval_text()).token_ids[:N_TOKENS]


def _token_nll(lm, token_ids) -> torch.Tensor:
    return score_text(lm, token_ids, window=N_TOKENS, progress=False).surprisal_nats[1:]


def test_lab04_costs_hold_within_what_another_processor_moves_them(embedded, eval_ids):
    baseline = _token_nll(embedded, eval_ids)
    nll, deltas = {}, {}
    for label, (weights, activations, stated, tolerance) in STATED.items():
        with quantized_model(embedded, weights, activations) as private:
            nll[label] = _token_nll(private, eval_ids)
        deltas[label] = delta_ppl_interval(baseline, nll[label])
        assert deltas[label].estimate == pytest.approx(stated, abs=tolerance), (label, deltas[label])
    # The discrete results lab 04's checked cell prints for such rows hold by a wide margin everywhere:
    assert comparison_word(deltas["W8A8 per tensor"]) == "larger" and deltas["W8A8 per tensor"].low > 50
    # per tensor against per token, the lab's lesson: resolved by tens of points
    assert delta_ppl_interval(nll["W8A8 per token"], nll["W8A8 per tensor"]).low > 30
