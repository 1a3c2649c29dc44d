import pytest
from hypothesis import given
from hypothesis import strategies as st

from labkit.core.memory import kv_bytes_per_token
from labkit.core.paging import (
    EVENT_KINDS, Request, replay_block_events, request_events, request_stream, simulate_kv_allocation,
)
from labkit.core.presets import model_preset
from labkit.core.spec import ModelSpec

# 1 layer, 1 KV head of width 1, BF16: 2 x 2 B = 4 bytes per cached token, so tokens are easy to read off.
FOUR_BYTES = ModelSpec("4 B/token", n_layers=1, d_model=2, n_heads=1, n_kv_heads=1, head_dim=1, vocab=2)


@pytest.mark.parametrize("total_len,blocks", [(1, 1), (15, 1), (16, 1), (17, 2), (32, 2), (33, 3)])
def test_paged_reserves_whole_blocks(total_len, blocks):
    report = simulate_kv_allocation([Request(total_len, 0)], FOUR_BYTES, "paged", block_size=16)
    assert report.reserved_bytes == blocks * 16 * 4
    assert report.last_block_bytes == (blocks * 16 - total_len) * 4
    assert report.over_reserved_bytes == 0


def test_contiguous_reserves_max_seq_len_for_everyone():
    requests = [Request(10, 7), Request(3, 2)]  # 17 and 5 tokens
    report = simulate_kv_allocation(requests, FOUR_BYTES, "contiguous", max_seq_len=32)
    assert (report.used_bytes, report.reserved_bytes, report.over_reserved_bytes) == (22 * 4, 64 * 4, 42 * 4)
    assert report.last_block_bytes == 0 and report.waste_fraction == 42 / 64
    default = simulate_kv_allocation(requests, FOUR_BYTES, "contiguous")  # reserve the longest: 17
    assert default.reserved_bytes == 34 * 4


def test_requests_fit_stops_exactly_at_the_budget():
    requests = [Request(16, 0)] * 3  # one 64-byte block each
    fits = [simulate_kv_allocation(requests, FOUR_BYTES, "paged", kv_budget_bytes=b).requests_fit
            for b in (0, 63, 64, 127, 128, 192, 10**6)]
    assert fits == [0, 0, 1, 1, 2, 3, 3]
    assert simulate_kv_allocation(requests, FOUR_BYTES, "paged").requests_fit is None


def test_stream_is_reproducible_and_in_range():
    stream = request_stream(200, seed=7, prompt_len=(5, 9), output_len=(1, 3))
    assert stream == request_stream(200, seed=7, prompt_len=(5, 9), output_len=(1, 3))
    assert stream != request_stream(200, seed=8, prompt_len=(5, 9), output_len=(1, 3))
    assert {r.prompt_len for r in stream} == set(range(5, 10))  # both ends are drawn
    assert {r.output_len for r in stream} == {1, 2, 3}


def test_paging_admits_more_llama_requests_than_max_length_reservation():
    spec, stream = model_preset("Llama-3-8B"), request_stream(500, seed=0)
    kv_budget = 16 * 2**30
    contiguous = simulate_kv_allocation(stream, spec, "contiguous", max_seq_len=2048, kv_budget_bytes=kv_budget)
    paged = simulate_kv_allocation(stream, spec, "paged", block_size=16, kv_budget_bytes=kv_budget)
    assert contiguous.requests_fit == kv_budget // (2048 * kv_bytes_per_token(spec))  # 128 x 128 KiB per token
    assert paged.requests_fit > 2 * contiguous.requests_fit
    assert paged.waste_fraction < 0.02 < 0.5 < contiguous.waste_fraction


requests = st.lists(st.builds(Request, st.integers(1, 300), st.integers(0, 300)), max_size=30)


@given(requests, st.integers(1, 64))
def test_paged_waste_is_less_than_one_block_per_request(stream, block_size):
    paged = simulate_kv_allocation(stream, FOUR_BYTES, "paged", block_size=block_size)
    contiguous = simulate_kv_allocation(stream, FOUR_BYTES, "contiguous")
    assert paged.used_bytes == contiguous.used_bytes == 4 * sum(r.total_len for r in stream)
    assert 0 <= paged.last_block_bytes <= len(stream) * (block_size - 1) * 4
    assert paged.reserved_bytes % (block_size * 4) == 0


@pytest.mark.parametrize("call,error,match", [
    (lambda: simulate_kv_allocation([], FOUR_BYTES, "buddy"), ValueError,
     r"policy must be one of \['contiguous', 'paged'\], got 'buddy'"),
    (lambda: simulate_kv_allocation([Request(1, 1)], FOUR_BYTES, "paged", block_size=0), ValueError,
     r"block_size must be an int >= 1, got 0"),
    (lambda: simulate_kv_allocation([Request(40, 1)], FOUR_BYTES, "contiguous", max_seq_len=32), ValueError,
     r"max_seq_len must be >= the longest request \(41 tokens\), got 32"),
    (lambda: simulate_kv_allocation([(1, 2)], FOUR_BYTES, "paged"), TypeError, r"requests must be a sequence of labkit.core.paging.Request, got \[\(1, 2\)\]"),
    (lambda: request_stream(3, prompt_len=(9, 5)), ValueError, r"prompt_len must be a \(low, high\) range"),
    (lambda: request_stream(3, output_len=5), TypeError, r"output_len must be a \(low, high\) pair, got 5"),
    (lambda: request_stream(3, output_len=(1, 2, 3)), ValueError, r"output_len must be a \(low, high\) pair"),
    (lambda: Request(0, 3), ValueError, r"prompt_len must be an int >= 1, got 0"),
])
def test_errors_name_argument_and_value(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ----- the block table, event by event -----

def test_block_replay_wastes_what_the_snapshot_counts_as_last_block_bytes():
    requests = request_stream(300, seed=3, prompt_len=(1, 200), output_len=(1, 100))
    for block_size in (1, 7, 16, 64):
        replay = replay_block_events(request_events(requests, append_tokens=[1, 5, None][block_size % 3]),
                                     n_blocks=10**6, block_size=block_size)
        report = simulate_kv_allocation(requests, FOUR_BYTES, "paged", block_size=block_size)
        assert replay.refused == [] and replay.wasted_slots * 4 == report.last_block_bytes
        assert (10**6 - replay.free_blocks) * block_size * 4 == report.reserved_bytes


@given(st.lists(st.tuples(st.sampled_from(EVENT_KINDS), st.integers(0, 5), st.integers(1, 20)), max_size=30),
       st.integers(0, 12), st.integers(1, 8))
def test_block_replay_never_hands_out_a_block_twice(events, n_blocks, block_size):
    events = [(kind, request, 0 if kind == "free" else n) for kind, request, n in events]
    seen, safe = set(), []
    for kind, request, n in events:  # each request id allocated once
        if kind == "allocate" and request in seen:
            continue
        seen.add(request)
        safe.append((kind, request, n))
    replay = replay_block_events(safe, n_blocks, block_size)
    held = [block for blocks in replay.block_tables.values() for block in blocks]
    assert len(held) == len(set(held)) and set(held) <= set(range(n_blocks))
    assert replay.free_blocks + len(held) == n_blocks
    assert 0 <= replay.wasted_slots < block_size * len(replay.block_tables) or not replay.block_tables


def test_a_refused_event_changes_nothing_and_freed_blocks_are_reused_lowest_first():
    events = [("allocate", 0, 8), ("allocate", 1, 5), ("append", 0, 1), ("free", 1, 0), ("free", 0, 0),
              ("allocate", 2, 1)]
    replay = replay_block_events(events, n_blocks=3, block_size=4)
    assert replay == ({2: [0]}, 2, 3, [1])
    with pytest.raises(ValueError, match="kind"):
        replay_block_events([("grow", 0, 1)], 2, 4)
