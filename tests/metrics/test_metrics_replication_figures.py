"""Replication figures on their way to /metrics, on their own: a worker's ISR change counts across
leaderships (hpbroker.workers.stats), and what a scrape makes of the stats files' roles and of the
controller's state (hpbroker.workers.exporter).  The cluster test (tests/cluster/
test_replication_metrics.py) scrapes real brokers."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from scrape import parse

from hpbroker.broker.config import BrokerConfig
from hpbroker.workers.exporter import MetricsEndpoint, SlotView
from hpbroker.workers.stats import WorkerStats, write_stats


def _leadership(shrinks: int = 0, expands: int = 0) -> SimpleNamespace:
    return SimpleNamespace(isr_shrinks=shrinks, isr_expands=expands)  # a LeaderReplica's counters


def test_isr_changes_are_counted_across_leaderships_once_each():
    stats = WorkerStats()
    first = _leadership(shrinks=1)
    partitions = [SimpleNamespace(replica=first), SimpleNamespace(replica=None)]
    stats.count_isr_changes(partitions)
    assert (stats.isr_shrinks, stats.isr_expands) == (1, 0)
    first.isr_shrinks, first.isr_expands = 2, 1  # more, then the leadership ends before the next report
    partitions[0].replica = SimpleNamespace(role="follower")
    second = _leadership(expands=1)  # a new leadership elsewhere, with a change already
    partitions[1].replica = second
    stats.count_isr_changes(partitions)
    assert (stats.isr_shrinks, stats.isr_expands) == (2, 2)
    second.isr_shrinks = 1
    stats.count_isr_changes(partitions)
    stats.count_isr_changes(partitions)
    assert (stats.isr_shrinks, stats.isr_expands) == (3, 2)  # the ended one is not counted again


def _entry(topic: str, partition: int, **replication) -> dict:
    fields = dict.fromkeys(("produced_records", "produced_bytes", "duplicate_records", "fetched_records",
                            "fetched_bytes", "flushes", "flushed_bytes", "log_start_offset", "size_bytes",
                            "damaged_ranges", "damaged_records", "writes_refused"), 0)
    return {"topic": topic, "partition": partition, **fields, "high_watermark": 50, "segments": 1,
            **replication}


@pytest.fixture
def endpoint(tmp_path):
    config = BrokerConfig(data_dir=str(tmp_path), host="127.0.0.1")  # metrics_port 0: any free port
    metrics = MetricsEndpoint(config, str(tmp_path), dict)
    snapshot = WorkerStats().snapshot(0, [], 0)
    snapshot["isr_shrinks"], snapshot["isr_expands"] = 4, 3
    snapshot["partitions"] = [
        _entry("plain", 0),  # unreplicated: led here
        _entry("orders", 0, role="leader", leader_epoch=2, replicated_high_watermark=40, under_replicated=1,
               under_min_isr=0, isr_shrinks=1, isr_expands=0,
               followers=[{"broker": 1, "fetch_offset": 40, "in_sync": True, "lag_records": 10,
                           "lag_bytes": 900, "last_caught_up_ms": 0},
                          {"broker": 2, "fetch_offset": -1, "in_sync": False, "lag_records": 50,
                           "lag_bytes": 4500, "last_caught_up_ms": 0}]),
        _entry("orders", 1, role="follower", leader_epoch=2, replicated_high_watermark=30),
        _entry("orders", 2, role="awaiting"),
    ]
    write_stats(str(tmp_path), 0, snapshot)
    metrics.slots = (SlotView(0, "serving", os.getpid(), 0),)
    metrics._groups = SimpleNamespace(close=lambda: None, snapshot=SimpleNamespace(  # a poller's reading
        read_at=0.0, offsets={("g", "plain", 0): 45, ("g", "orders", 0): 35, ("g", "orders", 1): 20}))
    yield metrics
    metrics.close()


def test_replication_series_only_for_partitions_led_here(endpoint):
    scraped = parse(endpoint.render())
    assert scraped.value("hpbroker_leader_partitions") == 2
    assert scraped.value("hpbroker_under_replicated_partitions") == 1
    assert scraped.value("hpbroker_under_min_isr_partitions") == 0
    assert scraped.value("hpbroker_isr_shrinks_total", worker=0) == 4
    assert scraped.value("hpbroker_isr_expands_total", worker=0) == 3
    assert scraped.series("hpbroker_replica_lag_records") == {
        frozenset({("topic", "orders"), ("partition", "0"), ("replica", "1")}): 10,
        frozenset({("topic", "orders"), ("partition", "0"), ("replica", "2")}): 50}
    assert scraped.value("hpbroker_replica_lag_bytes", topic="orders", partition=0, replica=2) == 4500
    for partition in (1, 2):  # a follower's, and one awaiting its role, have their log series only
        assert scraped.value("hpbroker_log_high_watermark", topic="orders", partition=partition) == 50
    # A group's lag where consumers read: to the replicated high watermark; none from a follower.
    assert scraped.series("hpbroker_consumer_group_lag") == {
        frozenset({("group", "g"), ("topic", "plain"), ("partition", "0")}): 5,
        frozenset({("group", "g"), ("topic", "orders"), ("partition", "0")}): 5}
    for name in ("hpbroker_controller_active", "hpbroker_leader_elections_total"):  # no ZooKeeper
        assert scraped.series(name) == {}, name


def test_the_cluster_figures_come_from_the_active_controller_only(endpoint):
    state = {"active": False, "broker_id": 0, "controller_epoch": -1, "offline_partitions": 0,
             "preferred_replica_imbalance": 0, "leader_elections": 2}
    endpoint.controller_state = lambda: state
    scraped = parse(endpoint.render())
    assert scraped.value("hpbroker_controller_active") == 0
    assert scraped.value("hpbroker_leader_elections_total") == 2
    for name in ("hpbroker_controller_epoch", "hpbroker_offline_partitions",
                 "hpbroker_preferred_replica_imbalance"):
        assert scraped.series(name) == {}, name
    state = {**state, "active": True, "controller_epoch": 7, "offline_partitions": 1,
             "preferred_replica_imbalance": 3, "leader_elections": 5}
    scraped = parse(endpoint.render())
    assert [scraped.value(f"hpbroker_{name}") for name in (
        "controller_active", "controller_epoch", "offline_partitions", "preferred_replica_imbalance",
        "leader_elections_total")] == [1, 7, 1, 3, 5]


def test_a_controller_state_that_fails_leaves_the_rest_of_the_scrape(endpoint):
    def broken():
        raise RuntimeError("gone")

    endpoint.controller_state = broken
    scraped = parse(endpoint.render())
    assert scraped.series("hpbroker_controller_active") == {}
    assert scraped.value("hpbroker_leader_partitions") == 2
