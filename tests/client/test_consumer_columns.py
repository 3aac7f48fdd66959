"""A consumer made with ``columns=``: the same records as record objects, as numpy columns."""

from __future__ import annotations

import time

import numpy as np
import pytest

from hpbroker import Consumer, RecordColumns, TopicPartition, create_message_streams, protocol
from hpbroker.client.columns import COLUMNS, BinaryColumn, check_columns
from hpbroker.client.connection import BrokerConnection
from hpbroker.errors import InvalidConfigError
from hpbroker.records import CODEC_LZ4, build_batch

FAST = {"fetch_max_wait_ms": 200, "auto_offset_reset": "earliest"}


def _produce(connection: BrokerConnection, topic: str, partition: int, values: list, **batch) -> None:
    connection.call(protocol.ProduceRequest(topic, partition, payload=build_batch(values, **batch)))


def _fill(connection: BrokerConnection, topic: str) -> int:
    """Two partitions of varied batches: keys, nulls, headers, lz4, two producers.  Records in all."""
    connection.call(protocol.CreateTopicRequest(topic, 2))
    _produce(connection, topic, 0, [b"a", None, b""], keys=[b"k1", None, b"k3"], producer="alpha",
             timestamps=[1_000, 1_001, 1_002])
    _produce(connection, topic, 0, [b"log line %d" % i for i in range(50)], compression=CODEC_LZ4,
             producer="beta")
    _produce(connection, topic, 1, [b"x", b"y"], headers=[[("h", b"1"), ("n", None)], []], producer="")
    _produce(connection, topic, 1, [b"z" * 3000], producer="\u00e9t\u00e9")
    return 3 + 50 + 2 + 1


def _poll_all(consumer: Consumer, count: int, timeout_s: float = 10.0) -> dict:
    """Everything by partition: lists of records, or lists of RecordColumns."""
    out: dict = {}
    got = 0
    deadline = time.monotonic() + timeout_s
    while got < count:
        assert time.monotonic() < deadline, f"got {got} of {count} records"
        for tp, part in consumer.poll(timeout_ms=500).items():
            out.setdefault(tp, []).append(part)
            got += len(part)
    return out


def test_columns_hold_exactly_what_record_objects_hold(connection, bootstrap, topic_name):
    count = _fill(connection, topic_name)
    tps = [TopicPartition(topic_name, p) for p in range(2)]
    with Consumer(bootstrap, **FAST) as consumer:
        consumer.assign(tps)
        polled = _poll_all(consumer, count)
        expected = {tp: [r for chunk in chunks for r in chunk] for tp, chunks in polled.items()}
    with Consumer(bootstrap, columns=COLUMNS, **FAST) as consumer:
        consumer.assign(tps)
        got = _poll_all(consumer, count)
        for tp in tps:
            assert consumer.position(tp) == expected[tp][-1].offset + 1
    for tp in tps:
        records = expected[tp]
        parts = got[tp]
        assert all(isinstance(part, RecordColumns) and (part.topic, part.partition) == tp for part in parts)
        assert np.concatenate([part.offsets for part in parts]).tolist() == [r.offset for r in records]
        assert np.concatenate([part.timestamps for part in parts]).tolist() == [r.timestamp for r in records]
        assert sum((part.producers.to_list() for part in parts), []) == [r.producer for r in records]
        assert sum((part.keys.to_list() for part in parts), []) == [r.key for r in records]
        assert sum((part.values.to_list() for part in parts), []) == [r.value for r in records]
        assert sum((part.headers.to_list() for part in parts), []) == [r.headers for r in records]


def test_only_the_columns_asked_for_are_decoded_and_a_seek_into_a_batch_starts_there(connection, bootstrap,
                                                                                    topic_name):
    connection.call(protocol.CreateTopicRequest(topic_name, 1))
    _produce(connection, topic_name, 0, [b"v%d" % i for i in range(10)])
    _produce(connection, topic_name, 0, [b"w%d" % i for i in range(5)])
    tp = TopicPartition(topic_name, 0)
    with Consumer(bootstrap, columns=("value",), **FAST) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 7)
        parts = _poll_all(consumer, 8)[tp]
        assert consumer.position(tp) == 15
    assert all(p.timestamps is None and p.keys is None and p.producers is None and p.headers is None
               for p in parts)
    with pytest.raises(ValueError, match="read-only"):
        parts[0].offsets[0] = 99
    with pytest.raises(ValueError, match="read-only"):
        parts[0].values.data[0] = 0
    assert np.concatenate([p.offsets for p in parts]).tolist() == list(range(7, 15))
    assert sum((p.values.to_list() for p in parts), []) == [b"v7", b"v8", b"v9", *(b"w%d" % i
                                                                                  for i in range(5))]
    assert parts[-1].next_offset == 15


def test_a_columnar_consumer_refuses_iteration_and_bad_column_names(bootstrap):
    with Consumer(bootstrap, columns=["value", "timestamp"]) as consumer:
        assert consumer.config.columns == ("offset", "timestamp", "value"), "schema order, offset always"
        with pytest.raises(TypeError, match="read it with poll"):
            iter(consumer)
    with pytest.raises(InvalidConfigError, match=r"unknown columns \['size'\]"):
        Consumer(bootstrap, columns=("value", "size"))
    with pytest.raises(InvalidConfigError, match="not the string 'value'"):
        Consumer(bootstrap, columns="value")
    with pytest.raises(InvalidConfigError, match="columns is empty"):
        Consumer(bootstrap, columns=())
    with pytest.raises(InvalidConfigError, match="message streams are iterated record by record"):
        create_message_streams(bootstrap, "any", 2, columns=("value",))


def test_check_columns_orders_by_schema_and_adds_the_offset():
    assert check_columns(["headers", "key"]) == ("offset", "key", "headers")
    assert check_columns(COLUMNS) == COLUMNS


def test_a_binary_column_reads_items_nulls_and_lengths():
    # three items: b"ab", null, b"" (Arrow layout: offsets 0,2,2,2; validity bits 1,0,1)
    column = BinaryColumn(bytearray(np.array([0, 2, 2, 2], dtype="<i4").tobytes()), bytearray(b"ab"),
                          bytearray([0b101]), 1)
    assert len(column) == 3
    assert column.to_list() == [b"ab", None, b""]
    assert column[-3] == b"ab" and column[-2] is None
    assert column.lengths.tolist() == [2, 0, 0]
    assert column.valid.tolist() == [True, False, True]
    with pytest.raises(IndexError):
        column[3]
    name = "\u00e9t\u00e9".encode()
    offsets = bytearray(np.array([0, len(name)], dtype="<i4").tobytes())
    text = BinaryColumn(offsets, bytearray(name), text=True)
    assert text.to_list() == ["\u00e9t\u00e9"] and text.valid.tolist() == [True]
