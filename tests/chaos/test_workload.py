"""The chaos workload against a plain replicated cluster on loopback (no faults): producers,
a consumer group and the drain write histories in which every acknowledged record is read back
at its offset, by the group and by the drain."""

from __future__ import annotations

import importlib.util
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from harness import wait_until

from chaos.checker import check
from chaos.history import HistoryWriter, read_histories
from chaos.workload import (
    Workload,
    WorkloadConfig,
    _Ownership,
    _poll_until,
    consumer_names,
    drain,
    producer_names,
)

pytest_plugins = ["group_fixtures"]  # group_cluster, group_zk (a broker registered in ZooKeeper)

TOPICS = {"chaos-all": {"acks": "all", "partitions": 3}, "chaos-one": {"acks": "1", "partitions": 3}}


def _cluster_class():
    """The loopback cluster helper of the cluster tests (their conftest, loaded under another name)."""
    path = Path(__file__).resolve().parent.parent / "cluster" / "conftest.py"
    spec = importlib.util.spec_from_file_location("cluster_tests_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Cluster


def _lines(history_dir: Path) -> dict[str, list[list[str]]]:
    """Every history file's lines, split on tabs, by client (the format is the checker's contract)."""
    out = {}
    for path in sorted(history_dir.glob("*.history")):
        out[path.stem] = [line.split("\t") for line in path.read_text().splitlines() if line]
    return out


def test_client_names_follow_the_acks_level_and_topic(tmp_path):
    config = WorkloadConfig("b:9092", "zk:2181", TOPICS, tmp_path, producers_per_topic=2,
                            consumers_per_topic=2)
    assert producer_names(config) == [("p-all-0", "chaos-all"), ("p-all-1", "chaos-all"),
                                      ("p-one-0", "chaos-one"), ("p-one-1", "chaos-one")]
    assert consumer_names(config) == [("c-chaos-all-0", "chaos-all"), ("c-chaos-all-1", "chaos-all"),
                                      ("c-chaos-one-0", "chaos-one"), ("c-chaos-one-1", "chaos-one")]


@pytest.mark.zookeeper
@pytest.mark.slow
def test_every_acknowledged_record_is_polled_by_the_group_and_read_by_the_drain(tmp_path, zookeeper, chroot):
    cluster = _cluster_class()(tmp_path, zookeeper.connect_string + chroot,
                               {"zookeeper_session_timeout_ms": 4000, "replica_lag_time_max_ms": 3000})
    workload = None
    try:
        for broker_id in (0, 1, 2):
            cluster.start(broker_id)
        for topic, spec in TOPICS.items():
            cluster.create_topic(topic, spec["partitions"], 3, via=0, configs={"min_insync_replicas": "2"})
            cluster.wait_for_leaders(topic, spec["partitions"], via=0, isr_size=3)
        history_dir = tmp_path / "history"
        config = WorkloadConfig(cluster.bootstrap(), cluster.connect, TOPICS, history_dir,
                                rate_per_producer=150, session_timeout_ms=4000, delivery_timeout_ms=30_000,
                                max_duration_s=120)
        workload = Workload(config)
        workload.start()
        acked = lambda client: sum(1 for f in _lines(history_dir).get(client, []) if f[0] == "ack")  # noqa: E731
        wait_until(lambda: acked("p-all-0") >= 600 and acked("p-one-0") >= 600, 90, interval_s=0.5,
                   what="600 acknowledged records per topic")
        assert workload.stop_producers(60) == []
        histories = _lines(history_dir)
        acks = {(f[3], int(f[4]), int(f[5])): f[6]
                for lines in histories.values() for f in lines if f[0] == "ack"}
        # the group reaches every acknowledged record before it leaves
        def group_caught_up():
            polled = {(f[3], int(f[4]), int(f[5])) for c, lines in _lines(history_dir).items()
                      if c.startswith("c-") for f in lines if f[0] == "poll"}
            return set(acks) <= polled
        wait_until(group_caught_up, 90, interval_s=1.0, what="the group polling every acknowledged record")
        assert workload.stop_consumers(30) == []
        counts = drain(cluster.bootstrap(), TOPICS, history_dir, timeout_s=60)
        assert sum(counts.values()) >= len(acks)
    finally:
        if workload is not None:
            workload.close()
        cluster.close()

    assert read_histories(history_dir).torn_lines == 0
    histories = _lines(history_dir)
    assert set(histories) == {"p-all-0", "p-one-0", "c-chaos-all-0", "c-chaos-all-1", "c-chaos-one-0",
                              "c-chaos-one-1", "drain"}
    invoked = {f[4] for c, lines in histories.items() if c.startswith("p-")
               for f in lines if f[0] == "invoke"}
    failed = [f for lines in histories.values() for f in lines if f[0] == "fail"]
    assert not failed, failed[:5]
    assert {v for v in acks.values()} == invoked  # every record sent was settled, and acknowledged
    for lines in histories.values():
        assert all(float(f[1]) > time.time() - 3600 for f in lines)
    drained = {(f[3], int(f[4]), int(f[5])): f[6] for f in histories["drain"] if f[0] == "poll"}
    assert {k: drained.get(k) for k in acks} == acks
    # the group: each member wrote its assignments, and per partition the polls between two
    # assignments move forward one offset at a time
    owners = defaultdict(set)
    for client in ("c-chaos-all-0", "c-chaos-all-1", "c-chaos-one-0", "c-chaos-one-1"):
        assert histories[client][0][0] == "assign", histories[client][:3]
        last: dict[tuple[str, int], int] = {}
        for f in histories[client]:
            if f[0] == "assign":
                last.clear()
                owners[client] |= set(filter(None, f[3].split(",")))
            elif f[0] == "poll":
                key = (f[3], int(f[4]))
                assert key not in last or int(f[5]) == last[key] + 1, (client, key, last.get(key), f)
                last[key] = int(f[5])
    assert owners["c-chaos-all-0"] | owners["c-chaos-all-1"] == {f"chaos-all:{p}" for p in range(3)}


@pytest.mark.zookeeper
def test_a_member_that_loses_its_partitions_and_takes_them_back_writes_both_before_the_re_read(
        tmp_path, zookeeper, group_cluster, group_zk):
    """A group member as the workload runs it, across an expired session: its partitions are
    lost, uncommitted, and taken back inside one poll, restarting at the log start (nothing was
    committed).  The history says so, from the rebalance listener: an ``assign`` without them,
    then one with them, before the polls that read them again; the checker finds no
    nonmonotonic-poll."""
    from group_harness import create_topic, expire, produce, unique_name, wait_topic_registered

    from hpbroker.client import Consumer
    from hpbroker.coord.groups import GroupRegistry

    topic = unique_name("w")
    create_topic(group_cluster.port, topic, 2)
    wait_topic_registered(GroupRegistry(group_zk, "any"), topic, 2)
    produce(group_cluster.bootstrap, topic, 2, 5)
    writer = HistoryWriter(tmp_path / "c-w-0.history")
    consumer = Consumer(group_cluster.bootstrap, group=unique_name("g"), topics=[topic],
                        zookeeper=group_cluster.zk_connect, session_timeout_ms=3000, fetch_max_wait_ms=100,
                        auto_offset_reset="earliest", auto_commit_interval_ms=600_000,
                        **_Ownership(writer, "c-w-0").listener())
    stop = threading.Event()
    polling = threading.Thread(target=_poll_until, args=(consumer, writer, "c-w-0", topic, stop,
                                                        time.monotonic() + 60), daemon=True)
    writer.assign("c-w-0", [])
    polling.start()
    try:
        def polls():
            writer.flush()
            return [f for f in _lines(tmp_path)["c-w-0"] if f[0] == "poll"]
        wait_until(lambda: len(polls()) >= 10, 20, what="every record polled once")
        expire(zookeeper.connect_string, consumer._group._session)
        wait_until(lambda: len(polls()) >= 20, 20, what="every record polled again")
    finally:
        stop.set()
        polling.join(20)
        consumer.close()
        writer.close()
    lines = _lines(tmp_path)["c-w-0"]
    kinds = [f[0] if f[0] == "poll" else f"{f[0]} {f[3]}" for f in lines]
    both = f"{topic}:0,{topic}:1"
    assert kinds == ["assign ", f"assign {both}", *["poll"] * 10, "assign ", f"assign {both}",
                     *["poll"] * 10], kinds
    result = check(read_histories(tmp_path), {topic: {"acks": "1", "partitions": 2}}, [])
    assert result.topics[topic].anomalies["nonmonotonic-poll"].count == 0
