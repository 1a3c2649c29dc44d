"""Lab 04's exercises: the prediction on the outlier visualizer, LLM.int8()'s mixed-precision matmul and GPTQ's
column loop, each with its bug zoo."""


import pytest
import torch

from labkit.core.gptq import layer_output_error, round_to_nearest
from labkit.core.outlier_schemes import outlier_channels
from labkit.exercises import exercises, get
from labkit.exercises.checking import check_function
from labkit.exercises.lab04 import _linear_input as PREDICT_INPUT
from zoo import assert_zoo

PREDICT = get("04.predict_outlier_channels")
INT8_MATMUL = get("04.int8_matmul")
GPTQ_COLUMNS = get("04.gptq_columns")


def test_prediction_within_a_factor_of_two(embedded):
    truth = PREDICT.reference()
    assert 1 <= truth <= 3  # the q/k/v_proj input at layer 15: channel 247 (the residual stream: over 500)
    assert check_function(PREDICT, lambda: truth * 0.6).close is True
    assert check_function(PREDICT, lambda: 5).close is False


def test_the_prediction_says_what_may_be_called():
    assert PREDICT.n_random == 0
    assert PREDICT.allowed_text == ("No labkit function may be called inside your function: the check reports any "
                                    "call into labkit.")


def test_lab04_registers_its_exercises_in_notebook_order():
    assert [ex.id for ex in exercises("04")] == ["04.predict_outlier_channels", "04.int8_matmul",
                                                 "04.gptq_columns"]
    assert [ex.points for ex in exercises("04")] == [1, 3, 3]


# --------------------------------------------------------------------------------------------------------------
# 04.int8_matmul: the solution, and the learners' mistakes written here (a call into labkit would be reported as
# such, not as the mistake)


def int8_solution(x, weight, threshold):
    outliers = (x.abs() >= threshold).any(dim=0)  # [in]: a channel where any token reaches the threshold
    float_part = x[:, outliers] @ weight[:, outliers].T
    x_rest, w_rest = x.masked_fill(outliers, 0.0), weight.masked_fill(outliers, 0.0)
    x_scales = x_rest.abs().amax(dim=1, keepdim=True) / 127  # [tokens, 1]
    w_scales = w_rest.abs().amax(dim=1, keepdim=True) / 127  # [out, 1]
    x_scales = torch.where(x_scales == 0, torch.ones_like(x_scales), x_scales)
    w_scales = torch.where(w_scales == 0, torch.ones_like(w_scales), w_scales)
    x_codes, w_codes = torch.round(x_rest / x_scales), torch.round(w_rest / w_scales)
    return float_part + (x_codes @ w_codes.T) * x_scales * w_scales.T


def _rowwise(values, dim=1):
    scales = values.abs().amax(dim=dim, keepdim=True) / 127
    scales = torch.where(scales == 0, torch.ones_like(scales), scales)
    return torch.round(values / scales) * scales


def _split(x, weight, keep):
    return x[:, keep] @ weight[:, keep].T, x.masked_fill(keep, 0.0), weight.masked_fill(keep, 0.0)


def per_tensor_scales(x, weight, threshold):
    float_part, x_rest, w_rest = _split(x, weight, (x.abs() >= threshold).any(dim=0))
    x_scale, w_scale = max(float(x_rest.abs().max()) / 127, 1e-12), max(float(w_rest.abs().max()) / 127, 1e-12)
    return float_part + (torch.round(x_rest / x_scale) * x_scale) @ (torch.round(w_rest / w_scale) * w_scale).T


def scales_with_outliers(x, weight, threshold):
    float_part, x_rest, w_rest = _split(x, weight, (x.abs() >= threshold).any(dim=0))
    x_scales = (x.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-12)
    w_scales = (weight.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-12)
    return float_part + (torch.round(x_rest / x_scales) * x_scales) @ (torch.round(w_rest / w_scales) * w_scales).T


def outliers_per_token(x, weight, threshold):
    large = x.abs() >= threshold
    return (x * large) @ weight.T + _rowwise(x.masked_fill(large, 0.0)) @ _rowwise(weight).T


def strictly_above(x, weight, threshold):
    float_part, x_rest, w_rest = _split(x, weight, (x.abs() > threshold).any(dim=0))
    return float_part + _rowwise(x_rest) @ _rowwise(w_rest).T


def outliers_dropped(x, weight, threshold):
    _, x_rest, w_rest = _split(x, weight, (x.abs() >= threshold).any(dim=0))
    return _rowwise(x_rest) @ _rowwise(w_rest).T


def weight_scales_per_column(x, weight, threshold):
    float_part, x_rest, w_rest = _split(x, weight, (x.abs() >= threshold).any(dim=0))
    return float_part + _rowwise(x_rest) @ _rowwise(w_rest, dim=0).T


def zero_row_nan(x, weight, threshold):
    float_part, x_rest, w_rest = _split(x, weight, (x.abs() >= threshold).any(dim=0))
    x_scales, w_scales = x_rest.abs().amax(dim=1, keepdim=True) / 127, w_rest.abs().amax(dim=1, keepdim=True) / 127
    return float_part + (torch.round(x_rest / x_scales) * x_scales) @ (torch.round(w_rest / w_scales) * w_scales).T


def int8_stub(x, weight, threshold):
    raise NotImplementedError("your code here")


def test_int8_matmul_zoo(embedded):
    assert_zoo(INT8_MATMUL, int8_solution, {
        per_tensor_scales: "one scale per token (row of x) and one per output row",
        scales_with_outliers: "take the scales after zeroing the outlier columns",
        outliers_per_token: "the float columns are whole input channels",
        strictly_above: "compare with >=, not >",
        outliers_dropped: "the outlier columns are not thrown away",
        weight_scales_per_column: "one per OUTPUT row",
        zero_row_nan: "an all-zero row has max|row| = 0",
    })
    assert check_function(INT8_MATMUL, int8_stub).status == "not attempted"


def test_int8_matmul_passes_on_the_real_layer_and_fresh_random_cases(embedded):
    # (how long a verdict takes is measured by `make bench`, not asserted here)
    assert check_function(INT8_MATMUL, int8_solution).status == "passed"


def test_int8_matmul_hand_cases_are_what_their_labels_say(embedded):
    cases = list(INT8_MATMUL.hand_cases)
    assert len(cases) == len(INT8_MATMUL.hand_cases) == 6
    plain, all_float, exact, zero_rows, one_token, real = cases
    reference = INT8_MATMUL.reference
    assert not bool(outlier_channels(plain.args[0], 6.0).any())
    assert torch.allclose(reference(*plain.args), _rowwise(plain.args[0]) @ _rowwise(plain.args[1]).T)
    assert bool(outlier_channels(all_float.args[0], 6.0).all())
    assert torch.equal(reference(*all_float.args), all_float.args[0] @ all_float.args[1].T)
    assert outlier_channels(exact.args[0], 6.0).tolist() == [True, False, False, False]
    out = reference(*zero_rows.args)
    assert not bool(out.isnan().any())
    assert torch.equal(out[0], torch.zeros(3)) and torch.equal(out[2], torch.zeros(3)) and bool(out[1].ne(0).any())
    assert outlier_channels(one_token.args[0], one_token.args[2]).tolist() == [False, False, True, False]
    x, weight, threshold = real.args
    assert x.shape[1] == weight.shape[1] == 576 and torch.equal(x, PREDICT_INPUT())
    assert int(outlier_channels(x, threshold).sum()) == int(PREDICT.reference())
    outputs = [wrong(*exact.args) for wrong in (int8_solution, scales_with_outliers, strictly_above,
                                                 outliers_dropped, outliers_per_token)]
    assert all(not torch.allclose(outputs[i], outputs[j]) for i in range(len(outputs)) for j in range(i))


def test_int8_matmul_says_what_may_be_called():
    assert INT8_MATMUL.allowed_text.startswith("Neither labkit's functions nor torch's ready-made "
                                               "`torch.quantize_per_tensor`")


# --------------------------------------------------------------------------------------------------------------
# 04.gptq_columns: the solution, and the learners' mistakes written here (a call into labkit would be reported
# as such, not as the mistake)


def gptq_solution(weight, inputs, bits, damp):
    q_max = 2 ** (bits - 1) - 1
    scales = weight.abs().amax(dim=1) / q_max
    scales = torch.where(scales == 0, torch.ones_like(scales), scales)  # an all-zero row: any scale gives 0
    hessian = 2 * inputs.T @ inputs
    hessian = hessian + damp * hessian.diagonal().mean() * torch.eye(hessian.shape[0], dtype=hessian.dtype)
    upper = torch.linalg.cholesky(torch.linalg.inv(hessian), upper=True)
    work, result = weight.clone(), torch.zeros_like(weight)
    for column in range(weight.shape[1]):
        result[:, column] = torch.clamp(torch.round(work[:, column] / scales), -q_max, q_max) * scales
        error = (work[:, column] - result[:, column]) / upper[column, column]
        work[:, column + 1:] -= torch.outer(error, upper[column, column + 1:])
    return result


def _scales(weight, bits, dim=1):
    q_max = 2 ** (bits - 1) - 1
    scales = weight.abs().amax(dim=dim, keepdim=True) / q_max
    return torch.where(scales == 0, torch.ones_like(scales), scales).expand_as(weight), q_max


def _damped(inputs, damp):
    hessian = 2 * inputs.T @ inputs
    return hessian + damp * hessian.diagonal().mean() * torch.eye(hessian.shape[0], dtype=hessian.dtype)


def _loop(weight, factor, scales, q_max, divide=True, clip=True):
    work, result = weight.clone(), torch.zeros_like(weight)
    for k in range(weight.shape[1]):
        codes = torch.round(work[:, k] / scales[:, k])
        result[:, k] = (codes.clamp(-q_max, q_max) if clip else codes) * scales[:, k]
        error = (work[:, k] - result[:, k]) / (factor[k, k] if divide else 1.0)
        work[:, k + 1:] -= torch.outer(error, factor[k, k + 1:])
    return result


def _upper_inverse(inputs, damp):
    return torch.linalg.cholesky(torch.linalg.inv(_damped(inputs, damp)), upper=True)


def round_to_nearest_only(weight, inputs, bits, damp):
    scales, q_max = _scales(weight, bits)
    return torch.clamp(torch.round(weight / scales), -q_max, q_max) * scales


def error_not_divided(weight, inputs, bits, damp):
    return _loop(weight, _upper_inverse(inputs, damp), *_scales(weight, bits), divide=False)


def hessian_not_inverse(weight, inputs, bits, damp):
    return _loop(weight, torch.linalg.cholesky(_damped(inputs, damp), upper=True), *_scales(weight, bits))


def rows_of_the_inverse(weight, inputs, bits, damp):
    return _loop(weight, torch.linalg.inv(_damped(inputs, damp)), *_scales(weight, bits))


def no_damping(weight, inputs, bits, damp):
    return _loop(weight, _upper_inverse(inputs, 0.0), *_scales(weight, bits))


def feedback_to_quantized_columns(weight, inputs, bits, damp):
    scales, q_max = _scales(weight, bits)
    upper = _upper_inverse(inputs, damp)
    work = weight.clone()
    for k in range(weight.shape[1]):
        quantized = torch.clamp(torch.round(work[:, k] / scales[:, k]), -q_max, q_max) * scales[:, k]
        error = (work[:, k] - quantized) / upper[k, k]
        work[:, k] = quantized
        work -= torch.outer(error, upper[:, k])
    return work


def no_clip(weight, inputs, bits, damp):
    return _loop(weight, _upper_inverse(inputs, damp), *_scales(weight, bits), clip=False)


def scale_per_column(weight, inputs, bits, damp):
    return _loop(weight, _upper_inverse(inputs, damp), *_scales(weight, bits, dim=0))


def zero_scale_nan(weight, inputs, bits, damp):
    q_max = 2 ** (bits - 1) - 1
    scales = (weight.abs().amax(dim=1, keepdim=True) / q_max).expand_as(weight)
    return _loop(weight, _upper_inverse(inputs, damp), scales, q_max)


def stub(weight, inputs, bits, damp):
    raise NotImplementedError("your code here")


def test_gptq_columns_zoo(embedded):
    assert_zoo(GPTQ_COLUMNS, gptq_solution, {
        round_to_nearest_only: "plain round-to-nearest",
        error_not_divided: "divide the error by the diagonal entry U[k, k]",
        hessian_not_inverse: "through the INVERSE Hessian",
        rows_of_the_inverse: "row k of H^-1 itself is only right for the first column",
        no_damping: "add the damping before inverting",
        feedback_to_quantized_columns: "a quantized column is final",
        no_clip: "clip the codes",
        scale_per_column: "one scale per output ROW",
        zero_scale_nan: "an all-zero row has max|w| = 0",
    })
    assert check_function(GPTQ_COLUMNS, stub).status == "not attempted"


def test_gptq_columns_passes_on_the_real_layer_and_fresh_random_cases(embedded):
    # (how long a verdict takes is measured by `make bench`, not asserted here)
    assert check_function(GPTQ_COLUMNS, gptq_solution).status == "passed"


def test_gptq_columns_hand_cases_are_what_their_labels_say(embedded):
    cases = list(GPTQ_COLUMNS.hand_cases)
    assert len(cases) == len(GPTQ_COLUMNS.hand_cases) == 8
    on_grid, diagonal, mixed, copies, singular, zero_row, one_column, real = cases
    outputs = [wrong(*mixed.args) for wrong in (gptq_solution, round_to_nearest_only, error_not_divided,
                                                 hessian_not_inverse, rows_of_the_inverse, no_damping, no_clip)]
    assert all(not torch.allclose(outputs[i], outputs[j]) for i in range(len(outputs)) for j in range(i))
    assert torch.equal(GPTQ_COLUMNS.reference(*on_grid.args), on_grid.args[0])
    for case in (diagonal, one_column):  # nothing to feed back: round-to-nearest exactly
        assert torch.equal(GPTQ_COLUMNS.reference(*case.args), round_to_nearest_only(*case.args))
    assert torch.allclose(GPTQ_COLUMNS.reference(*copies.args), torch.tensor([[0.6, 0.2, 0.4]], dtype=torch.float64))
    assert torch.allclose(round_to_nearest_only(*copies.args), torch.tensor([[0.6, 0.2, 0.2]], dtype=torch.float64))
    weight, inputs = singular.args[:2]
    assert inputs.shape[0] < inputs.shape[1]
    assert int(torch.linalg.matrix_rank(2 * inputs.T @ inputs)) == inputs.shape[0]
    assert torch.equal(GPTQ_COLUMNS.reference(*zero_row.args)[1], torch.zeros(5, dtype=torch.float64))
    assert real.args[0].shape == (128, 576) and real.args[1].shape == (1024, 576)


def test_gptq_columns_beats_round_to_nearest_on_held_out_tokens(embedded):
    from labkit.core.texts import load_eval_text, tokenize_sections
    from labkit.runtime.quantize import linear_inputs

    weight, calibration, bits, damp = list(GPTQ_COLUMNS.hand_cases)[-1].args
    eval_ids = tokenize_sections(embedded.tokenizer, load_eval_text()).token_ids
    held_out = linear_inputs(embedded, "model.layers.3.self_attn.q_proj", eval_ids)[1024:].double()
    mine = gptq_solution(weight, calibration, bits, damp)
    rtn = round_to_nearest(weight, bits).dequantize()
    assert layer_output_error(weight, mine, held_out) < 0.9 * layer_output_error(weight, rtn, held_out)


def test_gptq_columns_says_what_may_be_called():
    assert GPTQ_COLUMNS.allowed_text == ("No labkit function may be called inside your function: the check reports "
                                         "any call into labkit.")


def test_a_random_int8_case_never_hangs_on_how_the_learner_divides():
    """The taught formula round(v / s) and labkit's quantizer (v * (1 / s)) agree on every random case: a case
    whose INT8 part sits at a rounding tie is drawn again (the course's own solution once lost its points to
    one such case through the grader)."""
    from labkit.exercises.lab04 import INT8_MATMUL, _near_an_int8_tie

    def taught(x, weight, threshold):
        outliers = (x.abs() >= threshold).any(dim=0)
        x_rest, weight_rest = x.masked_fill(outliers, 0.0), weight.masked_fill(outliers, 0.0)
        x_scales = (x_rest.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-12)
        weight_scales = (weight_rest.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-12)
        codes = torch.round(x_rest / x_scales) @ torch.round(weight_rest / weight_scales).T
        return x[:, outliers] @ weight[:, outliers].T + codes * x_scales * weight_scales.T

    generator = torch.Generator().manual_seed(237449454)  # the seed of the case that cost the solution its points
    for _ in range(300):
        case = INT8_MATMUL.random_case(generator)
        assert not _near_an_int8_tie(*case.args)
        assert torch.allclose(taught(*case.args), INT8_MATMUL.reference(*case.args), rtol=1e-4, atol=1e-4)
