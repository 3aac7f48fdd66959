"""The fetcher's decoding in the compiled core, and the fetcher against a real broker's data port."""

from __future__ import annotations

import pickle
import select
import socket
import struct
import threading
import time

import pytest

from hpbroker import protocol
from hpbroker.client import columns as columns_module
from hpbroker.client.columns import COLUMNS, RecordColumns
from hpbroker.client.connection import BrokerAddress, BrokerConnection
from hpbroker.client.fetcher import FETCH_VERSION, FetchConfig, ListedOffset, PartitionFetcher
from hpbroker.client.metadata import ClusterMetadata
from hpbroker.errors import (
    CorruptRecordError,
    InvalidConfigError,
    InvalidRequestError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)
from hpbroker.records import build_batch, crc32c, decode_records


def _stamped(batch: bytes, base_offset: int) -> bytes:
    return base_offset.to_bytes(8, "little") + batch[8:]


def test_decoded_records_carry_topic_and_partition():
    batch = _stamped(build_batch([b"a", b"b"], keys=[b"k", None], timestamps=7, producer="p"), 40)
    first, second = decode_records(batch, topic="orders", partition=3)
    assert (first.topic, first.partition, first.offset) == ("orders", 3, 40)
    assert (first.key, first.value) == (b"k", b"a")
    assert (second.topic, second.partition, second.offset, second.producer) == ("orders", 3, 41, "p")
    assert "topic='orders', partition=3, offset=40" in repr(first)


def test_records_decoded_without_a_topic_say_so():
    (record,) = decode_records(build_batch([b"v"]))
    assert record.topic is None and record.partition == -1
    assert "topic" not in repr(record)


def test_min_offset_leaves_out_the_records_before_it_across_batches():
    buf = _stamped(build_batch([b"0", b"1", b"2"]), 10) + _stamped(build_batch([b"3", b"4"]), 13)
    assert [r.offset for r in decode_records(buf, min_offset=11)] == [11, 12, 13, 14]
    assert [r.offset for r in decode_records(buf, min_offset=13)] == [13, 14]
    assert decode_records(buf, min_offset=15) == []
    assert [r.value for r in decode_records(buf)] == [b"0", b"1", b"2", b"3", b"4"]


def test_records_left_out_by_min_offset_are_still_checked():
    batch = bytearray(_stamped(build_batch([b"skipped", b"kept"]), 0))
    batch[batch.index(b"skipped")] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        decode_records(bytes(batch), min_offset=1)


def test_records_with_topic_pickle_and_compare_by_where_they_came_from():
    batch = build_batch([b"v"], timestamps=5)
    (tagged,) = decode_records(batch, topic="t", partition=1)
    (other,) = decode_records(batch, topic="t", partition=2)
    assert pickle.loads(pickle.dumps(tagged)) == tagged
    assert pickle.loads(pickle.dumps(tagged)).partition == 1
    assert tagged != other


# --- against a real broker's data port ----------------------------------------------------------


@pytest.fixture
def partition_0(broker, topic_name):
    """``(connection, fetcher config kwargs, PartitionInfo)`` of a fresh one-partition topic."""
    _process, port = broker
    connection = BrokerConnection(BrokerAddress("127.0.0.1", port))
    connection.call(protocol.CreateTopicRequest(topic_name, 1))
    info = ClusterMetadata(connection).partition(topic_name, 0)
    yield connection, info
    connection.close()


def _produce(connection: BrokerConnection, topic: str, values: list[bytes]) -> None:
    connection.call(protocol.ProduceRequest(topic, 0, payload=build_batch(values)))


def _receive(fetcher: PartitionFetcher, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        select.select([fetcher], [], [], 0.1)
        completed = fetcher.receive()
        if completed is not None:
            return completed
    raise AssertionError(f"no fetch response in {timeout_s} s")


def test_the_next_fetch_is_in_flight_before_the_records_are_handed_over(partition_0, topic_name):
    connection, info = partition_0
    _produce(connection, topic_name, [b"a", b"b", b"c"])
    _produce(connection, topic_name, [b"d"])
    fetcher = PartitionFetcher(topic_name, 0, info.host, info.fetch_port, FetchConfig(fetch_max_wait_ms=100))
    try:
        fetcher.fetch(1)
        completed = _receive(fetcher)
        assert [(r.offset, r.value) for r in completed.records] == [(1, b"b"), (2, b"c"), (3, b"d")]
        assert (completed.fetch_offset, completed.next_offset, completed.high_watermark) == (1, 4, 4)
        assert completed.error is None
        assert fetcher.in_flight and fetcher.fetch_offset == 4, "pipelining: the next fetch already left"
        _produce(connection, topic_name, [b"e"])
        assert [r.value for r in _receive(fetcher).records] == [b"e"]
    finally:
        fetcher.close()


def test_a_raw_fetcher_hands_out_the_checked_batches_undecoded(partition_0, topic_name):
    connection, info = partition_0
    batches = [build_batch([b"a", b"b", b"c"], producer="p"), build_batch([b"d"], producer="p")]
    for batch in batches:
        connection.call(protocol.ProduceRequest(topic_name, 0, payload=batch))
    fetcher = PartitionFetcher(topic_name, 0, info.host, info.fetch_port, FetchConfig(fetch_max_wait_ms=100),
                               raw=True)
    try:
        fetcher.fetch(1)
        completed = _receive(fetcher)
        assert completed.records == [] and completed.error is None
        assert bytes(completed.payload) == batches[0] + _stamped(batches[1], 3), "from the batch holding 1"
        assert (completed.next_offset, fetcher.fetch_offset) == (4, 4), "pipelining as ever"
    finally:
        fetcher.close()


def test_a_first_batch_larger_than_max_bytes_comes_whole_into_a_grown_buffer(partition_0, topic_name):
    connection, info = partition_0
    big = [bytes([i]) * 1000 for i in range(200)]  # one batch of ~200 kB
    _produce(connection, topic_name, big)
    fetcher = PartitionFetcher(topic_name, 0, info.host, info.fetch_port,
                               FetchConfig(max_partition_fetch_bytes=1000, fetch_max_wait_ms=100))
    try:
        fetcher.fetch(0)
        assert [r.value for r in _receive(fetcher).records] == big
    finally:
        fetcher.close()


def test_an_offset_past_the_end_is_reported_with_the_logs_bounds(partition_0, topic_name):
    connection, info = partition_0
    _produce(connection, topic_name, [b"a", b"b"])
    fetcher = PartitionFetcher(topic_name, 0, info.host, info.fetch_port, FetchConfig())
    try:
        fetcher.fetch(7)
        completed = _receive(fetcher)
        assert isinstance(completed.error, OffsetOutOfRangeError)
        assert (completed.error.log_start_offset, completed.error.log_end_offset) == (0, 2)
        assert f"{topic_name}-0 from offset 7" in str(completed.error)
        assert completed.records == [] and not fetcher.in_flight, "no next fetch after an error"
    finally:
        fetcher.close()


def test_a_fetch_for_a_partition_another_port_serves_is_refused(partition_0, topic_name, broker):
    connection, info = partition_0
    other_port = next(p for p in (broker[1] + 1, broker[1] + 2) if p != info.fetch_port)
    fetcher = PartitionFetcher(topic_name, 0, info.host, other_port, FetchConfig())
    try:
        fetcher.fetch(0)
        assert isinstance(_receive(fetcher).error, UnknownTopicOrPartitionError)
    finally:
        fetcher.close()


def test_offsets_are_listed_over_the_data_port_and_the_same_connection_then_fetches(partition_0, topic_name):
    connection, info = partition_0
    _produce(connection, topic_name, [b"a", b"b", b"c"])
    fetcher = PartitionFetcher(topic_name, 0, info.host, info.fetch_port, FetchConfig(fetch_max_wait_ms=100))
    try:
        fetcher.list_offsets(protocol.LATEST_TIMESTAMP)
        assert fetcher.in_flight and "ListOffsets of" in fetcher.waiting_for()
        assert _receive(fetcher) == ListedOffset(protocol.LATEST_TIMESTAMP, 3)
        assert not fetcher.in_flight
        fetcher.list_offsets(protocol.EARLIEST_TIMESTAMP)
        assert _receive(fetcher) == ListedOffset(protocol.EARLIEST_TIMESTAMP, 0)
        fetcher.fetch(1)
        assert [r.value for r in _receive(fetcher).records] == [b"b", b"c"]
    finally:
        fetcher.close()


def test_offsets_listed_at_a_port_that_does_not_serve_the_partition_are_an_error(partition_0, topic_name,
                                                                                 broker):
    _connection, info = partition_0
    other_port = next(p for p in (broker[1] + 1, broker[1] + 2) if p != info.fetch_port)
    fetcher = PartitionFetcher(topic_name, 0, info.host, other_port, FetchConfig())
    try:
        fetcher.list_offsets(protocol.EARLIEST_TIMESTAMP)
        listed = _receive(fetcher)
        assert listed.offset == -1 and isinstance(listed.error, UnknownTopicOrPartitionError)
        assert f"{topic_name}-0 for timestamp -2 at 127.0.0.1:{other_port}" in str(listed.error)
    finally:
        fetcher.close()


# --- against a peer that misbehaves ----------------------------------------------------------------


def _peer_sending(payload: bytes, *, then_close: bool = False) -> tuple[socket.socket, threading.Thread]:
    """A TCP server that answers its first connection's first bytes with ``payload``, then
    closes it (``then_close``) or waits for the client to."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        connection, _ = server.accept()
        with connection:
            connection.recv(4096)
            connection.sendall(payload)
            if not then_close:
                connection.recv(4096)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread


def _offsets_and_values(records) -> list[tuple[int, bytes | None]]:
    """What a fetcher decoded, record objects or columns alike."""
    if isinstance(records, RecordColumns):
        return list(zip(records.offsets.tolist(), records.values.to_list(), strict=True))
    return [(r.offset, r.value) for r in records]


def _fetch_response(payload: bytes, correlation_id: int = 1) -> bytes:
    frames = protocol.encode_response(protocol.FetchResponse(high_watermark=99, log_start_offset=0,
                                                             payload=payload), correlation_id,
                                      version=FETCH_VERSION)  # the version the fetcher asks in
    return b"".join(bytes(f) for f in protocol.frame_tcp(frames))


@pytest.mark.parametrize("columns", [None, COLUMNS], ids=["records", "columns"])
def test_a_corrupt_batch_ends_the_response_after_the_good_ones(columns):
    good = _stamped(build_batch([b"a", b"b"]), 5)
    bad = bytearray(_stamped(build_batch([b"c"]), 7))
    bad[-2] ^= 0x01
    server, thread = _peer_sending(_fetch_response(good + bytes(bad)))
    fetcher = PartitionFetcher("t", 3, "127.0.0.1", server.getsockname()[1], FetchConfig(), columns=columns)
    try:
        fetcher.fetch(6)
        completed = _receive(fetcher)
        assert _offsets_and_values(completed.records) == [(6, b"b")]
        assert isinstance(completed.error, CorruptRecordError) and not fetcher.in_flight
        assert (completed.error.topic, completed.error.partition, completed.error.offset) == ("t", 3, 7)
        assert f"t-3 at offset 7 (byte {len(good)} of a fetch response" in str(completed.error)
        assert "CRC mismatch" in str(completed.error)
    finally:
        fetcher.close()
        server.close()
        thread.join(5)


def _undecodable(values: list[bytes], base_offset: int) -> bytes:
    """A batch that passes framing and CRC but whose header claims one record more than it holds."""
    batch = bytearray(_stamped(build_batch(values, timestamps=1_000), base_offset))
    struct.pack_into("<ii", batch, 24, len(values), len(values) + 1)  # last_offset_delta, record_count
    struct.pack_into("<I", batch, 16, crc32c(bytes(batch[20:])))
    return bytes(batch)


@pytest.mark.parametrize("columns", [None, COLUMNS], ids=["records", "columns"])
def test_a_batch_whose_crc_holds_but_whose_records_do_not_decode_ends_the_response(columns):
    good = _stamped(build_batch([b"a", b"b"]), 5) + _stamped(build_batch([b"c"]), 7)
    server, thread = _peer_sending(_fetch_response(good + _undecodable([b"d"], 8)))
    fetcher = PartitionFetcher("t", 3, "127.0.0.1", server.getsockname()[1], FetchConfig(), columns=columns)
    try:
        fetcher.fetch(6)
        completed = _receive(fetcher)
        assert _offsets_and_values(completed.records) == [(6, b"b"), (7, b"c")]
        assert isinstance(completed.error, CorruptRecordError) and completed.next_offset == 8
        assert (completed.error.topic, completed.error.partition, completed.error.offset) == ("t", 3, 8)
        assert f"t-3 at offset 8 (byte {len(good)} of a fetch response" in str(completed.error)
        assert not fetcher.in_flight, "the fetch sent past the bad batch is dropped"
    finally:
        fetcher.close()
        server.close()
        thread.join(5)


def test_a_columnar_fetcher_stopped_by_the_decoders_bound_refetches_from_where_it_stopped(monkeypatch):
    monkeypatch.setattr(columns_module, "_BUILDER_MAX_RECORDS", 2)  # full after the first batch
    batches = (_stamped(build_batch([b"a", b"b"]), 0) + _stamped(build_batch([b"c"]), 2)
               + _stamped(build_batch([b"d"]), 3))
    server, thread = _peer_sending(_fetch_response(batches))
    fetcher = PartitionFetcher("t", 0, "127.0.0.1", server.getsockname()[1], FetchConfig(),
                               columns=("value",))
    try:
        fetcher.fetch(0)
        completed = _receive(fetcher)
        assert _offsets_and_values(completed.records) == [(0, b"a"), (1, b"b")]
        assert completed.error is None and completed.next_offset == 2
        assert not fetcher.in_flight, "the fetch sent from offset 4 is dropped: 2 and 3 were not handed out"
    finally:
        fetcher.close()
        server.close()
        thread.join(5)


def test_batches_that_do_not_hold_the_offset_asked_for_are_refused():
    server, thread = _peer_sending(_fetch_response(_stamped(build_batch([b"a"]), 40)))
    fetcher = PartitionFetcher("t", 0, "127.0.0.1", server.getsockname()[1], FetchConfig())
    try:
        fetcher.fetch(10)
        completed = _receive(fetcher)
        assert completed.records == [] and isinstance(completed.error, CorruptRecordError)
        assert "holds offsets 40..40, not the offset asked for" in str(completed.error)
    finally:
        fetcher.close()
        server.close()
        thread.join(5)


def test_a_stream_that_makes_no_sense_or_ends_early_disconnects():
    server, thread = _peer_sending(bytes(8))  # head_length 0
    fetcher = PartitionFetcher("t", 0, "127.0.0.1", server.getsockname()[1], FetchConfig())
    try:
        fetcher.fetch(0)
        with pytest.raises(InvalidRequestError, match="head must be non-empty"):
            _receive(fetcher)
        assert not fetcher.in_flight
    finally:
        fetcher.close()
        server.close()
        thread.join(5)
    server, thread = _peer_sending(_fetch_response(b"")[:10], then_close=True)
    fetcher = PartitionFetcher("t", 0, "127.0.0.1", server.getsockname()[1], FetchConfig())
    try:
        fetcher.fetch(0)
        with pytest.raises(ConnectionError, match=r"closed the connection with a fetch of t-0 from offset 0 "
                                                  r"unanswered \(10 bytes of its response received\)"):
            _receive(fetcher)
        assert not fetcher.in_flight
    finally:
        fetcher.close()
        server.close()
        thread.join(5)


def test_a_fetch_nobody_answers_becomes_overdue():
    silent = socket.create_server(("127.0.0.1", 0))
    fetcher = PartitionFetcher("t", 0, "127.0.0.1", silent.getsockname()[1],
                               FetchConfig(fetch_max_wait_ms=10, request_timeout_ms=50))
    try:
        fetcher.fetch(0)
        assert fetcher.in_flight and not fetcher.overdue(time.monotonic())
        assert fetcher.receive() is None
        assert fetcher.overdue(fetcher.deadline() + 0.001)
        fetcher.disconnect()
        assert not fetcher.in_flight
    finally:
        fetcher.close()
        silent.close()


def test_fetch_settings_are_checked_by_name():
    with pytest.raises(InvalidConfigError, match="fetch_min_bytes"):
        FetchConfig(fetch_min_bytes=-1)
    with pytest.raises(InvalidConfigError, match="max_partition_fetch_bytes"):
        FetchConfig(max_partition_fetch_bytes=True)
