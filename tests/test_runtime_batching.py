"""labkit.runtime.batching: requests of different lengths, left-padded in batches, each get the tokens they get
alone; a request stops at its end token while its batch goes on."""

import pytest
import torch

from toys import Bigram
from alignment import assert_clear_greedy_choices
from labkit.runtime.batching import generate_requests, left_pad
from labkit.runtime.generation import generate

REQUESTS = ["The capital of France is", "Once upon a time",
            "In 1889 the Eiffel Tower was finished; it was then the tallest structure in the world. Today it",
            "Water boils at"]


@pytest.fixture(scope="module")
def requests(embedded):
    prompts = [embedded.text_ids(text)[0] for text in REQUESTS]
    alone = [generate(embedded, p[None], 8).new_token_ids for p in prompts]
    for prompt, new_token_ids in zip(prompts, alone):  # a batch is another path: no step may be a near-tie
        assert_clear_greedy_choices(embedded, prompt[None], new_token_ids)
    return prompts, [new_token_ids[0].tolist() for new_token_ids in alone]


@pytest.mark.parametrize("batch_size", [2, 4])
def test_every_request_gets_the_tokens_it_gets_alone(embedded, requests, batch_size):
    prompts, alone = requests
    run = generate_requests(embedded, prompts, 8, batch_size=batch_size)
    assert [r.request for r in run.results] == [0, 1, 2, 3]  # back in request order after sorting by length
    assert [list(r.new_token_ids) for r in run.results] == alone
    lengths = [len(p) for p in prompts]
    longest_first = sorted(range(4), key=lambda i: -lengths[i])
    assert [r.batch for r in run.results] == [longest_first.index(i) // batch_size for i in range(4)]
    for result in run.results:  # padded to the longest prompt of its own batch
        same_batch = [lengths[r.request] for r in run.results if r.batch == result.batch]
        assert result.padding == max(same_batch) - result.prompt_len
    assert run.new_tokens == 32 and run.tokens_per_s > 0
    assert all(0 < r.latency_s <= run.wall_s for r in run.results)


def test_a_request_stops_at_its_end_token_while_its_batch_goes_on(embedded, requests):
    prompts, alone = requests
    end = alone[1][2]  # the third token request 1 makes alone
    run = generate_requests(embedded, prompts, 8, batch_size=4, eos_token_id=end)
    first_end = alone[1].index(end)
    assert list(run.results[1].new_token_ids) == alone[1][:first_end + 1]
    assert any(len(r.new_token_ids) > first_end + 1 for r in run.results)  # the others went on


def test_left_padding_and_bad_requests():
    ids, mask = left_pad([torch.tensor([1, 2]), torch.tensor([3, 4, 5])], pad_token_id=9)
    assert ids.tolist() == [[9, 1, 2], [3, 4, 5]] and mask.tolist() == [[0, 1, 1], [1, 1, 1]]
    with pytest.raises(ValueError, match="prompts must be a non-empty list"):
        generate_requests(Bigram(), [], 4)
    with pytest.raises(ValueError, match=r"prompts\[1\] must be"):
        generate_requests(Bigram(), [torch.tensor([1]), torch.tensor([[1, 2]])], 4)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        generate_requests(Bigram(), [torch.tensor([1])], 4, batch_size=0)
