"""Leader failover under load: three brokers, every partition on all three, acks=all with
min_insync_replicas 2.  The leader of a partition is killed (kill -9: a machine gone) and
restarted, again and again, while a producer sends; every acknowledged record is then read back
exactly once, at the offset it was acknowledged with, in order per partition."""

from __future__ import annotations

import itertools
import logging
import threading
import time

import pytest
from harness import wait_until

from hpbroker import protocol
from hpbroker.client import Consumer, Producer, TopicPartition

pytestmark = pytest.mark.zookeeper

logger = logging.getLogger(__name__)

TOPIC = "failover"
PARTITIONS = 2


def _read_all(bootstrap: str, partition: int, end: int) -> list[tuple[int, bytes]]:
    with Consumer(bootstrap, consumer_timeout_ms=3000) as consumer:
        tp = TopicPartition(TOPIC, partition)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        records = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not records or records[-1][0] < end - 1):
            for record in consumer:
                records.append((record.offset, record.value))
                if record.offset >= end - 1:
                    break
        return records


def _outage_end(times: list[float], killed_at: float) -> float:
    """When acknowledgements resumed after the kill: the end of the longest gap between two
    acknowledgements from just before the kill on (an answer already on its way when the leader
    was killed may arrive just after)."""
    gaps = [(later - earlier, later) for earlier, later in itertools.pairwise(times) if later >= killed_at]
    return max(gaps)[1]


def test_killing_the_leader_again_and_again_loses_no_acknowledged_record(cluster):
    for broker_id in (0, 1, 2):
        cluster.start(broker_id)
    header, _ = cluster.client(0).request(protocol.CreateTopicRequest(
        TOPIC, PARTITIONS, [protocol.TopicConfigEntry("min_insync_replicas", "2")], replication_factor=3),
        timeout_s=40)
    assert header.error_code == 0, header.error_message
    cluster.wait_for_leaders(TOPIC, PARTITIONS, via=0, isr_size=3)

    acknowledged: dict[int, dict[int, bytes]] = {p: {} for p in range(PARTITIONS)}
    failures: list[BaseException] = []
    stop = threading.Event()
    acked_at: dict[int, list[float]] = {p: [] for p in range(PARTITIONS)}  # when each ack came (monotonic)

    def produce() -> None:
        try:
            settings = {"acks": "all", "request_timeout_ms": 3000, "delivery_timeout_ms": 120_000,
                        "linger_ms": 2, "audit_topic": None, "name": "failover"}
            with Producer(cluster.bootstrap(), **settings) as producer:
                sent = 0
                while not stop.is_set() and sent < 20_000:
                    futures = [(i, producer.send_future(TOPIC, b"record %d" % i, partition=i % PARTITIONS))
                               for i in range(sent, sent + 50)]
                    sent += 50
                    for i, future in futures:
                        metadata = future.result(120)
                        acknowledged[metadata.partition][metadata.offset] = b"record %d" % i
                        acked_at[metadata.partition].append(time.monotonic())
        except BaseException as e:  # reported by the test
            failures.append(e)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    failover_s = []
    try:
        wait_until(lambda: sum(len(a) for a in acknowledged.values()) >= 500 or failures, 60,
                   what="records acknowledged before any kill")
        for _round in range(3):
            leader = cluster.metadata(next(iter({b for b in cluster.processes})), TOPIC).partitions[0].leader
            before = len(acked_at[0])
            killed_at = time.monotonic()
            cluster.kill(leader)
            wait_until(lambda n=before + 200: failures or len(acked_at[0]) >= n, 60,
                       what="records of partition 0 acknowledged on the new leader")
            failover_s.append(_outage_end(acked_at[0][max(0, before - 1):], killed_at) - killed_at)
            cluster.start(leader)
            survivor = next(b for b in cluster.processes if b != leader)
            cluster.wait_for_leaders(TOPIC, PARTITIONS, via=survivor, isr_size=3, timeout_s=60)
    finally:
        stop.set()
        thread.join(180)
    assert not failures, failures
    logger.info("failover (kill -9 of the leader to the next acknowledged record): %s s",
                [round(s, 2) for s in failover_s])
    via = cluster.bootstrap()
    for partition in range(PARTITIONS):
        wanted = acknowledged[partition]
        end = max(wanted) + 1
        records = _read_all(via, partition, end)
        offsets = [o for o, _ in records]
        assert offsets == sorted(set(offsets)), "offsets repeat or go backwards"
        stored = dict(records)
        missing = [o for o in wanted if stored.get(o) != wanted[o]]
        assert not missing, f"partition {partition}: {len(missing)} acknowledged records lost: {missing[:5]}"
        values = [v for _, v in records]
        assert len(values) == len(set(values)), "a record is stored twice (a retry after failover)"
