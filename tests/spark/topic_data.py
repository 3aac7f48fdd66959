"""Test data for the Spark data source: a topic with every kind of record, and the reference read."""

from __future__ import annotations

import random

from hpbroker.client import Admin, Consumer, Producer, TopicPartition

BASE_MS = 1_700_000_000_000


def fill_topic(bootstrap: str, topic: str, *, partitions: int = 3, records: int = 3000,
               segment_bytes: int = 8192) -> None:
    """``topic`` with ``records`` records spread over ``partitions`` in many small batches and
    several segments each: from a plain and an lz4 producer, null and empty keys and values,
    headers, timestamps that go back and forth (but grow over the run: a timestamp range has
    records before and after it)."""
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions, {"segment_bytes": segment_bytes, "retention_ms": -1})
    rng = random.Random(topic)
    plain = Producer(bootstrap, name=f"{topic}-plain", batch_bytes=1500, linger_ms=1, audit_topic=None)
    packed = Producer(bootstrap, name=f"{topic}-lz4", batch_bytes=1500, linger_ms=1, compression="lz4",
                      audit_topic=None)
    with plain, packed:
        for i in range(records):
            producer = packed if i % 3 == 0 else plain
            key = None if i % 7 == 0 else (b"" if i % 11 == 0 else b"key-%d" % (i % 13))
            body = b"value %d " % i + b"x" * rng.randrange(60)
            value = None if i % 17 == 0 else (b"" if i % 19 == 0 else body)
            headers = [("n", b"%d" % i), ("empty", None)] if i % 5 == 0 else None
            timestamp = BASE_MS + 10 * i + rng.randrange(-50, 50)
            producer.send(topic, value, key=key, headers=headers, timestamp=timestamp,
                          partition=i % partitions)
            if i % 150 == 149:  # small requests: a request lands whole in one segment
                plain.flush()
                packed.flush()


def reference(bootstrap: str, topic: str) -> dict[tuple[int, int], tuple]:
    """Every record of ``topic`` read by the Consumer: ``(partition, offset) -> row`` with the
    data source's columns (timestamp in ms)."""
    rows = {}
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for records in consumer.poll(1000).values():
                for r in records:
                    rows[r.partition, r.offset] = (r.topic, r.partition, r.offset, r.timestamp, r.producer,
                                                   r.key, r.value, [(k, v) for k, v in r.headers])
    return rows


def as_tuples(rows) -> dict[tuple[int, int], tuple]:
    """Arrow or Spark rows (dicts or Row objects with every column) keyed like :func:`reference`."""
    out = {}
    for row in rows:
        row = row.asDict(recursive=True) if hasattr(row, "asDict") else row
        stamp = row["timestamp"]
        millis = stamp if isinstance(stamp, int) else round(stamp.timestamp() * 1000)
        headers = [(h["key"], None if h["value"] is None else bytes(h["value"])) for h in row["headers"]]
        key, value = (None if row[name] is None else bytes(row[name]) for name in ("key", "value"))
        out[row["partition"], row["offset"]] = (row["topic"], row["partition"], row["offset"], millis,
                                                row["producer"], key, value, headers)
    return out
