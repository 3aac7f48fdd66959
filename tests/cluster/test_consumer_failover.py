"""Consumers across a leader's death: three brokers, R = 3, min_insync_replicas 2, an acks=all
producer running on two partitions.  The leader of partition 0 is killed (kill -9: a machine
gone) while a consumer reads; the consumer follows the new leader by itself and hands out every
acknowledged record exactly once per offset, in offset order, with no gap.  Once with a consumer
that assigns and seeks, once with a member of a consumer group."""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict

import pytest
from harness import wait_until

from hpbroker.client import Consumer, Producer, TopicPartition

pytestmark = pytest.mark.zookeeper

logger = logging.getLogger(__name__)

TOPIC = "reading"
PARTITIONS = 2


@pytest.mark.parametrize("kind", ["assigned", "group"])
def test_a_consumer_reads_every_acknowledged_record_once_in_order_across_a_leader_kill(cluster, kind):
    for broker_id in (0, 1, 2):
        cluster.start(broker_id)
    cluster.create_topic(TOPIC, PARTITIONS, 3, via=0, configs={"min_insync_replicas": "2"})
    leader = cluster.wait_for_leaders(TOPIC, PARTITIONS, via=0, isr_size=3).partitions[0].leader
    survivors = [b for b in (0, 1, 2) if b != leader]
    bootstrap = cluster.bootstrap(*survivors)  # clients ask the first address for metadata

    acked: dict[int, dict[int, bytes]] = {p: {} for p in range(PARTITIONS)}
    consumed: dict[int, list[tuple[int, bytes, float]]] = defaultdict(list)
    failures: list[BaseException] = []
    stop_producing, stop_consuming = threading.Event(), threading.Event()

    def produce() -> None:
        try:
            settings = {"acks": "all", "request_timeout_ms": 3000, "delivery_timeout_ms": 120_000,
                        "linger_ms": 2, "audit_topic": None, "name": "reading"}
            with Producer(bootstrap, **settings) as producer:
                sent = 0
                while not stop_producing.is_set() and sent < 20_000:
                    futures = [(v, producer.send_future(TOPIC, v, partition=i % PARTITIONS))
                               for i, v in ((i, b"record %d" % i) for i in range(sent, sent + 20))]
                    sent += 20
                    for value, future in futures:
                        metadata = future.result(120)
                        acked[metadata.partition][metadata.offset] = value
                    time.sleep(0.01)  # a steady trickle, so the consumer keeps up
        except BaseException as e:  # reported by the test
            failures.append(e)

    def consume() -> None:
        try:
            if kind == "group":
                consumer = Consumer(bootstrap, group="readers", topics=[TOPIC], zookeeper=cluster.connect,
                                    auto_offset_reset="earliest", reconnect_timeout_ms=60_000)
            else:
                consumer = Consumer(bootstrap, reconnect_timeout_ms=60_000)
                tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
                consumer.assign(tps)
                for tp in tps:
                    consumer.seek(tp, 0)
            with consumer:
                while not stop_consuming.is_set():
                    for tp, batch in consumer.poll(200).items():
                        now = time.monotonic()
                        consumed[tp.partition].extend((r.offset, r.value, now) for r in batch)
        except BaseException as e:  # reported by the test
            failures.append(e)

    producer_thread = threading.Thread(target=produce, daemon=True)
    consumer_thread = threading.Thread(target=consume, daemon=True)
    producer_thread.start()
    consumer_thread.start()
    try:
        wait_until(lambda: failures or len(consumed[0]) >= 200, 60, interval_s=0.05,
                   what="records consumed from partition 0 before the kill")
        assert not failures, failures
        killed_at = time.monotonic()
        before = len(acked[0])
        cluster.kill(leader)
        wait_until(lambda: failures or len(acked[0]) >= before + 300, 90, interval_s=0.05,
                   what="records acknowledged on partition 0's new leader")
        stop_producing.set()
        producer_thread.join(150)
        assert not failures, failures
        ends = {p: max(acked[p]) + 1 for p in range(PARTITIONS)}
        wait_until(lambda: failures or all(consumed[p] and consumed[p][-1][0] >= ends[p] - 1
                                           for p in range(PARTITIONS)), 90, interval_s=0.05,
                   what="the consumer reaching every acknowledged record")
    finally:
        stop_producing.set()
        stop_consuming.set()
        producer_thread.join(150)
        consumer_thread.join(30)
    assert not failures, failures

    resumed = next(t for o, _, t in consumed[0] if t > killed_at and o >= before) - killed_at
    logger.warning("%s consumer: kill -9 of broker %d (leader of %s-0) -> next record of it consumed: %.2f s",
                   kind, leader, TOPIC, resumed)
    print(f"\n{kind} consumer: kill -9 of the leader -> next record of it consumed: {resumed:.2f} s")
    for p in range(PARTITIONS):
        offsets = [o for o, _, _ in consumed[p]]
        assert offsets == list(range(len(offsets))), \
            f"partition {p}: offsets repeat, skip or go backwards: {_first_break(offsets)}"
        stored = {o: v for o, v, _ in consumed[p]}
        missing = [o for o, v in acked[p].items() if stored.get(o) != v]
        assert not missing, f"partition {p}: {len(missing)} acknowledged records not consumed: {missing[:5]}"


def _first_break(offsets: list[int]) -> str:
    for i, o in enumerate(offsets):
        if o != i:
            return f"position {i} holds offset {o}, around {offsets[max(0, i - 3):i + 3]}"
    return "none"
