"""labkit.core.sampling: the lesson's worked example by hand, properties, and agreement with transformers' warpers."""

import math

import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    LogitsProcessorList, MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
)

import labkit.core.sampling as sampling

from labkit.core.course import lesson_logits
from labkit.core.distribution import kept_count, kept_mass
from labkit.core.sampling import (
    TOP_P_TOLERANCE, apply_temperature, filter_logits, min_p_filter, sample, sampling_logits, sampling_probs,
    softmax_with_temperature, top_k_filter, top_p_filter, top_p_filter_reference,
)

# The lesson's four-token vocabulary A, B, C, D with logits log 8, log 4, log 2, log 1.
LESSON = lesson_logits(torch.float64)
LESSON32 = lesson_logits()


def kept(filtered):
    return filtered.isfinite().tolist()


# ----- the worked example, in full -----

def test_t1_gives_8_4_2_1_over_15_and_greedy_chooses_a():
    assert torch.allclose(sampling_probs(LESSON) * 15, torch.tensor([8.0, 4, 2, 1], dtype=torch.float64))
    assert sampling_probs(LESSON, temperature=0).tolist() == [1.0, 0.0, 0.0, 0.0]


def test_top_k_2_gives_two_thirds_one_third():
    assert torch.allclose(sampling_probs(LESSON, top_k=2), torch.tensor([2 / 3, 1 / 3, 0, 0], dtype=torch.float64))


@pytest.mark.parametrize("logits", [LESSON, LESSON32], ids=["float64", "float32"])
def test_top_p_three_quarters_and_the_exact_four_fifths_boundary_keep_a_and_b(logits):
    assert kept(top_p_filter(logits, 0.75)) == [True, True, False, False]
    assert kept(top_p_filter(logits, 0.8)) == [True, True, False, False]  # 12/15 = 4/5 reaches p exactly
    assert kept(top_p_filter(logits, 4 / 5)) == [True, True, False, False]
    probs = sampling_probs(logits, top_p=0.8)
    assert torch.allclose(probs, torch.tensor([2 / 3, 1 / 3, 0, 0], dtype=logits.dtype))


def test_the_boundary_moves_only_outside_the_stated_tolerance():
    assert kept(top_p_filter(LESSON, 0.8 + 2 * TOP_P_TOLERANCE)) == [True, True, True, False]
    assert kept(top_p_filter(LESSON, 0.8 + TOP_P_TOLERANCE / 2)) == [True, True, False, False]
    assert kept(top_p_filter(LESSON, 8 / 15)) == [True, False, False, False]  # A alone reaches 8/15
    assert kept(top_p_filter(LESSON, 8 / 15 + 2 * TOP_P_TOLERANCE)) == [True, True, False, False]
    assert kept(top_p_filter(LESSON, 1e-9)) == [True, False, False, False]  # never empty


def test_half_temperature_then_top_p_keeps_only_a_but_the_reverse_order_keeps_b():
    assert torch.allclose(sampling_probs(LESSON, temperature=0.5) * 85,
                          torch.tensor([64.0, 16, 4, 1], dtype=torch.float64))
    assert sampling_probs(LESSON, temperature=0.5, top_p=0.75).tolist() == [1.0, 0.0, 0.0, 0.0]  # 64/85 > 3/4
    reverse = sampling_probs(LESSON, temperature=0.5, top_p=0.75, order="filters_first")
    assert torch.allclose(reverse, torch.tensor([0.8, 0.2, 0, 0], dtype=torch.float64))  # (64, 16) / 80


def test_what_transformers_and_the_seed_snippet_do_at_four_fifths():
    # transformers removes tokens whose ascending cumulative mass is <= 1 - p. Exactly, C's tail mass 3/15 equals
    # 1/5 and C goes; in floats 1 - 0.8 is 0.19999999999999996 < 0.2, so C stays: three tokens.
    for logits in (LESSON, LESSON32):
        assert kept(TopPLogitsWarper(0.8)(None, logits[None].clone())[0]) == [True, True, True, False]
    assert 1 - 0.8 < 0.2

    # The seed lab's snippet keeps a token while the mass *before* it is <= p: it keeps C exactly at the boundary
    # (in float64), and only float32's rounding of 8/15 + 4/15 up to 0.80000007 hides that.
    def seed_rule(logits, p):
        ranked, ids = torch.sort(logits, descending=True)
        above = torch.softmax(ranked, dim=-1).cumsum(dim=-1) > p
        above = torch.cat([torch.zeros_like(above[:1]), above[:-1]])
        return logits.masked_fill(above.scatter(0, ids, above), -math.inf)

    assert kept(seed_rule(LESSON, 0.8)) == [True, True, True, False]
    assert kept(seed_rule(LESSON32, 0.8)) == [True, True, False, False]


def test_min_p_keeps_ratios_at_least_min_p_exactly_at_the_boundary():
    for logits in (LESSON, LESSON32):
        assert kept(min_p_filter(logits, 0.25)) == [True, True, True, False]  # 2/8 = 1/4 reaches it
        assert kept(min_p_filter(logits, 0.5)) == [True, True, False, False]
        assert kept(min_p_filter(logits, 1.0)) == [True, False, False, False]
    assert kept(min_p_filter(torch.tensor([1.0, 1.0, 0.0]), 1.0)) == [True, True, False]  # tied tops both stay


def test_top_k_keeps_exactly_k_and_gives_a_tie_to_the_lower_id():
    logits = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.0], [5.0, 5.0, 5.0, 5.0, 5.0]])
    assert kept(top_k_filter(logits, 2)) == [[False, True, True, False, False], [True, True, False, False, False]]
    assert kept(top_k_filter(logits, 0)) == [[True] * 5] * 2
    assert torch.equal(top_k_filter(logits, 7), logits)


def test_top_p_ties_go_to_the_lower_id():
    assert kept(top_p_filter(torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0]), 0.5)) == [False, True, True, True, False]


# ----- the fast top-p equals the plain rule -----

@pytest.mark.parametrize("logits", [LESSON, LESSON32], ids=["float64", "float32"])
@pytest.mark.parametrize("top_p", [1e-9, 8 / 15, 0.75, 0.8, 0.8 + TOP_P_TOLERANCE / 2, 0.8 + 2 * TOP_P_TOLERANCE,
                                   0.81, 14 / 15, 1 - 1e-7, 1.0])
def test_fast_top_p_equals_the_reference_on_the_lesson_and_its_boundaries(logits, top_p):
    assert torch.equal(top_p_filter(logits, top_p), top_p_filter_reference(logits, top_p))


def test_the_reference_reads_as_the_rule():
    assert kept(top_p_filter_reference(LESSON, 0.75)) == [True, True, False, False]
    assert kept(top_p_filter_reference(LESSON, 0.8)) == [True, True, False, False]  # 12/15 reaches 4/5
    assert kept(top_p_filter_reference(LESSON, 0.81)) == [True, True, True, False]
    assert kept(top_p_filter_reference(torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0]), 0.5)) == [False, True, True, True,
                                                                                           False]


def test_fast_top_p_equals_the_reference_where_the_shortcut_is_stretched():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 5000, generator=generator) * torch.linspace(0.5, 6, 8)[:, None]
    logits[0, :300] = 4.0  # a long tie: the whole tie shares the boundary bucket
    logits[1, 1000:] = -math.inf  # removed tokens share the last bucket
    logits[2] = torch.linspace(0, 200, 5000)  # a range far wider than the buckets cover
    logits[3] = 0.0  # every token tied
    after_top_k = top_k_filter(logits, 100)
    quarter = torch.tensor([1.0, 1.0, 1.0, 1.0]).log()  # masses 1/4, 1/2, 3/4: the guard sends p = 1/2 to the rule
    for rows in (logits, after_top_k, logits[3], logits.double(), quarter):
        for top_p in (1e-9, 0.25, 0.3, 0.5, 0.9, 0.99, 1 - 2e-6):
            assert torch.equal(top_p_filter(rows, top_p), top_p_filter_reference(rows, top_p)), (rows.shape, top_p)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**31), batch=st.integers(1, 3), vocab=st.integers(1, 3000), scale=st.floats(0.01, 30),
       ties=st.booleans(), top_p=st.floats(1e-9, 1.0))
def test_fast_top_p_equals_the_reference(seed, batch, vocab, scale, ties, top_p):
    logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * scale
    if ties:
        logits = logits.round()
    assert torch.equal(top_p_filter(logits, top_p), top_p_filter_reference(logits, top_p))


def test_filters_go_top_k_then_top_p_then_min_p():
    # top-k 3 renormalizes to (8, 4, 2)/14; top-p 0.85 then needs 12/14 < 0.85? no: 12/14 = 0.857 >= 0.85 -> A, B.
    assert kept(filter_logits(LESSON, top_k=3, top_p=0.85)) == [True, True, False, False]
    assert kept(top_p_filter(LESSON, 0.85)) == [True, True, True, False]  # on its own, 12/15 < 0.85


# ----- validation -----

@pytest.mark.parametrize("kwargs,error,message", [
    ({"temperature": -0.1}, ValueError, r"temperature must be a real number >= 0 \(0 means greedy\), got -0.1"),
    ({"temperature": math.nan}, ValueError, "temperature"),
    ({"temperature": "1"}, TypeError, "temperature"),
    ({"top_k": -1}, ValueError, "top_k must be an int >= 0"),
    ({"top_k": 2.0}, TypeError, "top_k must be an int"),
    ({"top_k": True}, TypeError, "top_k"),
    ({"top_p": 0.0}, ValueError, r"top_p must be a real number in \(0, 1\]"),
    ({"top_p": 1.5}, ValueError, "top_p"),
    ({"top_p": math.nan}, ValueError, "top_p"),
    ({"min_p": -0.1}, ValueError, r"min_p must be a real number in \[0, 1\]"),
    ({"min_p": 2}, ValueError, "min_p"),
    ({"order": "temperature-first"}, ValueError, "order must be one of"),
])
def test_bad_arguments_are_named_in_the_error(kwargs, error, message):
    with pytest.raises(error, match=message):
        sampling_probs(LESSON, **kwargs)


@pytest.mark.parametrize("logits,message", [
    (torch.tensor([1.0, math.nan]), "NaN"),
    (torch.tensor([1.0, math.inf]), r"\+inf"),
    (torch.tensor([[0.0, 1.0], [-math.inf, -math.inf]]), "entirely -inf"),
    (torch.zeros(2, 2, 2), "shape"),
    (torch.zeros(0), "shape"),
])
def test_bad_logits_are_errors(logits, message):
    with pytest.raises(ValueError, match=message):
        sampling_probs(logits)


@pytest.mark.parametrize("step", [
    lambda x: top_k_filter(x, 2), lambda x: top_k_filter(x, 0), lambda x: top_p_filter(x, 0.9),
    lambda x: top_p_filter_reference(x, 0.9), lambda x: min_p_filter(x, 0.1), lambda x: apply_temperature(x, 0),
    lambda x: filter_logits(x), lambda x: sampling_logits(x, temperature=0.7),
], ids=["top_k", "top_k off", "top_p", "top_p reference", "min_p", "greedy", "no filter", "temperature"])
@pytest.mark.parametrize("bad,message", [(math.nan, "NaN"), (math.inf, r"\+inf"), (-math.inf, "entirely -inf")])
def test_every_step_rejects_bad_values_from_its_own_row_maximum(step, bad, message):
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]])
    logits[1] = bad if bad == -math.inf else logits[1]
    logits[1, 2] = bad
    before = logits.clone()
    with pytest.raises(ValueError, match=message):
        step(logits)
    assert torch.equal(logits.isnan(), before.isnan()) and torch.equal(logits.nan_to_num(), before.nan_to_num())


def test_a_plain_temperature_is_one_division_and_passes_nan_through():
    assert apply_temperature(torch.tensor([2.0, math.nan]), 2.0)[1].isnan()


def test_integer_logits_and_non_tensors_are_type_errors():
    with pytest.raises(TypeError, match="floating-point"):
        top_k_filter(torch.tensor([1, 2]), 1)
    with pytest.raises(TypeError, match=r"logits must be a floating-point tensor .*got \[1.0, 2.0\]"):
        top_p_filter([1.0, 2.0], 0.5)


def test_removed_tokens_may_come_in_as_minus_inf():
    logits = torch.tensor([0.0, -math.inf, 1.0, -math.inf])
    assert kept(sampling_logits(logits, temperature=0.7, top_k=3, top_p=0.99, min_p=0.01)) == [True, False, True,
                                                                                                 False]


# ----- sample -----

def test_sample_shapes_and_seeds():
    probs = torch.tensor([[0.1, 0.2, 0.7], [1.0, 0.0, 0.0]])
    assert sample(probs).shape == (2,) and sample(probs[0]).shape == ()
    first = [sample(probs, torch.Generator().manual_seed(7)).tolist() for _ in range(2)]
    assert first[0] == first[1]
    draws = sample(probs[0].expand(20_000, 3), torch.Generator().manual_seed(0))
    frequencies = torch.bincount(draws, minlength=3) / 20_000
    assert torch.allclose(frequencies, probs[0], atol=0.01)


@pytest.mark.parametrize("probs,message", [
    (torch.tensor([0.5, -0.1]), ">= 0"), (torch.tensor([0.0, 0.0]), "positive entry"),
    (torch.tensor([math.nan, 1.0]), "finite"),
])
def test_sample_rejects_what_is_not_a_distribution(probs, message):
    with pytest.raises(ValueError, match=message):
        sample(probs)
    with pytest.raises(TypeError, match="probs must be a floating-point tensor"):
        sample(torch.tensor([1, 0]))


def test_sample_rejects_a_seed_where_a_generator_belongs():
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        sample(torch.tensor([1.0]), generator=0)


# ----- properties -----

def logits_rows(min_vocab=1, max_vocab=60):
    return st.builds(
        lambda seed, batch, vocab, scale: torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed),
                                                      dtype=torch.float64) * scale,
        st.integers(0, 2**31), st.integers(1, 3), st.integers(min_vocab, max_vocab), st.floats(0.1, 8))


SETTINGS = dict(temperature=st.sampled_from([0.0, 0.3, 1.0, 2.5]), top_k=st.integers(0, 70),
                top_p=st.floats(0.01, 1.0), min_p=st.floats(0.0, 1.0), order=st.sampled_from(sampling.ORDERS))


@settings(max_examples=150, deadline=None)
@given(logits=logits_rows(), **SETTINGS)
def test_probabilities_sum_to_one_and_the_input_is_untouched(logits, temperature, top_k, top_p, min_p, order):
    before = logits.clone()
    probs = sampling_probs(logits, temperature, top_k, top_p, min_p, order)
    assert torch.equal(logits, before)
    assert (probs >= 0).all() and torch.allclose(probs.sum(-1), torch.ones(len(logits), dtype=probs.dtype))
    assert (probs[torch.arange(len(logits)), logits.argmax(-1)] > 0).all()  # the greedy token always survives


# The filter sums its masses in its own order (a cumulative sum of exp(z - logsumexp)); the test sums them as
# kept_mass does (a softmax, then a sum). The two float64 sums of at most 60 terms differ by ~1e-16, so a prefix the
# filter finds exactly at p - TOP_P_TOLERANCE can read a hair below it here: both sides of the boundary are compared
# with the same tolerance widened by the same 1e-12 (far above that rounding, far below any token's probability
# here). A filter keeping one token too few or too many still fails.
SUM_ROUNDING = 1e-12


@settings(max_examples=150, deadline=None)
@given(logits=logits_rows(), top_p=st.floats(0.01, 1.0))
@example(logits=LESSON[None], top_p=0.8000010000000002)  # kept A, B (mass 0.8): below p - 1e-6 by 2e-16 as summed here
@example(logits=torch.tensor([[math.log(2), 0.0]], dtype=torch.float64), top_p=0.6666676666666668)
def test_top_p_keeps_at_least_p_and_no_more_than_needed(logits, top_p):
    filtered = top_p_filter(logits, top_p)
    probs = torch.softmax(logits, -1)
    mass = kept_mass(logits, filtered)
    assert (mass >= top_p - TOP_P_TOLERANCE - SUM_ROUNDING).all() or top_p == 1
    smallest_kept = probs.masked_fill(filtered.isinf(), math.inf).amin(-1)
    minimal = (mass - smallest_kept < top_p - TOP_P_TOLERANCE + SUM_ROUNDING) | (kept_count(filtered) == 1)
    assert minimal.all() or top_p == 1
    # A prefix of the ranking: every kept logit is >= every removed one.
    lowest_kept = logits.masked_fill(filtered.isinf(), math.inf).amin(-1)
    highest_removed = logits.masked_fill(filtered.isfinite(), -math.inf).amax(-1)
    assert (lowest_kept >= highest_removed).all()


@settings(max_examples=100, deadline=None)
@given(logits=logits_rows(), extra=st.integers(0, 5))
def test_k_at_least_the_vocabulary_is_a_no_op_and_smaller_k_keeps_exactly_k(logits, extra):
    vocab = logits.shape[-1]
    assert torch.equal(top_k_filter(logits, vocab + extra), logits)
    k = max(1, vocab - extra)
    assert (kept_count(top_k_filter(logits, k)) == k).all()


@settings(max_examples=100, deadline=None)
@given(logits=logits_rows(min_vocab=2))
def test_small_temperatures_approach_the_argmax(logits):
    top2 = logits.topk(2, dim=-1).values
    gap = (top2[:, 0] - top2[:, 1]).min().item()
    assume(gap > 1e-3)
    greedy = sampling_probs(logits, temperature=0)
    p_max = [sampling_probs(logits, temperature=t).amax(-1) for t in (2.0, 1.0, 0.5, 0.1)]
    assert all((a <= b + 1e-12).all() for a, b in zip(p_max, p_max[1:]))  # sharper as T falls
    assert torch.allclose(sampling_probs(logits, temperature=gap / 50), greedy, atol=1e-15 + logits.shape[-1] * 2e-22)


@settings(max_examples=60, deadline=None)
@given(logits=logits_rows(), top_k=st.integers(0, 10), top_p=st.floats(0.05, 1.0), min_p=st.floats(0, 0.5))
def test_at_temperature_one_the_order_does_not_matter(logits, top_k, top_p, min_p):
    assert torch.equal(sampling_probs(logits, 1.0, top_k, top_p, min_p, "temperature_first"),
                       sampling_probs(logits, 1.0, top_k, top_p, min_p, "filters_first"))


def test_softmax_with_temperature_is_unchanged_for_lab_00():
    assert torch.equal(softmax_with_temperature(LESSON, 0.5), torch.softmax(LESSON / 0.5, -1))
    assert apply_temperature(torch.tensor([1.0, 3.0, 3.0]), 0).tolist() == [-math.inf, 0.0, -math.inf]


# ----- agreement with transformers' warpers, away from float ties -----

def _random_logits(seed, batch=4, vocab=2000):
    generator = torch.Generator().manual_seed(seed)
    scale = torch.rand(batch, 1, generator=generator) * 5 + 0.5
    return torch.randn(batch, vocab, generator=generator) * scale  # float32, as a model returns them


def _far_from_top_p_boundary(logits, top_p, margin=1e-4):
    ranked = torch.sort(logits.double(), descending=True).values
    mass_before = torch.softmax(ranked, -1).cumsum(-1) - torch.softmax(ranked, -1)
    return bool(((mass_before - top_p).abs() > margin).all())


@pytest.mark.parametrize("seed", range(12))
def test_agrees_with_transformers_warpers(seed):
    logits = _random_logits(seed)
    generator = torch.Generator().manual_seed(1000 + seed)
    temperature = float(torch.rand(1, generator=generator)) * 1.9 + 0.1
    top_k = int(torch.randint(1, 500, (1,), generator=generator))
    top_p = float(torch.rand(1, generator=generator)) * 0.98 + 0.01
    min_p = float(torch.rand(1, generator=generator)) * 0.3

    assert torch.equal(apply_temperature(logits, temperature), TemperatureLogitsWarper(temperature)(None, logits))
    kth = logits.topk(top_k, dim=-1).values[:, -1:]
    if bool(((logits == kth).sum(-1) == 1).all()):  # no tie at the cut, where the two tie rules differ
        assert torch.equal(top_k_filter(logits, top_k), TopKLogitsWarper(top_k)(None, logits))
    if _far_from_top_p_boundary(logits, top_p):
        assert torch.equal(top_p_filter(logits, top_p), TopPLogitsWarper(top_p)(None, logits))
    ratios = (logits.double() - logits.double().amax(-1, keepdim=True)).exp()
    if bool(((ratios / min_p - 1).abs() > 1e-4).all()):
        assert torch.equal(min_p_filter(logits, min_p), MinPLogitsWarper(min_p)(None, logits))

    chain = LogitsProcessorList([TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k),
                                 TopPLogitsWarper(top_p), MinPLogitsWarper(min_p)])
    tempered_topk = top_k_filter(logits / temperature, top_k)
    if _far_from_top_p_boundary(tempered_topk, top_p):
        ours = sampling_logits(logits, temperature, top_k, top_p, min_p)
        theirs = chain(None, logits)
        assert torch.equal(ours.isfinite(), theirs.isfinite())
        assert torch.allclose(torch.softmax(ours, -1), torch.softmax(theirs, -1), atol=1e-6)
