"""Planning and reading splits against a real broker, without Spark: the data source's engine."""

from __future__ import annotations

import os

import pytest
from harness import wait_until
from topic_data import BASE_MS, as_tuples, fill_topic, reference

from hpbroker import protocol
from hpbroker.client import Admin, Consumer, Producer, TopicPartition
from hpbroker.client.connection import BrokerConnection, parse_bootstrap
from hpbroker.errors import CorruptRecordError, OffsetOutOfRangeError, UnknownTopicOrPartitionError
from hpbroker.records import build_batch, scan_batches
from hpbroker.spark.columns import RECORD_FIELDS, arrow_schema
from hpbroker.spark.planning import (
    OffsetRange,
    OffsetSpec,
    parse_offsets,
    plan_read,
    split_range,
)
from hpbroker.spark.reading import ReadConfig, read_range
from hpbroker.timestamps import parse_time_ms

ALL = arrow_schema([name for name, _ in RECORD_FIELDS])
EARLIEST, LATEST = OffsetSpec("earliest"), OffsetSpec("latest")


def _read(bootstrap, splits, config=None, schema=ALL):
    return [row for split in splits for batch in read_range(bootstrap, split, schema, config)
            for row in batch.to_pylist()]


@pytest.fixture(scope="module")
def filled(bootstrap):
    """A topic of 3 partitions, many batches and segments each, and its reference read."""
    fill_topic(bootstrap, "filled")
    return "filled", reference(bootstrap, "filled")


def test_splits_read_exactly_the_records_of_every_partition_across_segments(broker, filled):
    topic, expected = filled
    for p in range(3):
        segments = [n for n in os.listdir(broker.data_dir / f"{topic}-{p}") if n.endswith(".log")]
        assert len(segments) >= 3, "the data spans several segments"
    splits = plan_read(broker.bootstrap, [topic], EARLIEST, LATEST, max_records_per_split=170)
    assert sum(s.count for s in splits) == len(expected) == 3000
    assert all(s.count <= 170 for s in splits) and len(splits) == sum(-(-1000 // 170) for _ in range(3))
    rows = _read(broker.bootstrap, splits, ReadConfig(fetch_max_bytes=4096, records_per_batch=50))
    assert len(rows) == 3000 and as_tuples(rows) == expected


def test_explicit_offsets_start_and_end_inside_batches(bootstrap, filled):
    topic, expected = filled
    starting = parse_offsets(f'{{"{topic}": {{"0": 13, "2": 500}}}}', "earliest", "starting")
    ending = parse_offsets(f'{{"{topic}": {{"0": 401, "1": -2}}}}', "latest", "ending")
    splits = plan_read(bootstrap, [topic], starting, ending, max_records_per_split=10**6)
    assert [(s.partition, s.start, s.end) for s in splits] == [(0, 13, 401), (2, 500, 1000)]
    rows = as_tuples(_read(bootstrap, splits, ReadConfig(fetch_max_bytes=2048)))
    assert rows == {k: v for k, v in expected.items()
                    if (k[0] == 0 and 13 <= k[1] < 401) or (k[0] == 2 and k[1] >= 500)}


def test_timestamps_resolve_to_the_offsets_the_broker_lists(bootstrap, filled):
    topic, expected = filled
    start_ms, end_ms = BASE_MS + 10_000, BASE_MS + 20_000
    splits = plan_read(bootstrap, [topic], OffsetSpec("timestamp", timestamp_ms=start_ms),
                       OffsetSpec("timestamp", timestamp_ms=end_ms), max_records_per_split=10**6)
    with Consumer(bootstrap) as consumer:
        tps = [TopicPartition(topic, p) for p in range(3)]
        starts = consumer.offsets_for_times(dict.fromkeys(tps, start_ms))
        ends = consumer.offsets_for_times(dict.fromkeys(tps, end_ms))
    assert [(s.partition, s.start, s.end) for s in splits] == [(p, starts[tp], ends[tp])
                                                               for p, tp in enumerate(tps)]
    rows = as_tuples(_read(bootstrap, splits))
    first = {p: starts[TopicPartition(topic, p)] for p in range(3)}
    assert rows and all(first[p] <= o < ends[TopicPartition(topic, p)] for p, o in rows)
    before_start = [v for (p, o), v in expected.items() if o < first[p]]
    assert before_start and max(v[3] for v in before_start) < start_ms, "every record before it is older"
    far = plan_read(bootstrap, [topic], OffsetSpec("timestamp", timestamp_ms=BASE_MS + 10**9), LATEST, 10**6)
    assert far == [], "no record that recent: the ranges start at the end"


def test_the_ends_are_a_snapshot_taken_when_planning(bootstrap, topic_name):
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, 2)
    with Producer(bootstrap, audit_topic=None) as producer:
        producer.send_many(topic_name, [b"before"] * 100, partition=0)
    splits = plan_read(bootstrap, [topic_name], EARLIEST, LATEST, 10**6)
    assert [(s.partition, s.start, s.end) for s in splits] == [(0, 0, 100)], "an empty partition has no split"
    with Producer(bootstrap, audit_topic=None) as producer:
        producer.send_many(topic_name, [b"after"] * 50, partition=0)
    rows = _read(bootstrap, splits)
    assert [r["value"] for r in rows] == [b"before"] * 100


def test_columns_left_out_are_not_returned(bootstrap, filled):
    topic, expected = filled
    schema = arrow_schema(["producer", "offset"])
    rows = _read(bootstrap, [OffsetRange(topic, 1, 0, 1000)], schema=schema)
    assert rows == [{"producer": expected[1, o][4], "offset": o} for o in range(1000)]


def test_a_corrupt_batch_on_disk_fails_the_read_naming_where(broker, topic_name):
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(topic_name, 1)
    connection = BrokerConnection(parse_bootstrap(broker.bootstrap)[0])
    try:
        for i in range(3):
            batch = build_batch([b"record %d" % i] * 10, producer="p")
            connection.call(protocol.ProduceRequest(topic_name, 0, payload=batch))
    finally:
        connection.close()
    segment = broker.data_dir / f"{topic_name}-0" / "00000000000000000000.log"
    data = bytearray(segment.read_bytes())
    scan = scan_batches(bytes(data))
    position = scan.positions[1] + scan.sizes[1] - 3  # inside the second batch's records
    data[position] ^= 0xFF
    with open(segment, "r+b") as f:  # the broker serves the page cache: the next fetch sends these bytes
        f.seek(position)
        f.write(bytes([data[position]]))
    with pytest.raises(CorruptRecordError, match=f"{topic_name}-0 at offset 10.*CRC mismatch") as raised:
        _read(broker.bootstrap, [OffsetRange(topic_name, 0, 0, 30)])
    assert (raised.value.topic, raised.value.partition, raised.value.offset) == (topic_name, 0, 10)


def test_records_deleted_by_retention_are_data_loss_unless_allowed(bootstrap, topic_name):
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, 1, {"segment_bytes": 2048, "retention_bytes": 4096})
    with Producer(bootstrap, batch_bytes=1024, linger_ms=0, audit_topic=None) as producer:
        for i in range(200):
            producer.send(topic_name, b"record %03d " % i + b"x" * 40, partition=0)
            if i % 20 == 19:
                producer.flush()
    with Consumer(bootstrap) as consumer:
        tp = TopicPartition(topic_name, 0)
        log_start = wait_until(lambda: consumer.beginning_offsets([tp])[tp], timeout_s=10, what="retention")
    whole = OffsetRange(topic_name, 0, 0, 200)
    with pytest.raises(OffsetOutOfRangeError, match=f"offsets 0 up to {log_start} are no longer stored"):
        _read(bootstrap, [whole])
    rows = _read(bootstrap, [whole], ReadConfig(fail_on_data_loss=False))
    assert [r["offset"] for r in rows] == list(range(log_start, 200))


def test_a_missing_topic_cannot_be_planned(bootstrap):
    with pytest.raises(UnknownTopicOrPartitionError):
        plan_read(bootstrap, ["no-such-topic"], EARLIEST, LATEST, 10)


def test_ranges_split_evenly_and_cover_the_whole():
    whole = OffsetRange("t", 0, 10, 1010)
    pieces = split_range(whole, 300)
    assert [(p.start, p.end) for p in pieces] == [(10, 260), (260, 510), (510, 760), (760, 1010)]
    assert split_range(OffsetRange("t", 0, 5, 5), 3) == []
    assert split_range(whole, 10**9) == [whole]


def test_offset_and_time_options_are_parsed_or_refused_by_name():
    assert parse_offsets(None, "latest", "ending") == OffsetSpec("latest")
    assert parse_offsets('{"t": {"1": -2}}', "earliest", "starting").offsets == {"t": {1: -2}}
    with pytest.raises(ValueError, match="startingOffsets"):
        parse_offsets("soon", "earliest", "startingOffsets")
    with pytest.raises(ValueError, match="partitions are >= 0"):
        parse_offsets('{"t": {"0": -3}}', "earliest", "startingOffsets")
    assert parse_time_ms("2023-11-14T22:13:20") == 1_700_000_000_000
    assert parse_time_ms("2023-11-14T23:13:20+01:00") == parse_time_ms("1700000000000") == 1_700_000_000_000
    with pytest.raises(ValueError, match="--from"):
        parse_time_ms("yesterday", "--from")
