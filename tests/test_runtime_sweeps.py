"""labkit.runtime.sweeps: sweeps over batches, prompt lengths, contexts and threads on the real model at tiny
sizes, and the latency model calibrated from them. Structure and invariants only: no test here compares a time
with a threshold (speed lives in benchmarks/timing.py)."""

import pytest

from labkit.core.distribution import CLEAR_MARGIN
from labkit.runtime import sweeps
from labkit.runtime.generation import greedy_margins

PROMPT = "The capital of France is Paris. The capital of Italy is"
TEXTS = ["The capital of France is Paris and", "Once upon a time there was a small dragon",
         "To make bread you need flour, water and"]


@pytest.fixture(scope="module")
def token_ids(embedded):
    return embedded.text_ids(PROMPT)  # [1, prompt_len]


def test_batches_keep_every_request_identical_to_running_it_alone(embedded):
    prompts = sweeps.same_length_prompts(embedded, TEXTS)
    assert prompts.shape[0] == 3 and prompts.shape[1] == min(embedded.text_ids(t).shape[1] for t in TEXTS)
    points = sweeps.batching_sweep(embedded, prompts, (1, 3), 3, repeats=1, threads=1)
    # A batch of 3 and a batch of 1 are different computations: the same tokens because every margin is clear.
    assert float(greedy_margins(embedded, prompts, points[-1].runs.runs[0].new_token_ids).min()) > CLEAR_MARGIN
    assert [p.batch_size for p in points] == [1, 3] and all(p.same_as_alone for p in points)
    assert all(p.tokens_per_s == pytest.approx(p.batch_size * 3 / p.e2e_s) for p in points)
    with pytest.raises(ValueError, match="batch_size must be an int in \\[1, 3\\] \\(there are 3 prompts\\)"):
        sweeps.batching_sweep(embedded, prompts, (4,), 2)


def test_prefill_sweep_and_calibration_fit_nonnegative_lines(embedded):
    token_ids = embedded.text_ids(" ".join(TEXTS))
    sweep = sweeps.prefill_sweep(embedded, token_ids, (4, 12), repeats=1, threads=1)
    assert [length for length, _ in sweep] == [4, 12] and all(s > 0 for _, s in sweep)
    prompts = sweeps.same_length_prompts(embedded, TEXTS)
    points = sweeps.batching_sweep(embedded, prompts, (1, 2), 3, repeats=1, threads=1)
    fit = sweeps.calibrate(sweep, points)
    latency = fit.latency
    assert min(latency.prefill_fixed_s, latency.prefill_per_token_s, latency.decode_fixed_s,
               latency.decode_per_sequence_s, latency.decode_per_cached_token_s) >= 0
    assert latency.predict(8, 3).e2e_s > 0
    # Every decode point sits at the one short context of the batching sweep: the cached-token cost is not
    # identifiable from them (whatever the times are), and the fit says so.
    assert fit.decode.n_points == 2 and not fit.decode.identifiable[2]
    prompt_len = points[0].runs.runs[0].prompt_len
    assert fit.context_lens == (prompt_len, prompt_len + 1) and fit.batch_sizes == (1, 2)  # 3 tokens: 2 steps


def test_a_context_sweep_times_every_pair_from_one_prefill(embedded):
    token_ids = embedded.text_ids(" ".join(TEXTS))  # [1, 25]
    sweep = sweeps.decode_sweep(embedded, token_ids, [(1, 4), (2, 4), (1, 20), (2, 20), (3, 12)], steps=2, warmup=1,
                            threads=1)
    assert sweep.prefill_len == 20 and sweep.prefill_s > 0 and sweep.threads == 1
    assert [(p.batch_size, p.context_len) for p in sweep.points] == [(1, 4), (2, 4), (1, 20), (2, 20), (3, 12)]
    held = sweep.point(3, 12)
    assert held.step_contexts == (13, 14) and held.median_context == 13.5 and len(held.step_s) == 2
    assert all(s > 0 for point in sweep.points for s in point.step_s)
    fitted = sweep.select([(1, 4), (2, 4), (1, 20), (2, 20)])
    assert len(fitted.points) == 4 and fitted.prefill_s == sweep.prefill_s
    with pytest.raises(ValueError, match=r"\(batch_size, context_len\) must be one of"):
        sweep.point(4, 12)
    fit = sweeps.calibrate([(4, 0.05)], [], fitted)
    assert all(fit.decode.identifiable) and fit.decode.n_points == 4
    assert fit.context_lens == (5, 22) and fit.batch_sizes == (1, 2) and fit.prefill_tokens == (4, 20)
    with pytest.raises(ValueError, match=r"context_len must be an int in \[1, 24\] \(token_ids must hold one more"):
        sweeps.decode_sweep(embedded, token_ids, [(1, 27)])


def test_thread_sweep_holds_each_count(embedded, token_ids):
    points = sweeps.thread_sweep(embedded, token_ids[:, :6], (1,), max_new_tokens=2, repeats=1)
    assert [p.threads for p in points] == [1] and points[0].bandwidth_bytes_per_s > 0
