"""Replication on /metrics: three real brokers on one real ZooKeeper, each serving its metrics,
scraped while a follower is killed and comes back and while the leader stops: the ISR's shrink
and expand, the followers' lag on the leader, under-replicated and under-min-ISR partitions, and
the controller (exactly one active; the cluster's figures only from it)."""

from __future__ import annotations

import pytest
from harness import free_ports, wait_until
from scrape import Scrape, scrape

from hpbroker.client import Producer

pytestmark = pytest.mark.zookeeper

TOPIC = "metered"
BROKERS = (0, 1, 2)


class MeteredCluster:
    """The ``cluster`` fixture's brokers, each with a metrics port of its own."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.metrics_ports: dict[int, int] = {}

    def start(self, broker_id: int) -> None:
        if broker_id not in self.metrics_ports:
            self.metrics_ports[broker_id] = free_ports(1)
        self.cluster.settings["metrics_port"] = self.metrics_ports[broker_id]  # read as it starts
        self.cluster.start(broker_id)

    def scrape(self, broker_id: int) -> Scrape:
        return scrape(self.metrics_ports[broker_id])

    def live(self) -> list[int]:
        return sorted(self.cluster.processes)

    def controllers(self) -> dict[int, Scrape] | None:
        """broker -> its scrape when exactly one live broker reports controller_active 1, else None."""
        scrapes = {b: self.scrape(b) for b in self.live()}
        active = {b: s for b, s in scrapes.items() if s.value("hpbroker_controller_active") == 1}
        if len(active) != 1 or any(s.value("hpbroker_controller_active") is None for s in scrapes.values()):
            return None
        return active


def _lags(s: Scrape, name: str) -> dict[int, float]:
    return {int(dict(labels)["replica"]): value
            for labels, value in s.series(name, topic=TOPIC, partition=0).items()}


def _produce(bootstrap: str, count: int, acks: object) -> None:
    with Producer(bootstrap, acks=acks, linger_ms=2, audit_topic=None) as producer:
        for i in range(count):
            producer.send(TOPIC, b"record %d" % i, partition=0)
        producer.flush()


def test_a_killed_follower_shows_on_the_leaders_metrics_and_one_controller_reports(cluster):
    metered = MeteredCluster(cluster)
    for broker_id in BROKERS:
        metered.start(broker_id)
    cluster.create_topic(TOPIC, 1, 3, via=0, configs={"min_insync_replicas": "3"})
    leader = cluster.wait_for_leaders(TOPIC, 1, via=0, isr_size=3).partitions[0].leader
    followers = [b for b in BROKERS if b != leader]
    _produce(cluster.bootstrap(), 200, "all")

    # Healthy: each follower caught up on the leader's lag gauges, nothing under-replicated.
    def caught_up() -> Scrape | None:
        s = metered.scrape(leader)
        lags = _lags(s, "hpbroker_replica_lag_records")
        return s if lags == {f: 0 for f in followers} \
            and s.value("hpbroker_under_replicated_partitions") == 0 \
            and s.value("hpbroker_log_high_watermark", topic=TOPIC, partition=0) == 200 else None
    healthy = wait_until(caught_up, 30, interval_s=0.2, what="both followers caught up on the leader")
    assert _lags(healthy, "hpbroker_replica_lag_bytes") == {f: 0 for f in followers}
    assert healthy.value("hpbroker_leader_partitions") == 1
    assert healthy.value("hpbroker_under_min_isr_partitions") == 0
    shrinks = healthy.total("hpbroker_isr_shrinks_total")
    expands = healthy.total("hpbroker_isr_expands_total")
    for follower in followers:  # per-partition replication series only where the partition is led
        s = metered.scrape(follower)
        assert s.series("hpbroker_replica_lag_records") == {}
        assert s.value("hpbroker_leader_partitions") == 0
        assert s.value("hpbroker_under_replicated_partitions") == 0
        assert s.value("hpbroker_log_high_watermark", topic=TOPIC, partition=0) is not None  # its log
    controllers = wait_until(metered.controllers, 30, interval_s=0.2, what="exactly one active controller")
    (controller, scraped), = controllers.items()
    assert scraped.value("hpbroker_controller_epoch") >= 1
    assert scraped.value("hpbroker_offline_partitions") == 0
    assert scraped.value("hpbroker_preferred_replica_imbalance") == 0
    for other in set(BROKERS) - {controller}:  # the cluster's figures come from the active one only
        s = metered.scrape(other)
        assert s.value("hpbroker_controller_active") == 0
        for name in ("hpbroker_controller_epoch", "hpbroker_offline_partitions",
                     "hpbroker_preferred_replica_imbalance"):
            assert s.series(name) == {}, name

    # A follower killed: the ISR shrinks, the leader says so; its lag grows with what it misses.
    gone = followers[0]
    cluster.kill(gone)  # kill -9: a machine gone

    def shrunk() -> Scrape | None:
        s = metered.scrape(leader)
        return s if s.value("hpbroker_under_replicated_partitions") == 1 \
            and s.total("hpbroker_isr_shrinks_total") >= shrinks + 1 else None
    s = wait_until(shrunk, 30, interval_s=0.2, what="the ISR shrink on the leader's metrics")
    assert s.value("hpbroker_under_min_isr_partitions") == 1  # 2 in sync, min_insync_replicas 3
    _produce(cluster.bootstrap(leader), 100, 1)

    def reported() -> Scrape | None:  # the worker's figures are up to one heartbeat old
        s = metered.scrape(leader)
        return s if s.value("hpbroker_log_high_watermark", topic=TOPIC, partition=0) == 300 \
            and _lags(s, "hpbroker_replica_lag_records").get(followers[1]) == 0 else None
    s = wait_until(reported, 30, interval_s=0.2, what="the new records on the leader's metrics")
    lags = _lags(s, "hpbroker_replica_lag_records")
    assert lags[gone] == 100, lags
    assert _lags(s, "hpbroker_replica_lag_bytes")[gone] >= 100 * len(b"record 99"), s
    assert wait_until(metered.controllers, 30, interval_s=0.2, what="one active controller among the live")

    # It comes back: it catches up, the ISR expands, nothing is under-replicated any more.
    metered.start(gone)

    def expanded() -> Scrape | None:
        s = metered.scrape(leader)
        return s if s.value("hpbroker_under_replicated_partitions") == 0 \
            and s.total("hpbroker_isr_expands_total") >= expands + 1 else None
    s = wait_until(expanded, 60, interval_s=0.2, what="the ISR expand on the leader's metrics")
    assert s.value("hpbroker_under_min_isr_partitions") == 0
    assert _lags(s, "hpbroker_replica_lag_records") == {f: 0 for f in followers}

    # The leader stops: the controller elects another and counts it; leadership left the preferred one.
    cluster.stop(leader)

    def reelected() -> dict[int, Scrape] | None:
        active = metered.controllers()
        if not active:
            return None
        (_, s), = active.items()
        elections = sum(metered.scrape(b).value("hpbroker_leader_elections_total") for b in metered.live())
        return active if elections >= 1 and s.value("hpbroker_preferred_replica_imbalance") == 1 else None
    wait_until(reelected, 60, interval_s=0.2, what="a new leader elected and counted by the controller")
    new_leader = cluster.wait_for_leaders(TOPIC, 1, via=followers[1]).partitions[0].leader
    assert new_leader in followers
    assert wait_until(lambda: metered.scrape(new_leader).value("hpbroker_leader_partitions") == 1, 30,
                      interval_s=0.2, what="the new leader's leader_partitions")
