"""Clients given every broker of a cluster as bootstrap addresses keep working when the first
is gone: three brokers, the first stopped.  Clients made before that go on asking another broker
for metadata; clients made after it, with the dead broker first, ask the next address.  Every
kind of client: producer, admin, assigned consumer, group member, the Spark source's reader."""

from __future__ import annotations

import time

import pytest
from harness import wait_until

from hpbroker.client import Admin, Consumer, Producer, TopicPartition
from hpbroker.spark.columns import RECORD_FIELDS, arrow_schema
from hpbroker.spark.planning import OffsetRange
from hpbroker.spark.reading import ReadConfig, read_range

pytestmark = pytest.mark.zookeeper

EARLY, LATE = "early", "late"  # read before the first broker stops / first read after it stopped
BOUND_MS = 15_000  # how long each client may take to find a broker that answers


def poll_values(consumer: Consumer, count: int) -> list[bytes]:
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(values) < count and time.monotonic() < deadline:
        for batch in consumer.poll(200).values():
            values.extend(record.value for record in batch)
    return values


def led_by_survivors(cluster, topic: str, partitions: int) -> bool:
    metadata = cluster.metadata(1, topic)
    return len(metadata.partitions) == partitions and all(
        p.error_code == 0 and p.leader in (1, 2) for p in metadata.partitions)


def test_clients_ask_the_other_bootstrap_addresses_when_the_first_broker_is_down(cluster):
    for broker_id in (0, 1, 2):
        cluster.start(broker_id, workers=1)
    cluster.create_topic(EARLY, 2, 3, via=1)
    cluster.create_topic(LATE, 1, 3, via=1)
    cluster.wait_for_leaders(EARLY, 2, via=1, isr_size=3)
    cluster.wait_for_leaders(LATE, 1, via=1, isr_size=3)
    everyone = cluster.bootstrap(0, 1, 2)  # the broker that stops first
    settings = {"audit_topic": None, "max_block_ms": BOUND_MS, "request_timeout_ms": 5000}

    early_producer = Producer(everyone, **settings)
    early_consumer = Consumer(everyone, reconnect_timeout_ms=BOUND_MS, auto_offset_reset="earliest")
    try:
        early_producer.send_future(EARLY, b"before", partition=0).result(30)
        early_consumer.assign([TopicPartition(EARLY, 0)])
        assert poll_values(early_consumer, 1) == [b"before"]

        cluster.stop(0)
        wait_until(lambda: led_by_survivors(cluster, EARLY, 2) and led_by_survivors(cluster, LATE, 1), 40,
                   interval_s=0.2, what="leaders on brokers 1 and 2")
        failures: dict[str, BaseException] = {}

        def attempt(client: str, check) -> None:
            try:
                check()
            except BaseException as e:  # every client is tried; the assertion lists the failures
                failures[client] = e

        # Made before: a topic they never asked about needs metadata from a broker still up.
        attempt("producer made before", lambda: early_producer.send_future(LATE, b"late").result(30))
        early_consumer.assign([TopicPartition(LATE, 0)])
        attempt("consumer made before", lambda: poll_values(early_consumer, 1) == [b"late"] or
                pytest.fail("the early consumer read nothing of the new topic"))

        def produce() -> None:
            with Producer(everyone, **settings) as producer:
                for i in range(10):
                    producer.send_future(EARLY, b"after %d" % i, partition=i % 2).result(30)

        def admin() -> None:
            with Admin(everyone, connect_timeout_ms=2000, request_timeout_ms=BOUND_MS) as made:
                made.create_topic("made-after", 1, replication_factor=2)
                assert {EARLY, LATE, "made-after"} <= set(made.list_topics())
                assert [p.leader in (1, 2) for p in made.describe_topic(EARLY).partitions] == [True, True]

        def consume() -> None:
            with Consumer(everyone, reconnect_timeout_ms=BOUND_MS, auto_offset_reset="earliest") as consumer:
                consumer.assign([TopicPartition(EARLY, 0), TopicPartition(EARLY, 1)])
                assert len(poll_values(consumer, 11)) == 11  # "before" and the ten above

        def group_member() -> None:
            with Consumer(everyone, group="after", topics=[EARLY], zookeeper=cluster.connect,
                          reconnect_timeout_ms=BOUND_MS, auto_offset_reset="earliest") as consumer:
                assert len(poll_values(consumer, 11)) == 11

        def spark_reader() -> None:
            schema = arrow_schema([name for name, _ in RECORD_FIELDS])
            config = ReadConfig(timeout_ms=BOUND_MS)
            batches = read_range(everyone, OffsetRange(LATE, 0, 0, 1), schema, config)
            assert [row["value"] for batch in batches for row in batch.to_pylist()] == [b"late"]

        for client, check in [("producer", produce), ("admin", admin), ("consumer", consume),
                              ("group member", group_member), ("spark reader", spark_reader)]:
            attempt(client, check)
        assert not failures, "\n".join(f"{client}: {e!r}" for client, e in failures.items())
    finally:
        early_consumer.close()
        early_producer.close(10)
