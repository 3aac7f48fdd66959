"""Benchmark plumbing: turn pytest-benchmark timings into the units our targets use.

A benchmark declares what one call processes with ``throughput(benchmark, records=..., bytes=...)``;
at the end of the run a table prints records/s and MB/s from each benchmark's median time, and
ratios between benchmarks measured in this same run (the machine is noisy: compare only within a run).
"""

from __future__ import annotations

import pytest

_RESULTS: list[tuple[str, object, int, int]] = []
_RATIOS: list[tuple[str, str, str, float | None]] = []


def throughput(benchmark, *, records: int = 0, nbytes: int = 0) -> None:
    """Record what one benchmarked call processes; the summary divides by the median time."""
    benchmark.extra_info["records_per_call"] = records
    benchmark.extra_info["bytes_per_call"] = nbytes
    _RESULTS.append((benchmark.name, benchmark, records, nbytes))


def median_s(name: str) -> float | None:
    for bench_name, bench, _, _ in _RESULTS:
        if bench_name == name and bench.stats is not None:
            return bench.stats.stats.median
    return None


def ratio(label: str, numerator: str, denominator: str, target: float | None = None) -> None:
    """Report throughput(numerator) / throughput(denominator) in the summary."""
    _RATIOS.append((label, numerator, denominator, target))


@pytest.fixture
def report_throughput():
    return throughput


def pytest_terminal_summary(terminalreporter):
    rows = [(name, bench, rec, nb) for name, bench, rec, nb in _RESULTS if bench.stats is not None]
    if not rows:
        return
    tr = terminalreporter
    tr.section("throughput (from median time per call)")
    tr.write_line(f"{'benchmark':<58} {'records/s':>14} {'MB/s':>10}")
    for name, bench, rec, nb in rows:
        median = bench.stats.stats.median
        rps = f"{rec / median:,.0f}" if rec else "-"
        mbps = f"{nb / median / 1e6:,.1f}" if nb else "-"
        tr.write_line(f"{name:<58} {rps:>14} {mbps:>10}")
    for label, num, den, target in _RATIOS:
        a, b = median_s(num), median_s(den)
        if a and b:
            value = b / a  # same work per call: throughput ratio is the inverse time ratio
            verdict = ""
            if target is not None:
                verdict = f"  (target >= {target:.2f}: {'met' if value >= target else 'MISSED'})"
            tr.write_line(f"ratio {label}: {value:.2f}{verdict}")
