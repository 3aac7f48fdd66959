"""The producer against a real broker: delivery, order, partitioning, compression, reports, bad input.

Records are read back with plain FetchRequests over a BrokerConnection, never through the
producer, so what is checked is what the broker stored.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import wait

import numpy as np
import pytest

from hpbroker import protocol
from hpbroker.client.connection import BrokerConnection
from hpbroker.client.partitioner import partition_for_key
from hpbroker.client.producer import Producer, ProducerClosedError, ProducerConfig, RecordMetadata
from hpbroker.errors import RecordTooLargeError, UnknownTopicOrPartitionError
from hpbroker.records import CODEC_LZ4, CODEC_NONE, decode_records, read_header, scan_batches


def create_topic(connection: BrokerConnection, name: str, partitions: int, **configs: object) -> str:
    entries = [protocol.TopicConfigEntry(key, str(value)) for key, value in configs.items()]
    connection.call(protocol.CreateTopicRequest(name, partitions, entries))
    return name


def fetch_all(connection: BrokerConnection, topic: str, partition: int) -> tuple[list, list[bytes]]:
    """Every flushed record of the partition, and the raw payloads they came in."""
    records, payloads, offset = [], [], 0
    while True:
        response = connection.call(protocol.FetchRequest(topic, partition, offset, max_bytes=4 << 20,
                                                         max_wait_ms=0))
        payload = bytes(response.payload)
        if not payload:
            return records, payloads
        payloads.append(payload)
        records += [r for r in decode_records(payload) if r.offset >= offset]
        offset = records[-1].offset + 1
        if offset >= response.high_watermark:
            return records, payloads


def read_partition(connection: BrokerConnection, topic: str, partition: int) -> list:
    return fetch_all(connection, topic, partition)[0]


def test_futures_report_the_partition_and_offset_where_records_are(bootstrap, connection, topic_name):
    create_topic(connection, topic_name, 3)
    with Producer(bootstrap, linger_ms=1) as producer:
        futures = [producer.send_future(topic_name, b"v%d" % i, partition=i % 3) for i in range(30)]
        results = [f.result(10) for f in futures]
    assert all(isinstance(r, RecordMetadata) and r.topic == topic_name for r in results)
    assert [r.partition for r in results] == [i % 3 for i in range(30)]
    for partition in range(3):
        stored = {r.offset: r.value for r in read_partition(connection, topic_name, partition)}
        mine = [(r.offset, b"v%d" % i) for i, r in enumerate(results) if r.partition == partition]
        assert [offset for offset, _ in mine] == list(range(10))
        assert all(stored[offset] == value for offset, value in mine)


def test_records_of_each_partition_are_stored_in_send_order(bootstrap, connection, topic_name):
    """Small batches and short linger: many batches and requests per partition, in flight together
    over partitions, and every record once, in order."""
    create_topic(connection, topic_name, 3)
    count = 20_000
    with Producer(bootstrap, batch_bytes=4096, linger_ms=1, max_request_bytes=16384) as producer:
        for i in range(count):
            producer.send(topic_name, b"%08d" % i, key=b"k%d" % (i % 7))
    seen = []
    for partition in range(3):
        values = [r.value for r in read_partition(connection, topic_name, partition)]
        assert values == sorted(values), f"partition {partition} out of order"
        seen += values
    assert sorted(seen) == [b"%08d" % i for i in range(count)]


def test_a_key_always_goes_to_the_partition_of_its_crc32c(bootstrap, connection, topic_name):
    create_topic(connection, topic_name, 5)
    keys = [b"user-%d" % i for i in range(40)] + [b"", b"123456789"]
    with Producer(bootstrap) as producer:
        first = [producer.send_future(topic_name, b"a", key=k) for k in keys]
        again = [producer.send_future(topic_name, b"b", key=bytearray(k)) for k in keys]
        placed = [f.result(10).partition for f in first]
    assert placed == [f.result(10).partition for f in again]
    assert placed == [partition_for_key(k, 5) for k in keys]
    assert placed[-2:] == [0, 3808858755 % 5]  # b"" has CRC 0; b"123456789" has CRC 0xE3069283
    for partition in range(5):
        for record in read_partition(connection, topic_name, partition):
            assert partition_for_key(record.key, 5) == partition


def test_keyless_records_are_spread_over_every_partition(bootstrap, connection, topic_name):
    create_topic(connection, topic_name, 4)
    with Producer(bootstrap, batch_bytes=2048, linger_ms=1) as producer:  # sticky: a partition per batch
        for i in range(4000):
            producer.send(topic_name, b"%06d" % i)
    counts = [len(read_partition(connection, topic_name, p)) for p in range(4)]
    assert sum(counts) == 4000
    assert min(counts) > 500, counts


def test_round_robin_sends_keyless_records_to_each_partition_in_turn(bootstrap, connection, topic_name):
    create_topic(connection, topic_name, 3)
    with Producer(bootstrap, partitioner="round_robin") as producer:
        placed = [producer.send_future(topic_name, b"x").result(10).partition for _ in range(6)]
    assert placed in ([0, 1, 2, 0, 1, 2], [1, 2, 0, 1, 2, 0], [2, 0, 1, 2, 0, 1])


def test_a_custom_partitioner_decides_and_an_explicit_partition_wins(bootstrap, connection, topic_name):
    create_topic(connection, topic_name, 3)
    calls = []

    def last(topic, key, count):
        calls.append((topic, key, count))
        return count - 1

    with Producer(bootstrap, partitioner=last) as producer:
        chosen = producer.send_future(topic_name, b"x", key=b"k").result(10)
        explicit = producer.send_future(topic_name, b"y", key=b"k", partition=0).result(10)
    assert (chosen.partition, explicit.partition) == (2, 0)
    assert calls == [(topic_name, b"k", 3)]


@pytest.mark.parametrize("compression", [None, "lz4"])
def test_records_round_trip_with_and_without_compression(bootstrap, connection, topic_name, compression):
    create_topic(connection, topic_name, 1)
    values = [b"log line %d: GET /index.html 200 " % i * 3 for i in range(3000)]
    with Producer(bootstrap, compression=compression, batch_bytes=64 << 10) as producer:
        producer.send_many(topic_name, values)
    records, payloads = fetch_all(connection, topic_name, 0)
    assert [r.value for r in records] == values
    codecs = {read_header(p, pos).compression for p in payloads for pos in scan_batches(p).positions}
    assert codecs == {CODEC_LZ4 if compression else CODEC_NONE}


def test_incompressible_batches_go_uncompressed(bootstrap, connection, topic_name):
    import os

    create_topic(connection, topic_name, 1)
    with Producer(bootstrap, compression="lz4") as producer:
        producer.send_many(topic_name, [os.urandom(200) for _ in range(100)])
    records, payloads = fetch_all(connection, topic_name, 0)
    assert len(records) == 100
    assert {read_header(p).compression for p in payloads} == {CODEC_NONE}


def test_records_carry_timestamp_headers_and_the_producer_name(bootstrap, connection, topic_name):
    create_topic(connection, topic_name, 1)
    before = int(time.time() * 1000)
    with Producer(bootstrap, name="orders-service") as producer:
        given = producer.send_future(topic_name, b"a", b"k", headers=[("trace", b"1"), ("empty", None)],
                                     timestamp=1_700_000_000_000).result(10)
        now = producer.send_future(topic_name, b"b").result(10)
    after = int(time.time() * 1000)
    first, second = read_partition(connection, topic_name, 0)
    assert (first.key, first.value, first.headers) == (b"k", b"a", (("trace", b"1"), ("empty", None)))
    assert first.timestamp == given.timestamp == 1_700_000_000_000
    assert before <= second.timestamp == now.timestamp <= after
    assert first.producer == second.producer == "orders-service"


def test_several_producers_at_once_each_keep_their_order(bootstrap, connection, topic_name):
    create_topic(connection, topic_name, 2)
    per_producer = 5000
    errors = []

    def produce(n):
        try:
            with Producer(bootstrap, name=f"p{n}", batch_bytes=8192, linger_ms=2) as producer:
                for i in range(per_producer):
                    producer.send(topic_name, b"%d:%06d" % (n, i), key=b"%d" % (i % 4))
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    total = 0
    for partition in range(2):
        records = read_partition(connection, topic_name, partition)
        total += len(records)
        for n in range(3):
            mine = [r.value for r in records if r.producer == f"p{n}"]
            assert mine == sorted(mine)
            assert all(v.startswith(b"%d:" % n) for v in mine)
    assert total == 3 * per_producer


def test_callbacks_get_metadata_or_error_on_the_io_thread(bootstrap, connection, topic_name):
    create_topic(connection, topic_name, 2)
    reports = []
    done = threading.Event()

    def callback(metadata, error):
        reports.append((metadata, error, threading.current_thread().name))
        if len(reports) == 3:
            done.set()

    with Producer(bootstrap, name="cb") as producer:
        for i in range(3):
            producer.send(topic_name, b"x", partition=i % 2, callback=callback)
        assert done.wait(10)
    assert sorted((m.partition, m.offset) for m, _, _ in reports) == [(0, 0), (0, 1), (1, 0)]
    assert all(error is None and "producer[cb]" in thread for _, error, thread in reports)


def test_send_many_appends_in_order_with_keys(bootstrap, connection, topic_name):
    create_topic(connection, topic_name, 3)
    keys = [b"k%d" % (i % 5) for i in range(300)]
    with Producer(bootstrap) as producer:
        assert producer.send_many(topic_name, [b"%03d" % i for i in range(300)], keys=keys) == 300
        assert producer.send_many(topic_name, (b"p1-%d" % i for i in range(10)), partition=1) == 10
    stored = {p: read_partition(connection, topic_name, p) for p in range(3)}
    for partition, records in stored.items():
        for record in records:
            if record.key is not None:
                assert partition_for_key(record.key, 3) == partition
    assert [r.value for r in stored[1] if r.key is None] == [b"p1-%d" % i for i in range(10)]
    assert sum(map(len, stored.values())) == 310


def test_send_many_of_a_2d_array_stores_row_i_as_record_i(bootstrap, connection, topic_name):
    """A numpy uint8 array of shape (n, size) as ``values``: what the broker stores is what the
    same rows as a list give, keyed rows in their key's partition, in order; a buffer this
    small makes send_many wait for room (GIL let go) many times on the way."""
    create_topic(connection, topic_name, 3)
    rows = np.random.default_rng(0).integers(0, 256, (2000, 100), dtype=np.uint8)
    keys = [b"k%d" % (i % 5) for i in range(2000)]
    data = bytearray(rows[:50].tobytes())
    with Producer(bootstrap, batch_bytes=1024, buffer_bytes=4096) as producer:
        assert producer.send_many(topic_name, rows, keys=keys) == 2000
        view = memoryview(data).cast("B", (50, 100))
        assert producer.send_many(topic_name, view, partition=1) == 50
        view.release()
        data.append(0)  # resizable again: send_many let the buffer go
    stored = {p: read_partition(connection, topic_name, p) for p in range(3)}
    for partition, records in stored.items():
        expected = [(key, row.tobytes()) for key, row in zip(keys, rows, strict=True)
                    if partition_for_key(key, 3) == partition]
        assert [(r.key, r.value) for r in records if r.key is not None] == expected
    assert [r.value for r in stored[1] if r.key is None] == [row.tobytes() for row in rows[:50]]
    assert sum(map(len, stored.values())) == 2050


def test_linger_sends_without_a_flush(bootstrap, connection, topic_name):
    create_topic(connection, topic_name, 1)
    with Producer(bootstrap, linger_ms=20) as producer:
        future = producer.send_future(topic_name, b"soon")
        assert future.result(10).offset == 0
        assert producer.unfinished_batches == 0


def test_acks_0_sends_without_waiting_for_answers(bootstrap, connection, topic_name):
    create_topic(connection, topic_name, 1)
    with Producer(bootstrap, acks=0) as producer:
        futures = [producer.send_future(topic_name, b"%d" % i) for i in range(100)]
        producer.flush(10)
    assert {f.result(0).offset for f in futures} == {-1}
    deadline = time.monotonic() + 10
    while len(read_partition(connection, topic_name, 0)) < 100:  # nobody said when it was flushed
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert [r.value for r in read_partition(connection, topic_name, 0)] == [b"%d" % i for i in range(100)]


def test_acks_0_requests_queued_at_close_still_go_out(bootstrap, connection, topic_name):
    """With acks=0 a request counts as sent once queued on the socket; close must not drop the
    ones libzmq has not written yet (nobody would resend them)."""
    create_topic(connection, topic_name, 1)
    value = b"v" * 1000
    with Producer(bootstrap, acks=0, batch_bytes=256 << 10, max_request_bytes=256 << 10,
                  buffer_bytes=64 << 20, audit_topic=None) as producer:
        producer.send_many(topic_name, [value] * 10_000)
    expected = 10_000
    deadline = time.monotonic() + 20
    while (stored := connection.call(protocol.FetchRequest(topic_name, 0, 0, max_bytes=1, max_wait_ms=0))
           .high_watermark) < expected:
        assert time.monotonic() < deadline, f"{stored} of {expected} records arrived"
        time.sleep(0.1)
    assert stored == expected


def test_bad_input_gets_a_clear_error(bootstrap, connection, topic_name):
    create_topic(connection, topic_name, 2)
    producer = Producer(bootstrap, batch_bytes=4096)
    try:
        with pytest.raises(TypeError, match="values must be bytes-like or None, not str"):
            producer.send(topic_name, "text")
        with pytest.raises(TypeError, match="not int"):
            producer.send(topic_name, 42)
        with pytest.raises(TypeError, match="keys must be bytes-like"):
            producer.send(topic_name, b"v", key="k")
        with pytest.raises(TypeError, match="topic must be a str"):
            producer.send(b"topic", b"v")
        with pytest.raises(UnknownTopicOrPartitionError, match="'no-such-topic' does not exist"):
            producer.send("no-such-topic", b"v")
        with pytest.raises(UnknownTopicOrPartitionError, match="has 2 partitions .*no partition 2"):
            producer.send(topic_name, b"v", partition=2)
        with pytest.raises(UnknownTopicOrPartitionError, match="no partition -1"):
            producer.send(topic_name, b"v", partition=-1)
        with pytest.raises(RecordTooLargeError, match="over batch_bytes 4096"):
            producer.send(topic_name, bytes(5000))
        with pytest.raises(ValueError, match="timestamp -5 is negative"):
            producer.send(topic_name, b"v", timestamp=-5)
        with pytest.raises(TypeError, match="header keys must be str"):
            producer.send(topic_name, b"v", headers=[(b"k", b"v")])
        producer.send(topic_name, None)  # a null value (tombstone) is a value
    finally:
        producer.close()
    with pytest.raises(ProducerClosedError, match="is closed"):
        producer.send(topic_name, b"v")
    with pytest.raises(ProducerClosedError):
        producer.send_future(topic_name, b"v")
    stored = read_partition(connection, topic_name, 0) + read_partition(connection, topic_name, 1)
    assert [r.value for r in stored] == [None]


@pytest.mark.parametrize(("options", "field"), [
    ({"acks": 2}, "acks"), ({"compression": "zstd"}, "compression"), ({"partitioner": "hash"}, "partitioner"),
    ({"linger_ms": -1}, "linger_ms"), ({"batch_bytes": 10}, "batch_bytes"), ({"name": "x" * 256}, "name"),
    ({"buffer_bytes": 1024}, "buffer_bytes"), ({"delivery_timeout_ms": 0}, "delivery_timeout_ms"),
])
def test_bad_settings_are_refused_by_name(options, field):
    with pytest.raises(ValueError, match=field):
        ProducerConfig(**options)


def test_a_non_retriable_error_fails_the_records_futures(bootstrap, connection, topic_name):
    """The topic takes batches of at most 1000 bytes; the producer's are larger: error 4 for each
    record of the request, reported by its future, by flush() for records sent plainly."""
    create_topic(connection, topic_name, 1, max_message_bytes=1000)
    producer = Producer(bootstrap, linger_ms=50)
    try:
        futures = [producer.send_future(topic_name, bytes(100)) for _ in range(20)]
        producer.send(topic_name, bytes(100))
        with pytest.raises(RecordTooLargeError, match="1 records sent without a future or callback failed"):
            producer.flush(10)
        wait(futures, 10)
        assert all(isinstance(f.exception(0), RecordTooLargeError) for f in futures)
        assert "1000" in str(futures[0].exception(0))
        small = producer.send_future(topic_name, bytes(10))  # the partition is usable again
        assert small.result(10).offset == 0
        producer.flush(10)  # nothing left to report
    finally:
        producer.close()
    assert [r.value for r in read_partition(connection, topic_name, 0)] == [bytes(10)]


def test_backpressure_blocks_send_until_batches_are_acknowledged(bootstrap, connection, topic_name):
    create_topic(connection, topic_name, 1)
    with Producer(bootstrap, batch_bytes=4096, buffer_bytes=8192, max_request_bytes=8192) as producer:
        for i in range(2000):
            producer.send(topic_name, b"%05d" % i + bytes(95))
            assert producer.buffered_bytes <= 8192 + 200
    assert len(read_partition(connection, topic_name, 0)) == 2000


def test_a_callback_may_send_but_not_wait_for_its_own_thread(bootstrap, connection, topic_name):
    create_topic(connection, topic_name, 1)
    other = create_topic(connection, topic_name + "-b", 1)
    outcomes = []
    done = threading.Event()

    def callback(metadata, error):
        producer.send(other, b"from the callback")  # a new topic: metadata asked on this very thread
        try:
            producer.flush()
        except RuntimeError as e:
            outcomes.append(str(e))
        done.set()

    with Producer(bootstrap) as producer:
        producer.send(topic_name, b"x", callback=callback)
        assert done.wait(10)
    assert outcomes and "flush() called from a callback" in outcomes[0]
    assert [r.value for r in read_partition(connection, other, 0)] == [b"from the callback"]


def test_a_send_that_waited_for_room_while_the_producer_closed_is_refused(bootstrap, connection, topic_name):
    """A send() blocked on a full buffer finds room only once close() has delivered everything:
    it must raise ProducerClosedError, never return as if its record were taken."""
    create_topic(connection, topic_name, 1)
    producer = Producer(bootstrap, batch_bytes=1024, buffer_bytes=1024, linger_ms=60_000)
    original_wait = producer._wait_for_room
    waiting, release = threading.Event(), threading.Event()

    def wait_after_close() -> None:
        waiting.set()
        release.wait(30)
        original_wait()

    producer._wait_for_room = wait_after_close
    outcome = []

    def send_into_full_buffer() -> None:
        try:
            while not waiting.is_set():
                producer.send(topic_name, b"filler " + bytes(200))
            outcome.append("returned")
        except ProducerClosedError:
            outcome.append("refused")

    sender = threading.Thread(target=send_into_full_buffer)
    sender.start()
    assert waiting.wait(30)
    closer = threading.Thread(target=producer.close)
    closer.start()
    deadline = time.monotonic() + 30
    while not (producer.closed and producer.buffered_bytes < producer.buffer_bytes):
        assert time.monotonic() < deadline, "close() delivered nothing"
        time.sleep(0.01)
    release.set()
    sender.join(30)
    closer.join(30)
    assert outcome == ["refused"]
    stored = read_partition(connection, topic_name, 0)
    assert stored and all(r.value.startswith(b"filler") for r in stored)


def test_a_buffer_full_of_open_batches_sends_them_before_their_linger(bootstrap, connection, topic_name):
    """buffer_bytes is reached by four partitions' open batches, none full, none due for ten
    minutes: send() does not wait for the linger (nor time out after max_block_ms), the batches
    go at once."""
    create_topic(connection, topic_name, 4)
    with Producer(bootstrap, batch_bytes=64 << 10, buffer_bytes=64 << 10, linger_ms=600_000,
                  max_block_ms=20_000) as producer:
        for i in range(1000):
            producer.send(topic_name, b"%04d" % i + bytes(996), partition=i % 4)
    assert [len(read_partition(connection, topic_name, p)) for p in range(4)] == [250] * 4


def test_a_callback_that_raises_even_system_exit_does_not_stop_delivery(bootstrap, connection, topic_name):
    create_topic(connection, topic_name, 1)

    def exits(metadata, error):
        raise SystemExit("a callback called sys.exit()")

    def interrupted(metadata, error):
        raise KeyboardInterrupt

    with Producer(bootstrap) as producer:
        producer.send(topic_name, b"first", callback=exits)
        producer.flush(10)
        producer.send(topic_name, b"second", callback=interrupted)
        assert producer.send_future(topic_name, b"third").result(10).offset == 2
        producer.send(topic_name, b"fourth")
        producer.flush(10)
    assert [r.value for r in read_partition(connection, topic_name, 0)] == [b"first", b"second", b"third",
                                                                            b"fourth"]


def test_once_the_io_thread_fails_records_fail_and_send_refuses(bootstrap, connection, topic_name):
    create_topic(connection, topic_name, 1)
    producer = Producer(bootstrap)
    try:
        producer.send_future(topic_name, b"delivered").result(10)

        def broken(now: float) -> None:
            raise RuntimeError("a bug in the I/O thread")

        producer._sender._send_due = broken
        future = producer.send_future(topic_name, b"never sent")
        producer.send(topic_name, b"never sent either")
        assert isinstance(future.exception(10), ProducerClosedError)
        assert "a bug in the I/O thread" in str(future.exception(0))
        with pytest.raises(ProducerClosedError, match="1 records sent without a future or callback failed"):
            producer.flush(10)
        with pytest.raises(ProducerClosedError, match="I/O thread failed"):
            producer.send(topic_name, b"after")
        with pytest.raises(ProducerClosedError, match="I/O thread failed"):
            producer.flush(10)
    finally:
        with pytest.raises(ProducerClosedError):
            producer.close(10)
    assert producer.unfinished_batches == 0
    assert [r.value for r in read_partition(connection, topic_name, 0)] == [b"delivered"]


def test_the_broker_is_given_less_time_than_the_client_waits(bootstrap, connection, topic_name, monkeypatch):
    """The broker answers error 12 when its timeout_ms passes: that answer must come before the
    client stops waiting, or the client always takes the 'outcome unknown' path instead."""
    create_topic(connection, topic_name, 1)
    sent = []
    original_send = BrokerConnection.send

    def recording_send(self, message, **kwargs):
        sent.append(message)
        return original_send(self, message, **kwargs)

    monkeypatch.setattr(BrokerConnection, "send", recording_send)
    with Producer(bootstrap, request_timeout_ms=10_000) as producer:
        producer.send_future(topic_name, b"v").result(10)
    [produce] = [m for m in sent if isinstance(m, protocol.ProduceRequest) and m.topic == topic_name]
    assert 0 < produce.timeout_ms < 10_000


def test_the_io_thread_does_not_sleep_on_a_response_a_synchronous_call_kept():
    """Responses read while the I/O thread waited for a metadata or fetch answer are kept by the
    connection; the socket no longer shows them, so the thread must not wait for it."""
    from harness import free_ports

    from hpbroker.client.connection import BrokerAddress, Response
    from hpbroker.client.links import BrokerLinks
    from hpbroker.client.producer import _Sender

    sender = _Sender(None, BrokerAddress("127.0.0.1", free_ports(1)), ProducerConfig(audit_topic=None), -1)
    sender.links = BrokerLinks(sender._address, "test", sender._poller)
    try:
        assert sender._poll_timeout_ms() == 1000  # nothing to do: the longest sleep
        sender.links.bootstrap.connection._arrived[5] = Response(5, protocol.ResponseHeader(5),
                                                                 protocol.ProduceResponse(0))
        assert sender._poll_timeout_ms() == 0
    finally:
        sender.links.close(0)


def test_a_wake_up_landing_while_the_io_thread_drains_its_pipe_is_not_lost(bootstrap, connection, topic_name,
                                                                            monkeypatch):
    """A send() that wakes the I/O thread while it empties its wake-up pipe must still be seen at
    once, not after the thread's idle poll timeout (about a second)."""
    import hpbroker.client.producer as producer_module

    create_topic(connection, topic_name, 1)
    real_read = producer_module.os.read
    holder: dict = {}

    def read_with_a_send_in_between(fd, n):
        data = real_read(fd, n)
        if data and holder.get("producer") is not None:
            holder["producer"].wake()  # as a send() on another thread would, mid-drain
        return data

    monkeypatch.setattr(producer_module.os, "read", read_with_a_send_in_between)
    with Producer(bootstrap, linger_ms=0) as producer:
        producer.send_future(topic_name, b"warm").result(timeout=10)
        holder["producer"] = producer
        for i in range(5):
            started = time.monotonic()
            producer.send_future(topic_name, b"x%d" % i).result(timeout=10)
            assert time.monotonic() - started < 0.5, "the acknowledgement waited for the idle poll"
