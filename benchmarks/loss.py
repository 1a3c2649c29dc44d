"""Lab 02's costs: tokens per second of perplexity scoring (by window size), and generation with and without
the KV cache. Medians over a few runs on this machine; ratios against a reference measured in the same run."""

from __future__ import annotations

import statistics
import time

import torch


def _timed_s(work, runs: int) -> list[float]:
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        seconds.append(time.perf_counter() - started)
    return seconds


def _row(label: str, n_tokens: int, seconds: list[float], reference_s: float) -> str:
    median = statistics.median(seconds)
    return (f"{label:<34} {n_tokens / median:>9.1f} {median:>8.2f} {min(seconds):>7.2f} {max(seconds):>7.2f} "
            f"{reference_s / median:>6.2f}x")


def main(runs: int = 3, n_score_tokens: int = 1024, n_new_tokens: int = 32) -> None:
    from labkit.runtime.generation import generate
    from labkit.runtime.scoring import score_text
    from labkit.runtime.models import load_model
    from labkit.core.texts import load_eval_text, tokenize_sections

    lm = load_model(progress=False)
    token_ids = tokenize_sections(lm.tokenizer, load_eval_text()).token_ids[:n_score_tokens]
    header = f"{'':<34} {'tokens/s':>9} {'median s':>8} {'min':>7} {'max':>7} {'ratio':>7}"
    print(f"threads: {torch.get_num_threads()}; runs: {runs}; warm-up pass excluded")
    score_text(lm, token_ids[:64], window=64, progress=False)  # warm-up: first-call allocations

    print(f"\nscoring {len(token_ids)} tokens of the evaluation text (ratio: against window 512, stride 512; "
          "perplexity: the layout's own, lower where more tokens see a longer context)")
    print(header + f" {'perplexity':>10}")
    settings = [(512, 512), (256, 256), (512, 256), (1024, 1024)]
    scored = {}

    def score(setting):
        scored[setting] = score_text(lm, token_ids, window=setting[0], stride=setting[1], progress=False)

    results = {s: _timed_s(lambda s=s: score(s), runs) for s in settings}
    reference = statistics.median(results[(512, 512)])
    for (window, stride), seconds in results.items():
        print(_row(f"window {window}, stride {stride}", len(token_ids) - 1, seconds, reference)
              + f" {scored[(window, stride)].perplexity():>10.2f}")

    prompt = lm.chat_ids("Describe a lighthouse at night.")
    print(f"\ngreedy generation of {n_new_tokens} tokens after a {prompt.shape[1]}-token prompt "
          "(ratio: against the cached loop)")
    print(header)
    def transformers_greedy():
        with torch.inference_mode():
            lm.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                              max_new_tokens=n_new_tokens, min_new_tokens=n_new_tokens,
                              pad_token_id=lm.tokenizer.eos_token_id)

    # Interleaved rounds: a burst of load from elsewhere on the machine hits all three alike.
    cached, uncached, hf = [], [], []
    for _ in range(runs):
        cached += _timed_s(lambda: generate(lm, prompt, n_new_tokens), 1)
        uncached += _timed_s(lambda: generate(lm, prompt, n_new_tokens, use_cache=False), 1)
        hf += _timed_s(transformers_greedy, 1)
    reference = statistics.median(cached)
    print(_row("labkit generate, KV cache", n_new_tokens, cached, reference))
    print(_row("labkit generate, no cache", n_new_tokens, uncached, reference))
    print(_row("transformers generate (greedy)", n_new_tokens, hf, reference))


if __name__ == "__main__":
    main()
