"""The checker on synthetic histories: each anomaly kind found where it is, and nowhere else."""

from __future__ import annotations

import json

import pytest

from chaos.checker import ANOMALY_KINDS, check
from chaos.history import read_histories

TOPICS = {"all": {"acks": "all", "partitions": 2}, "one": {"acks": "1", "partitions": 2}}


def _write(directory, files):
    """``files``: name -> events ``(kind, t, client, *fields)``, written as history lines."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, events in files.items():
        text = "".join("\t".join(str(f) for f in event) + "\n" for event in events)
        (directory / f"{name}.history").write_text(text)
    return directory


def _produce(client, topic, records, t0=1.0, step=0.01):
    """invoke + ack of each ``(partition, offset, value)``."""
    out = []
    for i, (p, o, v) in enumerate(records):
        t = t0 + i * step
        out += [("invoke", t, client, topic, v), ("ack", t + step / 2, client, topic, p, o, v)]
    return out


def _poll(client, topic, records, t0=100.0):
    """An ``assign`` of the partitions of ``records``, then a poll of each."""
    assigned = ",".join(sorted({f"{topic}:{p}" for p, _, _ in records}))
    return [("assign", t0, client, assigned)] + [("poll", t0 + 0.001 * i, client, topic, p, o, v)
                                                 for i, (p, o, v) in enumerate(records)]


def _check(tmp_path, files, topics=TOPICS, faults=(), drained=None):
    return check(read_histories(_write(tmp_path / "history", files)), topics, list(faults), drained)


def _counts(result, topic="all"):
    return {kind: a.count for kind, a in result.topics[topic].anomalies.items() if a.count}


def _clean_records(n=10):
    return [(i % 2, i // 2, f"p-{i}") for i in range(n)]


def test_clean_history_has_no_anomaly_of_any_kind(tmp_path):
    records = _clean_records()
    result = _check(tmp_path, {"p": _produce("p", "all", records), "c": _poll("c", "all", records),
                               "drain": _poll("drain", "all", records, t0=200.0)})
    t = result.topics["all"]
    assert (t.attempted, t.acknowledged, t.failed, t.read, t.verified) == (10, 10, 0, 10, 10)
    assert _counts(result) == {} and set(t.anomalies) == set(ANOMALY_KINDS)
    assert result.ok("all") and result.ok("1")
    assert result.topics["one"].acknowledged == 0


def test_lost_write_is_an_acknowledged_value_below_the_highest_offset_read(tmp_path):
    records = [(0, 0, "p-0"), (0, 1, "p-1"), (0, 2, "p-2")]
    reads = [(0, 0, "p-0"), (0, 2, "p-2")]
    result = _check(tmp_path, {"p": _produce("p", "all", records),
                               "c1": _poll("c1", "all", reads[:1]), "c2": _poll("c2", "all", reads[1:])})
    assert _counts(result) == {"lost-write": 1}
    [example] = result.topics["all"].anomalies["lost-write"].examples
    assert "'p-1'" in example and "all/0@1" in example
    assert not result.ok("all")


def test_unseen_is_an_acknowledged_value_beyond_every_read(tmp_path):
    records = [(0, 0, "p-0"), (0, 1, "p-1"), (1, 0, "p-2")]
    result = _check(tmp_path, {"p": _produce("p", "all", records), "c": _poll("c", "all", records[:1])})
    assert _counts(result) == {"unseen": 2}
    assert not result.ok("all")


def test_the_drain_reader_counts_as_a_read(tmp_path):
    records = _clean_records(4)
    result = _check(tmp_path, {"p": _produce("p", "all", records), "drain": _poll("drain", "all", records)})
    assert _counts(result) == {} and result.topics["all"].verified == 4


def test_duplicate_is_one_value_at_two_positions(tmp_path):
    records = [(0, 0, "p-0"), (0, 1, "p-1")]
    reads = [(0, 0, "p-0"), (0, 1, "p-1"), (0, 2, "p-1")]  # a retry written twice
    result = _check(tmp_path, {"p": _produce("p", "all", records), "c": _poll("c", "all", reads)})
    assert _counts(result) == {"duplicate": 1}
    assert "2 positions" in result.topics["all"].anomalies["duplicate"].examples[0]
    assert result.ok("all")  # a duplicate is reported, it is not a loss


def test_rereading_the_same_position_is_no_duplicate(tmp_path):
    records = _clean_records(6)
    reread = _poll("c", "all", records) + _poll("c", "all", records[2:], t0=150.0)  # rebalance, read again
    result = _check(tmp_path, {"p": _produce("p", "all", records), "c": reread,
                               "c2": _poll("c2", "all", records), "drain": _poll("drain", "all", records)})
    assert _counts(result) == {}


def test_inconsistent_offsets_is_one_position_with_two_values(tmp_path):
    records = [(0, 0, "p-0"), (0, 1, "p-1")]
    produced = _produce("p", "all", records) + [("invoke", 2.0, "p", "all", "p-2"),
                                                 ("fail", 2.1, "p", "all", "p-2", "timeout")]
    result = _check(tmp_path, {"p": produced, "c1": _poll("c1", "all", records),
                               "c2": _poll("c2", "all", [(0, 0, "p-0"), (0, 1, "p-2")])})
    assert _counts(result) == {"inconsistent-offsets": 1}
    example = result.topics["all"].anomalies["inconsistent-offsets"].examples[0]
    assert "all/0@1" in example and "'p-1'" in example and "'p-2'" in example
    assert not result.ok("all")


def test_acknowledged_offset_disagreeing_with_reads(tmp_path):
    """Two acks at one offset: inconsistent-offsets even before anyone reads; the one never read
    sits at the highest offset read, which a reader passed: a lost-write (the bound is inclusive)."""
    records = [(0, 0, "p-0"), (0, 0, "p-1")]
    result = _check(tmp_path, {"p": _produce("p", "all", records), "c": _poll("c", "all", records[:1])})
    assert _counts(result) == {"inconsistent-offsets": 1, "lost-write": 1}


def test_a_value_acknowledged_at_the_highest_offset_read_and_replaced_there_is_a_lost_write(tmp_path):
    """Jepsen's bound: acknowledged at o <= the highest offset read, never read, is lost."""
    records = [(0, 0, "a"), (0, 1, "b"), (0, 2, "c")]
    produced = _produce("p", "one", records) + [("invoke", 3.0, "q", "one", "x")]
    result = _check(tmp_path, {"p": produced,
                               "drain": _poll("drain", "one", [(0, 0, "a"), (0, 1, "b"), (0, 2, "x")])})
    assert _counts(result, "one") == {"lost-write": 1, "inconsistent-offsets": 1}
    assert "'c'" in result.topics["one"].anomalies["lost-write"].examples[0]


def test_a_value_read_by_the_group_then_missing_from_a_complete_drain_is_lost(tmp_path):
    """The final drain is the authority: records the group read and the final log no longer
    holds (a truncation after an early high watermark) are lost, not verified."""
    records = [(0, 0, "a"), (0, 1, "b"), (0, 2, "c")]
    files = {"p": _produce("p", "all", records), "c": _poll("c", "all", records),
             "drain": _poll("drain", "all", records[:1], t0=200.0)}
    result = _check(tmp_path, files, drained={"all": [0, 1]})
    assert _counts(result) == {"lost-write": 2}
    assert not result.ok("all")
    examples = result.topics["all"].anomalies["lost-write"].examples
    assert all("missing from the complete final drain of partition 0" in e for e in examples)
    assert "read before at 0@1" in examples[0]
    assert result.topics["all"].drained == [0, 1]


def test_a_value_acknowledged_beyond_a_complete_drain_is_lost_not_unseen(tmp_path):
    records = [(0, 0, "a"), (0, 1, "b"), (1, 0, "c")]
    files = {"p": _produce("p", "all", records), "drain": _poll("drain", "all", records[:1], t0=200.0)}
    assert _counts(_check(tmp_path, files, drained={"all": [0]})) == {"lost-write": 1, "unseen": 1}


def test_without_a_complete_drain_the_highest_read_decides(tmp_path):
    records = [(0, 0, "a"), (0, 1, "b"), (0, 2, "c")]
    files = {"p": _produce("p", "all", records), "c": _poll("c", "all", records),
             "drain": _poll("drain", "all", records[:1], t0=200.0)}
    assert _counts(_check(tmp_path, files, drained={"all": []})) == {}


def test_nonmonotonic_poll_without_an_assign_between(tmp_path):
    records = _clean_records(6)  # partition 0 offsets 0..2
    polls = _poll("c", "all", [(0, 0, "p-0"), (0, 1, "p-2"), (0, 1, "p-2"), (0, 2, "p-4")])
    result = _check(tmp_path, {"p": _produce("p", "all", records), "c": polls,
                               "drain": _poll("drain", "all", records)})
    assert _counts(result) == {"nonmonotonic-poll": 1}
    assert "offset 1 then 1" in result.topics["all"].anomalies["nonmonotonic-poll"].examples[0]
    assert result.ok("all")


def test_an_assign_line_resets_the_monotonic_tracking(tmp_path):
    records = _clean_records(6)
    polls = (_poll("c", "all", [(0, 0, "p-0"), (0, 1, "p-2"), (0, 2, "p-4")])
             + _poll("c", "all", [(0, 1, "p-2"), (0, 2, "p-4")], t0=150.0)   # rebalanced: back to 1
             + _poll("c", "all", [(1, 2, "p-5")], t0=160.0))                 # reassigned, further on
    result = _check(tmp_path, {"p": _produce("p", "all", records), "c": polls,
                               "drain": _poll("drain", "all", records)})
    assert _counts(result) == {}


def test_polls_of_different_partitions_interleave_freely(tmp_path):
    records = _clean_records(8)
    result = _check(tmp_path, {"p": _produce("p", "all", records), "c": _poll("c", "all", records)})
    assert _counts(result) == {}


def test_poll_skip_jumps_over_a_record_someone_saw(tmp_path):
    records = [(0, o, f"p-{o}") for o in range(4)]
    polls = _poll("c", "all", [(0, 0, "p-0"), (0, 3, "p-3")])
    result = _check(tmp_path, {"p": _produce("p", "all", records), "c": polls,
                               "drain": _poll("drain", "all", records)})
    assert _counts(result) == {"poll-skip": 1}
    assert "skipping 2 known records from offset 1" in result.topics["all"].anomalies["poll-skip"].examples[0]
    assert not result.ok("all")


def test_a_gap_nobody_saw_anything_in_is_no_poll_skip(tmp_path):
    records = [(0, 0, "p-0"), (0, 5, "p-5")]  # offsets 1..4: nothing there (aborted, compacted)
    result = _check(tmp_path, {"p": _produce("p", "all", records), "c": _poll("c", "all", records)})
    assert _counts(result) == {}


def test_poll_skip_across_an_assign_is_not_reported(tmp_path):
    records = [(0, o, f"p-{o}") for o in range(4)]
    polls = _poll("c", "all", [(0, 0, "p-0")]) + _poll("c", "all", [(0, 3, "p-3")], t0=150.0)
    result = _check(tmp_path, {"p": _produce("p", "all", records), "c": polls,
                               "drain": _poll("drain", "all", records)})
    assert _counts(result) == {}


def test_phantom_is_a_value_read_but_never_invoked(tmp_path):
    records = _clean_records(2)
    result = _check(tmp_path, {"p": _produce("p", "all", records),
                               "c": _poll("c", "all", records + [(0, 1, "p-\ufffd")])})
    assert _counts(result) == {"phantom": 1}
    assert "never invoked" in result.topics["all"].anomalies["phantom"].examples[0]
    assert result.ok("all")


def test_a_failed_write_read_later_is_fine_and_one_never_read_too(tmp_path):
    produced = _produce("p", "all", [(0, 0, "p-0")]) + [
        ("invoke", 2.0, "p", "all", "p-1"), ("fail", 2.5, "p", "all", "p-1", "NotEnoughReplicas"),
        ("invoke", 3.0, "p", "all", "p-2"), ("fail", 3.5, "p", "all", "p-2", "timeout")]
    result = _check(tmp_path, {"p": produced, "c": _poll("c", "all", [(0, 0, "p-0"), (0, 1, "p-1")])})
    t = result.topics["all"]
    assert _counts(result) == {}
    assert (t.attempted, t.acknowledged, t.failed, t.failed_read) == (3, 1, 2, 1)
    assert t.fail_errors == {"NotEnoughReplicas": 1, "timeout": 1}


def test_a_record_invoked_and_never_settled_is_counted_unsettled(tmp_path):
    produced = _produce("p", "all", [(0, 0, "p-0")]) + [("invoke", 5.0, "p", "all", "p-1"),
                                                         ("invoke", 5.1, "p", "all", "p-2"),
                                                         ("fail", 5.2, "p", "all", "p-2", "timeout")]
    t = _check(tmp_path, {"p": produced}).topics["all"]
    assert (t.attempted, t.acknowledged, t.failed, t.unsettled) == (3, 1, 1, 1)


def test_an_ack_without_an_offset_never_read_is_unseen(tmp_path):
    produced = [("invoke", 1.0, "p", "all", "p-0"), ("ack", 1.1, "p", "all", 0, -1, "p-0")]
    result = _check(tmp_path, {"p": produced, "c": _poll("c", "all", [(0, 3, "x")])},
                    topics={"all": {"acks": "all", "partitions": 1}})
    assert _counts(result) == {"unseen": 1, "phantom": 1}


def test_acks_one_losses_are_reported_but_do_not_decide_ok_all(tmp_path):
    records = [(0, 0, "q-0"), (0, 1, "q-1"), (0, 2, "q-2")]
    reads = [(0, 0, "q-0"), (0, 2, "q-2")]
    result = _check(tmp_path, {"q": _produce("q", "one", records),
                               "c1": _poll("c1", "one", reads[:1]), "c2": _poll("c2", "one", reads[1:])})
    assert _counts(result, "one") == {"lost-write": 1}
    assert result.topics["one"].acks == "1"
    assert result.ok("all") and not result.ok("1") and not result.ok(1)


def _acks_at(client, topic, partition, times):
    return [("ack", t, client, topic, partition, i, f"{client}-{partition}-{i}") for i, t in enumerate(times)]


def test_unavailability_is_the_longest_ack_gap_overlapping_the_fault(tmp_path):
    steady = [i * 0.5 for i in range(21)] + [15.0 + i * 0.5 for i in range(11)]  # gap 10 -> 15
    only_before = [i * 0.5 for i in range(21)]  # nothing after 10
    only_after = [15.0 + i * 0.5 for i in range(11)]  # nothing before 15
    files = {"p": _acks_at("p", "all", 0, steady) + _acks_at("p", "all", 1, only_before)
             + _acks_at("p", "one", 0, only_after)}
    faults = [{"nemesis": "kill", "target": "b1", "start": 11.0, "end": 12.0, "detail": ""},
              {"nemesis": "kill", "target": "b2", "start": 16.0, "end": 16.2, "detail": ""},
              {"nemesis": "pause", "target": "b3", "start": 19.0, "end": None, "detail": "open"}]
    result = _check(tmp_path, files, faults=faults)
    first, second, third = result.faults
    assert first.unavailable_s["all"] == {0: 5.0, 1: 2.0}  # acks 10 -> 15; last ack 10 -> fault end 12
    assert first.unavailable_s["one"] == {0: 4.0, 1: 1.0}  # fault start 11 -> first ack 15; none at all
    assert second.unavailable_s["all"] == {0: 0.5, 1: pytest.approx(6.2)}  # still nothing since 10
    assert third.end is None and third.unavailable_s["all"][0] == 0.5  # ends at the history's end (20.0)
    kill = result.nemeses["kill"]
    assert kill.faults == 2
    assert kill.unavailability_max_s["all"] == pytest.approx(6.2)
    # over each fault's worst partition (5.0 and 6.2), not over untouched partitions' usual gaps
    assert kill.unavailability_p50_s["all"] == pytest.approx((5.0 + 6.2) / 2)
    assert result.nemeses["pause"].faults == 1


def test_events_are_attributed_to_the_fault_that_started_last(tmp_path):
    records = [(0, o, f"p-{o}") for o in range(6)]
    produced = _produce("p", "all", records, t0=1.0, step=1.0)  # acks at 1.5, 2.5, ... 6.5
    reads = [r for r in records if r[1] != 3]  # offset 3 (acked at 4.5) lost
    faults = [{"nemesis": "kill", "target": "b1", "start": 2.0, "end": 3.0, "detail": ""},
              {"nemesis": "split", "target": "b1|b2,b3", "start": 4.0, "end": 4.2, "detail": ""}]
    result = _check(tmp_path, {"p": produced, "c1": _poll("c1", "all", reads[:3]),
                               "c2": _poll("c2", "all", reads[3:])}, faults=faults)
    assert list(result.nemeses) == ["kill", "split", "none"]
    assert result.nemeses["none"].acknowledged["all"] == 1  # 1.5
    assert result.nemeses["kill"].acknowledged["all"] == 2  # 2.5, 3.5
    assert result.nemeses["split"].acknowledged["all"] == 3  # 4.5, 5.5, 6.5
    assert result.nemeses["split"].verified["all"] == 2
    assert result.nemeses["split"].anomalies["all"]["lost-write"] == 1
    assert result.nemeses["kill"].anomalies["all"]["lost-write"] == 0


def test_faults_may_be_objects_and_topics_unknown_to_the_meta_are_checked(tmp_path):
    class Fault:
        nemesis, target, start, end, detail = "clock", "b1", 1.0, 2.0, "+600 s"
    records = _clean_records(2)
    result = _check(tmp_path, {"p": _produce("p", "extra", records), "c": _poll("c", "extra", records[:1])},
                    faults=[Fault()])
    assert result.topics["extra"].acks == "?" and _counts(result, "extra") == {"unseen": 1}
    assert result.ok("all") and result.faults[0].nemesis == "clock"


def test_result_is_json_and_throughput_counts_acks_per_second(tmp_path):
    records = _clean_records(10)
    result = _check(tmp_path, {"p": _produce("p", "all", records, t0=10.2, step=0.25),
                               "c": _poll("c", "all", records)},
                    faults=[{"nemesis": "kill", "target": "b1", "start": 11.0, "end": 12.0, "detail": ""}])
    doc = json.loads(json.dumps(result.to_json()))
    assert doc["ok_all"] is True
    assert doc["faults"][0]["unavailable_s"]["all"].keys() == {"0", "1"}
    assert doc["topics"]["all"]["anomalies"]["lost-write"] == {"count": 0, "examples": []}
    assert result.throughput_start_s == 10.0
    assert sum(result.throughput["all"]) == 10 and len(result.throughput["all"]) == 3
    assert result.throughput["one"] == [0, 0, 0]


def test_an_empty_history_checks_clean(tmp_path):
    result = _check(tmp_path, {})
    assert result.ok("all") and result.topics["all"].acknowledged == 0
    assert result.throughput_start_s is None


@pytest.mark.skip(reason="performance sanity check, run by hand: not a timed test")
def test_ten_million_lines_check_in_reasonable_time(tmp_path):  # pragma: no cover
    import time

    from chaos.history import HistoryWriter

    directory = tmp_path / "history"
    n = 2_500_000
    with HistoryWriter(directory / "p.history") as p, HistoryWriter(directory / "c.history") as c:
        for i in range(n):
            v = f"p-all-0-{i}"
            p.invoke("p-all-0", "all", v, t=i * 0.001)
            p.ack("p-all-0", "all", i % 2, i // 2, v, t=i * 0.001)
            c.poll("c-all-0", "all", i % 2, i // 2, v, t=i * 0.001)
            c.poll("drain", "all", i % 2, i // 2, v, t=i * 0.001)
    started = time.monotonic()
    result = check(read_histories(directory), TOPICS, [])
    print(f"read and checked {4 * n} lines in {time.monotonic() - started:.1f} s")
    assert result.ok("all") and result.topics["all"].verified == n


def test_group_skip_is_an_offset_no_member_polled_below_where_the_group_got(tmp_path):
    """Member c1 reads 0..2, then c2 takes the partition over at 5 (a commit past what c1 was
    handed): 3 and 4 were never handed to the group, which per-consumer poll-skip cannot see."""
    records = [(0, o, f"p-{o}") for o in range(8)]
    files = {"p": _produce("p", "all", records), "c1": _poll("c1", "all", records[:3]),
             "c2": _poll("c2", "all", records[5:7], t0=150.0),
             "drain": _poll("drain", "all", records, t0=200.0)}
    result = _check(tmp_path, files, drained={"all": [0, 1]})
    assert _counts(result) == {"group-skip": 2}  # 7, beyond the group's highest poll, is no skip
    assert not result.ok("all")
    examples = result.topics["all"].anomalies["group-skip"].examples
    assert "'p-3' at all/0@3" in examples[0] and "'p-4' at all/0@4" in examples[1]
    assert _counts(_check(tmp_path / "b", files, drained={"all": []})) == {}  # no complete drain: not judged
