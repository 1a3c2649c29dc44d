"""Lab 05's static pictures: KV bytes against context, paged vs contiguous reservations, a grid of fit verdicts
(layer 3, explorers).

Plain matplotlib figures of numbers the core returns; the notebook shows each one as an image. The KV-cache
explorer itself (compute, render, the widget) is in :mod:`labkit.explorers.memory`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from labkit.core.budget import MemoryBudget
from labkit.core.memory import GB, GIB, kv_cache_bytes
from labkit.core.paging import AllocationReport
from labkit.core.spec import ModelSpec
from labkit.explorers.canvas import describe, plain, readable


def kv_context_figure(spec: ModelSpec, kv_heads: dict[str, int], contexts: Sequence[int], kv_dtype: str = "bf16",
                      capacity_bytes: int | None = None, weights_bytes: int | None = None,
                      weights_label: str = "the weights") -> Any:
    """KV-cache GiB of one sequence against context, one line per number of KV heads (MHA, GQA, MQA).

    ``capacity_bytes`` draws the card's size; with ``weights_bytes`` also what is left for the cache once the
    weights are loaded (the line a cache must stay under).

    >>> from labkit.core.presets import model_preset
    >>> figure = kv_context_figure(model_preset("Llama-3-8B"), {"MHA": 32, "MQA": 1}, [256, 512])
    >>> len(figure.axes[0].lines)
    2
    """
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 3.4), dpi=80, layout="constrained")
    axes = figure.add_subplot()
    said = []
    for label, n_kv_heads in kv_heads.items():
        shape = dataclasses.replace(spec, n_kv_heads=n_kv_heads)
        gib = [kv_cache_bytes(shape, 1, t, kv_dtype) / GIB for t in contexts]
        axes.plot(list(contexts), gib, marker="o", label=label)
        said.append(f"{label} ({n_kv_heads} KV heads) {plain(gib[0])} GiB at {contexts[0]:,} tokens to "
                    f"{plain(gib[-1])} GiB at {contexts[-1]:,}")
    if weights_bytes is not None and capacity_bytes is None:
        raise ValueError(f"weights_bytes needs capacity_bytes (what the weights are taken from), got weights_bytes="
                         f"{weights_bytes!r} and capacity_bytes=None")
    if capacity_bytes is not None:
        axes.axhline(capacity_bytes / GIB, color="grey", linestyle=":",
                     label=f"the card: {capacity_bytes / GIB:.4g} GiB = {capacity_bytes / GB:.4g} GB")
    if weights_bytes is not None:
        axes.axhline((capacity_bytes - weights_bytes) / GIB, color="grey", linestyle="--",
                     label=f"left after {weights_label}")
    axes.set(xscale="log", yscale="log", xlabel="cached tokens (one sequence)",
             ylabel=f"KV cache, GiB ({kv_dtype.upper()})", title=f"{spec.name}'s shape: KV bytes against context")
    axes.legend(fontsize=8)
    lines = ""
    if capacity_bytes is not None:
        lines = f"; a dotted line at the card's {plain(capacity_bytes / GIB)} GiB"
    if weights_bytes is not None:
        left = plain((capacity_bytes - weights_bytes) / GIB)
        lines += f", a dashed line at the {left} GiB left after {weights_label}"
    return describe(readable(figure), f"{spec.name}'s KV cache for one sequence ({kv_dtype.upper()}, log-log) against "
                    "cached tokens, one line per attention layout: " + "; ".join(said) + lines + ".")


def paging_figure(block_sizes: Sequence[int], paged: Sequence[AllocationReport],
                  contiguous: dict[str, AllocationReport]) -> Any:
    """Waste and requests that fit against the paged block size, with contiguous reservations as lines."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 3.3), dpi=80, layout="constrained")
    waste_axes, fit_axes = figure.subplots(1, 2)
    waste_axes.plot(list(block_sizes), [100 * r.waste_fraction for r in paged], marker="o", label="paged")
    fit_axes.plot(list(block_sizes), [r.requests_fit for r in paged], marker="o", label="paged")
    for (label, report), style in zip(contiguous.items(), ("--", ":", "-.")):
        waste_axes.axhline(100 * report.waste_fraction, color="grey", linestyle=style, label=label)
        fit_axes.axhline(report.requests_fit, color="grey", linestyle=style, label=label)
    waste_axes.set(xscale="log", xlabel="block size (tokens)", ylabel="wasted, % of reserved",
                   title="KV memory reserved but unused")
    fit_axes.set(xscale="log", xlabel="block size (tokens)", ylabel="requests", title="Requests that fit at once")
    waste_axes.legend(fontsize=8)
    fit_axes.legend(fontsize=8)
    paged_words = ", ".join(f"block {size}: {plain(100 * r.waste_fraction)} % wasted, {r.requests_fit} fit"
                            for size, r in zip(block_sizes, paged))
    lines = "; ".join(f"{label}: {plain(100 * r.waste_fraction)} % wasted, {r.requests_fit} fit (grey lines)"
                      for label, r in contiguous.items())
    return describe(readable(figure), "Two panels against the paged block size in tokens (log): KV memory reserved "
                    f"but unused, and requests that fit at once. Paged: {paged_words}. {lines}.")


def fit_grid_figure(rows: dict[str, Sequence[MemoryBudget]], columns: Sequence[str], title: str = "") -> Any:
    """Fit verdicts as a grid: one row per setting, one column per choice (e.g. GPU count), each cell green when
    its budget fits and red when not, labelled with the total GB per GPU.

    >>> fits = MemoryBudget(weights_bytes=2, kv_cache_bytes=1, activations_bytes=0, workspace_bytes=0,
    ...                     capacity_bytes=4)
    >>> figure = fit_grid_figure({"a setting": [fits, dataclasses.replace(fits, capacity_bytes=2)]}, ["1", "2"])
    >>> [text.get_text().splitlines()[1] for text in figure.axes[0].texts]
    ['fits', 'does not fit']
    """
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure

    labels = list(rows)
    if any(len(rows[label]) != len(columns) for label in labels):
        raise ValueError(f"every row needs one budget per column ({len(columns)})")
    figure = Figure(figsize=(2.6 + 1.4 * len(columns), 1.2 + 0.55 * len(labels)), dpi=80, layout="constrained")
    axes = figure.add_subplot()
    grid = [[float(result.fits) for result in rows[label]] for label in labels]
    axes.imshow(grid, cmap=ListedColormap(["#f4c7c3", "#b7e1cd"]), vmin=0, vmax=1, aspect="auto")
    for row, label in enumerate(labels):
        for column, result in enumerate(rows[label]):
            axes.text(column, row, f"{result.total_gb:.1f} GB\n{'fits' if result.fits else 'does not fit'}",
                      ha="center", va="center", fontsize=8)
    axes.set_xticks(range(len(columns)), list(columns))
    axes.set_yticks(range(len(labels)), labels)
    axes.set_title(title, fontsize=10)
    rows_said = "; ".join(f"{label}: " + ", ".join(
        f"{column} {result.total_gb:.1f} GB {'fits' if result.fits else 'does not fit'}"
        for column, result in zip(columns, rows[label])) for label in labels)
    heading = f"{title}: " if title else ""
    return describe(readable(figure), f"{heading}a grid of fit verdicts, green where the budget fits and red where "
                    f"not, total GB per GPU in each cell. {rows_said}.")
