"""Speculative decoding on the embedded model: plain greedy, transformers' prompt lookup, labkit's prompt lookup
and the early-exit self-draft, on the same prompts in one run, alternating, with repeats (medians and spread);
greedy outputs checked token-identical (with each prompt's smallest greedy margin, which must be far above float noise
for that check to hold on any CPU); measured alpha and c fed to the closed form beside the measured speedup
(the paper's per-step ratio, and the same applied to the whole request: the prefill both sides pay, and a verify
pass that costs more than one step on a CPU; ``labkit.core.speedup.request_speedup``);
and the simulator's update latency. Run: ``python -m benchmarks.speculative``.
"""

from __future__ import annotations

import statistics
import time

PASSAGE = ("The lighthouse keeper climbed the spiral stairs every evening to light the lamp. Ships passing the rocky "
           "coast relied on its beam, and on stormy nights he stayed awake until dawn, watching the waves.")
REPEATS = 5
N_NEW = 48


def _prompts(lm):
    return {
        "copy a passage (chat)": lm.chat_ids("Copy this text exactly:\n\n" + PASSAGE),
        "repeat a passage (raw text)": lm.text_ids(PASSAGE + "\n\n" + PASSAGE + "\n\n" + PASSAGE[:40]),
        "open question (chat)": lm.chat_ids("Why is the sky blue? Answer in two sentences."),
    }


def main() -> None:
    import torch

    from labkit.core import speedup as sp
    from labkit.core.distribution import CLEAR_MARGIN
    from labkit.runtime import drafters
    from labkit.runtime import speculative as rs
    from labkit.runtime.generation import greedy_margins
    from labkit.runtime import sweeps
    from labkit.runtime.models import load_model

    lm = load_model(progress=False)
    eos = lm.tokenizer.eos_token_id
    print(f"\nSpeculative decoding, {N_NEW} new tokens, gamma 4 (early exit: 4 blocks, gamma 2), {REPEATS} repeats, "
          "medians [min-max] in ms")
    for name, prompt in _prompts(lm).items():
        plain, _ = rs.plain_greedy(lm, prompt, N_NEW, eos)
        margin = float(greedy_margins(lm, prompt, torch.tensor([plain])).min())  # how far the closest step is from a tie
        methods = {
            "plain greedy": lambda: (*rs.plain_greedy(lm, prompt, N_NEW, eos), None),
            "transformers prompt lookup": lambda: (*rs.transformers_prompt_lookup(lm, prompt, N_NEW, 4, eos), None),
            "labkit prompt lookup": lambda: _spec(rs, lm, prompt, drafters.PromptLookup(), 4, eos),
            "early exit (4 blocks)": lambda: _spec(rs, lm, prompt, drafters.EarlyExit(4), 2, eos),
        }
        times = {method: [] for method in methods}
        runs = {}
        for repeat in range(REPEATS):
            order = list(methods) if repeat % 2 == 0 else list(reversed(methods))
            for method in order:
                tokens, seconds, run = methods[method]()
                assert tokens == plain, f"{method} differs from plain greedy on {name!r}"
                times[method].append(seconds)
                runs[method] = run
        base = statistics.median(times["plain greedy"])
        step_s, verify5_s = rs.decode_step_s(lm, prompt, 1), rs.decode_step_s(lm, prompt, 5)
        prefill_s = sweeps.prefill_sweep(lm, prompt, (prompt.shape[1],), repeats=3)[0][1]
        print(f"\n{name}: {len(plain)} tokens, identical outputs (smallest greedy margin {margin:.3f}, "
              f"{margin / CLEAR_MARGIN:.0f}x CLEAR_MARGIN); prefill {prefill_s*1e3:.1f} ms, decode step "
              f"{step_s*1e3:.1f} ms, verify of 5 {verify5_s*1e3:.1f} ms")
        for method, values in times.items():
            median = statistics.median(values)
            line = (f"  {method:28s} {median*1e3:8.1f} [{min(values)*1e3:7.1f}-{max(values)*1e3:7.1f}]  "
                    f"speedup {base/median:5.2f}x")
            run = runs[method]
            if run is not None:
                drafter = drafters.PromptLookup() if "lookup" in method else drafters.EarlyExit(4)
                cost = rs.draft_step_s(lm, prompt, drafter) / step_s
                predicted = sp.walltime_improvement(run.alpha, run.gamma, cost)
                # A verify pass scores the drafts actually proposed plus one: measured at the run's mean length.
                verify_ratio = rs.decode_step_s(lm, prompt, round(run.mean_draft_length) + 1) / step_s
                whole = sp.request_speedup(run.alpha, run.gamma, cost, len(plain), verify_ratio=verify_ratio,
                                           prefill_ratio=prefill_s / step_s)
                line += (f"  alpha {run.alpha:.3f} c {cost:.3f} tokens/call {run.tokens_per_call:.2f}  predicted: "
                         f"paper {predicted:.2f}x, whole request {whole:.2f}x "
                         f"({(base / median) / whole - 1:+.0%} measured vs whole)")
            print(line)

    from labkit.explorers.speculative import SpeculativeExplorer

    explorer = SpeculativeExplorer()
    latencies = []
    for value in [0.1, 0.3, 0.5, 0.7, 0.9] * 6:
        started = time.perf_counter()
        explorer.alpha.value = value
        latencies.append(time.perf_counter() - started)
    latencies.sort()
    print(f"\nsimulator update: p50 {latencies[len(latencies)//2]*1e3:.1f} ms, "
          f"p95 {latencies[int(len(latencies)*0.95)]*1e3:.1f} ms over {len(latencies)} slider moves")


def _spec(rs, lm, prompt, drafter, gamma, eos):
    run = rs.speculative_generate(lm, prompt, N_NEW, drafter, gamma=gamma, eos_token_id=eos)
    return run.new_token_ids, run.total_s, run


if __name__ == "__main__":
    main()
