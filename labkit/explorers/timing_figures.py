"""Lab 06's static pictures: the roofline, cached vs uncached steps, token emissions, batched requests (layer 3,
explorers).

Plain matplotlib figures of numbers the core and the runtime return; the notebook shows each one as an image. The
latency explorer itself (compute, render, the widget) is in :mod:`labkit.explorers.timing`.
"""

from __future__ import annotations

from typing import Any, Sequence

from labkit.core.roofline import attainable_flops_per_s
from labkit.explorers.canvas import describe, plain, readable


def roofline_figure(peak_flops_per_s: float, bandwidth_bytes_per_s: float,
                    points: dict[str, tuple[float, float]], title: str = "this machine's roofline") -> Any:
    """The roofline (log-log) with labelled points: ``{label: (FLOPs per byte, achieved FLOP/s)}``.

    >>> figure = roofline_figure(1e11, 1e10, {"decode": (0.5, 2e9)})
    >>> len(figure.axes[0].lines)  # the roof and one point
    2
    """
    from matplotlib.figure import Figure

    import numpy as np

    figure = Figure(figsize=(6.4, 3.4), dpi=80, layout="constrained")
    axes = figure.add_subplot()
    intensities = [i for i, _ in points.values()]
    low = min([0.1, *intensities]) / 2
    high = max([10 * peak_flops_per_s / bandwidth_bytes_per_s, *intensities]) * 2
    grid = np.geomspace(low, high, 200)
    roof = [attainable_flops_per_s(x, peak_flops_per_s, bandwidth_bytes_per_s) / 1e9 for x in grid]
    axes.plot(grid, roof, color="black", linewidth=1.5)
    for label, (intensity, achieved) in points.items():
        axes.scatter([intensity], [achieved / 1e9], zorder=3)
        axes.annotate(label, (intensity, achieved / 1e9), textcoords="offset points", xytext=(5, -10), fontsize=8)
    ridge = peak_flops_per_s / bandwidth_bytes_per_s
    axes.axvline(ridge, color="grey", linestyle=":")
    axes.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOPs per byte)", ylabel="GFLOP/s",
             title=f"{title}: ridge at {ridge:.1f} FLOPs/byte")
    def roof_at(intensity: float) -> float:
        return attainable_flops_per_s(intensity, peak_flops_per_s, bandwidth_bytes_per_s)

    said = "; ".join(f"{label} at {plain(intensity)} FLOPs/byte, {plain(achieved / 1e9)} GFLOP/s "
                     f"({plain(100 * achieved / roof_at(intensity))} % of the roof there)"
                     for label, (intensity, achieved) in points.items())
    return describe(readable(figure), f"{title} (log-log): GFLOP/s against arithmetic intensity; the roof rises at "
                    f"{plain(bandwidth_bytes_per_s / 1e9)} GB/s to a flat {plain(peak_flops_per_s / 1e9)} GFLOP/s, "
                    f"the ridge (dotted) at {ridge:.1f} FLOPs/byte. Points: {said}.")


def steps_figure(prefix_lens: Sequence[int], cached_step_s: Sequence[float], uncached_step_s: Sequence[float]) -> Any:
    """Step time against the prefix length, with and without the KV cache (step 0, the prefill, included).

    >>> len(steps_figure([4, 5], [0.2, 0.1], [0.2, 0.25]).axes[0].lines)
    2
    """
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 3.0), dpi=80, layout="constrained")
    axes = figure.add_subplot()
    axes.plot(list(prefix_lens), [s * 1e3 for s in cached_step_s], "o-", label="with the KV cache")
    axes.plot(list(prefix_lens), [s * 1e3 for s in uncached_step_s], "s-", label="recomputing the whole prefix")
    axes.set(xlabel="tokens in the prefix", ylabel="step time (ms)", ylim=(0, None),
             title="one new token: cached step vs full recomputation")
    axes.legend(fontsize=8)
    first, last = prefix_lens[0], prefix_lens[-1]
    return describe(readable(figure), "Step time in ms against tokens in the prefix, two lines: with the KV cache "
                    f"{plain(cached_step_s[0] * 1e3)} ms at {first} tokens (the prefill) then "
                    f"{plain(cached_step_s[-1] * 1e3)} ms at {last}; recomputing the whole prefix "
                    f"{plain(uncached_step_s[0] * 1e3)} ms at {first} and {plain(uncached_step_s[-1] * 1e3)} ms "
                    f"at {last}.")


def emissions_figure(requests: Sequence[Any], title: str = "when each token came out") -> Any:
    """One row per timed request: its TTFT as a bar from the start, then a tick at each token's emission.

    ``requests``: ``labkit.core.timing.RequestMetrics`` (read by attribute: ``ttft_s``, ``itl_s``).

    >>> from labkit.core.timing import request_metrics
    >>> figure = emissions_figure([request_metrics([0.5, 0.6, 0.7]), request_metrics([0.4, 0.6])])
    >>> len(figure.axes[0].patches), len(figure.axes[0].collections)  # two TTFT bars, two rows of ticks
    (2, 2)
    """
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 0.8 + 0.45 * len(requests)), dpi=80, layout="constrained")
    axes = figure.add_subplot()
    for row, request in enumerate(requests):
        stamps = [request.ttft_s + sum(request.itl_s[:i]) for i in range(len(request.itl_s) + 1)]
        axes.barh(row, request.ttft_s * 1e3, height=0.5, color="tab:orange", label="TTFT" if row == 0 else None)
        axes.scatter([s * 1e3 for s in stamps], [row] * len(stamps), marker="|", s=300, color="tab:blue",
                     label="a token emitted" if row == 0 else None)
    axes.set(yticks=range(len(requests)), yticklabels=[f"repeat {row + 1}" for row in range(len(requests))],
             xlabel="ms from the request's start", xlim=(0, None), title=title)
    axes.invert_yaxis()
    axes.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))  # beside the bars
    said = "; ".join(f"repeat {row + 1}: first token at {plain(request.ttft_s * 1e3)} ms (orange bar), "
                     f"{len(request.itl_s) + 1} tokens by {plain((request.ttft_s + sum(request.itl_s)) * 1e3)} ms"
                     for row, request in enumerate(requests))
    return describe(readable(figure), f"{title}: one row per timed repeat, a blue tick at each token's emission, "
                    f"in ms from the request's start. {said}.")


def requests_timeline_figure(one_after_another: Any, one_batch: Any,
                             title: str = "each request, from the start to its last token") -> Any:
    """A Gantt chart of two runs of the same requests: served one after another, and in one batch.

    Each run is a ``labkit.runtime.batching.RequestsRun`` (read by attribute: ``results`` with ``request``,
    ``batch`` and ``latency_s``). A request's bar starts when its batch starts (when the batch before it ended)
    and ends at its last token.

    >>> from types import SimpleNamespace as Run
    >>> alone = Run(results=[Run(request=0, batch=0, latency_s=1.0), Run(request=1, batch=1, latency_s=2.0)])
    >>> together = Run(results=[Run(request=0, batch=0, latency_s=1.5), Run(request=1, batch=0, latency_s=1.5)])
    >>> len(requests_timeline_figure(alone, together).axes[0].patches)  # one bar per request per run
    4
    """
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 0.8 + 0.5 * len(one_batch.results)), dpi=80, layout="constrained")
    axes = figure.add_subplot()
    for offset, run, colour, label in ((-0.2, one_after_another, "tab:grey", "one after another"),
                                       (0.2, one_batch, "tab:blue", "in one batch")):
        ends = {}  # batch -> when its last request finished
        for result in run.results:
            ends[result.batch] = max(ends.get(result.batch, 0.0), result.latency_s)
        for number, result in enumerate(sorted(run.results, key=lambda r: r.request)):
            start = max((end for batch, end in ends.items() if batch < result.batch), default=0.0)
            axes.barh(result.request + offset, (result.latency_s - start) * 1e3, left=start * 1e3, height=0.38,
                      color=colour, label=label if number == 0 else None)
    axes.set(yticks=sorted(r.request for r in one_batch.results), xlabel="ms from the start of the run",
             ylabel="request", title=title)
    axes.invert_yaxis()
    axes.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))  # beside the bars

    def finishes(run: Any) -> str:
        return ", ".join(f"{r.request} at {plain(r.latency_s * 1e3)} ms"
                         for r in sorted(run.results, key=lambda r: r.request))

    return describe(readable(figure), f"{title}: one bar pair per request, from its start to its last token. "
                    f"One after another (grey), requests end: {finishes(one_after_another)}. In one batch (blue): "
                    f"{finishes(one_batch)}.")
