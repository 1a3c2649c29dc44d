"""Lab 05's static figures plot what the core returns (labkit.explorers.memory_figures)."""

import pytest

from labkit.core.memory import GB, GIB
from labkit.core.paging import request_stream, simulate_kv_allocation
from labkit.core.presets import model_preset
from labkit.explorers.memory_figures import kv_context_figure, paging_figure


def test_the_lab_s_two_figures_plot_what_the_core_returns():
    from labkit.core.memory import kv_cache_bytes

    spec = model_preset("Llama-3-8B")
    weights = 16_060_522_496
    figure = kv_context_figure(spec, {"MHA": 32, "GQA": 8}, [256, 1024], capacity_bytes=80 * GIB,
                               weights_bytes=weights, weights_label="the BF16 weights")
    card, left = figure.axes[0].lines[2:]
    assert card.get_ydata()[0] == 80 and left.get_ydata()[0] == (80 * GIB - weights) / GIB
    assert left.get_label() == "left after the BF16 weights" and card.get_label() == "the card: 80 GiB = 85.9 GB"
    with pytest.raises(ValueError, match="weights_bytes needs capacity_bytes"):
        kv_context_figure(spec, {"GQA": 8}, [256], weights_bytes=weights)
    mha = figure.axes[0].lines[0].get_ydata()
    assert mha[1] * GIB == kv_cache_bytes(spec.__class__(**{**spec.__dict__, "n_kv_heads": 32}), 1, 1024)
    stream = request_stream(50, seed=0)
    paged = [simulate_kv_allocation(stream, spec, "paged", block_size=b, kv_budget_bytes=10 * GB) for b in (1, 16)]
    whole = simulate_kv_allocation(stream, spec, "contiguous", kv_budget_bytes=10 * GB)
    figure = paging_figure([1, 16], paged, {"contiguous, longest": whole})
    waste, fit = figure.axes
    assert list(fit.lines[0].get_ydata()) == [r.requests_fit for r in paged] and len(waste.lines) == 2
