"""The monitoring event format (hpbroker.audit.events) and the producer's counts
(hpbroker.client.monitoring): pure logic, no broker."""

from __future__ import annotations

import struct

import doc_tables
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpbroker.audit.events import (
    VALUE_HEADER,
    MonitoringEvent,
    decode_event,
    encode_event,
    window_start,
)
from hpbroker.client._accumulator import RecordAccumulator
from hpbroker.client.monitoring import MonitoringCounts


def test_an_event_value_has_the_documented_layout():
    key, value = encode_event(MonitoringEvent("p1", "orders", 1_700_000_000_000, 10_000, 1234, 77, 5))
    assert key == b"orders"
    assert value == (bytes([1]) + (77).to_bytes(8, "little") + (5).to_bytes(8, "little")
                     + (1_700_000_000_000).to_bytes(8, "little") + (10_000).to_bytes(4, "little")
                     + (1234).to_bytes(8, "little") + (6).to_bytes(2, "little") + b"orders")
    assert VALUE_HEADER.size == 39


@given(producer=st.text(max_size=20), topic=st.text(min_size=1, max_size=40),
       window_ms=st.integers(1, 0xFFFFFFFF), window=st.integers(0, 10**6), count=st.integers(1, 2**62),
       instance=st.integers(0, 2**63 - 1), sequence=st.integers(0, 2**63 - 1))
def test_events_round_trip(producer, topic, window_ms, window, count, instance, sequence):
    event = MonitoringEvent(producer, topic, window * window_ms, window_ms, count, instance, sequence)
    _key, value = encode_event(event)
    assert decode_event(producer, value) == event


@pytest.mark.parametrize(("value", "message"), [
    (b"\x01" * 5, "at least 39 bytes"),
    (b"\x02" + bytes(38), "version 2"),
    (VALUE_HEADER.pack(1, 0, 0, 0, 10, 1, 5) + b"abc", "topic_length 5"),
    (VALUE_HEADER.pack(1, 0, 0, 0, 10, 1, 2) + b"\xff\xfe", "not UTF-8"),
    (VALUE_HEADER.pack(1, 0, 0, 5, 10, 1, 1) + b"t", "not a multiple"),
    (VALUE_HEADER.pack(1, 0, 0, 0, 10, 0, 1) + b"t", "at least 1"),
    (VALUE_HEADER.pack(1, 0, 0, 0, 0, 1, 1) + b"t", "window_ms"),
    (VALUE_HEADER.pack(1, 2**63, 0, 0, 10, 1, 1) + b"t", "instance"),
])
def test_a_bad_event_value_is_refused_with_the_reason(value, message):
    with pytest.raises(ValueError, match=message):
        decode_event("p", value)


def test_window_start_is_the_floor_of_the_timestamp():
    assert window_start(0, 10_000) == 0
    assert window_start(9_999, 10_000) == 0
    assert window_start(10_000, 10_000) == 10_000
    assert window_start(1_700_000_012_345, 10_000) == 1_700_000_010_000


def test_counts_are_taken_once_and_a_failed_event_is_published_again_unchanged():
    counts = MonitoringCounts("p", "_audit", 1000)
    i = counts.instance
    counts.add_records("a", 1500, 3)
    counts.add_records("a", 1999, 2)
    counts.add_records("b", 500, 1)
    counts.add_records("_audit", 500, 7)  # the audit topic itself is not counted
    events = counts.take()
    assert events == [MonitoringEvent("p", "b", 0, 1000, 1, i, 0),
                      MonitoringEvent("p", "a", 1000, 1000, 5, i, 1)]
    assert counts.take() == []
    counts.give_back(events[1])  # its outcome is unknown: the same event, never merged into a new one
    counts.add_records("a", 1000, 1)
    assert counts.take() == [events[1], MonitoringEvent("p", "a", 1000, 1000, 1, i, 2)]
    assert MonitoringCounts("p", "_audit", 1000).instance != i


class _OneTopic(RecordAccumulator):
    def _topic_partition_count(self, topic):
        return 1


@pytest.mark.parametrize("codec", [0, 1])
def test_the_accumulator_counts_each_batch_per_window_of_record_timestamps(codec):
    accumulator = _OneTopic("p", codec=codec, window_ms=1000)
    timestamps = [500, 999, 1000, 2500, 700, 2999, 5000, 1001]
    for ts in timestamps:
        accumulator.send("t", b"x" * 30, None, None, 1_700_000_000_000 + ts)
    [(_queue, batches)] = accumulator.drain(float("inf"), 1 << 30)[0]
    accumulator.build_payload(batches)
    [batch] = batches
    expected = {}
    for ts in timestamps:
        start = window_start(1_700_000_000_000 + ts, 1000)
        expected[start] = expected.get(start, 0) + 1
    assert dict(batch.window_counts) == expected
    assert sum(count for _start, count in batch.window_counts) == len(timestamps)


def test_a_batch_within_one_window_is_counted_from_its_header():
    accumulator = _OneTopic("p", window_ms=10_000)
    accumulator.send_many("t", [b"a"] * 1000, timestamp=1_700_000_001_000)
    [(_queue, batches)] = accumulator.drain(float("inf"), 1 << 30)[0]
    accumulator.build_payload(batches)
    assert batches[0].window_counts == [(1_700_000_000_000, 1000)]


def test_without_a_window_nothing_is_counted():
    accumulator = _OneTopic("p")
    accumulator.send("t", b"a")
    [(_queue, batches)] = accumulator.drain(float("inf"), 1 << 30)[0]
    accumulator.build_payload(batches)
    assert batches[0].window_counts is None


class _SilentBroker:
    """The bootstrap broker as the metadata cache asks it: every request times out, counted (pure
    logic of the publisher)."""

    def __init__(self) -> None:
        self.calls = 0

    def request(self, topics, timeout_s):  # as the producer's metadata cache asks its broker
        from hpbroker.errors import RequestTimedOutError

        self.calls += 1
        assert timeout_s <= 1.0, "the I/O thread must not wait long for the audit topic"
        raise RequestTimedOutError("no answer")


def test_a_broker_that_does_not_answer_costs_one_lookup_per_backoff_and_keeps_the_counts():
    from hpbroker.client.monitoring import MonitoringPublisher

    counts = MonitoringCounts("p", "_audit", 1000)
    counts.add_records("a", 1500, 3)
    publisher = MonitoringPublisher(counts)
    broker = _SilentBroker()
    assert publisher.publish(None, broker, None) == 0
    assert publisher.publish(None, broker, None) == 0  # backing off: no second wait
    assert broker.calls == 1
    [event] = counts.take()
    assert (event.topic, event.record_count) == ("a", 3)


def test_an_unexpected_error_while_publishing_keeps_the_events_and_the_thread():
    from hpbroker.client.monitoring import MonitoringPublisher

    class _Producer:
        def __init__(self):
            self.sent = 0

        def send_internal(self, *args):
            self.sent += 1
            if self.sent == 2:
                raise ValueError("boom")

    counts = MonitoringCounts("p", "_audit", 1000)
    for topic in ("a", "b", "c"):
        counts.add_records(topic, 1500, 1)
    publisher = MonitoringPublisher(counts)
    publisher._partitions = 1  # the audit topic is known
    assert publisher.publish(_Producer(), None, None) == 1
    assert [e.topic for e in counts.take()] == ["b", "c"]


def test_the_close_publishes_even_while_the_lookup_backs_off():
    from hpbroker.client.monitoring import MonitoringPublisher

    class _Producer:
        sent = 0

        def send_internal(self, *args):
            self.sent += 1

    counts = MonitoringCounts("p", "_audit", 1000)
    counts.add_records("a", 1500, 3)
    publisher = MonitoringPublisher(counts)
    publisher._partitions = 1
    publisher._retry_at_s = float("inf")  # a failed lookup a moment ago
    producer = _Producer()
    assert publisher.publish(producer, None, None) == 0
    assert publisher.publish(producer, None, None, last=True) == 1 and producer.sent == 1


def test_the_documents_event_table_is_the_encoders_layout():
    rows = doc_tables.table_rows("AUDIT.md", "## Monitoring events", "position")
    fixed = [(int(row[0]), int(row[1]), row[3]) for row in rows if row[1].isdigit()]
    codes = {"u8": "B", "u16": "H", "u32": "I", "u64": "Q", "i64": "q"}
    assert "<" + "".join(codes[kind] for _, _, kind in fixed) == VALUE_HEADER.format
    assert [position for position, _, _ in fixed] == [struct.calcsize(VALUE_HEADER.format[:1 + i])
                                                      for i in range(len(fixed))]
