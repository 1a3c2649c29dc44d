"""labkit.runtime.timing: the measurement plumbing on the real model at tiny sizes. Structure and invariants only:
no test here compares a time with a threshold (speed lives in benchmarks/timing.py)."""

import pytest
import torch

from labkit.core.sampling import CLEAR_MARGIN
from labkit.core.timing import request_metrics
from labkit.runtime import timing as rt
from labkit.runtime.generation import generate, greedy_margins

PROMPT = "The capital of France is Paris. The capital of Italy is"
TEXTS = ["The capital of France is Paris and", "Once upon a time there was a small dragon",
         "To make bread you need flour, water and"]


@pytest.fixture(scope="module")
def ids(embedded):
    return embedded.text_ids(PROMPT)


def test_held_threads_restores_the_count_even_after_an_error():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="inside"):
        with rt.held_threads(1) as held:
            assert held == torch.get_num_threads() == 1
            raise RuntimeError("inside")
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="threads must be an int >= 1"):
        with rt.held_threads(0):
            pass


def test_a_timed_generation_is_the_same_generation_with_consistent_stamps(embedded, ids):
    run = rt.timed_generation(embedded, ids, 4, threads=1)
    plain = generate(embedded, ids, 4)
    assert torch.equal(run.new_token_ids, plain.new_token_ids)  # timing changes nothing
    m = run.metrics
    assert (m.n_tokens, len(m.itl_s), run.threads, run.batch_size, run.prompt_len) == (4, 3, 1, 1, ids.shape[1])
    assert 0 < m.ttft_s <= m.e2e_s and m.tpot_s == pytest.approx(sum(m.itl_s) / 3)
    assert len(run.step_s) == 4 and all(s > 0 for s in run.step_s) and run.prefill_s == run.step_s[0]
    # The callback's stamps bracket the loop's own step times: each gap holds at least the step it follows.
    assert all(gap >= step * (1 - 1e-6) for gap, step in zip(m.itl_s, run.decode_step_s))
    assert run.context_lens[0] == 0 and run.context_lens[1:] == tuple(ids.shape[1] + k for k in range(3))


def test_one_token_has_no_tpot(embedded, ids):
    run = rt.timed_generation(embedded, ids, 1)
    assert run.metrics.tpot_s is None and run.metrics.itl_s == () and run.decode_step_s == ()
    assert run.metrics.e2e_s == run.metrics.ttft_s


def test_repeats_are_summarised_by_median_and_spread(embedded, ids):
    runs = rt.measure_generation(embedded, ids, 3, warmup=1, repeats=3, threads=1)
    assert len(runs.runs) == 3 and runs.warmup == 1 and runs.threads == 1 and runs.same_tokens
    ttft = runs.ttft_s
    assert ttft.n == 3 and ttft.minimum <= ttft.median <= ttft.maximum
    assert runs.tpot_s.n == 3 and set(runs.itl_p50_p99_s) == {50, 99}
    assert runs.e2e_s.median >= runs.ttft_s.minimum


def test_cached_and_uncached_logits_agree_on_identical_prefixes(embedded, ids):
    comparison = rt.cached_vs_uncached(embedded, ids, 4, threads=1)
    # Two paths, one greedy choice each step: only a claim because no step is near a tie on this prompt.
    assert float(greedy_margins(embedded, ids, comparison.new_token_ids).min()) > CLEAR_MARGIN
    assert comparison.tokens_identical and comparison.steps_compared == 4
    assert all(comparison.argmax_agree)
    assert comparison.max_abs_diff < 1e-3  # float32 reductions in another order: last bits only
    assert comparison.prefix_lens == tuple(ids.shape[1] + k for k in range(4))
    assert len(comparison.cached_step_s) == len(comparison.uncached_step_s) == 4


def test_probes_report_their_work_and_thread_count():
    bandwidth = rt.bandwidth_probe(4 * 2**20, threads=1, min_run_time=0.01)
    assert bandwidth.work == 4 * 2**20 and bandwidth.threads == 1 and bandwidth.n_measurements >= 1
    assert bandwidth.rate == bandwidth.work / bandwidth.median_s > 0
    matmul = rt.matmul_probe(64, threads=1, min_run_time=0.01)
    assert matmul.work == 2 * 64**3 and "64 x 64 matmul (float32)" == matmul.what
    roof = rt.MachineRoofline(bandwidth, matmul)
    assert roof.ridge == pytest.approx(matmul.rate / bandwidth.rate)
    with pytest.raises(ValueError, match=r"n_bytes must be an int >= 4 MiB \(4,194,304\), got 1000"):
        rt.bandwidth_probe(1000)


def test_batches_keep_every_request_identical_to_running_it_alone(embedded):
    prompts = rt.same_length_prompts(embedded, TEXTS)
    assert prompts.shape[0] == 3 and prompts.shape[1] == min(embedded.text_ids(t).shape[1] for t in TEXTS)
    points = rt.batching_sweep(embedded, prompts, (1, 3), 3, repeats=1, threads=1)
    # A batch of 3 and a batch of 1 are different computations: the same tokens because every margin is clear.
    assert float(greedy_margins(embedded, prompts, points[-1].runs.runs[0].new_token_ids).min()) > CLEAR_MARGIN
    assert [p.batch_size for p in points] == [1, 3] and all(p.same_as_alone for p in points)
    assert all(p.tokens_per_s == pytest.approx(p.batch_size * 3 / p.e2e_s) for p in points)
    with pytest.raises(ValueError, match="batch_size must be an int in \\[1, 3\\] \\(there are 3 prompts\\)"):
        rt.batching_sweep(embedded, prompts, (4,), 2)


def test_prefill_sweep_and_calibration_fit_nonnegative_lines(embedded):
    ids = embedded.text_ids(" ".join(TEXTS))
    sweep = rt.prefill_sweep(embedded, ids, (4, 12), repeats=1, threads=1)
    assert [length for length, _ in sweep] == [4, 12] and all(s > 0 for _, s in sweep)
    points = rt.batching_sweep(embedded, rt.same_length_prompts(embedded, TEXTS), (1, 2), 3, repeats=1, threads=1)
    fit = rt.calibrate(sweep, points)
    model = fit.model
    assert min(model.prefill_fixed_s, model.prefill_per_token_s, model.decode_fixed_s, model.decode_per_sequence_s,
               model.decode_per_cached_token_s) >= 0
    assert model.predict(8, 3).e2e_s > 0
    # Every decode point sits at the one short context of the batching sweep: the cached-token cost is not
    # identifiable from them (whatever the times are), and the fit says so.
    assert fit.decode.n_points == 2 and not fit.decode.identifiable[2]
    prompt_len = points[0].runs.runs[0].prompt_len
    assert fit.context_lens == (prompt_len, prompt_len + 1) and fit.batch_sizes == (1, 2)  # 3 tokens: 2 steps


def test_a_context_sweep_times_every_pair_from_one_prefill(embedded):
    ids = embedded.text_ids(" ".join(TEXTS))  # [1, 25]
    sweep = rt.decode_sweep(embedded, ids, [(1, 4), (2, 4), (1, 20), (2, 20), (3, 12)], steps=2, warmup=1,
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
    fit = rt.calibrate([(4, 0.05)], [], fitted)
    assert all(fit.decode.identifiable) and fit.decode.n_points == 4
    assert fit.context_lens == (5, 22) and fit.batch_sizes == (1, 2) and fit.prefill_tokens == (4, 20)
    with pytest.raises(ValueError, match=r"context_len must be an int in \[1, 24\] \(input_ids must hold one more"):
        rt.decode_sweep(embedded, ids, [(1, 27)])


def test_thread_sweep_holds_each_count(embedded, ids):
    points = rt.thread_sweep(embedded, ids[:, :6], (1,), max_new_tokens=2, repeats=1)
    assert [p.threads for p in points] == [1] and points[0].bandwidth_bytes_per_s > 0


def test_transformers_generate_timed_the_same_way_gives_the_same_tokens(embedded, ids):
    metrics, new_ids = rt.transformers_generation(embedded, ids, 4, threads=1)
    assert metrics.n_tokens == 4 and metrics.tpot_s is not None
    ours = generate(embedded, ids, 4).new_token_ids
    assert float(greedy_margins(embedded, ids, ours).min()) > CLEAR_MARGIN  # two loops: no near-tie to flip
    assert torch.equal(new_ids, ours)
    assert request_metrics([metrics.ttft_s], 0.0).ttft_s == metrics.ttft_s


def test_greedy_steps_run_the_greedy_loop_one_step_at_a_time(embedded, ids):
    step = rt.GreedySteps(embedded, ids)
    expected = generate(embedded, ids, 4).new_token_ids[0].tolist()
    for _ in range(2):  # step(0) starts the request again
        assert [step(k) for k in range(4)] == expected
    with pytest.raises(ValueError, match="step\\(0\\) starts a request"):
        rt.GreedySteps(embedded, ids)(1)
