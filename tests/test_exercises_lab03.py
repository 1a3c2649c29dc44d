"""The bug zoo of lab 03: each wrong implementation fails with a pointed hint; the solutions pass."""

import pytest
import torch

from labkit.exercises import exercises, get
from labkit.exercises.checking import check_function
from labkit.core.numerics import round_trip_checkpoint
from labkit.exercises.lab03 import weights_back_exactly
from zoo import assert_zoo

PER_CHANNEL = get("03.fake_quantize_per_channel")
AFFINE = get("03.affine_fake_quantize")
ROUND_TRIP = get("03.predict_fp16_round_trip")


def per_channel_solution(weight, bits):
    q_max = 2 ** (bits - 1) - 1
    scale = weight.abs().amax(dim=1, keepdim=True) / q_max
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)  # an all-zero row: any positive scale gives 0
    return torch.clamp(torch.round(weight / scale), -q_max, q_max) * scale


def affine_solution(x, bits):
    q_max = 2**bits - 1
    low, high = torch.clamp(x.min(), max=0), torch.clamp(x.max(), min=0)
    scale = torch.clamp((high - low) / q_max, min=torch.finfo(x.dtype).eps)  # an all-zero tensor: s > 0
    zero = torch.clamp(-torch.round(low / scale), 0, q_max)
    return (torch.clamp(torch.round(x / scale) + zero, 0, q_max) - zero) * scale


def naive_per_channel(weight, bits):
    """Right everywhere except on an all-zero row, where the scale is 0 and 0 / 0 gives NaN."""
    q_max = 2 ** (bits - 1) - 1
    scale = weight.abs().amax(dim=1, keepdim=True) / q_max
    return torch.clamp(torch.round(weight / scale), -q_max, q_max) * scale


def naive_affine(x, bits):
    """Right everywhere except on an all-zero tensor, where the scale is 0 and 0 / 0 gives NaN."""
    q_max = 2**bits - 1
    low, high = torch.clamp(x.min(), max=0), torch.clamp(x.max(), min=0)
    scale = (high - low) / q_max
    zero = torch.clamp(-torch.round(low / scale), 0, q_max)
    return (torch.clamp(torch.round(x / scale) + zero, 0, q_max) - zero) * scale


# The learners' mistakes, written here (a call into labkit would be reported as such, not as the mistake).

def _rowwise(weight, bits, q_max, rounding=torch.round, dim=1, dequantize=True):
    scale = weight.abs().amax(dim=dim, keepdim=True) / q_max
    codes = torch.clamp(rounding(weight / scale), -q_max, q_max)
    return codes * scale if dequantize else codes


def _per_tensor(weight, bits):
    q_max = 2 ** (bits - 1) - 1
    scale = weight.abs().max() / q_max
    return torch.clamp(torch.round(weight / scale), -q_max, q_max) * scale


def _uses_128(weight, bits):
    q_max = 2 ** (bits - 1)
    scale = weight.abs().amax(dim=1, keepdim=True) / q_max
    return torch.clamp(torch.round(weight / scale), -q_max, q_max - 1) * scale


def _floor(weight, bits):
    return _rowwise(weight, bits, 2 ** (bits - 1) - 1, rounding=torch.floor)


def _codes_not_dequantized(weight, bits):
    return _rowwise(weight, bits, 2 ** (bits - 1) - 1, dequantize=False)


def _per_column(weight, bits):
    return _rowwise(weight, bits, 2 ** (bits - 1) - 1, dim=0)


def _affine(x, bits, include_zero=True, levels=None, round_zero=True, subtract_zero=True):
    q_max = levels or 2**bits - 1
    low, high = (x.min().clamp(max=0), x.max().clamp(min=0)) if include_zero else (x.min(), x.max())
    scale = (high - low) / q_max
    zero = torch.clamp(-torch.round(low / scale), 0, q_max) if round_zero else -low / scale
    shifted = torch.round(x / scale) + zero if round_zero else torch.round(x / scale + zero)
    codes = torch.clamp(shifted, 0, q_max)
    return (codes - zero) * scale if subtract_zero else codes * scale


def _forgets_zero_point(x, bits):
    return _affine(x, bits, subtract_zero=False)


def _range_without_zero(x, bits):
    return _affine(x, bits, include_zero=False)


def _unrounded_zero_point(x, bits):
    return _affine(x, bits, round_zero=False)


def _codes_to_2_pow_bits(x, bits):
    return _affine(x, bits, levels=2**bits)


def _offset_by_minimum(x, bits):
    q_max = 2**bits - 1
    low, high = x.min().clamp(max=0), x.max().clamp(min=0)
    scale = (high - low) / q_max
    return torch.clamp(torch.round((x - low) / scale), 0, q_max) * scale + low


def _centred_grid(x, bits):
    q_max = 2**bits - 1
    scale = 2 * x.abs().max() / q_max
    zero = 2 ** (bits - 1)
    return (torch.clamp(torch.round(x / scale) + zero, 0, q_max) - zero) * scale


def test_per_channel_zoo():
    assert_zoo(PER_CHANNEL, per_channel_solution, {
        _per_tensor: "one scale per ROW", _uses_128: "not 2^(bits-1) (128)", _floor: "not down (floor)",
        _codes_not_dequantized: "not the integer codes", _per_column: "reduce over dim=1",
        naive_per_channel: "0 / 0 gives NaN"})


def test_affine_zoo():
    assert_zoo(AFFINE, affine_solution, {
        _forgets_zero_point: "with the zero point", _range_without_zero: "include 0",
        _unrounded_zero_point: "integer code", _codes_to_2_pow_bits: "2^bits - 1",
        _offset_by_minimum: "puts 0 between two codes", _centred_grid: "not [-max|x|, max|x|]",
        naive_affine: "0 / 0 gives NaN"})


def test_an_all_zero_row_or_tensor_comes_back_as_zeros():
    """labkit's references return 0 where a scale of 0 would give NaN, and a hand case of each exercise says so."""
    weight = torch.tensor([[0.0, 0.0, 0.0], [2.0, -0.5, 1.0]])
    assert torch.equal(PER_CHANNEL.reference(weight, 8)[0], torch.zeros(3))
    assert torch.isnan(naive_per_channel(weight, 8)[0]).all()
    assert torch.equal(AFFINE.reference(torch.zeros(2, 3), 4), torch.zeros(2, 3))
    assert torch.isnan(naive_affine(torch.zeros(2, 3), 4)).all()
    assert any("all-zero row" in case.label for case in PER_CHANNEL.hand_cases)
    assert any("all-zero tensor" in case.label for case in AFFINE.hand_cases)


@pytest.mark.parametrize("exercise, solution", [(PER_CHANNEL, per_channel_solution), (AFFINE, affine_solution)])
def test_the_solution_passes_on_fresh_random_cases(exercise, solution):
    # (how long a verdict takes is measured by `make bench`, not asserted here)
    assert check_function(exercise, solution).status == "passed"


@pytest.mark.parametrize("exercise", [PER_CHANNEL, AFFINE])
def test_the_learner_stub_is_not_attempted(exercise):
    def stub(values, bits):
        raise NotImplementedError("your code here")

    assert check_function(exercise, stub).status == "not attempted"


def test_forbidden_torch_kernel_is_reported():
    def uses_torch(x, bits):
        s = float((x.max().clamp(min=0) - x.min().clamp(max=0)) / (2**bits - 1))
        z = int(-round(float(x.min().clamp(max=0)) / s))
        return torch.fake_quantize_per_tensor_affine(x, s, z, 0, 2**bits - 1)

    assert check_function(AFFINE, uses_torch, seed=0).status == "failed"


# ----- 03.predict_fp16_round_trip: what an FP16 checkpoint gives back in FP32 -----

def test_round_trip_answer_is_the_weights_already_on_fp16s_grid():
    copied, tuned = round_trip_checkpoint()
    assert weights_back_exactly() == 400.0
    assert torch.equal(copied.half().float(), copied)  # the copied weights lose nothing
    assert not bool((tuned.half().float() == tuned).any())  # every fine-tuned weight loses something


@pytest.mark.parametrize("guess, close", [
    (400, True), (404, True),
    (1000, False),  # "FP32 gives the precision back"
    (0, False),  # "nothing survives": the weights that were FP16 already do
    (600, False),  # the two groups swapped
])
def test_round_trip_prediction(guess, close):
    verdict = check_function(ROUND_TRIP, lambda: guess)
    assert (verdict.status, verdict.close) == ("passed", close), verdict
    malformed = check_function(ROUND_TRIP, lambda: "400")
    assert malformed.status == "failed" and "a number of weights (of 1,000)" in str(malformed)
    hint = next(line for line in str(malformed).splitlines() if "hint:" in line)
    assert "400" not in hint and "exact" not in hint, hint


def test_predictions_say_what_may_be_called():
    for exercise in (ROUND_TRIP,):
        assert exercise.n_random == 0
        assert exercise.allowed_text == ("No labkit function may be called inside your function: the check "
                                         "reports any call into labkit.")


def test_lab03_registers_its_exercises_in_notebook_order():
    assert [ex.id for ex in exercises("03")] == ["03.predict_fp16_round_trip", "03.fake_quantize_per_channel",
                                                 "03.affine_fake_quantize"]


def test_random_cases_keep_away_from_rounding_ties():
    """Where x / s sits on a half code, x / s and x * (1 / s) may round apart and two right answers differ by a
    whole step (seen once in about 4,600 checks of the solution): random cases are drawn away from such inputs."""
    from labkit.exercises import lab03

    assert lab03._near_a_tie(torch.tensor([0.0, 1.5, 3.0]), 2)  # s = 1: 1.5 is a tie
    assert not lab03._near_a_tie(torch.tensor([0.0, 1.2, 3.0]), 2)
    assert not lab03._near_a_tie(torch.zeros(2, 3), 4)  # an all-zero tensor has no grid to tie on
    generator = torch.Generator().manual_seed(0)
    for _ in range(300):
        assert not lab03._near_a_tie(*lab03._affine_case(generator).args)
