"""labkit.runtime.timing: timing generations on the real model at tiny sizes. Structure and invariants only:
no test here compares a time with a threshold (speed lives in benchmarks/timing.py)."""

import pytest
import torch

from labkit.core.distribution import CLEAR_MARGIN
from labkit.core.timing import request_metrics
from labkit.runtime import timing as rt
from labkit.runtime.generation import generate, greedy_margins

PROMPT = "The capital of France is Paris. The capital of Italy is"


@pytest.fixture(scope="module")
def token_ids(embedded):
    return embedded.text_ids(PROMPT)  # [1, prompt_len]


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


def test_a_timed_generation_is_the_same_generation_with_consistent_stamps(embedded, token_ids):
    run = rt.timed_generation(embedded, token_ids, 4, threads=1)
    plain = generate(embedded, token_ids, 4)
    assert torch.equal(run.new_token_ids, plain.new_token_ids)  # timing changes nothing
    m = run.metrics
    assert (m.n_tokens, len(m.itl_s), run.threads, run.batch_size, run.prompt_len) == (4, 3, 1, 1, token_ids.shape[1])
    assert 0 < m.ttft_s <= m.e2e_s and m.tpot_s == pytest.approx(sum(m.itl_s) / 3)
    assert len(run.step_s) == 4 and all(s > 0 for s in run.step_s) and run.prefill_s == run.step_s[0]
    # The callback's stamps bracket the loop's own step times: each gap holds at least the step it follows.
    assert all(gap >= step * (1 - 1e-6) for gap, step in zip(m.itl_s, run.decode_step_s))
    assert run.context_lens[0] == 0 and run.context_lens[1:] == tuple(token_ids.shape[1] + k for k in range(3))


def test_one_token_has_no_tpot(embedded, token_ids):
    run = rt.timed_generation(embedded, token_ids, 1)
    assert run.metrics.tpot_s is None and run.metrics.itl_s == () and run.decode_step_s == ()
    assert run.metrics.e2e_s == run.metrics.ttft_s


def test_repeats_are_summarised_by_median_and_spread(embedded, token_ids):
    runs = rt.measure_generation(embedded, token_ids, 3, warmup=1, repeats=3, threads=1)
    assert len(runs.runs) == 3 and runs.warmup == 1 and runs.threads == 1 and runs.same_tokens
    ttft = runs.ttft_s
    assert ttft.n == 3 and ttft.minimum <= ttft.median <= ttft.maximum
    assert runs.tpot_s.n == 3 and set(runs.itl_p50_p99_s) == {50, 99}
    assert runs.e2e_s.median >= runs.ttft_s.minimum


def test_cached_and_uncached_logits_agree_on_identical_prefixes(embedded, token_ids):
    comparison = rt.cached_vs_uncached(embedded, token_ids, 4, threads=1)
    # Two paths, one greedy choice each step: only a claim because no step is near a tie on this prompt.
    assert float(greedy_margins(embedded, token_ids, comparison.new_token_ids).min()) > CLEAR_MARGIN
    assert comparison.tokens_identical and comparison.steps_compared == 4
    assert all(comparison.argmax_agree)
    assert comparison.max_abs_diff < 1e-3  # float32 reductions in another order: last bits only
    assert comparison.prefix_lens == tuple(token_ids.shape[1] + k for k in range(4))
    assert len(comparison.cached_step_s) == len(comparison.uncached_step_s) == 4


def test_transformers_generate_timed_the_same_way_gives_the_same_tokens(embedded, token_ids):
    metrics, new_ids = rt.transformers_generation(embedded, token_ids, 4, threads=1)
    assert metrics.n_tokens == 4 and metrics.tpot_s is not None
    ours = generate(embedded, token_ids, 4).new_token_ids
    assert float(greedy_margins(embedded, token_ids, ours).min()) > CLEAR_MARGIN  # two loops: no near-tie to flip
    assert torch.equal(new_ids, ours)
    assert request_metrics([metrics.ttft_s], 0.0).ttft_s == metrics.ttft_s


def test_greedy_steps_run_the_greedy_loop_one_step_at_a_time(embedded, token_ids):
    step = rt.GreedySteps(embedded, token_ids)
    expected = generate(embedded, token_ids, 4).new_token_ids[0].tolist()
    for _ in range(2):  # step(0) starts the request again
        assert [step(k) for k in range(4)] == expected
    with pytest.raises(ValueError, match="step\\(0\\) starts a request"):
        rt.GreedySteps(embedded, token_ids)(1)
