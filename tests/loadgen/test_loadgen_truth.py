"""Ground truth: records per producer, topic and epoch-aligned window; its JSON and CSV."""

from __future__ import annotations

import csv
import json

import pytest

from loadgen.truth import TruthWindows, truth_document, write_truth


def test_windows_start_at_multiples_of_their_length_since_the_epoch():
    truth = TruthWindows(10_000)
    truth.add("t", 1_714_564_809_999, 5, 500)
    truth.add("t", 1_714_564_810_000, 2, 200)
    truth.add("t", 1_714_564_819_000, 1, 100)
    truth.add("u", 1_714_564_810_500, 4, 400)
    rows = truth.rows("p-0", 0)
    assert [(r["topic"], r["window_start_ms"], r["records"], r["bytes"]) for r in rows] == [
        ("t", 1_714_564_800_000, 5, 500), ("t", 1_714_564_810_000, 3, 300), ("u", 1_714_564_810_000, 4, 400)]
    assert all(r["window_ms"] == 10_000 and r["producer"] == "p-0" for r in rows)


def test_document_totals_are_the_sum_of_the_windows():
    a, b = TruthWindows(1000), TruthWindows(1000)
    a.add("t", 5_500, 10, 1000)
    b.add("t", 5_900, 7, 700)
    b.add("t", 6_100, 3, 300)
    document = truth_document(0x1234, 1000, [], a.rows("p-0", 0) + b.rows("p-1", 1))
    assert document["run_id"] == "00001234"
    assert document["total_records"] == 20 and document["total_bytes"] == 2000
    assert [(w["producer_index"], w["window_start_ms"]) for w in document["windows"]] == [
        (0, 5000), (1, 5000), (1, 6000)]


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_file_holds_every_window(tmp_path, suffix):
    truth = TruthWindows(10_000)
    truth.add("t", 20_000, 4, 40)
    truth.add("t", 30_000, 6, 60)
    summaries = [{"producer": "p-0", "index": 0, "records": 10}]
    document = truth_document(1, 10_000, summaries, truth.rows("p-0", 0))
    path = tmp_path / f"truth{suffix}"
    write_truth(path, document)
    if suffix == ".json":
        assert json.loads(path.read_text()) == document
    else:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        assert [(r["producer"], r["topic"], r["window_start_ms"], r["records"]) for r in rows] == [
            ("p-0", "t", "20000", "4"), ("p-0", "t", "30000", "6")]


def test_window_must_be_positive():
    with pytest.raises(ValueError):
        TruthWindows(0)
