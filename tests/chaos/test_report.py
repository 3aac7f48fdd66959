"""The report files: markdown tables per nemesis, JSON, and a well-formed SVG chart."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from chaos.checker import check
from chaos.history import HistoryWriter, read_histories
from chaos.report import render_svg, summary, write_report

SVG = "{http://www.w3.org/2000/svg}"
TOPICS = {"chaos-all": {"acks": "all", "partitions": 2}, "chaos-one": {"acks": "1", "partitions": 2}}
META = {"seed": 42, "duration_s": 30, "argv": ["--duration", "30"], "topics": TOPICS, "brokers": 3,
        "nemeses": ["kill", "split"], "replay": "python -m chaos --seed 42 --duration 30"}


@dataclass
class Fault:
    nemesis: str
    target: str
    start: float
    end: float | None
    detail: str


def _campaign(tmp_path, lose_one=True):
    """30 s of writes at 10/s per topic; a kill at 5-8 s with a 3 s hole in chaos-all, a split at
    15-17 s; the acks=1 topic loses one record (an offset below what was read)."""
    base = 1_700_000_000.0
    directory = tmp_path / "history"
    with HistoryWriter(directory / "p.history") as p, HistoryWriter(directory / "c.history") as c:
        for topic in TOPICS:
            c.assign(f"c-{topic}", [(topic, 0), (topic, 1)], t=base)
            for i in range(300):
                t = base + i * 0.1
                if topic == "chaos-all" and 5.0 <= t - base < 8.0:
                    continue
                value, partition, offset = f"p-{topic}-{i}", i % 2, i // 2
                p.invoke("p", topic, value, t=t)
                p.ack("p", topic, partition, offset, value, t=t + 0.01)
                if not (lose_one and topic == "chaos-one" and i == 100):
                    c.poll(f"c-{topic}", topic, partition, offset, value, t=t + 0.05)
    faults = [Fault("kill", "b2", base + 5.0, base + 8.0, "leader of chaos-all-0"),
              Fault("split", "b1|b2,b3,zk1", base + 15.0, base + 17.0, "")]
    return check(read_histories(directory), TOPICS, faults), faults


def test_report_files_are_written_and_well_formed(tmp_path):
    result, faults = _campaign(tmp_path)
    paths = write_report(result, faults, META, tmp_path / "out")
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"report.md", "report.json", "throughput.svg"}
    assert paths["md"] == tmp_path / "out" / "report.md"

    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    assert doc["ok"] == {"all": True, "1": False}
    assert doc["meta"]["seed"] == 42
    assert doc["result"]["topics"]["chaos-one"]["anomalies"]["lost-write"]["count"] == 1
    assert doc["result"]["nemeses"]["kill"]["unavailability_max_s"]["chaos-all"] >= 3.0

    root = ET.fromstring((tmp_path / "out" / "throughput.svg").read_text())
    assert root.tag == f"{SVG}svg"
    lines = root.findall(f"{SVG}polyline")
    assert len(lines) == 2
    assert all(len(line.get("points").split()) == 30 for line in lines)  # acks over 30 s, 1 s buckets
    titles = [t.text for t in root.iter(f"{SVG}title")]
    assert any(t.startswith("kill b2") for t in titles) and any(t.startswith("split b1|b2") for t in titles)
    labels = {t.text for t in root.iter(f"{SVG}text")}
    assert {"kill", "split", "chaos-all (acks=all)", "chaos-one (acks=1)"} <= labels


def test_markdown_has_a_table_per_nemesis_and_the_anomalies_with_examples(tmp_path):
    result, faults = _campaign(tmp_path)
    write_report(result, faults, META, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "**acks=all: OK**" in text
    assert "Replay: `python -m chaos --seed 42 --duration 30`" in text and "| duration s | 30 |" in text
    for section in ("### kill", "### split", "### none", "### acks=all", "### acks=1"):
        assert section in text
    overview = next(line for line in text.splitlines() if line.startswith("| kill |"))
    assert [c.strip() for c in overview.strip("|").split("|")][:4] == ["kill", "1", "70 / 70", "100 / 99"]
    kill = text.split("### kill")[1].split("###")[0]
    assert "Faults injected: 1" in kill
    header = next(line for line in kill.splitlines() if line.startswith("| topic"))
    assert "unavailability p50 s" in header and "lost-write" in header and "verified" in header
    row = next(line for line in kill.splitlines() if line.startswith("| chaos-all"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:4] == ["chaos-all", "all", "70", "70"]  # acked 8.0 s .. 15.0 s
    assert float(cells[-1]) >= 3.0
    one = text.split("### acks=1")[1]
    assert "**lost-write** on `chaos-one`: 1" in one and "'p-chaos-one-100'" in one
    assert "leader of chaos-all-0" in text  # the faults table


def test_markdown_of_a_clean_run_lists_no_anomalies(tmp_path):
    result, faults = _campaign(tmp_path, lose_one=False)
    write_report(result, faults, META, tmp_path)
    text = (tmp_path / "report.md").read_text()
    anomalies = text.split("## Anomalies")[1].split("## Faults")[0]
    assert anomalies.count("none") == 2 and "**" not in anomalies


def test_summary_names_counts_anomalies_and_the_verdict(tmp_path):
    result, _ = _campaign(tmp_path)
    text = summary(result)
    assert "chaos-one (acks=1)" in text and "lost-write 1" in text
    assert "faults: 2 (kill 1, split 1)" in text
    assert text.splitlines()[-1] == "acks=all: OK"


def test_summary_says_failed_with_the_kinds(tmp_path):
    result, _ = _campaign(tmp_path)
    result.topics["chaos-all"].anomalies["unseen"].count = 3
    assert summary(result).splitlines()[-1] == "acks=all: FAILED (unseen 3)"


def test_svg_of_an_empty_run_is_still_a_document(tmp_path):
    (tmp_path / "history").mkdir()
    result = check(read_histories(tmp_path / "history"), TOPICS, [])
    root = ET.fromstring(render_svg(result, []))
    assert "no acknowledged writes" in {t.text for t in root.iter(f"{SVG}text")}
    write_report(result, [], {"argv": ["python", "-m", "chaos", "--short"]}, tmp_path / "out")
    text = (tmp_path / "out" / "report.md").read_text()
    assert "# Chaos campaign, seed ?" in text and "Replay: `python -m chaos --short`" in text


def test_faults_given_as_dicts_and_one_not_healed(tmp_path):
    result, faults = _campaign(tmp_path)
    raw = [{"nemesis": f.nemesis, "target": f.target, "start": f.start, "end": None, "detail": "<&>"}
           for f in faults]
    root = ET.fromstring(render_svg(result, raw))
    assert len([r for r in root.iter(f"{SVG}rect") if r.find(f"{SVG}title") is not None]) == 2
    write_report(result, raw, META, tmp_path)
    assert "not healed" in (tmp_path / "report.md").read_text()
