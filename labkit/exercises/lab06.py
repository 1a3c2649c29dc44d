"""Lab 06's exercises: TPOT from timestamps (unavailable for one token), E2E by eq. 8.1, the decode floor from a
spec and a bandwidth, and predictions (Lesson 4.1's questions 2, 6 and 7, and batching's throughput) checked
against labkit's arithmetic and a latency model.

The timestamps are in milliseconds and the answers too, so the chapter's example reads as printed: 700 ms to the
first token, then 35 ms a token. The bug zoo holds the mistakes the seed chapter warns about (total time divided
by n, the first token counted among the decode intervals) and the ones learners make at n = 1.
"""

from __future__ import annotations

import torch

from labkit.core.memory import GB, GIB, kv_cache_bytes
from labkit.core.presets import model_preset
from labkit.core.spec import ModelSpec
from labkit.core.timing import LatencyModel, decode_floor_s, e2e_estimate, tpot
from labkit.exercises import register
from labkit.exercises.checking import Case, Exercise, Mistake, prediction

# ----- 06.tpot_ms -----


def reference_tpot_ms(start_ms: float, token_times_ms: list[float]) -> float | None:
    """labkit's answer: the mean of the n - 1 gaps after the first token, None for one token."""
    return tpot(token_times_ms)


def _stamps(ttft_ms: float, gaps_ms: list[float], start_ms: float = 0.0) -> list[float]:
    times = [start_ms + ttft_ms]
    for gap in gaps_ms:
        times.append(times[-1] + gap)
    return times


def _random_tpot_case(generator: torch.Generator) -> Case:
    n = int(torch.randint(1, 40, (1,), generator=generator))
    start = float(torch.rand((), generator=generator)) * 1000
    ttft = 50 + float(torch.rand((), generator=generator)) * 950  # prefill much longer than one step, as on a CPU
    gaps = (5 + torch.rand(n - 1, generator=generator) * 60).tolist()
    return Case((start, _stamps(ttft, gaps, start)), label=f"{n} tokens, request started at {start:.1f} ms")


def _total_over_n(start_ms, token_times_ms):
    return (token_times_ms[-1] - start_ms) / len(token_times_ms)


def _decode_span_over_n(start_ms, token_times_ms):
    return (token_times_ms[-1] - token_times_ms[0]) / len(token_times_ms)


def _ttft_included(start_ms, token_times_ms):
    n = len(token_times_ms)
    return None if n == 1 else (token_times_ms[-1] - start_ms) / (n - 1)


def _zero_for_one_token(start_ms, token_times_ms):
    n = len(token_times_ms)
    return 0.0 if n == 1 else (token_times_ms[-1] - token_times_ms[0]) / (n - 1)


CHAPTER_STAMPS = _stamps(700, [35] * 19)  # 20 tokens: the chapter's example, arrival at 0

TPOT = register(Exercise(
    id="06.tpot_ms",
    title="TPOT from token timestamps (None for one token)",
    function="tpot_ms",
    reference=reference_tpot_ms,
    points=2,
    rtol=1e-9,
    atol=1e-9,
    hand_cases=(
        Case((0.0, CHAPTER_STAMPS), label="the chapter's example: first token at 700 ms, then 19 gaps of 35 ms"),
        Case((0.0, [700.0]), label="one token: no interval after the first, so TPOT is unavailable (None)"),
        Case((100.0, [400.0, 450.0]), label="two tokens: one interval of 50 ms"),
        Case((0.0, [300.0, 310.0, 330.0, 390.0]), label="uneven gaps 10, 20, 60: their mean is 30"),
        Case((5.0, [9.0, 9.0, 9.0]), label="tokens emitted together: TPOT 0"),
    ),
    random_case=_random_tpot_case,
    hints=("TPOT = (t_n - t_1) / (n - 1): the mean of the n - 1 gaps after the first token; with one token there is "
           "no gap, so return None",),
    mistakes=(
        Mistake("with one token TPOT is unavailable: return None, not 0 (0 would mean infinitely fast)",
                _zero_for_one_token),
        Mistake("dividing the total time by n mixes the prefill wait (TTFT) into every token: measure from the first "
                "token, t_n - t_1", _total_over_n),
        Mistake("n tokens have n - 1 gaps between them: divide by n - 1, not n", _decode_span_over_n),
        Mistake("the first token's wait is TTFT, not a decode interval: start from t_1, not from the request start",
                _ttft_included),
    ),
))


# ----- 06.e2e_ms -----


def reference_e2e_ms(ttft_ms: float, tpot_ms: float | None, n_tokens: int) -> float:
    """labkit's answer: eq. 8.1, TTFT + (n - 1) x TPOT."""
    return float(e2e_estimate(ttft_ms, tpot_ms, n_tokens))


def _random_e2e_case(generator: torch.Generator) -> Case:
    n = int(torch.randint(1, 500, (1,), generator=generator))
    ttft = float(torch.rand((), generator=generator)) * 2000
    tpot_ms = None if n == 1 else 1 + float(torch.rand((), generator=generator)) * 100
    return Case((ttft, tpot_ms, n), label=f"{n} tokens")


def _n_times_tpot(ttft_ms, tpot_ms, n_tokens):
    return ttft_ms + n_tokens * (tpot_ms or 0.0)


def _no_ttft(ttft_ms, tpot_ms, n_tokens):
    return (n_tokens - 1) * (tpot_ms or 0.0)


def _only_decode(ttft_ms, tpot_ms, n_tokens):
    return n_tokens * (tpot_ms or 0.0)


E2E = register(Exercise(
    id="06.e2e_ms",
    title="End-to-end latency from TTFT and TPOT (eq. 8.1)",
    function="e2e_ms",
    reference=reference_e2e_ms,
    points=1,
    rtol=1e-9,
    atol=1e-9,
    hand_cases=(
        Case((700.0, 35.0, 20), label="the chapter's example: 700 + 19 x 35 = 1,365 ms"),
        Case((700.0, None, 1), label="one token: the answer is TTFT alone (TPOT is None)"),
        Case((120.0, 80.0, 2), label="two tokens: TTFT + one interval"),
    ),
    random_case=_random_e2e_case,
    hints=("E2E = TTFT + (n - 1) x TPOT: the first token is already inside TTFT; with one token TPOT is None and "
           "E2E is TTFT",),
    mistakes=(
        Mistake("the first token is already counted in TTFT: add (n - 1) intervals, not n", _n_times_tpot),
        Mistake("E2E starts at the request: add TTFT", _no_ttft),
        Mistake("E2E starts at the request: add TTFT, and only n - 1 intervals follow the first token", _only_decode),
    ),
))


# ----- 06.decode_floor_ms -----

_FORMAT = {4: "fp32", 2: "bf16", 1: "fp8", 0.5: "int4"}


def reference_decode_floor_ms(spec: ModelSpec, bytes_per_value: float, context_len: int, batch_size: int,
                              bandwidth_gb_per_s: float) -> float:
    """labkit's answer: (weights once + every sequence's cached K and V) / bandwidth, in ms."""
    if bytes_per_value not in _FORMAT:
        raise ValueError(f"bytes_per_value must be one of {sorted(_FORMAT)}, got {bytes_per_value!r}")
    weights = spec.n_params * bytes_per_value
    kv = kv_cache_bytes(spec, batch_size, context_len, _FORMAT[bytes_per_value])
    return decode_floor_s(weights + kv, bandwidth_gb_per_s * GB) * 1e3


def _random_spec(generator: torch.Generator) -> ModelSpec:
    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=generator))

    n_kv_heads, group = draw(1, 8), [1, 2, 4, 8][draw(0, 3)]
    head_dim = [64, 80, 128][draw(0, 2)]
    n_heads = n_kv_heads * group
    return ModelSpec("random", n_layers=draw(1, 80), d_model=n_heads * head_dim, n_heads=n_heads,
                     n_kv_heads=n_kv_heads, head_dim=head_dim, vocab=32000, n_params=draw(10**7, 10**11))


def _random_floor_case(generator: torch.Generator) -> Case:
    spec = _random_spec(generator)
    bytes_per_value = list(_FORMAT)[int(torch.randint(0, 4, (1,), generator=generator))]
    context_len = int(torch.randint(0, 32_769, (1,), generator=generator))
    batch_size = int(torch.randint(1, 65, (1,), generator=generator))
    bandwidth = [10, 20, 50, 320, 1555, 2039, 3350][int(torch.randint(0, 7, (1,), generator=generator))]
    return Case((spec, bytes_per_value, context_len, batch_size, float(bandwidth)), label="a random model")


def _kv_bytes(spec, bytes_per_value, context_len, batch_size, kv_heads=None, factor=2):
    return factor * batch_size * context_len * spec.n_layers * (kv_heads or spec.n_kv_heads) * spec.head_dim \
        * bytes_per_value


def _weights_only(spec, bytes_per_value, context_len, batch_size, bandwidth_gb_per_s):
    return spec.n_params * bytes_per_value / (bandwidth_gb_per_s * 1e9) * 1e3


def _weights_per_sequence(spec, bytes_per_value, context_len, batch_size, bandwidth_gb_per_s):
    total = batch_size * spec.n_params * bytes_per_value + _kv_bytes(spec, bytes_per_value, context_len, batch_size)
    return total / (bandwidth_gb_per_s * 1e9) * 1e3


def _gib_bandwidth(spec, bytes_per_value, context_len, batch_size, bandwidth_gb_per_s):
    total = spec.n_params * bytes_per_value + _kv_bytes(spec, bytes_per_value, context_len, batch_size)
    return total / (bandwidth_gb_per_s * GIB) * 1e3


def _seconds(spec, bytes_per_value, context_len, batch_size, bandwidth_gb_per_s):
    total = spec.n_params * bytes_per_value + _kv_bytes(spec, bytes_per_value, context_len, batch_size)
    return total / (bandwidth_gb_per_s * 1e9)


def _query_heads(spec, bytes_per_value, context_len, batch_size, bandwidth_gb_per_s):
    total = spec.n_params * bytes_per_value + _kv_bytes(spec, bytes_per_value, context_len, batch_size,
                                                        kv_heads=spec.n_heads)
    return total / (bandwidth_gb_per_s * 1e9) * 1e3


def _keys_only(spec, bytes_per_value, context_len, batch_size, bandwidth_gb_per_s):
    total = spec.n_params * bytes_per_value + _kv_bytes(spec, bytes_per_value, context_len, batch_size, factor=1)
    return total / (bandwidth_gb_per_s * 1e9) * 1e3


SMOLLM2 = model_preset("SmolLM2-135M")

DECODE_FLOOR = register(Exercise(
    id="06.decode_floor_ms",
    title="The decode floor: bytes one step must read / bandwidth",
    function="decode_floor_ms",
    reference=reference_decode_floor_ms,
    allowed=(ModelSpec,),
    points=2,
    rtol=1e-9,
    atol=0.0,
    hand_cases=(
        Case((SMOLLM2, 4, 0, 1, 20.0), label="SmolLM2-135M in FP32, empty cache, 20 GB/s: 538,060,032 B / 20e9 B/s "
                                             "= 26.9 ms"),
        Case((model_preset("Llama-3.3-70B"), 2, 0, 1, 2000.0), label="a 70B model in BF16 on 2 TB/s: about 70 ms"),
        Case((SMOLLM2, 4, 1000, 8, 20.0), label="a batch of 8 with 1,000 cached tokens each: the weights are read "
                                               "once, the KV cache per sequence"),
        Case((model_preset("Llama-3-8B"), 2, 4096, 16, 3350.0), label="Llama-3-8B, 16 x 4,096 tokens on an H100: "
                                                                      "8 GiB of KV cache read each step"),
    ),
    random_case=_random_floor_case,
    hints=("bytes = n_params x bytes_per_value + 2 x batch x context x n_layers x n_kv_heads x head_dim x "
           "bytes_per_value; ms = bytes / (bandwidth_gb_per_s x 10**9) x 1000",),
    mistakes=(
        Mistake("a decode step also reads every cached key and value: add the KV cache", _weights_only),
        Mistake("a batch shares one read of the weights (that is why batching helps): count them once, the KV "
                "cache per sequence", _weights_per_sequence),
        Mistake("vendors' GB/s are 10**9 bytes per second, not 2**30", _gib_bandwidth),
        Mistake("return milliseconds: multiply seconds by 1000", _seconds),
        Mistake("only the key/value heads are cached: use spec.n_kv_heads", _query_heads),
        Mistake("the cache holds keys AND values: multiply by 2", _keys_only),
    ),
))


# ----- 06.predict_batch_throughput: predict, then check -----

# A CPU like a laptop's, as labkit.core.timing.LatencyModel coefficients in seconds: prefill 20 ms + 1.5 ms per
# prompt token; a decode step 70 ms (the weights' read) + 6 ms per sequence + 2 us per cached token.
EXAMPLE_CPU = LatencyModel(prefill_fixed_s=0.020, prefill_per_token_s=0.0015, decode_fixed_s=0.070,
                           decode_per_sequence_s=0.006, decode_per_cached_token_s=2e-6)
PREDICT_PROMPT_LEN, PREDICT_OUTPUT_LEN, PREDICT_BATCH = 32, 16, 8


def throughput_gain_on_the_example() -> float:
    """Throughput at batch 8 / throughput at batch 1 on EXAMPLE_CPU (32-token prompts, 16 new tokens)."""
    batched = EXAMPLE_CPU.predict(PREDICT_PROMPT_LEN, PREDICT_OUTPUT_LEN, PREDICT_BATCH)
    alone = EXAMPLE_CPU.predict(PREDICT_PROMPT_LEN, PREDICT_OUTPUT_LEN, 1)
    return batched.tokens_per_s / alone.tokens_per_s


PREDICT = register(prediction(
    "06.predict_batch_throughput", "Predict, then check: the throughput gain of a batch of 8",
    "predicted_throughput_gain", throughput_gain_on_the_example, rtol=0.25,  # within 25% of the model's answer
    asked="EXAMPLE_CPU, 32-token prompts, 16 new tokens, batch 8 against batch 1",
    hint="return your prediction as a number; each decode step reads the weights once for the whole batch, but the "
         "prefill work grows with the batch"))


# ----- Lesson 4.1's retrieve-and-predict questions 2, 6 and 7 -----

OUTPUT_TOKENS = 8


def decode_calls_for_eight_tokens() -> int:
    """Counted on the model: the forward calls after the prefill while labkit's greedy loop writes 8 tokens (the
    prefill's logits choose the first, so eq. 8.1's n - 1)."""
    from labkit.runtime.generation import generate
    from labkit.runtime.models import load_model

    lm = load_model(progress=False)
    steps = []
    generate(lm, lm.text_ids("The tide"), OUTPUT_TOKENS, on_step=steps.append)
    return sum(step.phase == "decode" for step in steps)


PREDICT_CALLS = register(prediction(
    "06.predict_forward_calls", "Predict: forward calls after the prefill for eight output tokens",
    "forward_calls_after_prefill", decode_calls_for_eight_tokens,
    asked="eight output tokens, one prefill already run", hint="which call's logits choose the first token?"))

CHAPTER_TTFT_MS, CHAPTER_TPOT_MS, CHAPTER_TOKENS, SHORTER_TOKENS = 700, 35, 20, 10


def shorter_run_e2e_ms() -> float:
    """The chapter's request (700 ms to the first token, 35 ms a token after) cut to 10 tokens: E2E by eq. 8.1."""
    return e2e_estimate(CHAPTER_TTFT_MS, CHAPTER_TPOT_MS, SHORTER_TOKENS)


PREDICT_SHORTER = register(prediction(
    "06.predict_shorter_run_e2e", "Predict: E2E of a run with half the tokens and the same speed",
    "predicted_shorter_run_e2e_ms", shorter_run_e2e_ms, rtol=0.01,
    asked=f"TTFT {CHAPTER_TTFT_MS} ms, TPOT {CHAPTER_TPOT_MS} ms, {SHORTER_TOKENS} tokens instead of {CHAPTER_TOKENS}",
    hint="eq. 8.1: E2E = TTFT + (n - 1) x TPOT; nothing about the speed changed"))

QUEUE = 3  # requests arriving together


def requests_finishing_sooner_in_a_batch() -> int:
    """Of three requests arriving together on EXAMPLE_CPU (32-token prompts, 16 new tokens), how many finish sooner
    in one batch of 3 than served one after another in arrival order (the k-th then waits for k - 1 others)?"""
    alone = EXAMPLE_CPU.predict(PREDICT_PROMPT_LEN, PREDICT_OUTPUT_LEN, 1).e2e_s
    together = EXAMPLE_CPU.predict(PREDICT_PROMPT_LEN, PREDICT_OUTPUT_LEN, QUEUE).e2e_s
    return sum(together < k * alone for k in range(1, QUEUE + 1))


PREDICT_SOONER = register(prediction(
    "06.predict_requests_sooner", "Predict: how many of three requests finish sooner when batched",
    "predicted_requests_sooner", requests_finishing_sooner_in_a_batch,
    asked="EXAMPLE_CPU, three requests of 32 prompt tokens and 16 new tokens: one batch of 3 against one after "
          "another", hint="compare each request's finish time: served k-th, it waits for k - 1 whole requests first; "
                          "in the batch, all finish when the batch does"))
