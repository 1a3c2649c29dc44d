"""labkit.runtime.probes: the bandwidth and matmul micro-benchmarks report their work, time and thread count.
No test here compares a time with a threshold (speed lives in benchmarks/timing.py)."""

import pytest

from labkit.runtime import probes


def test_probes_report_their_work_and_thread_count():
    bandwidth = probes.bandwidth_probe(4 * 2**20, threads=1, min_run_time=0.01)
    assert bandwidth.work == 4 * 2**20 and bandwidth.threads == 1 and bandwidth.n_measurements >= 1
    assert bandwidth.rate == bandwidth.work / bandwidth.median_s > 0
    matmul = probes.matmul_probe(64, threads=1, min_run_time=0.01)
    assert matmul.work == 2 * 64**3 and "64 x 64 matmul (float32)" == matmul.what
    roof = probes.MachineRoofline(bandwidth, matmul)
    assert roof.ridge == pytest.approx(matmul.rate / bandwidth.rate)
    with pytest.raises(ValueError, match=r"n_bytes must be an int >= 4 MiB \(4,194,304\), got 1000"):
        probes.bandwidth_probe(1000)
