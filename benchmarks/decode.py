"""Decode at the memory floor (issues #32, #44): transformers' ``generate`` against labkit's Llama forward in FP32,
BF16, INT8 and INT4, each beside its own floor = bytes read per token / this machine's measured read bandwidth, and
llama.cpp on the embedded model's own GGUF file as the anchor of an engine built for CPUs.

Printed, in one run at one held thread count: the bandwidth probe; for each engine the median TPOT with its spread
(min-max over the repeats), the bytes a step reads, the floor, TPOT / floor and the speedup over transformers
(the repeats are interleaved round-robin, so a busy spell slows every engine alike); the least-squares line
``time = overhead + bytes / bandwidth`` through labkit's formats (``core.roofline.fit_step_time``) with standard
errors; where each step's time goes (``runtime.step_profile``: the weight matmuls against everything else, then
each format's largest operators with their calls per step); and ``torch.compile`` of the INT4 decoder, its first
call timed in a fresh process with an empty and then a warm on-disk cache. llama.cpp's line needs
``llama-cpp-python`` (optional, never a dependency of the labs or the tests: ``pip install -e .[llamacpp]`` builds
it from source, about 15 minutes on 2 cores); without it the line says so. Targets (2 cores): every format's TPOT
<= 2x its floor (FP32 <= 1.5x); INT4 at or below llama.cpp; labkit FP32 >= 2x faster than transformers per token.
Never asserts on time. Run: ``python -m benchmarks decode``.
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
    from labkit.runtime.models import gguf_path, load_model
    from labkit.runtime.sources import EMBEDDED, known_models
    from labkit.runtime.step_profile import profile_decode

    threads = torch.get_num_threads()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lm = load_model(progress=False)
    ids = lm.text_ids(PROMPT)
    gguf = gguf_path(known_models()[EMBEDDED])
    engines = {"transformers generate": lm, **{f"labkit {w}": llama.decoder(lm, w) for w in FORMATS}}
    llama_cpp = _llama_cpp_runner(gguf, ids, threads)
    if not isinstance(llama_cpp, str):
        engines["llama.cpp (its Q4_1 file)"] = llama_cpp
    with measure.held_threads(threads):
        probe = probes.bandwidth_probe(threads=threads, min_run_time=1.0)
        bandwidth = probe.rate
        for name, engine in engines.items():  # warm-up
            _run(name, engine, ids, 4, threads)
        tpot: dict[str, list[float]] = {name: [] for name in engines}
        tokens: dict[str, torch.Tensor] = {}
        names = list(engines)
        for repeat in range(REPEATS):
            for name in names[repeat % len(names):] + names[:repeat % len(names)]:  # rotate who goes first
                seconds, new = _run(name, engines[name], ids, NEW_TOKENS, threads)
                tpot[name].append(seconds)
                tokens[name] = new
        profiles = {name: profile_decode(engine, ids, threads=threads) for name, engine in engines.items()
                    if name.startswith("labkit")}
        profiles["transformers generate"] = profile_decode(llama.with_forward(lm, "transformers"), ids,
                                                           threads=threads)
    context = ids.shape[1] + NEW_TOKENS // 2
    read = {}
    for name, engine in engines.items():
        if name.startswith("llama.cpp"):
            read[name] = gguf.stat().st_size + _kv_bytes_read(lm, context, 2)  # its whole file; an F16 cache
        elif isinstance(engine.model, llama.Llama):
            read[name] = engine.model.weight_bytes + _kv_bytes_read(lm, context, engine.model.new_cache(1, 1)
                                                                     .keys[0].element_size())
        else:
            read[name] = sum(p.numel() * p.element_size() for p in engine.model.parameters()) + _kv_bytes_read(
                lm, context, 4)
    reference = statistics.median(tpot["transformers generate"])
    print(f"decode: {NEW_TOKENS} new tokens after a {ids.shape[1]}-token prompt, {REPEATS} interleaved repeats, "
          f"{threads} threads, load average {load:.1f} when started (another process's work slows every engine)")
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s ({probe.what}, IQR {probe.iqr_s / probe.median_s:.0%} of the "
          f"median)")
    print(f"{'engine':<26} {'TPOT ms':>8} {'min-max ms':>13} {'MB read':>8} {'floor ms':>9} {'/ floor':>8} "
          f"{'speedup':>8} {'same tokens':>11}")
    for name in engines:
        s = spread(tpot[name])
        floor_s = read[name] / bandwidth
        same = torch.equal(tokens[name], tokens["transformers generate"])
        print(f"{name:<26} {s.median * 1e3:>8.1f} {s.minimum * 1e3:>6.1f}-{s.maximum * 1e3:<6.1f} "
              f"{read[name] / 1e6:>8.0f} {floor_s * 1e3:>9.1f} {s.median / floor_s:>8.2f} "
              f"{reference / s.median:>7.2f}x {str(same):>11}")
    if isinstance(llama_cpp, str):
        print(f"llama.cpp: no line: {llama_cpp}")
    labkit = [f"labkit {w}" for w in FORMATS]
    fit = fit_step_time([read[name] for name in labkit], [tpot[name] for name in labkit])
    print(f"fit over labkit's formats: time = {fit.overhead_s * 1e3:.1f} ms (+-{fit.overhead_se_s * 1e3:.1f}) + "
          f"bytes / {fit.bandwidth_bytes_per_s / 1e9:.1f} GB/s (slope +-{fit.seconds_per_byte_se * 1e12:.1f} ps/B); "
          f"the probe's bandwidth: {bandwidth / 1e9:.1f} GB/s")
    print(f"{'where a step goes':<26} {'matmul ms':>10} {'other ms':>9} {'matmul share':>13} {'ops/step':>9} "
          f"{'matmul / floor':>15}   (torch.profiler, CPU time, {profiles['labkit fp32'].steps} steps)")
    for name, p in profiles.items():
        print(f"{name:<26} {p.matmul_s * 1e3:>10.1f} {p.other_s * 1e3:>9.1f} {p.matmul_share:>13.0%} "
              f"{p.ops_per_step:>9} {p.matmul_s / (read[name] / bandwidth):>15.2f}")
    print("the largest operators of a step (self CPU ms per step, calls per step):")
    for name, p in profiles.items():
        print(f"  {name:<24} " + "; ".join(f"{op.name.split('::')[-1]} {op.self_s * 1e3:.2f} ({op.calls:.0f})"
                                            for op in p.top[:6]))
    compiled = _compiled_first_calls("int4", threads)
    print(compiled)
    print("targets (TPOT / floor):")
    for name in labkit:
        bound = 1.5 if name.endswith("fp32") else 2.0
        ratio = statistics.median(tpot[name]) / (read[name] / bandwidth)
        print(f"  {name:<24} {ratio:.2f} (target <= {bound}: {'met' if ratio <= bound else 'missed'})")
    fp32 = statistics.median(tpot["labkit fp32"])
    print(f"  transformers / labkit FP32 = {reference / fp32:.2f} (target >= 2: "
          f"{'met' if reference >= 2 * fp32 else 'missed'})")
    if not isinstance(llama_cpp, str):
        int4, cpp = statistics.median(tpot["labkit int4"]), statistics.median(tpot["llama.cpp (its Q4_1 file)"])
        print(f"  labkit INT4 / llama.cpp = {int4 / cpp:.2f} (target <= 1: {'met' if int4 <= cpp else 'missed'})")
    p = profiles["labkit fp32"]
    fp32_floor = read["labkit fp32"] / bandwidth
    print(f"the rest of FP32's step: its matmuls alone take {p.matmul_s / fp32_floor:.2f}x the floor (the kernel reads "
          f"the weights at {read['labkit fp32'] / p.matmul_s / 1e9:.1f} GB/s, the probe's sum at "
          f"{bandwidth / 1e9:.1f}), everything else {p.other_s * 1e3:.1f} ms ({1 - p.matmul_share:.0%} of a step)")


def _run(name: str, engine, ids: torch.Tensor, n_new: int, threads: int) -> tuple[float, torch.Tensor]:
    """One greedy generation: (TPOT seconds, new token ids ``[1, n_new]``)."""
    from labkit.runtime import timing as measure

    if name == "transformers generate":
        metrics, new = measure.transformers_generation(engine, ids, n_new, threads=threads)
        return metrics.tpot_s, new
    if callable(engine):
        return engine(n_new)
    run = measure.timed_generation(engine, ids, n_new, threads=threads)
    return run.metrics.tpot_s, run.new_token_ids


def _llama_cpp_runner(gguf, ids: torch.Tensor, threads: int):
    """A function ``n_new -> (TPOT seconds, new token ids)`` running llama.cpp greedily on ``gguf`` from the same
    prompt ids, or why there is none. TPOT is the time between the first and the last new token over their gaps,
    as labkit's harness measures it."""
    import time

    try:
        import llama_cpp
    except ImportError:
        return ("llama-cpp-python is not installed (optional: pip install -e .[llamacpp] builds it from source, about "
                "15 minutes on 2 cores)")
    engine = llama_cpp.Llama(model_path=str(gguf), n_threads=threads, n_threads_batch=threads, n_ctx=256,
                             verbose=False)
    prompt = ids[0].tolist()

    def run(n_new: int) -> tuple[float, torch.Tensor]:
        engine.reset()
        stamps, new = [], []
        for token in engine.generate(prompt, top_k=1, temp=0.0, reset=True):
            stamps.append(time.perf_counter())
            new.append(token)
            if len(new) == n_new:
                break
        return (stamps[-1] - stamps[0]) / max(len(stamps) - 1, 1), torch.tensor([new])

    return run


def _compiled_first_calls(weights: str, threads: int) -> str:
    """``torch.compile`` (inductor, CPU) of the decoder in ``weights``, each in a fresh process: the first with an
    empty on-disk cache, the second with the cache the first left. Each process times its first generation of 8
    tokens (tracing, compiling and the first steps) and then the compiled against the eager decoder, interleaved."""
    import json
    import subprocess
    import sys
    import tempfile

    lines = []
    with tempfile.TemporaryDirectory() as cache:
        for state in ("an empty", "a warm"):
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            done = subprocess.run([sys.executable, "-c", f"from benchmarks.decode import _compiled_child; "
                                   f"_compiled_child({weights!r}, {threads})"], env=env, capture_output=True,
                                  text=True)
            if done.returncode:
                return f"torch.compile of {weights}: failed ({done.stderr.strip().splitlines()[-1:]})"
            found = json.loads(done.stdout.strip().splitlines()[-1])
            lines.append(f"first call {found['first_s']:.0f} s with {state} cache")
    return (f"torch.compile of labkit {weights} (inductor, CPU): {'; '.join(lines)}; then TPOT "
            f"{found['compiled_ms']:.1f} ms compiled against {found['eager_ms']:.1f} ms eager "
            f"({found['eager_ms'] / found['compiled_ms']:.2f}x, medians of {REPEATS} interleaved), same tokens "
            f"{found['same']}")


def _compiled_child(weights: str, threads: int) -> None:
    """In a fresh process: print one JSON line of the compiled decoder's first-call seconds and TPOT medians."""
    import json
    import time

    from labkit.runtime import llama
    from labkit.runtime import timing as measure
    from labkit.runtime.models import load_model

    torch.set_num_threads(threads)
    lm = load_model(progress=False)
    ids = lm.text_ids(PROMPT)
    eager, compiled = llama.decoder(lm, weights), llama.decoder(lm, weights)
    compiled.model.forward = torch.compile(compiled.model.forward)
    started = time.perf_counter()
    measure.timed_generation(compiled, ids, 8, threads=threads)
    first_s = time.perf_counter() - started
    for name, engine in (("eager", eager), ("compiled", compiled)):  # warm-up
        measure.timed_generation(engine, ids, 4, threads=threads)
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    tokens: dict[str, torch.Tensor] = {}
    for _ in range(REPEATS):
        for name, engine in (("eager", eager), ("compiled", compiled)):
            run = measure.timed_generation(engine, ids, NEW_TOKENS, threads=threads)
            times[name].append(run.metrics.tpot_s)
            tokens[name] = run.new_token_ids
    medians = {f"{name}_ms": statistics.median(values) * 1e3 for name, values in times.items()}
    print(json.dumps({"first_s": first_s, **medians, "same": torch.equal(tokens["eager"], tokens["compiled"])}))


if __name__ == "__main__":
    main()
