"""The report: collecting the workers' messages, totals and rates, text, live line, chart, CLI."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from loadgen.cli import build_parser, config_from_args, parse_count, report_ok
from loadgen.config import LoadConfig
from loadgen.histogram import Histogram
from loadgen.payload import HEADER_DTYPE, MAGIC_U16
from loadgen.plot import render_svg, write_plot
from loadgen.report import Collector, format_report, progress_line
from loadgen.tally import Tally

RUN = 0x42


def sparse(*values_ns) -> dict:
    h = Histogram()
    h.record_array(list(values_ns))
    return h.to_sparse()


def tally_export(sequences) -> dict:
    import numpy as np

    t = Tally(RUN)
    h = np.zeros(len(sequences), dtype=HEADER_DTYPE)
    h["magic"], h["run_id"], h["sequence"] = MAGIC_U16, RUN, sequences
    t.add(0, h)
    return t.export()


def collected(received=range(1000)) -> Collector:
    c = Collector(LoadConfig(workload="e2e", interval_s=1.0), RUN)
    c.t0 = 1000.0
    for tick, ack_ms in ((1, 2), (2, 4)):
        c.add({"role": "producer", "index": 0, "kind": "progress", "tick": tick, "records": 500,
               "bytes": 50_000, "acked": 500, "failed": 0, "retries": 0,
               "latency": sparse(ack_ms * 1_000_000)})
        c.add({"role": "consumer", "index": 0, "kind": "progress", "tick": tick, "records": 500,
               "bytes": 50_000, "errors": 0, "run_records": 500 * tick,
               "latency": sparse(1_000_000, 3_000_000)})
    c.add({"role": "producer", "index": 0, "kind": "done", "name": "loadgen-00000042-0", "run_id": RUN,
           "records": 1000, "bytes": 100_000, "acked": 1000, "failed": 0, "retries": 0, "first_error": None,
           "started": 1000.0, "send_ended": 1001.9, "ended": 1002.0, "max_lag_s": 0.0012,
           "ack_latency": sparse(2_000_000, 4_000_000), "truth": []})
    c.add({"role": "consumer", "index": 0, "kind": "done", "records": len(received),
           "bytes": 100 * len(received), "errors": 0, "first_error": None, "started": 1000.0,
           "first_record": 1000.01, "last_record": 1002.5, "e2e_latency": sparse(1_000_000, 3_000_000),
           "tally": tally_export(list(received)), "checked": True})
    return c


def test_report_totals_rates_latencies_and_check():
    report = collected().report(partitions=2, topic_created=True, consumers_started=1)
    p, c, k = report["produce"], report["consume"], report["check"]
    assert (p["records"], p["bytes"], p["duration_s"], p["records_per_s"]) == (1000, 100_000, 2.0, 500.0)
    assert p["mb_per_s"] == 0.05 and p["max_schedule_lag_ms"] == 1.2
    assert p["ack_latency_ms"]["p50"] == pytest.approx(2.0, rel=0.004)
    assert p["ack_latency_ms"]["max"] == 4.0
    assert (c["records"], c["duration_s"], c["records_per_s"]) == (1000, 2.5, 400.0)
    assert c["e2e_latency_ms"]["count"] == 2
    assert k["ok"] and (k["sent"], k["missing"], k["duplicated"]) == (1000, 0, 0)
    assert [row["t_s"] for row in report["timeline"]] == [1.0, 2.0]
    assert report["timeline"][1]["ack_p50_ms"] == pytest.approx(4.0, rel=0.004)
    assert report_ok(report)


def test_loss_makes_the_report_not_ok_and_says_so():
    report = collected(received=range(990)).report(partitions=1, topic_created=False, consumers_started=1)
    assert report["check"]["missing"] == 10 and not report_ok(report)
    assert "check: PROBLEMS" in format_report(report)


def test_text_report_names_the_figures():
    text = format_report(collected().report(partitions=2, topic_created=True, consumers_started=1))
    assert "500 records/s" in text and "end-to-end latency" in text and "p99.9" in text
    assert "check: OK" in text


def test_progress_line_shows_rates_latency_and_errors():
    report = collected().report(partitions=2, topic_created=True, consumers_started=1)
    line = progress_line(report["timeline"][0], "e2e", 1.0)
    assert line.startswith("[   1.0s] produce") and "500 rec/s" in line and "e2e p50" in line
    assert "errors 0" in line


def test_chart_is_well_formed_svg_and_html_embeds_it(tmp_path):
    report = collected().report(partitions=2, topic_created=True, consumers_started=1)
    root = ET.fromstring(render_svg(report))
    assert root.tag.endswith("svg") and len(root.findall(".//{http://www.w3.org/2000/svg}polyline")) >= 4
    write_plot(tmp_path / "run.html", report)
    page = (tmp_path / "run.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "http" not in page.replace(
        "http://www.w3.org/2000/svg", "")


def test_chart_of_an_empty_timeline_still_renders():
    ET.fromstring(render_svg({"timeline": []}))


@pytest.mark.parametrize(("text", "value"),
                         [("2000", 2000), ("2.5k", 2500), ("10M", 10_000_000), ("1g", 1e9)])
def test_counts_take_decimal_suffixes(text, value):
    assert parse_count(text) == value


def test_command_line_maps_to_the_config():
    args = build_parser().parse_args(
        ["e2e", "--bootstrap", "127.0.0.1:1", "--topic", "t", "--create-topic", "--partitions", "4",
         "--topic-config", "flush_fsync=false", "--producers", "2", "--consumers", "3",
         "--record-size", "uniform:50:150", "--payload", "log", "--keys", "zipf:100", "--rate", "50k",
         "--records", "1M", "--acks", "0", "--compression", "lz4", "--linger-ms", "0", "--window", "5",
         "--truth", "t.csv", "--json", "--plot", "p.svg"])
    config = config_from_args(args)
    assert (config.partitions, config.producers, config.consumers, config.rate) == (4, 2, 3, 50_000)
    assert config.topic_configs == (("flush_fsync", "false"),)
    assert str(config.record_size) == "uniform:50:150" and str(config.keys) == "zipf:100:1.1"
    assert (config.records, config.acks, config.compression, config.linger_ms) == (1_000_000, 0, "lz4", 0)
    assert config.window_ms == 5000 and config.effective_duration_s is None
    assert config.consumer_start == "latest"


def test_defaults_run_ten_seconds_and_consume_starts_at_the_beginning():
    assert LoadConfig().effective_duration_s == 10.0
    assert LoadConfig(workload="consume").consumer_start == "earliest"


@pytest.mark.parametrize("changes", [{"workload": "x"}, {"rate": 0}, {"acks": 2}, {"until_end": True},
                                     {"plot_path": "x.png"}, {"records": 1, "producers": 2}])
def test_invalid_settings_are_refused(changes):
    with pytest.raises(ValueError):
        LoadConfig(**changes)
