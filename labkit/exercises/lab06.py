"""Lab 06's exercises: the KV-cached greedy loop written by hand (identical tokens to labkit's ``generate``, the
prefill once and the decode calls counted), a timing harness checked on a clock the checker controls, the decode floor from a spec and a
bandwidth, the line time = overhead + bytes / bandwidth fitted through measured weight formats, and predictions
(forward calls after the prefill, a shorter run's end-to-end latency, batching's throughput and who finishes
sooner) checked against the model and labkit's arithmetic.

The harness's hand case is the classic example, 700 ms to the first token, then 35 ms a token for 20 tokens: TTFT
700 ms, TPOT 35 ms, E2E = TTFT + (n - 1) x TPOT = 1,365 ms. The bug zoos hold the mistakes learners make in a
decoding loop (re-feeding the prefix, feeding a stale token, reading the first position, one step too few or
too many, the end token), in a timing harness (no warm-up, a mean, the first token in TPOT, n intervals, the
wrong origin, a stamp taken before the step) and in the fit (a line through the origin, means of noisy repeats,
GiB or bytes per second for GB/s, seconds for ms).
"""

from __future__ import annotations

import functools
import statistics

import torch

from labkit.core.latency_model import EXAMPLE_CPU
from labkit.core.memory import GB, GIB, kv_cache_bytes
from labkit.core.presets import model_preset
from labkit.core.roofline import decode_floor_s, fit_step_time
from labkit.core.spec import ModelSpec
from labkit.core.timing import ScriptedClock, ScriptedSteps, e2e_estimate, request_metrics
from labkit.exercises import register
from labkit.exercises.definitions import Case, CodeExercise, Mistake, prediction
from labkit.exercises.random_cases import random_spec
from labkit.runtime.step_counter import StepCounter

# EXAMPLE_CPU (labkit.core.latency_model): prefill 20 ms + 1.5 ms per prompt token; a decode step 70 ms + 6 ms per
# sequence + 2 us per cached token. The batching predictions ask about 32-token prompts and 16 new tokens.
PREDICT_PROMPT_LEN, PREDICT_OUTPUT_LEN, PREDICT_BATCH = 32, 16, 8


# ----- 06.predict_forward_calls: predict, then count -----

OUTPUT_TOKENS = 8


def decode_calls_for_eight_tokens() -> int:
    """Counted on the model: the forward calls after the prefill while labkit's greedy loop writes 8 tokens (the
    prefill's logits choose the first, so n - 1)."""
    from labkit.runtime.generation import generate
    from labkit.runtime.models import load_model

    lm = load_model(progress=False)
    steps = []
    generate(lm, lm.text_ids("The tide"), OUTPUT_TOKENS, on_step=steps.append)
    return sum(step.phase == "decode" for step in steps)


PREDICT_CALLS = register(prediction(
    "06.predict_forward_calls", "Predict: forward calls after the prefill for eight output tokens",
    "forward_calls_after_prefill", decode_calls_for_eight_tokens,
    asked="eight output tokens, one prefill already run", hint="return a number of forward calls, such as 3",
    reveal="""The prefill's logits at the last prompt position already choose the first new token. Each decode call
    feeds the newest token, and its logits choose the one after it: for n tokens, n - 1 decode calls (7 for eight),
    and none at all for one token. The last token is chosen but never fed back. The next cell counts the calls.""",
    # "first new token" alone also names what a chunk's mask shows (section 7): the sentence that answers is the choice
    giveaways=("n - 1", "n − 1", "n-1", "7 decode", "seven decode", "decode: 7", "choose the first new token",
               "needs no decode call", "never fed back")))

# ----- 06.greedy_loop: the KV-cached greedy loop, by hand -----

# "The tide" and "The" in the embedded model's tokenizer; greedy after "The tide": 282, 260, 1896, 28, 253, ...
THE_TIDE, THE = torch.tensor([[504, 17662]]), torch.tensor([[504]])
THIRD_TOKEN = 1896  # the third greedy token after "The tide": an end token there stops the loop after it
LOOP_PROMPTS = ("Once upon a time", "The capital of France is", "Water boils at", "My favourite food is",
                "The best way to learn is", "In the morning I", "Cats and dogs are", "The sun rises in the")


@functools.lru_cache(maxsize=256)
def _greedy_after(prompt: tuple[int, ...], max_new_tokens: int) -> tuple[int, ...]:
    """labkit's greedy continuation of one prompt (no end token), once per process."""
    from labkit.runtime.generation import generate
    from labkit.runtime.models import load_model

    return tuple(generate(load_model(progress=False), torch.tensor([prompt]), max_new_tokens).new_token_ids[0].tolist())


def reference_greedy_tokens(runner: StepCounter, prompt_ids: torch.Tensor, max_new_tokens: int,
                            eos_token_id: int | None) -> list[int]:
    """labkit's answer: ``generate``'s greedy tokens, up to and including the first end token."""
    tokens = list(_greedy_after(tuple(prompt_ids[0].tolist()), max_new_tokens))
    if eos_token_id is not None and eos_token_id in tokens:
        tokens = tokens[: tokens.index(eos_token_id) + 1]
    return tokens


def _loop_case(prompt_ids: torch.Tensor, max_new_tokens: int, eos_token_id: int | None, decode_calls: int,
               label: str) -> Case:
    runner = StepCounter(max_prefill_calls=1, max_decode_calls=decode_calls)  # the embedded model, loaded when used
    return Case((runner, prompt_ids, max_new_tokens, eos_token_id), label=label)


def _random_loop_case(generator: torch.Generator) -> Case:
    from labkit.runtime.models import load_model

    text = LOOP_PROMPTS[int(torch.randint(0, len(LOOP_PROMPTS), (1,), generator=generator))]
    prompt_ids = load_model(progress=False).text_ids(text)
    max_new_tokens = int(torch.randint(2, 4, (1,), generator=generator))
    tokens = _greedy_after(tuple(prompt_ids[0].tolist()), max_new_tokens)
    eos = None
    if bool(torch.rand((), generator=generator) < 0.5):  # an end token the loop meets on the way
        eos = tokens[int(torch.randint(0, max_new_tokens, (1,), generator=generator))]
    n_out = len(reference_greedy_tokens(StepCounter(), prompt_ids, max_new_tokens, eos))
    return _loop_case(prompt_ids, max_new_tokens, eos, n_out - 1,
                      f"{text!r}, {max_new_tokens} new tokens, end token {eos}")


def _first_token(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1].argmax(dim=-1, keepdim=True)


def _loop(runner, prompt_ids, max_new_tokens, eos_token_id, *, feed_prompt=False, position=-1, steps=None,
          keep_eos=True):
    logits, cache = runner.prefill(prompt_ids)
    token = logits[:, position].argmax(dim=-1, keepdim=True)
    tokens: list[int] = []
    wanted = max_new_tokens if steps is None else steps
    while True:
        if int(token) == eos_token_id and not keep_eos:
            return tokens
        tokens.append(int(token))
        if len(tokens) >= wanted or int(token) == eos_token_id:
            return tokens
        fed = prompt_ids[:, -1:] if feed_prompt else token
        logits, cache = runner.decode_one_token(fed, cache)
        token = _first_token(logits)


def _stale_token(runner, prompt_ids, max_new_tokens, eos_token_id):
    return _loop(runner, prompt_ids, max_new_tokens, eos_token_id, feed_prompt=True)


def _first_position(runner, prompt_ids, max_new_tokens, eos_token_id):
    return _loop(runner, prompt_ids, max_new_tokens, eos_token_id, position=0)


def _one_short(runner, prompt_ids, max_new_tokens, eos_token_id):
    return _loop(runner, prompt_ids, max_new_tokens, eos_token_id, steps=max(1, max_new_tokens - 1))


def _drops_eos(runner, prompt_ids, max_new_tokens, eos_token_id):
    return _loop(runner, prompt_ids, max_new_tokens, eos_token_id, keep_eos=False)


GREEDY_LOOP = register(CodeExercise(
    id="06.greedy_loop",
    title="The KV-cached greedy loop: prefill once, then decode with the cache",
    function="greedy_generate",
    reference=reference_greedy_tokens,
    allowed=(StepCounter,),
    points=3,
    n_random=2,
    time_limit_s=30.0,  # a few forward passes: generous, for a busy machine (about 1 s on a quiet one)
    hand_cases=(
        _loop_case(THE_TIDE, 1, None, 0, "one new token: the prefill's logits choose it, no decode call"),
        _loop_case(THE, 3, None, 2, "a one-token prompt, three new tokens: one prefill, two decode calls"),
        _loop_case(THE_TIDE, 5, THIRD_TOKEN, 2, f"end token {THIRD_TOKEN}, the third token chosen: keep it, "
                                                "then stop (two decode calls)"),
    ),
    random_case=_random_loop_case,
    hints=("prefill the prompt once; take the argmax of its last position's logits; then, until you have "
           "max_new_tokens tokens or the end token, feed only the newest token to decode_one_token",),
    mistakes=(
        Mistake("feed decode_one_token the token you just chose: the cache holds everything before it",
                _stale_token),
        Mistake("the next token is predicted at the prompt's last position: logits[:, -1], not logits[:, 0]",
                _first_position),
        Mistake("one token short: the prefill's logits give the first token, then max_new_tokens - 1 decode calls "
                "give the rest", _one_short),
        Mistake("keep the end token itself (labkit's generate returns it), then stop", _drops_eos),
    ),
))


# ----- 06.latency_harness: TTFT, TPOT and E2E with warm-up, repeats and medians -----


def reference_latency_harness(step, clock, n_tokens: int, warmup: int, repeats: int) -> torch.Tensor:
    """labkit's answer: ``warmup`` untimed requests, then per repeat the metrics of its emission times; the medians
    of TTFT, TPOT and E2E as a float64 tensor ``[3]``, in the clock's unit."""
    for _ in range(warmup):
        for k in range(n_tokens):
            step(k)
    runs = []
    for _ in range(repeats):
        start = clock()
        stamps = []
        for k in range(n_tokens):
            step(k)
            stamps.append(clock())
        runs.append(request_metrics(stamps, start))
    return torch.tensor([statistics.median(run.ttft_s for run in runs),
                         statistics.median(run.tpot_s for run in runs),
                         statistics.median(run.e2e_s for run in runs)], dtype=torch.float64)


def _script(prefill_s: float, decode_s: float, *, warmup: int = 0, repeats: int = 1, start_s: float = 0.0,
            pause: tuple[int, float] | None = None, jitter: torch.Generator | None = None,
            n_tokens: int = 2) -> tuple[ScriptedSteps, ScriptedClock]:
    """A scripted generation: the first ``warmup`` requests run 3x slower (cold), ``pause`` = (request, seconds)
    adds a pause to that request's last decode step, ``jitter`` spreads every step by up to +-10 %."""
    rows = []
    for request in range(warmup + repeats + 1):
        row = [prefill_s] + [decode_s] * (n_tokens - 1)
        if jitter is not None:
            row = [value * (0.9 + 0.2 * float(torch.rand((), generator=jitter))) for value in row]
        if request < warmup:
            row = [3 * value for value in row]
        if pause is not None and request == pause[0]:
            row[-1] += pause[1]
        rows.append([round(value, 6) for value in row])
    clock = ScriptedClock(start_s)
    return ScriptedSteps(clock, rows), clock


def _harness_case(label: str, n_tokens: int, warmup: int, repeats: int, **script) -> Case:
    step, clock = _script(n_tokens=n_tokens, warmup=warmup, repeats=repeats, **script)
    return Case((step, clock, n_tokens, warmup, repeats), label=label)


def _random_harness_case(generator: torch.Generator) -> Case:
    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=generator))

    n_tokens, warmup, repeats = draw(2, 12), draw(0, 2), 2 * draw(0, 2) + 1
    prefill_s, decode_s = 0.1 + 0.8 * float(torch.rand((), generator=generator)), 0.02 + 0.05 * float(
        torch.rand((), generator=generator))
    start_s = round(1000 * float(torch.rand((), generator=generator)), 3)
    pause = (warmup + draw(0, repeats - 1), 0.5) if repeats > 1 else None
    return _harness_case(f"{n_tokens} tokens, {warmup} warm-up, {repeats} repeats, clock at {start_s} s",
                         n_tokens, warmup, repeats, prefill_s=prefill_s, decode_s=decode_s, start_s=start_s,
                         pause=pause, jitter=generator)


def _harness(step, clock, n_tokens, warmup, repeats, *, skip_warmup=False, average=statistics.median,
             tpot_rule="gaps", origin="request", stamp="after"):
    for _ in range(0 if skip_warmup else warmup):
        for k in range(n_tokens):
            step(k)
    runs, first_start = [], clock()
    for _ in range(repeats):
        start = clock() if origin == "request" else first_start
        stamps = []
        for k in range(n_tokens):
            if stamp == "before":
                stamps.append(clock())
            step(k)
            if stamp == "after":
                stamps.append(clock())
        ttft, e2e = stamps[0] - start, stamps[-1] - start
        if tpot_rule == "gaps":
            tpot_value = (stamps[-1] - stamps[0]) / (n_tokens - 1)
        elif tpot_rule == "n intervals":
            tpot_value = (stamps[-1] - stamps[0]) / n_tokens
        else:  # the first token's wait counted among the intervals
            tpot_value = (stamps[-1] - start) / n_tokens
        runs.append((ttft, tpot_value, e2e))
    return torch.tensor([average(run[i] for run in runs) for i in range(3)], dtype=torch.float64)


def _no_warmup(step, clock, n_tokens, warmup, repeats):
    return _harness(step, clock, n_tokens, warmup, repeats, skip_warmup=True)


def _mean(step, clock, n_tokens, warmup, repeats):
    return _harness(step, clock, n_tokens, warmup, repeats, average=statistics.fmean)


def _first_token_in_tpot(step, clock, n_tokens, warmup, repeats):
    return _harness(step, clock, n_tokens, warmup, repeats, tpot_rule="first token")


def _n_intervals(step, clock, n_tokens, warmup, repeats):
    return _harness(step, clock, n_tokens, warmup, repeats, tpot_rule="n intervals")


def _origin_before_warmup(step, clock, n_tokens, warmup, repeats):
    start = clock()  # read once, before the warm-up
    for _ in range(warmup):
        for k in range(n_tokens):
            step(k)
    runs = []
    for _ in range(repeats):
        stamps = []
        for k in range(n_tokens):
            step(k)
            stamps.append(clock())
        runs.append((stamps[0] - start, (stamps[-1] - stamps[0]) / (n_tokens - 1), stamps[-1] - start))
    return torch.tensor([statistics.median(run[i] for run in runs) for i in range(3)], dtype=torch.float64)


def _origin_once(step, clock, n_tokens, warmup, repeats):
    return _harness(step, clock, n_tokens, warmup, repeats, origin="once")


def _stamp_before_step(step, clock, n_tokens, warmup, repeats):
    return _harness(step, clock, n_tokens, warmup, repeats, stamp="before")


LATENCY_HARNESS = register(CodeExercise(
    id="06.latency_harness",
    title="A timing harness: warm-up, repeats, and the medians of TTFT, TPOT and E2E",
    function="measure_latency",
    reference=reference_latency_harness,
    allowed=(ScriptedSteps, ScriptedClock),
    points=3,
    rtol=1e-6,
    atol=1e-9,
    hand_cases=(
        _harness_case("a steady machine: prefill 0.7 s, then 0.035 s a token, 20 tokens, one run: TTFT 0.7, "
                      "TPOT 0.035, E2E 0.7 + 19 x 0.035 = 1.365", 20, 0, 1, prefill_s=0.7, decode_s=0.035),
        _harness_case("two tokens: one interval", 2, 0, 1, prefill_s=0.25, decode_s=0.0625),
        _harness_case("the first request runs 3x slower (cold): one warm-up request, then one timed", 6, 1, 1,
                      prefill_s=0.5, decode_s=0.05),
        _harness_case("one of three repeats has a 0.5 s pause in its last step; the clock starts at 1,000 s", 5, 1,
                      3, prefill_s=0.4, decode_s=0.04, start_s=1000.0, pause=(2, 0.5)),
        _harness_case("two cold requests, two warm-up requests, three repeats", 4, 2, 3, prefill_s=0.3,
                      decode_s=0.03, start_s=50.0),
    ),
    random_case=_random_harness_case,
    hints=("for each repeat: start = clock() just before step(0); after each step(k), stamp clock(); TTFT = t_1 - "
           "start, TPOT = (t_n - t_1) / (n - 1), E2E = t_n - start; return the medians",),
    mistakes=(
        Mistake("run `warmup` whole requests first and drop their times: the first requests pay for allocation "
                "and set-up", _no_warmup),
        Mistake("each repeat is a request of its own: read its start on the clock just before its step(0), not "
                "once before the warm-up", _origin_before_warmup),
        Mistake("each repeat is a request of its own: read its start on the clock just before its step(0), not "
                "once before all the repeats", _origin_once),
        Mistake("stamp the clock after step(k) returns: a token is emitted when its step ends, not when it "
                "starts", _stamp_before_step),
        Mistake("TPOT leaves the first token out: (t_n - t_1) / (n - 1), the mean of the n - 1 gaps after it",
                _first_token_in_tpot),
        Mistake("n tokens have n - 1 gaps between them: divide t_n - t_1 by n - 1, not n", _n_intervals),
        Mistake("report the median over the repeats, not the mean: one slow repeat drags a mean a long way",
                _mean),
    ),
))


# ----- 06.predict_shorter_run_e2e: predict, then check -----

EXAMPLE_TTFT_MS, EXAMPLE_TPOT_MS, EXAMPLE_TOKENS, SHORTER_TOKENS = 700, 35, 20, 10


def shorter_run_e2e_ms() -> float:
    """The example request (700 ms to the first token, 35 ms a token after) cut to 10 tokens:
    E2E = TTFT + (n - 1) x TPOT."""
    return e2e_estimate(EXAMPLE_TTFT_MS, EXAMPLE_TPOT_MS, SHORTER_TOKENS)


PREDICT_SHORTER = register(prediction(
    "06.predict_shorter_run_e2e", "Predict: E2E of a run with half the tokens and the same speed",
    "predicted_shorter_run_e2e_ms", shorter_run_e2e_ms, rtol=0.01,
    asked=f"TTFT {EXAMPLE_TTFT_MS} ms, TPOT {EXAMPLE_TPOT_MS} ms, {SHORTER_TOKENS} tokens instead of {EXAMPLE_TOKENS}",
    hint="return a number of milliseconds, such as 900",
    reveal="""E2E = TTFT + (n - 1) × TPOT: 700 + 9 × 35 = 1,015 ms for 10 tokens, against 1,365 ms for 20. A
    quarter lower, with not one token computed faster: E2E mixes speed with length, so two runs' E2E compare their
    speeds only at the same number of tokens.""",
    # "quarter" and "25 %" alone name other things on the page (a byte ratio, the latency model's target)
    giveaways=("quarter lower", "quarter less", "1,015", "1015", "25 % lower", "25% lower", "9 × 35", "9 x 35",
               "e2e_estimate(700, 35, 10)")))

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


def _random_floor_case(generator: torch.Generator) -> Case:
    spec = random_spec(generator, head_dims=(64, 80, 128), max_layers=80, with_params=True)
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

DECODE_FLOOR = register(CodeExercise(
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


# ----- 06.overhead_bandwidth_fit: time = overhead + bytes / bandwidth, read off measured formats -----


def reference_overhead_bandwidth_fit(bytes_read: torch.Tensor, step_s: torch.Tensor) -> torch.Tensor:
    """labkit's answer: ``fit_step_time`` through each format's median; [overhead in ms, bandwidth in GB/s]."""
    fit = fit_step_time(bytes_read.tolist(), step_s.tolist())
    return torch.tensor([fit.overhead_s * 1e3, fit.bandwidth_bytes_per_s / GB], dtype=torch.float64)


def _fit_case(label: str, bytes_read, overhead_ms: float, bandwidth_gb_per_s: float, *, repeats: int = 1,
              stall: float = 0.0, off_line_ms=None) -> Case:
    """Step times on the line overhead + bytes / bandwidth, every repeat equal, except the last repeat of each
    format stalled by ``stall`` x its time, and ``off_line_ms`` added to each format's times."""
    rows = []
    for k, size in enumerate(bytes_read):
        time_s = overhead_ms / 1e3 + size / (bandwidth_gb_per_s * GB) + (off_line_ms[k] / 1e3 if off_line_ms else 0)
        rows.append([time_s] * (repeats - 1) + [time_s * (1 + stall)])
    return Case((torch.tensor(bytes_read, dtype=torch.float64), torch.tensor(rows, dtype=torch.float64)),
                label=label)


def _random_fit_case(generator: torch.Generator) -> Case:
    def uniform(low: float, high: float) -> float:
        return low + (high - low) * float(torch.rand((), generator=generator))

    n_formats = int(torch.randint(2, 5, (1,), generator=generator))
    bytes_per_value = [4, 2, 1, 0.5][:n_formats]
    overhead_ms, bandwidth = uniform(2, 60), uniform(5, 100)
    largest_ms = uniform(10, 100)  # the largest format's memory term: well above the noise
    n_params = largest_ms / 1e3 * bandwidth * GB / bytes_per_value[0]
    bytes_read = [round(n_params * size) for size in bytes_per_value]
    repeats = [1, 3, 5][int(torch.randint(0, 3, (1,), generator=generator))]
    rows = []
    for size in bytes_read:
        truth = overhead_ms / 1e3 + size / (bandwidth * GB)
        row = [truth * (1 + 0.01 * float(torch.randn((), generator=generator))) for _ in range(repeats)]
        if repeats > 1:  # one repeat stalled, as a busy machine does
            row[int(torch.randint(0, repeats, (1,), generator=generator))] *= uniform(1.5, 3)
        rows.append(row)
    return Case((torch.tensor(bytes_read, dtype=torch.float64), torch.tensor(rows, dtype=torch.float64)),
                label=f"{n_formats} formats, {repeats} repeat(s) each")


def _fit(bytes_read, step_s, *, average="median", origin=False, byte_unit=GB, overhead_unit=1e3):
    x = bytes_read.double()
    y = step_s.double().median(dim=1).values if average == "median" else step_s.double().mean(dim=1)
    if origin:  # time = bytes / bandwidth: no overhead term
        slope, overhead = float((x * y).sum() / (x * x).sum()), 0.0
    else:
        dx = x - x.mean()
        slope = float((dx * (y - y.mean())).sum() / (dx * dx).sum())
        overhead = float(y.mean()) - slope * float(x.mean())
    return torch.tensor([overhead * overhead_unit, 1 / slope / byte_unit], dtype=torch.float64)


def _through_origin(bytes_read, step_s):
    return _fit(bytes_read, step_s, origin=True)


def _means(bytes_read, step_s):
    return _fit(bytes_read, step_s, average="mean")


def _gib(bytes_read, step_s):
    return _fit(bytes_read, step_s, byte_unit=GIB)


def _bytes_per_s(bytes_read, step_s):
    return _fit(bytes_read, step_s, byte_unit=1)


def _overhead_in_s(bytes_read, step_s):
    return _fit(bytes_read, step_s, overhead_unit=1)


_SMOL_BYTES = [538_060_032, 269_030_016, 134_515_008]  # SmolLM2-135M's weights at 4, 2 and 1 bytes each

OVERHEAD_FIT = register(CodeExercise(
    id="06.overhead_bandwidth_fit",
    title="Overhead and bandwidth: a least-squares line through (bytes read, step time)",
    function="fit_overhead_bandwidth",
    reference=reference_overhead_bandwidth_fit,
    points=2,
    rtol=1e-4,  # a float32 fit of times near 0.05 s lands within a few 1e-6; every mistake below is off by > 7 %
    atol=1e-9,
    hand_cases=(
        _fit_case("three formats exactly on 20 ms + bytes / 25 GB/s, one repeat each", _SMOL_BYTES, 20, 25),
        _fit_case("two formats: the line through both points", _SMOL_BYTES[:2], 8, 30),
        _fit_case("five repeats, the last of each stalled to 3x its time: the medians lie on 12 ms + bytes / "
                  "40 GB/s", _SMOL_BYTES, 12, 40, repeats=5, stall=2.0),
        _fit_case("three points off one line (+1, -2, +1 ms): least squares through all three", _SMOL_BYTES, 30, 20,
                  off_line_ms=(1.0, -2.0, 1.0)),
        _fit_case("four formats (4, 2, 1, 0.5 bytes a weight), three repeats, one stalled by half", [
            *_SMOL_BYTES, 67_257_504], 45, 60, repeats=3, stall=0.5),
    ),
    random_case=_random_fit_case,
    hints=("take each format's median step time; fit time = a + b x bytes by least squares (e.g. numpy.polyfit("
           "bytes, medians, 1)); overhead_ms = a x 1000, bandwidth_gb_per_s = 1 / b / 10**9",),
    mistakes=(
        Mistake("the line has an intercept: a step costs its overhead whatever it reads; fit time = a + b x bytes, "
                "not time = b x bytes through the origin", _through_origin),
        Mistake("take each format's median over its repeats, not the mean: one stalled repeat drags a mean a long "
                "way", _means),
        Mistake("GB/s are 10**9 bytes per second, not 2**30", _gib),
        Mistake("return the bandwidth in GB/s: 1 / slope is in bytes per second, divide by 10**9", _bytes_per_s),
        Mistake("return the overhead in milliseconds: the intercept is in seconds, multiply by 1000",
                _overhead_in_s),
    ),
))


# ----- 06.predict_requests_sooner: predict, then check -----

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
          "another", hint="return a number of requests (of 3), such as 1",
    reveal="""Two of the three. In the batch all three finish together, when the batch does; one after another,
    the k-th finishes after k whole requests. The batch ends after more than one request's time but less than
    two: the first in line, which alone would have finished after one request, finishes later in the batch, and
    the other two sooner. Servers therefore cap the batch and use continuous batching: a finished request leaves
    the batch and a waiting one joins at the next step (Orca, then vLLM).""",
    giveaways=("Two of the three", "first in line", "2 of 3", "-> later", "finishes later", "gains least")))


# ----- 06.predict_batch_throughput: predict, then check -----



def throughput_gain_on_the_example() -> float:
    """Throughput at batch 8 / throughput at batch 1 on EXAMPLE_CPU (32-token prompts, 16 new tokens)."""
    batched = EXAMPLE_CPU.predict(PREDICT_PROMPT_LEN, PREDICT_OUTPUT_LEN, PREDICT_BATCH)
    alone = EXAMPLE_CPU.predict(PREDICT_PROMPT_LEN, PREDICT_OUTPUT_LEN, 1)
    return batched.tokens_per_s / alone.tokens_per_s


PREDICT = register(prediction(
    "06.predict_batch_throughput", "Predict, then check: the throughput gain of a batch of 8",
    "predicted_throughput_gain", throughput_gain_on_the_example, rtol=0.25,  # within 25% of the model's answer
    asked="EXAMPLE_CPU, 32-token prompts, 16 new tokens, batch 8 against batch 1",
    hint="return your prediction as a number, such as 2.5 for 2.5 times the tokens per second",
    reveal="""Less than 8×: each decode step shares one read of the weights, but does 6 ms of work per sequence,
    and all eight prompts are prefilled before anyone's first token. The next cell prints both batches' TTFT, TPOT
    and throughput.""",
    # As a gain only ("x4.43", "4.43×"): a bare 4.43 is also a latency a slower processor measures (on a 2 GHz
    # Zen 1 the timing explorer read "E2E ... 4.43 s at 16").
    giveaways=("Less than 8", "x4.43", "4.43×", "4.43x", "4.4×", "4.4x")))
