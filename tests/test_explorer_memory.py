"""The KV-cache explorer: compute() values, render() moves artists in place, the widget answers its controls."""

import pytest

from labkit.core.budget import budget, max_batch_size
from labkit.explorers.memory import (
    GROUP_SIZE, MemoryFigure, bar_parts_gb, compute, memory_explorer, render, steps_html, verdict_html, verdict_text,
)
from labkit.core.memory import GB, GIB, kv_cache_bytes
from labkit.core.presets import gpu_preset, model_layout, model_preset
from labkit.core.spec import ATTENTION


def test_compute_agrees_with_the_core_budget():
    view = compute("Llama-3-8B", "H100-SXM", "bf16", "fp16", batch_size=16, seq_len=4096)
    expected = budget(model_preset("Llama-3-8B"), gpu_preset("H100-SXM"), 16, 4096, kv_dtype="fp16",
                      layout=model_layout("Llama-3-8B"))
    assert view.budget == expected and view.budget.kv_cache_bytes == 8 * GIB
    assert view.max_batch == max_batch_size(model_preset("Llama-3-8B"), gpu_preset("H100-SXM"), 4096,
                                            kv_dtype="fp16")
    assert "2 x B 16 x T 4,096 x L 32 x H_kv 8 x d_h 128 x 2 B = 8,589,934,592 B" in view.steps[1]
    assert view.steps[0].startswith("weights: 8,030,261,248 params x 2 B = 16,060,522,496 B")


def test_integer_weights_carry_group_scales_in_the_arithmetic():
    view = compute("Llama-3.3-70B", "A100-80GB", "int4", batch_size=1, seq_len=4096)
    n = model_preset("Llama-3.3-70B").n_params
    assert view.budget.weights_bytes == n // 2 + -(-n // GROUP_SIZE) * 2
    assert f"ceil({n:,} / 128) scales x 2 B" in view.steps[0]


def test_attention_what_if_scales_the_kv_cache_by_the_group():
    views = {a: compute("Llama-3-8B", "A100-80GB", batch_size=4, seq_len=8192, attention=a) for a in ATTENTION}
    kv = {a: v.budget.kv_cache_bytes for a, v in views.items()}
    assert kv["as built"] == kv["GQA"] == kv["MHA"] // 4 == kv["MQA"] * 8
    assert views["MHA"].budget.weights_bytes > views["as built"].budget.weights_bytes  # bigger k/v projections


def test_tensor_parallel_is_per_gpu_and_impossible_splits_are_reported():
    one, four = (compute("Llama-3.3-70B", "H100-SXM", batch_size=1, seq_len=8192, tp=tp) for tp in (1, 4))
    assert not one.budget.fits and four.budget.fits
    assert four.budget.kv_cache_bytes == kv_cache_bytes(model_preset("Llama-3.3-70B"), 1, 8192) // 4
    falcon = compute("Falcon-7B", "T4", tp=2)
    assert falcon.budget is None and "tp must divide n_heads (71)" in falcon.error
    assert bar_parts_gb(falcon) == (0.0,) * 5 and verdict_text(falcon).startswith("impossible setting")
    assert compute("Falcon-7B", "T4", attention="GQA").error == "GQA what-if: 71 query heads cannot be grouped by 4"


def test_bar_parts_sum_to_the_capacity_when_it_fits():
    view = compute("SmolLM2-135M", "T4", batch_size=8, seq_len=2048)
    parts = bar_parts_gb(view)
    assert sum(parts) == pytest.approx(15_360 * 2**20 / GB) and parts[-1] == view.budget.headroom_bytes / GB
    assert verdict_text(view).startswith("FITS: ")


def test_render_moves_the_same_artists():
    figure = MemoryFigure()
    bars, line = list(figure.bars), figure.capacity
    n_artists = len(figure.axes.get_children())
    small = compute("SmolLM2-135M", "T4", batch_size=1, seq_len=1024)
    big = compute("Llama-3.3-70B", "H100-SXM", batch_size=16, seq_len=16384)
    render(figure, small)
    first = figure.canvas.image.value
    render(figure, big)
    assert figure.bars == bars and figure.capacity is line and len(figure.axes.get_children()) == n_artists
    assert figure.bars[1].get_width() == pytest.approx(big.budget.kv_cache_bytes / GB)
    assert figure.axes.get_xlim()[1] > 279  # widened to show what does not fit
    assert figure.canvas.image.value != first and figure.canvas.image.value[:4] == b"\x89PNG"
    assert "DOES NOT FIT" in verdict_html(big) and "&times;" not in steps_html(big)


def test_widget_builds_and_answers_every_control():
    explorer = memory_explorer()
    controls, image, text = explorer.controls, explorer.canvas.image, explorer.text
    for name, value in [("preset", "Qwen3-0.6B"), ("gpu_name", "T4"), ("weight_fmt", "int4"), ("kv_dtype", "fp8"),
                        ("log2_batch", 7), ("log2_seq", 15), ("attention", "MQA"), ("tp", 2),
                        ("prefill_chunk", 8192)]:
        before = (image.value, text.value, explorer.canvas.alt_text)
        controls[name].value = value
        after = (image.value, text.value, explorer.canvas.alt_text)
        assert all(b != a for b, a in zip(before, after)), name  # the picture, the numbers and its text
    assert "Qwen3-0.6B on 2 x T4, batch 128 x 32,768 tokens, INT4 weights, FP8 KV cache" in explorer.canvas.alt_text
    assert explorer.canvas.alt_text in explorer.canvas.caption.value.replace("&#x27;", "'")
    assert "H_kv 1 (of 1, over 2 GPUs)" in text.value  # MQA over 2 GPUs: the single KV head is copied
    controls["preset"].value = "Falcon-7B"  # 71 heads over 2 GPUs: reported, not raised
    assert "impossible setting" in explorer.verdict.value


def test_chunked_prefill_turns_the_seed_labs_70b_experiment_into_a_fit():
    # 16 x 16,384 tokens of Llama-3.3-70B in INT4, FP16 cache, on 2 H100s: a one-pass prefill needs 24.5 GiB of
    # activations per GPU and does not fit; chunks of 8,192 tokens do.
    setting = dict(weight_fmt="int4", batch_size=16, seq_len=16_384, kv_dtype="fp16", tp=2)
    one_pass = compute("Llama-3.3-70B", "H100-SXM", **setting)
    chunked = compute("Llama-3.3-70B", "H100-SXM", prefill_chunk=8192, **setting)
    assert not one_pass.budget.fits and chunked.budget.fits
    assert chunked.budget.kv_cache_bytes == one_pass.budget.kv_cache_bytes  # only the activations change
    assert chunked.budget.activations_bytes < one_pass.budget.activations_bytes / 20
    assert "a chunk of 8,192 tokens" in chunked.steps[2] and "every prompt at once" in one_pass.steps[2]


def test_display_carries_the_widget_and_a_picture_of_it():
    import base64

    explorer = memory_explorer()
    bundle = explorer._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == explorer.widget.model_id
    assert base64.b64decode(bundle["image/png"])[:4] == b"\x89PNG"
    assert "VBox" not in bundle["text/plain"]
    # The picture's HTML form: the same PNG, with the text alternative the caption shows.
    png = bundle["image/png"]
    assert bundle["text/html"].startswith(f'<img src="data:image/png;base64,{png}" alt="Llama-3-8B on 1')
    assert "red line at the GPU&#x27;s 85.9 GB: fits" in bundle["text/html"]  # escaped for an attribute


def test_no_number_in_the_text_is_the_explorer_s_own_arithmetic():
    view = compute("Llama-3-8B", "A100-80GB", "int4", batch_size=2, seq_len=1024, tp=2)
    b = view.budget
    for part in (b.weights_bytes, b.kv_cache_bytes, b.activations_bytes, b.workspace_bytes, b.total_bytes):
        assert f"{part:,} B" in "".join(view.steps)
    assert "10% of the GPU" in view.steps[3] and b.workspace_bytes == 8 * 2**30  # of the A100's 81,920 MiB
    assert "(nvidia-smi: 81,920 MiB; datasheet: 80 GB HBM2e)" in view.steps[5]
