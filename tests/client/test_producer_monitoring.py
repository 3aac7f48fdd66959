"""Monitoring events from real producers to a real broker: every acknowledged record is announced
once, in an event of its window (hpbroker.audit.events), periodically and on close."""

from __future__ import annotations

import collections
import time

from harness import wait_until
from test_producer import create_topic

from hpbroker.audit.events import AUDIT_TOPIC, decode_event, window_start
from hpbroker.client import Consumer, Producer, TopicPartition


def announced(bootstrap: str, producer_name: str) -> collections.Counter:
    """Sum of the audit topic's events of ``producer_name`` per (topic, window_start_ms)."""
    totals: collections.Counter = collections.Counter()
    with Consumer(bootstrap) as consumer:
        numbers = sorted(consumer.partitions_for_topic(AUDIT_TOPIC))
        partitions = [TopicPartition(AUDIT_TOPIC, p) for p in numbers]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            for records in consumer.poll(1000).values():
                for record in records:
                    if record.producer == producer_name:
                        event = decode_event(record.producer, record.value)
                        totals[event.topic, event.window_start_ms] += event.record_count
    return totals


def test_closing_announces_every_acknowledged_record_in_its_window(bootstrap, connection, topic_name):
    create_topic(connection, topic_name, 3)
    base = 1_700_000_000_000
    expected: collections.Counter = collections.Counter()
    name = f"{topic_name}-monitored"
    with Producer(bootstrap, name=name, audit_window_ms=1000, batch_bytes=4096) as producer:
        for i in range(5000):
            timestamp = base + (i * 7919) % 4000  # four windows, out of order, batches spanning them
            producer.send(topic_name, b"record %d" % i, timestamp=timestamp)
            expected[topic_name, window_start(timestamp, 1000)] += 1
        producer.send_many(topic_name, [b"x"] * 300, timestamp=base + 9000)
        expected[topic_name, base + 9000] += 300
    assert announced(bootstrap, name) == expected


def test_events_are_published_every_window_without_closing(bootstrap, connection, topic_name):
    create_topic(connection, topic_name, 1)
    with Producer(bootstrap, name=f"{topic_name}-periodic", audit_window_ms=200) as producer:
        producer.send_many(topic_name, [b"a"] * 10)
        producer.flush()
        wait_until(lambda: sum(announced(bootstrap, f"{topic_name}-periodic").values()) == 10, timeout_s=10,
                   what="the monitoring event of 10 records")
        producer.send_many(topic_name, [b"b"] * 5)
    assert sum(announced(bootstrap, f"{topic_name}-periodic").values()) == 15


def test_acks_0_announces_the_records_sent(bootstrap, connection, topic_name):
    create_topic(connection, topic_name, 2)
    with Producer(bootstrap, name=f"{topic_name}-acks0", acks=0) as producer:
        producer.send_many(topic_name, [b"a"] * 100, timestamp=1_700_000_000_000)
    assert announced(bootstrap, f"{topic_name}-acks0") == {(topic_name, 1_700_000_000_000): 100}


def test_no_events_without_an_audit_topic(bootstrap, connection, topic_name):
    create_topic(connection, topic_name, 1)
    with Producer(bootstrap, name=f"{topic_name}-silent", audit_topic=None) as producer:
        producer.send_many(topic_name, [b"a"] * 10)
    with Producer(bootstrap, name=f"{topic_name}-loud") as producer:  # makes sure the topic exists
        producer.send(topic_name, b"a")
    assert announced(bootstrap, f"{topic_name}-silent") == {}
    assert sum(announced(bootstrap, f"{topic_name}-loud").values()) == 1


def test_a_producer_that_sent_nothing_publishes_nothing(bootstrap, connection, topic_name):
    create_topic(connection, topic_name, 1)
    with Producer(bootstrap, name=f"{topic_name}-idle", audit_window_ms=100):
        time.sleep(0.3)
    with Producer(bootstrap, name=f"{topic_name}-other") as producer:
        producer.send(topic_name, b"a")
    assert announced(bootstrap, f"{topic_name}-idle") == {}
