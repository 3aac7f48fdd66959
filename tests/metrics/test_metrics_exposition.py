"""The Prometheus text format 0.0.4 as hpbroker.metrics renders it, and the histogram behind it."""

from __future__ import annotations

import math

import pytest

from hpbroker.metrics import Histogram, MetricFamily, render
from hpbroker.metrics.exposition import format_value


def test_a_counter_and_a_gauge_render_with_help_type_and_labels():
    records = MetricFamily("hpb_records_total", "counter", "Records appended.", ("topic", "partition"))
    records.add(("orders", 0), 10)
    records.add(("orders", 1), 7)
    workers = MetricFamily("hpb_workers", "gauge", "Workers by state.")
    workers.add((), 2)
    assert render([records, workers]) == (
        "# HELP hpb_records_total Records appended.\n"
        "# TYPE hpb_records_total counter\n"
        'hpb_records_total{topic="orders",partition="0"} 10\n'
        'hpb_records_total{topic="orders",partition="1"} 7\n'
        "# HELP hpb_workers Workers by state.\n"
        "# TYPE hpb_workers gauge\n"
        "hpb_workers 2\n"
    )


def test_label_values_escape_backslash_quote_and_newline_and_help_escapes_backslash_and_newline():
    family = MetricFamily("hpb_info", "gauge", 'a \\ b\nc "d"', ("value",))
    family.add(('C:\\dir "x"\nnext',), 1)
    lines = render([family]).splitlines()
    assert lines[0] == '# HELP hpb_info a \\\\ b\\nc "d"'
    assert lines[2] == 'hpb_info{value="C:\\\\dir \\"x\\"\\nnext"} 1'


def test_histogram_buckets_are_cumulative_and_end_with_inf_sum_and_count():
    histogram = Histogram((0.001, 0.01, 0.1))
    for value in (0.0005, 0.001, 0.002, 0.05, 0.05, 3.0):
        histogram.observe(value)
    family = MetricFamily("hpb_latency_seconds", "histogram", "Latency.", ("worker",))
    family.add((0,), histogram)
    assert render([family]).splitlines()[2:] == [
        'hpb_latency_seconds_bucket{worker="0",le="0.001"} 2',  # le means <=: 0.001 is in it
        'hpb_latency_seconds_bucket{worker="0",le="0.01"} 3',
        'hpb_latency_seconds_bucket{worker="0",le="0.1"} 5',
        'hpb_latency_seconds_bucket{worker="0",le="+Inf"} 6',
        f'hpb_latency_seconds_sum{{worker="0"}} {0.0005 + 0.001 + 0.002 + 0.05 + 0.05 + 3.0!r}',
        'hpb_latency_seconds_count{worker="0"} 6',
    ]


def test_an_unlabelled_histogram_and_an_empty_family():
    histogram = Histogram((1.0,))
    family = MetricFamily("hpb_flush_seconds", "histogram", "Flushes.")
    family.add((), histogram)
    empty = MetricFamily("hpb_lag", "gauge", "No series yet.", ("group",))
    assert render([family, empty]).splitlines() == [
        "# HELP hpb_flush_seconds Flushes.",
        "# TYPE hpb_flush_seconds histogram",
        'hpb_flush_seconds_bucket{le="1.0"} 0',
        'hpb_flush_seconds_bucket{le="+Inf"} 0',
        "hpb_flush_seconds_sum 0.0",
        "hpb_flush_seconds_count 0",
        "# HELP hpb_lag No series yet.",
        "# TYPE hpb_lag gauge",
    ]


def test_a_family_is_listed_once():
    first = MetricFamily("hpb_up", "gauge", "Up.")
    with pytest.raises(ValueError, match="hpb_up given twice"):
        render([first, MetricFamily("hpb_up", "gauge", "Up again.")])


@pytest.mark.parametrize(("name", "kind", "labels", "message"), [
    ("hpb-bad", "gauge", (), "invalid metric name"),
    ("hpb_records", "counter", (), "must be named ..._total"),
    ("hpb_latency_count", "histogram", (), "must not end with"),
    ("hpb_latency", "histogram", ("le",), "invalid label name 'le'"),
    ("hpb_up", "gauge", ("__name",), "invalid label name"),
    ("hpb_up", "gauge", ("a-b",), "invalid label name"),
    ("hpb_up", "gauge", ("a", "a"), "repeated label names"),
    ("hpb_up", "summary", (), "type must be one of"),
])
def test_invalid_families_are_refused_when_made(name, kind, labels, message):
    with pytest.raises(ValueError, match=message):
        MetricFamily(name, kind, "help", labels)


def test_series_must_match_the_label_names_and_the_type():
    family = MetricFamily("hpb_up", "gauge", "Up.", ("worker",))
    with pytest.raises(ValueError, match="has labels"):
        family.add((), 1)
    with pytest.raises(ValueError, match="cannot take Histogram"):
        family.add((0,), Histogram())
    with pytest.raises(ValueError, match="cannot take int"):
        MetricFamily("hpb_seconds", "histogram", "h").add((), 1)


@pytest.mark.parametrize(("value", "text"), [
    (0, "0"), (12345678901234567890, "12345678901234567890"), (True, "1"), (0.5, "0.5"), (1e-05, "1e-05"),
    (2.0, "2.0"), (math.inf, "+Inf"), (-math.inf, "-Inf"), (math.nan, "NaN"),
])
def test_numbers_are_written_as_prometheus_parses_them(value, text):
    assert format_value(value) == text


def test_histogram_observations_land_in_the_first_bucket_whose_bound_they_do_not_exceed():
    histogram = Histogram((1.0, 2.0))
    for value in (0.0, 1.0, 1.0000001, 2.0, 2.5):
        histogram.observe(value)
    assert histogram.counts == [2, 2, 1]
    assert histogram.cumulative() == [(1.0, 2), (2.0, 4), (math.inf, 5)]
    assert histogram.count == 5


def test_histogram_snapshots_round_trip_and_bad_ones_are_refused():
    histogram = Histogram()
    histogram.observe(0.003)
    copy = Histogram.from_json(histogram.to_json())
    assert (copy.counts, copy.sum) == (histogram.counts, histogram.sum)
    for bad in ({"counts": [1], "sum": 0}, {"counts": histogram.counts}, [], {"counts": [-1] * 17, "sum": 0}):
        with pytest.raises(ValueError):
            Histogram.from_json(bad)
    with pytest.raises(ValueError, match="strictly increasing"):
        Histogram((1.0, 1.0))
