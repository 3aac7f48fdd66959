"""The checker catches what it claims: with the test-only setting that makes a leader answer
acks=all at its own flush (``HPBROKER_UNSAFE_ACK_BEFORE_REPLICATION=1`` in the brokers'
environment), a scripted scenario loses acknowledged records and the checker reports them as
lost-write; without it, the same scenario loses nothing.

The scenario, on a ChaosCluster of three brokers (one partition, R = 3, min_insync_replicas 2):

1. 100 records acknowledged with every replica in sync;
2. the leader split from its two followers (nftables DROP both ways; all three still reach
   ZooKeeper and the clients), so no fetch answer, parked or new, can carry the next records to
   a follower, whatever the timing; 100 more records sent with acks=all (with the bug they are
   acknowledged by the leader alone; without it they wait);
3. the leader killed (kill -9); one of the followers, from the ISR, leads; the split removed;
4. 150 records from a second producer land at the offsets the lost records had, and beyond;
5. the old leader started again (it truncates to the new leader's log), everything drained.
"""

from __future__ import annotations

import threading
import time

import pytest
from harness import wait_until

from chaos.checker import check
from chaos.cluster import ChaosCluster
from chaos.history import HistoryWriter, read_histories
from chaos.workload import drain
from hpbroker.client import Producer

pytestmark = [pytest.mark.slow, pytest.mark.zookeeper]

ENV = "HPBROKER_UNSAFE_ACK_BEFORE_REPLICATION"
TOPIC = "planted"
TOPICS = {TOPIC: {"acks": "all", "partitions": 1}}
FETCH_WAIT_MS = 200


class _Recorder:
    """A producer writing its history, counting what settled."""

    def __init__(self, bootstrap: str, name: str, history_dir) -> None:
        self.name = name
        self.writer = HistoryWriter(history_dir / f"{name}.history")
        self.producer = Producer(bootstrap, acks="all", name=name, linger_ms=2, request_timeout_ms=3000,
                                 delivery_timeout_ms=120_000, audit_topic=None)
        self.lock = threading.Lock()
        self.sent = self.acked = self.failed = 0

    def send(self, count: int) -> None:
        for _ in range(count):
            value = f"{self.name}-{self.sent}"
            self.sent += 1
            self.writer.invoke(self.name, TOPIC, value)
            self.producer.send(TOPIC, value.encode(), partition=0, callback=self._settled(value))

    def _settled(self, value: str):
        def callback(metadata, error) -> None:
            if error is None:
                self.writer.ack(self.name, TOPIC, metadata.partition, metadata.offset, value)
            else:
                self.writer.fail(self.name, TOPIC, value, repr(error))
            with self.lock:
                if error is None:
                    self.acked += 1
                else:
                    self.failed += 1
        return callback

    def settled(self) -> int:
        with self.lock:
            return self.acked + self.failed

    def close(self) -> None:
        try:
            self.producer.close(timeout_s=10)
        finally:
            self.writer.close()


@pytest.fixture
def chaos_cluster(tmp_path):
    reason = ChaosCluster.unavailable()
    if reason is not None:
        pytest.skip(reason)
    # a long replica lag: the cut-off followers stay in the ISR, so one of them may lead after the
    # kill
    cluster = ChaosCluster(tmp_path / "cluster", brokers=3, session_timeout_ms=6000,
                           broker_settings={"replica_lag_time_max_ms": 30_000,
                                            "replica_fetch_wait_max_ms": FETCH_WAIT_MS})
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.mark.parametrize("planted", [True, False], ids=["bug-planted", "no-bug"])
def test_the_checker_reports_lost_writes_exactly_when_the_planted_bug_acknowledges_early(
        chaos_cluster, tmp_path, monkeypatch, planted):
    if planted:
        monkeypatch.setenv(ENV, "1")  # the brokers inherit the environment at start
    else:
        monkeypatch.delenv(ENV, raising=False)
    cluster = chaos_cluster
    cluster.start_all()
    cluster.create_topic(TOPIC, 1, replication_factor=3, min_insync_replicas=2)
    cluster.wait_in_sync([TOPIC], 60)
    history_dir = tmp_path / "history"
    first = _Recorder(cluster.bootstrap(), "p-all-0", history_dir)
    second = None
    try:
        first.send(100)
        wait_until(lambda: first.acked == 100, 60, interval_s=0.05, what="100 records acknowledged in sync")

        leader = cluster.leaders(TOPIC)[0]
        followers = [b for b in cluster.broker_ids if b != leader]
        cluster.network.split([[f"b{leader}"], [f"b{b}" for b in followers]])
        try:
            first.send(100)
            if planted:
                wait_until(lambda: first.acked == 200, 30, interval_s=0.02,
                           what="records acknowledged by the leader alone (the planted bug)")
            else:
                time.sleep(2.0)  # time the leader would need to answer early; it must not
                assert first.acked == 100, "acks=all answered while both followers were cut off"
            cluster.kill(leader)
            wait_until(lambda: cluster.leaders(TOPIC).get(0) in followers, 90, interval_s=0.2,
                       what="a follower from the ISR leading")
        finally:
            cluster.network.join()

        # a new client asks its first bootstrap broker for metadata: one that is alive
        second = _Recorder(",".join(cluster.address(b) for b in followers), "p-all-1", history_dir)
        second.send(150)
        wait_until(lambda: first.settled() == 200 and second.settled() == 150, 150, interval_s=0.2,
                   what="every record sent acknowledged or failed")
        cluster.start(leader)
        cluster.wait_serving(leader, 120)
        cluster.wait_in_sync([TOPIC], 120)
    finally:
        first.close()
        if second is not None:
            second.close()
    drained = drain(cluster.bootstrap(), TOPICS, history_dir, timeout_s=90)
    assert drained.incomplete() == []

    result = check(read_histories(history_dir), TOPICS, [], drained.complete_partitions())
    topic = result.topics[TOPIC]
    lost = topic.anomalies["lost-write"]
    if planted:
        assert lost.count > 0, f"the checker missed the lost writes: {topic}"
        assert not result.ok("all")
    else:
        assert first.acked + second.acked == 350, (first.acked, first.failed, second.acked, second.failed)
        assert result.ok("all"), {kind: a for kind, a in topic.anomalies.items() if a.count}
        assert lost.count == 0
        assert topic.verified == topic.acknowledged == 350
