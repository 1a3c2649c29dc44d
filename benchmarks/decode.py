"""Decode at the memory floor (issue #32): transformers' ``generate`` against labkit's Llama forward in FP32, BF16,
INT8 and INT4, each beside its own floor = bytes read per token / this machine's measured read bandwidth.

Printed, in one run at one held thread count: the bandwidth probe; for each engine the median TPOT with its spread
(min-max over the repeats), the bytes a step reads, the floor, TPOT / floor and the speedup over transformers
(the repeats are interleaved round-robin, so a busy spell slows every engine alike); the least-squares line
``time = overhead + bytes / bandwidth`` through labkit's formats (``core.roofline.fit_step_time``) with standard
errors; then where each step's time goes (``runtime.step_profile``: the weight matmuls against everything else),
which says what keeps a target out of reach. Targets (2 cores): FP32 TPOT <= 1.5x its floor; labkit >= 2x faster
than transformers per token. Never asserts on time. Run: ``python -m benchmarks decode``.
"""

from __future__ import annotations

import os
import statistics

import torch

PROMPT = ("The lighthouse keeper climbed the spiral stairs every evening to light the lamp. Ships passing the rocky "
          "coast relied on its beam.")
NEW_TOKENS = 32
REPEATS = 5
FORMATS = ("fp32", "bf16", "int8", "int4")


def _kv_bytes_read(lm, context_len: int, element_bytes: int) -> int:
    """Keys and values a decode step reads at ``context_len`` cached tokens (every layer, every KV head)."""
    spec = lm.spec
    return 2 * spec.n_layers * spec.n_kv_heads * spec.head_dim * context_len * element_bytes


def main() -> None:
    from labkit.core.roofline import fit_step_time
    from labkit.core.timing import spread
    from labkit.runtime import llama, probes
    from labkit.runtime import timing as measure
    from labkit.runtime.models import load_model
    from labkit.runtime.step_profile import profile_decode

    threads = torch.get_num_threads()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lm = load_model(progress=False)
    ids = lm.text_ids(PROMPT)
    engines = {"transformers generate": lm, **{f"labkit {w}": llama.decoder(lm, w) for w in FORMATS}}
    with measure.held_threads(threads):
        probe = probes.bandwidth_probe(threads=threads, min_run_time=1.0)
        bandwidth = probe.rate
        for name, engine in engines.items():  # warm-up
            _run(name, engine, ids, 4, threads, llama)
        tpot: dict[str, list[float]] = {name: [] for name in engines}
        tokens: dict[str, torch.Tensor] = {}
        names = list(engines)
        for repeat in range(REPEATS):
            for name in names[repeat % len(names):] + names[:repeat % len(names)]:  # rotate who goes first
                seconds, new = _run(name, engines[name], ids, NEW_TOKENS, threads, llama)
                tpot[name].append(seconds)
                tokens[name] = new
        profiles = {name: profile_decode(engine, ids, threads=threads) for name, engine in engines.items()
                    if name != "transformers generate"}
        with llama.use_forward("transformers"):
            profiles["transformers generate"] = profile_decode(lm, ids, threads=threads)
    context = ids.shape[1] + NEW_TOKENS // 2
    read = {name: (engine.model.weight_bytes if isinstance(engine.model, llama.Llama)
                   else sum(p.numel() * p.element_size() for p in engine.model.parameters()))
            + _kv_bytes_read(lm, context, 4 if name.endswith(("fp32", "generate")) else 2)
            for name, engine in engines.items()}
    reference = statistics.median(tpot["transformers generate"])
    print(f"decode: {NEW_TOKENS} new tokens after a {ids.shape[1]}-token prompt, {REPEATS} interleaved repeats, "
          f"{threads} threads, load average {load:.1f} when started (another process's work slows every engine)")
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s ({probe.what}, IQR {probe.iqr_s / probe.median_s:.0%} of the "
          f"median)")
    print(f"{'engine':<22} {'TPOT ms':>8} {'min-max ms':>13} {'MB read':>8} {'floor ms':>9} {'/ floor':>8} "
          f"{'speedup':>8} {'same tokens':>11}")
    for name in engines:
        s = spread(tpot[name])
        floor_s = read[name] / bandwidth
        same = torch.equal(tokens[name], tokens["transformers generate"])
        print(f"{name:<22} {s.median * 1e3:>8.1f} {s.minimum * 1e3:>6.1f}-{s.maximum * 1e3:<6.1f} "
              f"{read[name] / 1e6:>8.0f} {floor_s * 1e3:>9.1f} {s.median / floor_s:>8.2f} "
              f"{reference / s.median:>7.2f}x {str(same):>11}")
    labkit = [f"labkit {w}" for w in FORMATS]
    fit = fit_step_time([read[name] for name in labkit], [tpot[name] for name in labkit])
    print(f"fit over labkit's formats: time = {fit.overhead_s * 1e3:.1f} ms (+-{fit.overhead_se_s * 1e3:.1f}) + "
          f"bytes / {fit.bandwidth_bytes_per_s / 1e9:.1f} GB/s (slope +-{fit.seconds_per_byte_se * 1e12:.1f} ps/B); "
          f"the probe's bandwidth: {bandwidth / 1e9:.1f} GB/s")
    print(f"{'where a step goes':<22} {'matmul ms':>10} {'other ms':>9} {'matmul share':>13} {'ops/step':>9} "
          f"{'matmul / floor':>15}   (torch.profiler, CPU time, {profiles['labkit fp32'].steps} steps)")
    for name in engines:
        p = profiles[name]
        print(f"{name:<22} {p.matmul_s * 1e3:>10.1f} {p.other_s * 1e3:>9.1f} {p.matmul_share:>13.0%} "
              f"{p.ops_per_step:>9} {p.matmul_s / (read[name] / bandwidth):>15.2f}")
    fp32 = statistics.median(tpot["labkit fp32"])
    fp32_floor = read["labkit fp32"] / bandwidth
    print(f"targets: FP32 TPOT / floor = {fp32 / fp32_floor:.2f} (target <= 1.5: "
          f"{'met' if fp32 <= 1.5 * fp32_floor else 'missed'}); transformers / labkit FP32 = {reference / fp32:.2f} "
          f"(target >= 2: {'met' if reference >= 2 * fp32 else 'missed'})")
    p = profiles["labkit fp32"]
    print(f"the rest of FP32's step: its matmuls alone take {p.matmul_s / fp32_floor:.2f}x the floor (the kernel reads "
          f"the weights at {read['labkit fp32'] / p.matmul_s / 1e9:.1f} GB/s, the probe's sum at "
          f"{bandwidth / 1e9:.1f}), everything else {p.other_s * 1e3:.1f} ms ({1 - p.matmul_share:.0%} of a step)")


def _run(name: str, engine, ids: torch.Tensor, n_new: int, threads: int, llama) -> tuple[float, torch.Tensor]:
    """One greedy generation: (TPOT seconds, new token ids)."""
    from labkit.runtime import timing as measure

    if name == "transformers generate":
        metrics, new = measure.transformers_generation(engine, ids, n_new, threads=threads)
        return metrics.tpot_s, new
    run = measure.timed_generation(engine, ids, n_new, threads=threads)
    return run.metrics.tpot_s, run.new_token_ids


if __name__ == "__main__":
    main()
