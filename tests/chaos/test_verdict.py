"""A campaign's verdict (OK, FAILED, INCONCLUSIVE) and exit status, the report that states it, a
refused results directory and an uninterruptible cleanup (no cluster needed)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from chaos import runner
from chaos.checker import check
from chaos.history import HistoryWriter, read_histories
from chaos.nemesis import Fault
from chaos.report import write_report
from chaos.verdict import judge

TOPICS = {"chaos-all": {"acks": "all", "partitions": 1}, "chaos-one": {"acks": "1", "partitions": 1}}


def _history(directory, drained_values=("v0", "v1"), group_values=()):
    directory.mkdir(parents=True, exist_ok=True)
    with HistoryWriter(directory / "p.history") as p:
        for topic in TOPICS:
            for o, v in enumerate(("v0", "v1")):
                p.invoke("p", topic, v, t=1 + o)
                p.ack("p", topic, 0, o, v, t=1.5 + o)
    with HistoryWriter(directory / "c.history") as c:
        c.assign("c", [(t, 0) for t in TOPICS], t=4)
        for topic in TOPICS:
            for o, v in enumerate(group_values):
                c.poll("c", topic, 0, o, v, t=5 + o)
    with HistoryWriter(directory / "drain.history") as d:
        d.assign("drain", [(t, 0) for t in TOPICS], t=9)
        for topic in TOPICS:
            for o, v in enumerate(drained_values):
                d.poll("drain", topic, 0, o, v, t=10 + o)
    return read_histories(directory)


def _faults(*names, healed=True):
    return [Fault(name, "b1", 2.0 + i, 3.0 + i if healed else None, "", healed)
            for i, name in enumerate(names)]


def test_a_clean_campaign_with_every_nemesis_injected_is_ok(tmp_path):
    result = check(_history(tmp_path), TOPICS, _faults("kill", "pause"), {"chaos-all": [0], "chaos-one": [0]})
    verdict = judge(result, problems=[], planned=["kill", "pause"], faults=_faults("kill", "pause"),
                    nemeses=["kill", "pause"])
    assert (verdict.verdict, verdict.exit_status, verdict.problems) == ("OK", 0, [])
    assert verdict.faults == {"kill": [1, 1], "pause": [1, 1]}


def test_an_empty_campaign_is_inconclusive(tmp_path):
    (tmp_path / "h").mkdir()
    result = check(read_histories(tmp_path / "h"), TOPICS, [], {})
    verdict = judge(result, problems=[], planned=[], faults=[], nemeses=["kill"])
    assert (verdict.verdict, verdict.exit_status) == ("INCONCLUSIVE", 3)
    text = "\n".join(verdict.problems)
    assert "no fault was injected" in text and "never injected: kill" in text
    assert "topic chaos-all: no record was acknowledged" in text


@pytest.mark.parametrize("faults, planned, expected", [
    (_faults("kill"), ["kill", "pause"], "never injected: pause"),
    (_faults("kill", "pause", healed=False), ["kill", "pause"], "fault kill on b1 was not healed"),
    (_faults("kill", "pause"), ["kill", "pause", "kill"], "2 of 3 planned faults injected"),
])
def test_a_shortfall_of_faults_is_inconclusive(tmp_path, faults, planned, expected):
    result = check(_history(tmp_path), TOPICS, faults, {"chaos-all": [0], "chaos-one": [0]})
    verdict = judge(result, problems=[], planned=planned, faults=faults, nemeses=["kill", "pause"])
    assert verdict.verdict == "INCONCLUSIVE" and any(expected in p for p in verdict.problems), verdict


def test_a_loss_fails_the_run_whatever_else_went_wrong(tmp_path):
    history = _history(tmp_path, drained_values=("v0",), group_values=("v0", "v1"))
    result = check(history, TOPICS, _faults("kill"), {"chaos-all": [0], "chaos-one": [0]})
    verdict = judge(result, problems=["the schedule: boom"], planned=["kill"], faults=_faults("kill"),
                    nemeses=["kill"])
    assert (verdict.verdict, verdict.exit_status, verdict.anomalies) == ("FAILED", 1, {"lost-write": 1})
    assert verdict.line() == "FAILED (lost-write 1)"


def test_values_an_incomplete_drain_did_not_reach_make_the_run_inconclusive_not_failed(tmp_path):
    history = _history(tmp_path, drained_values=("v0",))
    result = check(history, TOPICS, _faults("kill"), {"chaos-all": [], "chaos-one": []})
    verdict = judge(result, problems=["drain: chaos-all-0 not read to its end (end 2, read to 1)"],
                    planned=["kill"], faults=_faults("kill"), nemeses=["kill"])
    assert verdict.verdict == "INCONCLUSIVE"
    assert any("1 acknowledged acks=all records unseen" in p for p in verdict.problems)


def test_the_report_states_the_verdict_and_its_problems(tmp_path):
    (tmp_path / "h").mkdir()
    result = check(read_histories(tmp_path / "h"), TOPICS, [], {})
    verdict = judge(result, problems=["the schedule: broker 2 does not serve"], planned=["kill"], faults=[],
                    nemeses=["kill"])
    write_report(result, [], {"seed": 1, "verdict": verdict.to_json(), "planned_faults": 1}, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "**Verdict: INCONCLUSIVE (6 problems)**" in text
    assert "- the schedule: broker 2 does not serve" in text
    assert "| kill | 1 | 0 |" in text
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["ok"]["all"] is False and doc["verdict"]["exit_status"] == 3


def test_the_faults_table_says_a_failed_heal_and_the_evidence_and_recovery(tmp_path):
    (tmp_path / "h").mkdir()
    result = check(read_histories(tmp_path / "h"), TOPICS, [], {})
    faults = [Fault("kill", "b2", 10.0, 14.0, "kill -9", True, [7], "pids [7] gone", 1, "", 2.5),
              Fault("disk-full", "b1", 20.0, None, "filled", False, [], "NOT VERIFIED: 9 bytes free", 2)]
    write_report(result, faults, {"seed": 1}, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "| kill | kill | `b2` | 0.0 | 4.0 | 2.5 | kill -9 | pids [7] gone |" in text
    assert ("| disk-full | disk-full | `b1` | 10.0 | not healed | - | filled | NOT VERIFIED: 9 bytes free |"
            in text)


def test_an_empty_campaign_exits_inconclusive(tmp_path, monkeypatch, capsys):
    """The command line itself refuses to call a campaign that did nothing a success."""
    def nothing_happened(options, seed, steps, topics, out, faults, drained):
        (out / "history").mkdir()
        return []

    monkeypatch.setattr(runner, "unavailable", lambda options=None: None)
    monkeypatch.setattr(runner, "_run", nothing_happened)
    status = runner.run_campaign(runner.SHORT.replace(out=tmp_path / "out", seed=3))
    printed = capsys.readouterr().out
    assert status == 3, printed
    assert "chaos: INCONCLUSIVE" in printed and "chaos: problem: no fault was injected" in printed
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["verdict"]["verdict"] == "INCONCLUSIVE"


def test_a_results_directory_in_use_is_refused(tmp_path, monkeypatch, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "meta.json").write_text("{}")
    monkeypatch.setattr(runner, "unavailable", lambda options=None: None)
    assert runner.run_campaign(runner.SHORT.replace(out=tmp_path / "out")) == 2
    assert "is not empty" in capsys.readouterr().err
    assert runner.refuse_out(tmp_path / "new") is None
    (tmp_path / "empty").mkdir()
    assert runner.refuse_out(tmp_path / "empty") is None


def test_signals_during_the_cleanup_are_ignored():
    previous = signal.signal(signal.SIGTERM, runner._interrupted)
    try:
        with runner.uninterruptible():
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM):
                os.kill(os.getpid(), signum)
        assert signal.getsignal(signal.SIGTERM) is runner._interrupted
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0)  # let the handler run
    finally:
        signal.signal(signal.SIGTERM, previous)
