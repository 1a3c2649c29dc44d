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


# The tiny Llama the runtime, memory and spec tests build: 2 layers, 4 query heads sharing 2 KV heads of width 16.
TINY_LLAMA = dict(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16)


def tiny_llama_config(**overrides):
    """A transformers LlamaConfig of :data:`TINY_LLAMA`, with any field overridden."""
    from transformers import LlamaConfig

    return LlamaConfig(**{**TINY_LLAMA, **overrides})


def tiny_llama(seed=0, **overrides):
    """A random tiny LlamaForCausalLM in eval mode (weights drawn after ``torch.manual_seed(seed)``)."""
    from transformers import LlamaForCausalLM

    config = tiny_llama_config(**overrides)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


WORDS = ["<unk>", "<|endoftext|>", "the", "cat", "sat", "on", "mat"]


def tiny_tokenizer():
    """A whitespace word-level tokenizer over :data:`WORDS` ("the cat sat" -> [2, 3, 4])."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({word: i for i, word in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<|endoftext|>")


def shape_of(lm):
    """(n_layers, n_kv_heads, head_dim, vocab) of a LoadedModel or a bare transformers module."""
    from labkit import runtime

    config = runtime.module_of(lm).config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers, config.num_key_value_heads, head_dim, config.vocab_size


def random_token_ids(lm, batch_size, seq_len, seed=0):
    """Token ids drawn uniformly from the model's vocabulary: ``[batch_size, seq_len]``."""
    vocab = shape_of(lm)[3]
    return torch.randint(0, vocab, (batch_size, seq_len), generator=torch.Generator().manual_seed(seed))
