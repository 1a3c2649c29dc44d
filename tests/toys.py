"""Tiny stand-in models the tests share (no weights to load)."""

import torch


class Bigram(torch.nn.Module):
    """A causal LM with a transformers-style forward that keeps no cache: token i is followed by i + 1 (mod 3)."""

    def __init__(self):
        super().__init__()
        self.table = torch.tensor([[0.0, 5.0, 0.0], [0.0, 0.0, 5.0], [5.0, 0.0, 0.0]])  # logits of the next token

    def forward(self, input_ids, use_cache=False, past_key_values=None):
        class Output(dict):
            pass

        output = Output(past_key_values=None)
        output.logits = self.table[input_ids]  # [batch, seq_len, 3]
        return output
