"""Lab 04's exercises: a prediction checked on the outlier visualizer, LLM.int8()'s mixed-precision matrix
multiplication checked against labkit's ``int8_decomposed_matmul``, and GPTQ's column loop written by the learner
and checked against labkit's ``gptq`` (small hand and random cases, then the real layer).

Each exercise's task text in ``notebooks/solutions/04_outliers_quantization.ipynb`` states the rules used here.
"""

from __future__ import annotations

import functools

import torch

from labkit.core.gptq import gptq
from labkit.core.outlier_schemes import int8_decomposed_matmul, outlier_channels
from labkit.exercises import register
from labkit.exercises.definitions import Case, CodeExercise, Mistake, prediction
from labkit.exercises.lab03 import TIE_MARGIN


# --------------------------------------------------------------------------------------------------------------
# 04.predict_outlier_channels: predict, then check on the visualizer

PREDICT_PROMPT = "The Eiffel Tower is in Paris. It was finished in 1889 and is 330 metres tall."
PREDICT_LAYER, PREDICT_THRESHOLD = 15, 6.0


@functools.lru_cache(maxsize=1)
def _linear_input() -> torch.Tensor:
    from labkit import runtime
    from labkit.runtime.models import load_model
    from labkit.runtime.quantize import linear_inputs

    lm = load_model(progress=False)
    name = f"{runtime.layer_names(lm)[PREDICT_LAYER]}.self_attn.q_proj"  # k_proj and v_proj read the same tensor
    return linear_inputs(lm, name, lm.text_ids(PREDICT_PROMPT)[0])  # [tokens, 576]


def outlier_channels_on_the_model() -> float:
    """How many of the 576 input channels of layer 15's q/k/v_proj reach |x| >= 6 on the visualizer's prompt: the
    channels LLM.int8() would keep in float there."""
    return float(outlier_channels(_linear_input(), PREDICT_THRESHOLD).sum())


PREDICT = register(prediction(
    "04.predict_outlier_channels", "Predict, then check: q/k/v_proj input channels reaching 6.0 at layer 15",
    "predicted_outlier_channels", outlier_channels_on_the_model,
    rtol=0.5,  # within a factor of two: |prediction - truth| <= max(prediction, truth) / 2
    asked=f"layer {PREDICT_LAYER}, input of q/k/v_proj, threshold {PREDICT_THRESHOLD}, prompt {PREDICT_PROMPT!r}",
    hint="return your prediction as a number of channels (of 576), such as 40",
    reveal="""One channel of the 576 reaches 6: the small minority LLM.int8()'s float part is designed for. On the
    residual stream nearly every channel would, but RMSNorm divides each token by its own root mean square,
    bringing the median |x| from about 2 to about 0.1. The next cell prints both, with the channel's number.""",
    # "One channel" alone also opens the lesson's sentences on the residual stream (channel 507), another count
    giveaways=("One channel of the 576", "one channel of 576", "one channel in float", "channel 247", "(247)",
               "one of the 576")))

__all__ = ["PREDICT", "outlier_channels_on_the_model"]


# --------------------------------------------------------------------------------------------------------------
# 04.int8_matmul: LLM.int8()'s mixed-precision decomposition, against labkit's int8_decomposed_matmul

INT8_THRESHOLD = 6.0
INT8_REAL_ROWS = 64


def _planted_case(generator: torch.Generator) -> Case:
    """Activations of ordinary size with a few outlier channels planted (one token each), a small weight; drawn
    again while some value of the INT8 part sits at a rounding tie (:func:`_near_an_int8_tie`)."""
    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=generator))

    for _ in range(1000):
        n_tokens, n_in, n_out = draw(1, 12), draw(2, 48), draw(1, 16)
        threshold = (6.0, 6.0, 3.0, 1.5)[draw(0, 3)]
        x = torch.randn(n_tokens, n_in, generator=generator) * threshold / 6
        planted = torch.randperm(n_in, generator=generator)[:draw(0, max(1, n_in // 8))]
        for channel in planted.tolist():
            size = threshold * (1 + 3 * float(torch.rand(1, generator=generator)))
            x[draw(0, n_tokens - 1), channel] = size if draw(0, 1) else -size
        weight = torch.randn(n_out, n_in, generator=generator) * 0.1
        if not _near_an_int8_tie(x, weight, threshold):
            break
    reaching = int(outlier_channels(x, threshold).sum())
    return Case((x, weight, threshold),
                label=f"random x [{n_tokens}, {n_in}] with {len(planted)} planted outlier channels "
                      f"({reaching} reaching the threshold in all), weight [{n_out}, {n_in}], "
                      f"threshold {threshold}")


def _near_an_int8_tie(x: torch.Tensor, weight: torch.Tensor, threshold: float) -> bool:
    """Whether some value of the INT8 part (x and weight with the outlier columns zeroed, over their row's scale
    max|row| / 127) lies within TIE_MARGIN of a half code: there ``v / s`` and ``v * (1 / s)`` (labkit's
    quantizer) can round to codes one apart, and a right answer would be off by a whole step (a random case of
    the course's own solution met one)."""
    keep = outlier_channels(x, threshold)
    for part in (x.masked_fill(keep, 0.0), weight.masked_fill(keep, 0.0)):
        wide = part.double()
        scales = (wide.abs().amax(dim=1, keepdim=True) / 127).clamp_min(torch.finfo(torch.float64).tiny)
        scaled = (wide / scales).abs()
        if bool(((scaled - scaled.floor() - 0.5).abs() < TIE_MARGIN).any()):
            return True
    return False


@functools.lru_cache(maxsize=1)
def _int8_real_case() -> Case:
    # A random weight: the real q_proj's values sit on the model file's 4-bit grid, where v / s often lands
    # exactly halfway between two codes, and the answer would then hang on how the learner divides.
    weight = torch.randn(INT8_REAL_ROWS, 576, generator=torch.Generator().manual_seed(15)) * 0.05
    return Case((_linear_input().float(), weight, INT8_THRESHOLD),
                label=f"the real model: layer {PREDICT_LAYER}'s q_proj input on the prediction's prompt (one channel "
                      f"reaches {INT8_THRESHOLD}), times a random weight [{INT8_REAL_ROWS}, 576]")


class _HandCasesThenInt8Real(tuple):
    """The hand cases, then the real layer's case, built on first use only (importing must not load the model)."""

    def __iter__(self):
        yield from tuple.__iter__(self)
        yield _int8_real_case()

    def __len__(self) -> int:
        return tuple.__len__(self) + 1

    def __getitem__(self, index):
        return list(self)[index]


def _float32(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


_INT8_WEIGHT = _float32([0.31, -0.52, 0.07, 0.9], [-0.24, 0.11, 0.63, -0.05], [0.0, 0.0, 0.0, 0.0])
_INT8_HAND_CASES = _HandCasesThenInt8Real((
    Case((_float32([0.5, -1.25, 2.0, 0.1], [3.3, 0.04, -0.7, 1.9], [-0.02, 0.6, 0.35, -4.1]),
          _INT8_WEIGHT, 6.0),
         label="no outliers: plain vector-wise INT8, one scale per token row of x and one per row of the "
               "weight (the third weight row is all zeros)"),
    Case((_float32([7.0, 0.3, -6.5, 0.25], [0.2, -9.0, 1.1, 8.5]), _INT8_WEIGHT, 6.0),
         label="every column an outlier (some token reaches 6 in each): the plain float product x @ weight.T"),
    Case((_float32([-6.0, 0.5, 1.3, 0.2], [2.5, 5.999, -0.8, 0.45], [0.1, -2.0, 0.9, 3.1]), _INT8_WEIGHT, 6.0),
         label="|x| = 6.0 exactly reaches the threshold (column 0 is kept in float); 5.999 does not (column 1 "
               "is quantized)"),
    Case((_float32([0.0, 0.0, 0.0, 0.0], [1.5, -12.0, 0.4, -0.9], [0.0, 0.0, 0.0, 0.0]), _INT8_WEIGHT, 6.0),
         label="two all-zero token rows: their scale would be 0, their outputs are 0 (not NaN); column 1 is an "
               "outlier"),
    Case((_float32([0.8, -0.3, 2.4, 0.6], [-1.1, 0.2, 1.7, -0.4]), _INT8_WEIGHT, 2.0),
         label="threshold 2.0: column 2 is an outlier through one token only (2.4), the other token's 1.7 goes "
               "with it into the float part"),
))


def _int8_parts(x, weight, keep):
    """(the float part, x's rest, the weight's rest) for a bool mask of float columns [in]."""
    return x[:, keep] @ weight[:, keep].T, x.masked_fill(keep, 0.0), weight.masked_fill(keep, 0.0)


def _vectorwise(values, dim=1):
    """Symmetric INT8 fake quantization with one scale per row (dim=1) or per column (dim=0)."""
    scales = (values.abs().amax(dim=dim, keepdim=True) / 127).clamp_min(torch.finfo(values.dtype).eps)
    return torch.round(values / scales) * scales


def _per_tensor_scales(x, weight, threshold):
    keep = (x.abs() >= threshold).any(dim=0)
    float_part, x_rest, w_rest = _int8_parts(x, weight, keep)
    x_hat = torch.round(x_rest / (x_rest.abs().max() / 127).clamp_min(1e-12)) * (x_rest.abs().max() / 127)
    w_hat = torch.round(w_rest / (w_rest.abs().max() / 127).clamp_min(1e-12)) * (w_rest.abs().max() / 127)
    return float_part + x_hat @ w_hat.T


def _scales_with_outliers(x, weight, threshold):
    keep = (x.abs() >= threshold).any(dim=0)
    float_part, x_rest, w_rest = _int8_parts(x, weight, keep)
    x_scales = (x.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-12)
    w_scales = (weight.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-12)
    return float_part + (torch.round(x_rest / x_scales) * x_scales) @ (torch.round(w_rest / w_scales) * w_scales).T


def _outliers_per_token(x, weight, threshold):
    entries = x.abs() >= threshold  # [tokens, in]: each token's own large entries, not whole channels
    float_part = (x * entries) @ weight.T
    return float_part + _vectorwise(x.masked_fill(entries, 0.0)) @ _vectorwise(weight).T


def _strictly_above(x, weight, threshold):
    float_part, x_rest, w_rest = _int8_parts(x, weight, (x.abs() > threshold).any(dim=0))
    return float_part + _vectorwise(x_rest) @ _vectorwise(w_rest).T


def _outliers_dropped(x, weight, threshold):
    _, x_rest, w_rest = _int8_parts(x, weight, (x.abs() >= threshold).any(dim=0))
    return _vectorwise(x_rest) @ _vectorwise(w_rest).T


def _weight_scales_per_column(x, weight, threshold):
    float_part, x_rest, w_rest = _int8_parts(x, weight, (x.abs() >= threshold).any(dim=0))
    return float_part + _vectorwise(x_rest) @ _vectorwise(w_rest, dim=0).T


def _zero_row_nan(x, weight, threshold):
    float_part, x_rest, w_rest = _int8_parts(x, weight, (x.abs() >= threshold).any(dim=0))
    x_scales, w_scales = x_rest.abs().amax(dim=1, keepdim=True) / 127, w_rest.abs().amax(dim=1, keepdim=True) / 127
    return float_part + (torch.round(x_rest / x_scales) * x_scales) @ (torch.round(w_rest / w_scales) * w_scales).T


INT8_MATMUL = register(CodeExercise(
    id="04.int8_matmul",
    title="LLM.int8()'s mixed-precision matrix multiplication",
    function="int8_matmul",
    reference=int8_decomposed_matmul,
    points=3,
    rtol=1e-4,
    atol=1e-4,
    n_random=25,
    hand_cases=_INT8_HAND_CASES,
    random_case=_planted_case,
    forbidden=(torch.quantize_per_tensor, torch.quantize_per_channel, torch.fake_quantize_per_tensor_affine,
               torch.fake_quantize_per_channel_affine),
    hints=("outlier columns: (x.abs() >= threshold).any(dim=0); float part x[:, cols] @ weight[:, cols].T; zero "
           "those columns in x and weight, then one scale per row of each, max|row| / 127, codes round(v / s); "
           "int part (codes_x @ codes_w.T) * s_x * s_w.T",),
    mistakes=(
        Mistake("vector-wise means one scale per token (row of x) and one per output row of the weight, not one "
                "for the whole tensor", _per_tensor_scales),
        Mistake("take the scales after zeroing the outlier columns: the outliers must not set the INT8 range",
                _scales_with_outliers),
        Mistake("the float columns are whole input channels: a channel goes to float when ANY token reaches the "
                "threshold (.any(dim=0)), and then for every token, since the weight's column must leave INT8 "
                "with it", _outliers_per_token),
        Mistake("|x| equal to the threshold counts as an outlier: compare with >=, not >", _strictly_above),
        Mistake("the outlier columns are not thrown away: multiply them in float (x[:, cols] @ weight[:, cols].T) "
                "and add that to the INT8 part", _outliers_dropped),
        Mistake("the weight's scales go one per OUTPUT row (max over dim=1 of weight [out, in]): a scale per input "
                "column cannot be pulled out of the sum over input channels", _weight_scales_per_column),
        Mistake("an all-zero row has max|row| = 0, so its scale is 0 and 0 / 0 gives NaN: give such a row any "
                "positive scale (torch.where, or clamp_min)", _zero_row_nan),
    ),
))

__all__ += ["INT8_MATMUL"]


# --------------------------------------------------------------------------------------------------------------
# 04.gptq_columns: GPTQ's column loop on one projection, per output row, against labkit's gptq

GPTQ_LAYER = "model.layers.3.self_attn.q_proj"
GPTQ_CALIBRATION_TOKENS = 1024
GPTQ_ROWS = 128  # the first two query heads' output rows: GPTQ treats rows independently, given H


def gptq_quantize(weight: torch.Tensor, inputs: torch.Tensor, bits: int, damp: float) -> torch.Tensor:
    """The reference: labkit's GPTQ with one symmetric scale per output row, columns left to right, dequantized."""
    return gptq(weight, inputs, bits, damp=damp).dequantize()


def _correlated_inputs(generator: torch.Generator, n_rows: int, n_in: int) -> torch.Tensor:
    """Calibration inputs whose channels are correlated and of unequal size, like a real Linear's: float64."""
    mixing = torch.eye(n_in, dtype=torch.float64) + 0.8 * torch.randn(n_in, n_in, generator=generator,
                                                                       dtype=torch.float64)
    sizes = torch.exp(torch.randn(n_in, generator=generator, dtype=torch.float64))
    return torch.randn(n_rows, n_in, generator=generator, dtype=torch.float64) @ mixing * sizes


def _gptq_case(generator: torch.Generator) -> Case:
    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=generator))

    n_out, n_in, bits = draw(1, 8), draw(2, 16), draw(2, 8)
    n_rows = draw(4, 64)
    damp = (0.01, 0.1, 1.0)[draw(0, 2)]
    weight = torch.randn(n_out, n_in, generator=generator, dtype=torch.float64) * (0.02 + float(
        torch.rand(1, generator=generator, dtype=torch.float64)))
    singular = " (fewer rows than inputs: H singular until damped)" if n_rows < n_in else ""
    return Case((weight, _correlated_inputs(generator, n_rows, n_in), bits, damp),
                label=f"a random [{n_out}, {n_in}] weight, {n_rows} calibration rows{singular}, bits = {bits}, "
                      f"damp = {damp}")


@functools.lru_cache(maxsize=1)
def _real_layer_case() -> Case:
    from labkit import runtime
    from labkit.core.texts import load_eval_text, tokenize_sections
    from labkit.runtime.models import load_model
    from labkit.runtime.quantize import linear_inputs

    lm = load_model(progress=False)
    eval_ids = tokenize_sections(lm.tokenizer, load_eval_text()).token_ids[:GPTQ_CALIBRATION_TOKENS]
    weight = runtime.module_of(lm).get_submodule(GPTQ_LAYER).weight.detach()[:GPTQ_ROWS].double()  # [128, 576]
    inputs = linear_inputs(lm, GPTQ_LAYER, eval_ids).double()  # [1024, 576]
    return Case((weight, inputs, 4, 0.01),
                label=f"the real layer: {GPTQ_LAYER}'s first {GPTQ_ROWS} output rows (two query heads) and all 576 "
                      f"inputs, 4 bits, calibrated on the first {GPTQ_CALIBRATION_TOKENS:,} tokens of the evaluation "
                      "text")


class _HandCasesThenRealLayer(tuple):
    """The small hand cases, then the real layer's case, built (the model's inputs captured) on first use only:
    importing the exercises must not load the model."""

    def __iter__(self):
        yield from tuple.__iter__(self)
        yield _real_layer_case()

    def __len__(self) -> int:
        return tuple.__len__(self) + 1

    def __getitem__(self, index):
        return list(self)[index]


def _fixed(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


_SMALL, _MIXED = torch.Generator().manual_seed(4), torch.Generator().manual_seed(82)
_GPTQ_HAND_CASES = _HandCasesThenRealLayer((
    Case((_fixed([1.0, -2.0, 3.0], [0.5, 0.25, -0.75]), _correlated_inputs(_SMALL, 4, 3), 3, 0.01),
         label="weights already on the grid (scales 1 and 0.25, 3 bits): nothing to round, nothing to feed back"),
    Case((_fixed([0.3, -1.0]), _fixed([2.0, 0.0], [0.0, 1.0]), 3, 0.01),
         label="uncorrelated inputs, so H is diagonal: no feedback at all, GPTQ gives round-to-nearest's 1/3, -1"),
    Case((torch.randn(4, 8, generator=_MIXED, dtype=torch.float64), _correlated_inputs(_MIXED, 64, 8), 3, 0.1),
         label="a [4, 8] weight, 64 calibration rows of correlated inputs of unequal sizes, 3 bits, damp 0.1"),
    # (every mistake of the zoo below gives a different answer on this case, so each is named by its own hint)
    Case((_fixed([0.6, 0.29, 0.29]), _fixed([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]), 3, 0.01),
         label="three copies of one input channel, scale 0.2: round-to-nearest gives 0.6, 0.2, 0.2 (sum 1.0 for "
               "1.18); the second column's error 0.09 moves to the third: 0.6, 0.2, 0.4 (sum 1.2)"),
    Case((torch.randn(3, 6, generator=_SMALL, dtype=torch.float64), _correlated_inputs(_SMALL, 2, 6), 4, 0.01),
         label="2 calibration rows for 6 inputs: H has rank 2 and is invertible only once damped"),
    Case((torch.cat([torch.randn(1, 5, generator=_SMALL, dtype=torch.float64), torch.zeros(1, 5, dtype=torch.float64)]),
          _correlated_inputs(_SMALL, 8, 5), 4, 0.01),
         label="an all-zero weight row comes back as zeros (its scale would be 0: not NaN)"),
    Case((_fixed([0.7], [-0.2], [0.05]), _fixed([1.0], [3.0]), 2, 0.01),
         label="one column: nothing after it to feed back to (round-to-nearest: 0.7, 0, 0.05)"),
))


def _inverse_factor(hessian: torch.Tensor, damp: float) -> torch.Tensor:
    damped = hessian + damp * hessian.diagonal().mean() * torch.eye(hessian.shape[0], dtype=hessian.dtype)
    return torch.linalg.cholesky(torch.linalg.inv(damped), upper=True)


def _grid(weight, bits):
    """(scales [out, in]: each row's one scale repeated along the row, q_max)."""
    q_max = 2 ** (bits - 1) - 1
    scales = (weight.abs().amax(dim=1, keepdim=True) / q_max).clamp_min(torch.finfo(weight.dtype).eps)
    return scales.expand_as(weight), q_max


def _column_loop(weight, factor, scales, q_max, divide=True, clip=True):
    """The loop with switches for two of the mistakes: the error divided by the factor's diagonal, codes clipped."""
    work, result = weight.clone(), torch.zeros_like(weight)
    for k in range(weight.shape[1]):
        codes = torch.round(work[:, k] / scales[:, k])
        result[:, k] = (codes.clamp(-q_max, q_max) if clip else codes) * scales[:, k]
        error = (work[:, k] - result[:, k]) / (factor[k, k] if divide else 1.0)
        work[:, k + 1:] -= torch.outer(error, factor[k, k + 1:])
    return result


def _round_to_nearest_only(weight, inputs, bits, damp):
    scales, q_max = _grid(weight, bits)
    return torch.clamp(torch.round(weight / scales), -q_max, q_max) * scales


def _error_not_divided(weight, inputs, bits, damp):
    scales, q_max = _grid(weight, bits)
    return _column_loop(weight, _inverse_factor(2 * inputs.T @ inputs, damp), scales, q_max, divide=False)


def _hessian_not_inverse(weight, inputs, bits, damp):
    hessian = 2 * inputs.T @ inputs
    damped = hessian + damp * hessian.diagonal().mean() * torch.eye(hessian.shape[0], dtype=hessian.dtype)
    scales, q_max = _grid(weight, bits)
    return _column_loop(weight, torch.linalg.cholesky(damped, upper=True), scales, q_max)


def _rows_of_the_inverse(weight, inputs, bits, damp):
    hessian = 2 * inputs.T @ inputs
    damped = hessian + damp * hessian.diagonal().mean() * torch.eye(hessian.shape[0], dtype=hessian.dtype)
    scales, q_max = _grid(weight, bits)
    return _column_loop(weight, torch.linalg.inv(damped), scales, q_max)


def _no_damping(weight, inputs, bits, damp):
    scales, q_max = _grid(weight, bits)
    return _column_loop(weight, _inverse_factor(2 * inputs.T @ inputs, 0.0), scales, q_max)


def _feedback_to_quantized_columns(weight, inputs, bits, damp):
    scales, q_max = _grid(weight, bits)
    factor = _inverse_factor(2 * inputs.T @ inputs, damp)
    work = weight.clone()
    for k in range(weight.shape[1]):
        quantized = torch.clamp(torch.round(work[:, k] / scales[:, k]), -q_max, q_max) * scales[:, k]
        error = (work[:, k] - quantized) / factor[k, k]
        work[:, k] = quantized
        work -= torch.outer(error, factor[:, k])  # column k of U: it reaches back to the columns before k
    return work


def _no_clip(weight, inputs, bits, damp):
    scales, q_max = _grid(weight, bits)
    return _column_loop(weight, _inverse_factor(2 * inputs.T @ inputs, damp), scales, q_max, clip=False)


def _zero_scale(weight, inputs, bits, damp):
    q_max = 2 ** (bits - 1) - 1
    scales = (weight.abs().amax(dim=1, keepdim=True) / q_max).expand_as(weight)  # 0 on an all-zero row
    return _column_loop(weight, _inverse_factor(2 * inputs.T @ inputs, damp), scales, q_max)


def _scale_per_column(weight, inputs, bits, damp):
    q_max = 2 ** (bits - 1) - 1
    scales = (weight.abs().amax(dim=0, keepdim=True) / q_max).clamp_min(torch.finfo(weight.dtype).eps)
    return _column_loop(weight, _inverse_factor(2 * inputs.T @ inputs, damp), scales.expand_as(weight), q_max)


GPTQ_COLUMNS = register(CodeExercise(
    id="04.gptq_columns",
    title="GPTQ's column loop on one projection",
    function="gptq_quantize",
    reference=gptq_quantize,
    points=3,
    rtol=1e-6,
    atol=1e-9,
    n_random=25,
    hand_cases=_GPTQ_HAND_CASES,
    random_case=_gptq_case,
    hints=("s = max|row| / (2^(bits-1) - 1) per output row, fixed; H = 2 X^T X + damp * mean(diag H) * I (the "
           "damping makes a singular H invertible); "
           "U = the upper Cholesky factor of H^-1; for each column k: q = clip(round(w_k / s)) * s, "
           "e = (w_k - q) / U[k, k], and w[:, k+1:] -= outer(e, U[k, k+1:])",),
    mistakes=(
        Mistake("that is plain round-to-nearest: after quantizing column k, push its error onto the columns not yet "
                "quantized (w[:, k+1:] -= outer(e, U[k, k+1:]))", _round_to_nearest_only),
        Mistake("divide the error by the diagonal entry U[k, k] before spreading it: e = (w_k - q_k) / U[k, k]",
                _error_not_divided),
        Mistake("the update goes through the INVERSE Hessian: factor H^-1 (torch.linalg.inv, then "
                "torch.linalg.cholesky(..., upper=True)), not H itself", _hessian_not_inverse),
        Mistake("row k of H^-1 itself is only right for the first column: once a column is quantized it must "
                "leave H^-1. The upper Cholesky factor of H^-1 does that for every column at once: use its rows",
                _rows_of_the_inverse),
        Mistake("add the damping before inverting: H + damp * mean(diag H) * I (without it the result changes, "
                "and a singular H cannot be inverted at all)", _no_damping),
        Mistake("a quantized column is final: spread the error with ROW k of the upper factor, U[k, k+1:], onto "
                "the columns after k; column k of U reaches back to columns already on the grid",
                _feedback_to_quantized_columns),
        Mistake("clip the codes to [-(2^(bits-1) - 1), 2^(bits-1) - 1]: the feedback can push a weight past its "
                "row's largest value", _no_clip),
        Mistake("one scale per output ROW, max|w| over dim=1 of the original weight, fixed before the loop",
                _scale_per_column),
        Mistake("an all-zero row has max|w| = 0, so its scale is 0 and 0 / 0 gives NaN: give such a row any "
                "positive scale (torch.where, or clamp_min)", _zero_scale),
    ),
))

__all__ += ["GPTQ_COLUMNS", "gptq_quantize"]
