"""The latency histogram: bucket layout, percentile error within 1 %, merging, transport."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.histogram import BUCKETS, MAX_BITS, Histogram, bucket_bounds, bucket_index


def exact_percentile(values: np.ndarray, q: float) -> int:
    """The ceil(q/100 * n)-th smallest value: the definition the histogram approximates."""
    ordered = np.sort(values)
    rank = max(1, int(np.ceil(q / 100 * ordered.size)))
    return int(ordered[rank - 1])


def test_buckets_tile_the_range_without_gaps_or_overlaps():
    previous_high = -1
    for index in range(BUCKETS):
        low, high = bucket_bounds(index)
        assert low == previous_high + 1
        assert bucket_index(low) == index and bucket_index(high) == index
        assert high == low if low < 256 else (high - low + 1) / low <= 1 / 128  # exact, then log-linear
        previous_high = high
    assert previous_high == (1 << MAX_BITS) - 1


def test_small_values_are_exact():
    h = Histogram()
    h.record_array(np.arange(256))
    assert h.percentile(50) == 127
    assert h.percentile(100) == 255
    assert h.min == 0 and h.max == 255


def test_scalar_and_array_recording_agree():
    values = np.random.default_rng(1).integers(0, 10**9, 5000)
    a, b = Histogram(), Histogram()
    a.record_array(values)
    for v in values.tolist():
        b.record(v)
    assert np.array_equal(a.counts, b.counts)
    assert (a.total, a.min, a.max, a.sum) == (b.total, b.min, b.max, b.sum)


@pytest.mark.parametrize("distribution", ["lognormal", "uniform", "bimodal"])
def test_percentiles_within_one_percent_of_exact(distribution):
    rng = np.random.default_rng(7)
    if distribution == "lognormal":
        values = rng.lognormal(13, 1.5, 200_000).astype(np.int64)  # ~0.4 ms median, long tail, in ns
    elif distribution == "uniform":
        values = rng.integers(1_000, 50_000_000, 200_000)
    else:
        values = np.concatenate([rng.normal(300_000, 20_000, 150_000), rng.normal(40_000_000, 1e6, 50_000)])
        values = np.maximum(values, 0).astype(np.int64)
    h = Histogram()
    h.record_array(values)
    for q in (1, 10, 50, 90, 95, 99, 99.9, 99.99):
        exact = exact_percentile(values, q)
        assert abs(h.percentile(q) - exact) <= 0.01 * exact, q
    assert h.percentile(100) == values.max()
    assert h.mean() == pytest.approx(values.mean())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**40 - 1), min_size=1, max_size=300), st.floats(0, 100))
def test_any_percentile_of_any_values_within_one_percent(values, q):
    h = Histogram()
    h.record_array(values)
    exact = exact_percentile(np.array(values), q)
    assert abs(h.percentile(q) - exact) <= 0.01 * exact + 0.5


def test_weighted_recording_counts_each_value_that_many_times():
    h = Histogram()
    h.record_array([1000, 2000], counts=[3, 1])
    assert h.total == 4
    assert h.percentile(75) == pytest.approx(1000, rel=0.004)
    assert h.percentile(76) == pytest.approx(2000, rel=0.004)


def test_merge_equals_recording_everything_in_one():
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 10**8, 1000), rng.integers(10**6, 10**10, 1000)
    a, b, both = Histogram(), Histogram(), Histogram()
    a.record_array(x)
    b.record_array(y)
    both.record_array(np.concatenate([x, y]))
    a.merge(b)
    assert np.array_equal(a.counts, both.counts)
    assert (a.total, a.min, a.max, a.sum) == (both.total, both.min, both.max, both.sum)


def test_sparse_round_trip_keeps_everything():
    h = Histogram()
    h.record_array([5, 5, 70_000, 3_000_000_000])
    copy = Histogram.from_sparse(h.to_sparse())
    assert np.array_equal(copy.counts, h.counts)
    assert copy.summary() == h.summary()


def test_out_of_range_values_are_clamped_and_counted():
    h = Histogram()
    h.record_array([-5, 1 << 50])
    assert h.clamped == 2
    assert h.counts[0] == 1 and h.counts[BUCKETS - 1] == 1
    assert h.min == -5 and h.max == 1 << 50  # exact extremes are kept


def test_empty_histogram_summarises_as_none():
    summary = Histogram().summary()
    assert summary["count"] == 0 and summary["p50"] is None and summary["max"] is None


def test_summary_scales_ns_to_ms_with_named_percentiles():
    h = Histogram()
    h.record_array(np.full(10, 2_000_000))
    assert h.summary() == {"count": 10, "min": 2.0, "mean": 2.0, "p50": 2.0, "p95": 2.0, "p99": 2.0,
                           "p999": 2.0, "max": 2.0}
