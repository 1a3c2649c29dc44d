"""labkit.exercises.comparing: an answer against labkit's, within its tolerance; the difference shown is where the
answer really is wrong, among infinities too; sameness that NaN and lying comparisons cannot fool."""

import math

import torch

from labkit.exercises.comparing import compare, same


def test_compare_reports_nan_where_a_number_was_expected():
    assert "got nan" in compare(torch.tensor([1.0]), torch.tensor([math.nan]), 1e-5, 1e-8)
    assert compare(0.5, 0.5 + 1e-9, 1e-6, 0) is None
    assert compare(0.5, "0.5", 1e-6, 0) == "expected a number, got str"


def test_the_difference_is_found_where_it_really_is_among_infinities():
    inf = math.inf
    expected = torch.tensor([-inf, 2.0, 2.0, -inf, -inf])
    got = torch.tensor([-inf, 2.0, 2.0, 2.0, -inf])
    assert compare(expected, got, 1e-6, 1e-9) == (
        "largest difference at index (3,): expected -inf (removed), got 2 (kept) (tolerance rtol=1e-06, atol=1e-09)")
    assert "expected 2 (kept), got -inf (removed)" in compare(got, expected, 1e-6, 1e-9)
    assert "index (1,): expected 1, got 5" in compare(torch.tensor([inf, 1.0, 0.0]), torch.tensor([inf, 5.0, 0.1]),
                                                      1e-6, 1e-9)
    assert "index (0,): expected inf, got -inf" in compare(torch.tensor([inf]), torch.tensor([-inf]), 1e-6, 1e-9)


def test_same_needs_one_shape_and_dtype_and_survives_a_comparison_that_raises():
    assert same({"a": torch.tensor([math.nan])}, {"a": torch.tensor([math.nan])})
    assert not same(torch.tensor([1, 2]), torch.tensor([[1, 2]]))
    assert not same({"a": 1}, {"b": 1}) and not same([1, 2], [1, 2, 3])

    class Broken:
        def __eq__(self, other):
            raise RuntimeError("no")

    broken = Broken()
    assert same(broken, broken) and not same(broken, Broken())
