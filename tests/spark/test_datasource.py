"""``spark.read.format("hpbroker")`` in a real local Spark session against a real broker."""

from __future__ import annotations

import json

import pytest
from topic_data import BASE_MS, as_tuples, fill_topic, reference

from hpbroker.client import Admin, Consumer, Producer, TopicPartition
from hpbroker.spark.planning import OffsetSpec, plan_read

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def filled(bootstrap):
    fill_topic(bootstrap, "filled", records=2000)
    return "filled", reference(bootstrap, "filled")


def _reader(spark, bootstrap, topic, **options):
    reader = spark.read.format("hpbroker").option("bootstrap", bootstrap).option("topic", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader


def _collect(df):
    from pyspark.sql import functions as F

    if "timestamp" in df.columns:
        df = df.withColumn("timestamp", F.unix_millis("timestamp"))
    return [row.asDict(recursive=True) for row in df.collect()]


def test_a_split_read_of_every_partition_returns_exactly_the_stored_records(spark, bootstrap, filled):
    topic, expected = filled
    df = _reader(spark, bootstrap, topic, maxRecordsPerSplit=300, fetchMaxBytes=4096,
                 recordsPerBatch=100).load()
    assert df.schema.simpleString() == ("struct<topic:string,partition:int,offset:bigint,timestamp:timestamp,"
                                        "producer:string,key:binary,value:binary,"
                                        "headers:array<struct<key:string,value:binary>>>")
    rows = _collect(df)
    assert len(rows) == 2000 and as_tuples(rows) == expected
    assert df.rdd.getNumPartitions() == 3 * 3, "667 offsets a partition, at most 300 a split"


def test_offsets_timestamps_and_columns_pick_what_is_read(spark, bootstrap, filled):
    topic, expected = filled
    starting = json.dumps({topic: {"0": 17, "1": -1}})
    ending = json.dumps({topic: {"0": 123, "2": 50}})
    rows = _collect(_reader(spark, bootstrap, topic, startingOffsets=starting, endingOffsets=ending).load())
    assert as_tuples(rows) == {k: v for k, v in expected.items()
                               if (k[0] == 0 and 17 <= k[1] < 123) or (k[0] == 2 and k[1] < 50)}

    start_ms, end_ms = BASE_MS + 5_000, BASE_MS + 12_000
    with Consumer(bootstrap) as consumer:
        tps = [TopicPartition(topic, p) for p in range(3)]
        starts, ends = (consumer.offsets_for_times(dict.fromkeys(tps, ms)) for ms in (start_ms, end_ms))
    iso = "2023-11-14T22:13:25+00:00"  # BASE_MS + 5 s
    timed = _reader(spark, bootstrap, topic, startingTimestamp=iso, endingTimestamp=str(end_ms),
                    columns="partition,offset").load()
    assert timed.columns == ["partition", "offset"]
    assert sorted((r["partition"], r["offset"]) for r in _collect(timed)) == [
        (p, o) for p, tp in enumerate(tps) for o in range(starts[tp], ends[tp])]

    chosen = _reader(spark, bootstrap, topic).schema("producer string, offset bigint").load()
    producers = {(r["offset"], r["producer"]) for r in _collect(chosen.where("offset < 5"))}
    assert producers == {(o, v[4]) for (p, o), v in expected.items() if o < 5}


def test_the_offsets_are_fixed_when_the_read_is_planned(spark, bootstrap, topic_name):
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, 2)
    with Producer(bootstrap, audit_topic=None) as producer:
        producer.send_many(topic_name, [b"first"] * 40, partition=1)
    df = _reader(spark, bootstrap, topic_name).load()
    assert df.count() == 40
    with Producer(bootstrap, audit_topic=None) as producer:
        producer.send_many(topic_name, [b"later"] * 25, partition=0)
    assert df.count() == 40 and df.where("value = 'later'").count() == 0, "the same snapshot"
    assert _reader(spark, bootstrap, topic_name).load().count() == 65, "a new load, a new snapshot"


def test_an_empty_topic_reads_as_no_rows(spark, bootstrap, topic_name):
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, 3)
    assert _reader(spark, bootstrap, topic_name).load().count() == 0
    assert plan_read(bootstrap, [topic_name], OffsetSpec("earliest"), OffsetSpec("latest"), 10) == []


def test_bad_options_and_broken_data_fail_clearly(spark, broker, topic_name):
    with pytest.raises(Exception, match="option topic is required"):
        spark.read.format("hpbroker").option("bootstrap", broker.bootstrap).load()
    with pytest.raises(Exception, match="startingOffsets and startingTimestamp exclude each other"):
        _reader(spark, broker.bootstrap, "x", startingOffsets="earliest", startingTimestamp="0").load()
    with pytest.raises(Exception, match="the hpbroker source returns"):
        _reader(spark, broker.bootstrap, "x").schema("value string").load().collect()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(topic_name, 1)
    with Producer(broker.bootstrap, audit_topic=None, linger_ms=0) as producer:
        for i in range(3):
            producer.send_many(topic_name, [b"record %d" % i] * 10, partition=0)
            producer.flush()
    segment = broker.data_dir / f"{topic_name}-0" / "00000000000000000000.log"
    with open(segment, "r+b") as f:
        f.seek(-5, 2)
        last = f.read(1)
        f.seek(-5, 2)
        f.write(bytes([last[0] ^ 0xFF]))
    with pytest.raises(Exception, match=f"(?s)CorruptRecordError.*{topic_name}-0 at offset 20.*CRC mismatch"):
        _reader(spark, broker.bootstrap, topic_name).load().collect()
