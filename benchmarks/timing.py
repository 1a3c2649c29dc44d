"""Lab 06's measurements at full length: this machine's roofline, labkit's decode loop against the floor it implies
and against transformers' ``generate``, the calibrated latency model held to its target, the thread sweep, and the
latency explorer's update time.

Printed, in one run at one held thread count: the read-bandwidth and matmul probes (``torch.utils.benchmark``),
labkit's TTFT/TPOT and transformers' (same prompt, same greedy tokens with their smallest margin, timed
alternately so a busy machine slows both alike), the decode floor = bytes per token / measured bandwidth, and the
ratios labkit / floor and labkit / transformers; then the lab's latency model fitted again and again on the
notebook's points (decode at 16 and 1,024 cached tokens, batches 1 and 3), each coefficient's spread over the
repeats beside the fit's own standard error, and predicted / measured decode steps at points it was not fitted on
(docs/DESIGN.md's target: within +-25 %); then prefill and decode step against the thread count; then the explorer's
p50/p95 update. Never asserts on time. Run: ``python -m benchmarks timing``.
"""

from __future__ import annotations

import statistics
import time

import torch

PROMPT = ("The lighthouse keeper climbed the spiral stairs every evening to light the lamp. Ships passing the rocky "
          "coast relied on its beam.")
NEW_TOKENS = 32
REPEATS = 5
# The latency model: fitted on the notebook's points, held to account at others (interpolated, then beyond the fit).
FITTED = [(batch_size, context) for context in (16, 1024) for batch_size in (1, 3)]  # as the notebook
HELD_OUT = [(2, 640), (2, 64), (4, 1536), (6, 128)]
MODEL_REPEATS = 3


def _decode_comparison(lm, threads: int) -> None:
    from labkit.core import roofline
    from labkit.runtime import probes
    from labkit.runtime import timing as measure

    ids = lm.text_ids(PROMPT)
    roof = probes.roofline_probe(threads=threads)
    decode = roofline.step_cost(lm.spec, 1, context_len=ids.shape[1] + NEW_TOKENS // 2)
    floor_s = roofline.decode_floor_s(decode.bytes, roof.bandwidth_bytes_per_s)
    print(f"threads {threads}; read bandwidth {roof.bandwidth_bytes_per_s / 1e9:.1f} GB/s "
          f"({roof.bandwidth.what}, IQR {roof.bandwidth.iqr_s / roof.bandwidth.median_s:.0%} of the median); "
          f"matmul {roof.peak_flops_per_s / 1e9:.1f} GFLOP/s; ridge {roof.ridge:.1f} FLOPs/byte")

    ours, theirs, same = [], [], True
    measure.timed_generation(lm, ids, 4, threads=threads)  # warm-up of both loops
    measure.transformers_generation(lm, ids, 4, threads=threads)
    for run in range(REPEATS):
        order = (0, 1) if run % 2 == 0 else (1, 0)
        for which in order:
            if which == 0:
                timed = measure.timed_generation(lm, ids, NEW_TOKENS, threads=threads)
                ours.append(timed.metrics)
                labkit_ids = timed.new_token_ids
            else:
                metrics, hf_ids = measure.transformers_generation(lm, ids, NEW_TOKENS, threads=threads)
                theirs.append(metrics)
        same = same and torch.equal(labkit_ids, hf_ids)
    from labkit.runtime.generation import greedy_margins

    margin = float(greedy_margins(lm, ids, labkit_ids).min())  # two loops agree only where no step is a near-tie
    ours_tpot = statistics.median(m.tpot_s for m in ours)
    theirs_tpot = statistics.median(m.tpot_s for m in theirs)
    print(f"{NEW_TOKENS} new tokens after a {ids.shape[1]}-token prompt, medians of {REPEATS} alternating runs "
          f"(greedy tokens identical: {same}; smallest margin {margin:.3f})")
    print(f"{'':<24} {'TTFT ms':>9} {'TPOT ms':>9} {'tokens/s':>9} {'/ floor':>8}")
    for label, runs, tpot in [("labkit generate", ours, ours_tpot), ("transformers generate", theirs, theirs_tpot)]:
        ttft = statistics.median(m.ttft_s for m in runs)
        print(f"{label:<24} {ttft * 1e3:>9.1f} {tpot * 1e3:>9.1f} {1 / tpot:>9.1f} {tpot / floor_s:>8.2f}")
    print(f"{'decode floor':<24} {'':>9} {floor_s * 1e3:>9.1f} {1 / floor_s:>9.1f} {1.0:>8.2f}   "
          f"({decode.bytes:,} B / bandwidth)")
    print(f"labkit / transformers TPOT: {ours_tpot / theirs_tpot:.2f}; labkit / floor: {ours_tpot / floor_s:.2f}; "
          f"bandwidth utilization: "
          f"{roofline.bandwidth_utilization(decode.bytes, 1 / ours_tpot, roof.bandwidth_bytes_per_s):.0%}")
    predicted = roofline.roofline_time(decode, roof.peak_flops_per_s, roof.bandwidth_bytes_per_s)
    print(f"cost model (roofline) decode step {predicted.floor_s * 1e3:.1f} ms vs measured {ours_tpot * 1e3:.1f} ms: "
          f"measured / predicted = {ours_tpot / predicted.floor_s:.2f}")


def _bf16_comparison(lm, threads: int) -> None:
    """Would a BF16 copy decode faster here, with the same greedy tokens? (Offered only if both hold; on the
    2-core AVX-512 machine this was written on it decoded about 12 % slower than FP32, tokens identical.)"""
    from labkit.runtime import model_copy
    from labkit.runtime import timing as measure
    from labkit.runtime.generation import generate

    ids = lm.text_ids(PROMPT)
    bf16 = model_copy(lm)
    bf16.model.to(torch.bfloat16)
    tpot = {"fp32": [], "bf16": []}
    for run in range(REPEATS):
        for name in (("fp32", "bf16") if run % 2 == 0 else ("bf16", "fp32")):
            timed_lm = lm if name == "fp32" else bf16
            tpot[name].append(measure.timed_generation(timed_lm, ids, NEW_TOKENS, threads=threads).metrics.tpot_s)
    from labkit.runtime.generation import greedy_margins

    prompts = [PROMPT, "The capital of France is", "Once upon a time", "Write one sentence about the sea."]
    fp32_ids = [generate(lm, lm.text_ids(p), 24).new_token_ids for p in prompts]
    same = all(torch.equal(ours, generate(bf16, lm.text_ids(p), 24).new_token_ids)
               for p, ours in zip(prompts, fp32_ids))
    margin = min(float(greedy_margins(lm, lm.text_ids(p), ours).min()) for p, ours in zip(prompts, fp32_ids))
    fp32_s, bf16_s = statistics.median(tpot["fp32"]), statistics.median(tpot["bf16"])
    # BF16 rounds the weights: another function, not the same one summed in another order, so CLEAR_MARGIN does not
    # cover it; identical tokens are an observation on these prompts, and the smallest FP32 margin says how close.
    print(f"BF16 copy: TPOT {bf16_s * 1e3:.1f} ms vs FP32 {fp32_s * 1e3:.1f} ms (x{bf16_s / fp32_s:.2f}); "
          f"greedy tokens identical on {len(prompts)} prompts: {same} (smallest FP32 margin {margin:.3f}) -> "
          f"{'worth offering' if bf16_s < fp32_s and same else 'FP32 stays the default'}")


def _latency_model(lm, threads: int) -> None:
    """The notebook's latency model, fitted MODEL_REPEATS times, and its predictions where it was not fitted."""
    from labkit.core import latency_model
    from labkit.core.texts import load_eval_text, tokenize_sections
    from labkit.explorers.timing import fit_table
    from labkit.runtime import sweeps

    texts = ["The capital of France is Paris and", "Once upon a time there was a small dragon",
             "To make bread you need flour, water and"]
    prompts = sweeps.same_length_prompts(lm, texts)
    text_ids = tokenize_sections(lm.tokenizer, load_eval_text()).token_ids[None, :1 + max(c for _, c in HELD_OUT)]
    fits, ratios = [], {point: [] for point in HELD_OUT}
    for _ in range(MODEL_REPEATS):
        batches = sweeps.batching_sweep(lm, prompts, (1, 3), 5, repeats=3, threads=threads)
        prefill = sweeps.prefill_sweep(lm, lm.text_ids(" ".join(texts * 3)), (8, 32, 64), repeats=3, threads=threads)
        sweep = sweeps.decode_sweep(lm, text_ids, [*FITTED, *HELD_OUT], steps=5, threads=threads)
        fit = sweeps.calibrate(prefill, batches, sweep.select(FITTED))
        fits.append(fit)
        for point in HELD_OUT:
            held = sweep.point(*point)
            predicted = fit.latency.decode_step_s(held.batch_size, held.median_context)
            ratios[point].append(latency_model.prediction_ratio(predicted, held.median_s))
    print(f"latency model, fitted {MODEL_REPEATS} times on decode at {sorted({c for _, c in FITTED})} cached tokens, "
          f"batches {sorted({b for b, _ in FITTED})} (5 steps per point); the last fit:")
    print(fit_table(fits[-1]))
    print(f"{'decode coefficient':<22} {'median':>10} {'min':>10} {'max':>10} {'median std. error':>18}  "
          f"(over the fits)")
    for index, name in enumerate(latency_model.DECODE_TERMS):
        scale, unit = (1e6, "us") if name == "per cached token" else (1e3, "ms")
        values = [f.decode.coefficients[index] * scale for f in fits]
        errors = [f.decode.standard_errors[index] * scale for f in fits]
        print(f"{name + ' (' + unit + ')':<22} {statistics.median(values):>10.2f} {min(values):>10.2f} "
              f"{max(values):>10.2f} {statistics.median(errors):>18.2f}")
    print("predicted / measured decode step where the model was not fitted (target 0.75 .. 1.25):")
    for (batch_size, context), values in ratios.items():
        beyond = [note for note in fits[-1].extrapolations(context, 2, batch_size) if not note.startswith("prefill")]
        print(f"  batch {batch_size}, {context:>5,} cached tokens: " + "  ".join(f"{r:.2f}" for r in values)
              + f"   median {statistics.median(values):.2f}" + (f"   (beyond the fit: {'; '.join(beyond)})" if beyond
                                                                  else "   (inside the fitted range)"))


def _thread_sweep(lm) -> None:
    from labkit.runtime import sweeps

    ids = lm.text_ids(PROMPT)
    counts = sorted({1, 2, torch.get_num_threads()})
    print(f"thread sweep ({ids.shape[1]}-token prompt, 8 new tokens, medians of 3 runs):")
    print(f"{'threads':>8} {'prefill ms':>11} {'decode ms':>10} {'GB/s':>7}")
    for point in sweeps.thread_sweep(lm, ids, counts, max_new_tokens=8, repeats=3, quick=False):
        print(f"{point.threads:>8} {point.prefill_s * 1e3:>11.1f} {point.decode_step_s * 1e3:>10.1f} "
              f"{point.bandwidth_bytes_per_s / 1e9:>7.1f}")


def _explorer_latency(n_changes: int = 120) -> None:
    from labkit.core.latency_model import LatencyModel
    from labkit.core.timing import percentile
    from labkit.explorers.timing import timing_explorer

    explorer = timing_explorer(LatencyModel(0.02, 0.001, 0.06, 0.004, 1e-6))
    times_ms = []
    for change in range(n_changes):
        name = ("prompt_len", "output_len", "batch_size")[change % 3]
        control = explorer.controls[name]
        value = control.min + (control.value + 7) % (control.max - control.min + 1)
        started = time.perf_counter()
        control.value = value
        times_ms.append((time.perf_counter() - started) * 1e3)
    print(f"latency explorer, {n_changes} control changes: p50 {percentile(times_ms, 50):.1f} ms, "
          f"p95 {percentile(times_ms, 95):.1f} ms per update (compute + render + PNG)")


def main() -> None:
    from labkit.runtime.models import load_model

    lm = load_model(progress=False)
    threads = torch.get_num_threads()
    print("== lab 06: where the time goes ==")
    _decode_comparison(lm, threads)
    _bf16_comparison(lm, threads)
    _latency_model(lm, threads)
    _thread_sweep(lm)
    _explorer_latency()


if __name__ == "__main__":
    main()
