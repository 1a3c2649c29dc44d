"""Lab 05's measurements at full length: this machine's roofline, labkit's decode loop against the floor it implies
and against transformers' ``generate``, the thread sweep, and the latency explorer's update time.

Printed, in one run at one held thread count: the read-bandwidth and matmul probes (``torch.utils.benchmark``),
labkit's TTFT/TPOT and transformers' (same prompt, same greedy tokens, timed alternately so a busy machine slows
both alike), the decode floor = bytes per token / measured bandwidth, and the ratios labkit / floor and
labkit / transformers; then prefill and decode step against the thread count; then the explorer's p50/p95 update.
Never asserts on time. Run: ``python -m benchmarks timing``.
"""

from __future__ import annotations

import statistics
import time

import torch

PROMPT = ("The lighthouse keeper climbed the spiral stairs every evening to light the lamp. Ships passing the rocky "
          "coast relied on its beam.")
NEW_TOKENS = 32
REPEATS = 5


def _decode_comparison(lm, threads: int) -> None:
    from labkit.core import timing
    from labkit.runtime import timing as measure

    ids = lm.text_ids(PROMPT)
    roof = measure.roofline_probe(threads=threads)
    decode = timing.step_cost(lm.spec, 1, context_len=ids.shape[1] + NEW_TOKENS // 2)
    floor_s = timing.decode_floor_s(decode.bytes, roof.bandwidth_bytes_per_s)
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
    ours_tpot = statistics.median(m.tpot_s for m in ours)
    theirs_tpot = statistics.median(m.tpot_s for m in theirs)
    print(f"{NEW_TOKENS} new tokens after a {ids.shape[1]}-token prompt, medians of {REPEATS} alternating runs "
          f"(greedy tokens identical: {same})")
    print(f"{'':<24} {'TTFT ms':>9} {'TPOT ms':>9} {'tokens/s':>9} {'/ floor':>8}")
    for label, runs, tpot in [("labkit generate", ours, ours_tpot), ("transformers generate", theirs, theirs_tpot)]:
        ttft = statistics.median(m.ttft_s for m in runs)
        print(f"{label:<24} {ttft * 1e3:>9.1f} {tpot * 1e3:>9.1f} {1 / tpot:>9.1f} {tpot / floor_s:>8.2f}")
    print(f"{'decode floor':<24} {'':>9} {floor_s * 1e3:>9.1f} {1 / floor_s:>9.1f} {1.0:>8.2f}   "
          f"({decode.bytes:,} B / bandwidth)")
    print(f"labkit / transformers TPOT: {ours_tpot / theirs_tpot:.2f}; labkit / floor: {ours_tpot / floor_s:.2f}; "
          f"bandwidth utilization: "
          f"{timing.bandwidth_utilization(decode.bytes, 1 / ours_tpot, roof.bandwidth_bytes_per_s):.0%}")
    predicted = timing.roofline_time(decode, roof.peak_flops_per_s, roof.bandwidth_bytes_per_s)
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
            model = lm if name == "fp32" else bf16
            tpot[name].append(measure.timed_generation(model, ids, NEW_TOKENS, threads=threads).metrics.tpot_s)
    prompts = [PROMPT, "The capital of France is", "Once upon a time", "Write one sentence about the sea."]
    same = all(torch.equal(generate(lm, lm.text_ids(p), 24).new_token_ids,
                           generate(bf16, lm.text_ids(p), 24).new_token_ids) for p in prompts)
    fp32_s, bf16_s = statistics.median(tpot["fp32"]), statistics.median(tpot["bf16"])
    print(f"BF16 copy: TPOT {bf16_s * 1e3:.1f} ms vs FP32 {fp32_s * 1e3:.1f} ms (x{bf16_s / fp32_s:.2f}); greedy tokens "
          f"identical on {len(prompts)} prompts: {same} -> "
          f"{'worth offering' if bf16_s < fp32_s and same else 'FP32 stays the default'}")


def _thread_sweep(lm) -> None:
    from labkit.runtime import timing as measure

    ids = lm.text_ids(PROMPT)
    counts = sorted({1, 2, torch.get_num_threads()})
    print(f"thread sweep ({ids.shape[1]}-token prompt, 8 new tokens, medians of 3 runs):")
    print(f"{'threads':>8} {'prefill ms':>11} {'decode ms':>10} {'GB/s':>7}")
    for point in measure.thread_sweep(lm, ids, counts, max_new_tokens=8, repeats=3, quick=False):
        print(f"{point.threads:>8} {point.prefill_s * 1e3:>11.1f} {point.decode_step_s * 1e3:>10.1f} "
              f"{point.bandwidth_bytes_per_s / 1e9:>7.1f}")


def _explorer_latency(n_changes: int = 120) -> None:
    from labkit.core.timing import LatencyModel
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
    times_ms.sort()
    print(f"latency explorer, {n_changes} control changes: p50 {times_ms[len(times_ms) // 2]:.1f} ms, "
          f"p95 {times_ms[int(0.95 * (len(times_ms) - 1))]:.1f} ms per update (compute + render + PNG)")


def main() -> None:
    from labkit.runtime.models import load_model

    lm = load_model(progress=False)
    threads = torch.get_num_threads()
    print("== lab 05: where the time goes ==")
    _decode_comparison(lm, threads)
    _bf16_comparison(lm, threads)
    _thread_sweep(lm)
    _explorer_latency()


if __name__ == "__main__":
    main()
