"""The consumer when things break: corrupt batches on disk, a broker restart mid-stream, no broker."""

from __future__ import annotations

import os
import signal
import struct
import threading
import time

import pytest
import zmq
from harness import free_ports, start_broker

from hpbroker import Consumer, TopicPartition, protocol
from hpbroker.client.connection import BrokerAddress, BrokerConnection
from hpbroker.errors import BrokerNotAvailableError, CorruptRecordError
from hpbroker.records import build_batch, crc32c, scan_batches

TOPIC = "faults"


@pytest.fixture
def own_broker(tmp_path):
    """A broker of this test's own, its data under ``tmp_path / "data"``: ``(process, port)``."""
    process, port = start_broker(tmp_path / "data", tmp_path / "broker.log")
    brokers = [process]
    yield brokers, port
    for broker in brokers:
        broker.stop()


def produce_batches(port: int, partition: int, batches: int, size: int, start: int = 0) -> None:
    connection = BrokerConnection(BrokerAddress("127.0.0.1", port))
    try:
        for b in range(start, start + batches):
            values = [b"batch%d-record%d" % (b, i) for i in range(size)]
            connection.call(protocol.ProduceRequest(TOPIC, partition, payload=build_batch(values)))
    finally:
        connection.close()


def create_topic(port: int, partitions: int = 1) -> None:
    connection = BrokerConnection(BrokerAddress("127.0.0.1", port))
    try:
        connection.call(protocol.CreateTopicRequest(TOPIC, partitions))
    finally:
        connection.close()


def poll_until(consumer: Consumer, count: int, records: list, timeout_s: float = 20.0) -> list:
    deadline = time.monotonic() + timeout_s
    while len(records) < count:
        assert time.monotonic() < deadline, f"got {len(records)} of {count} records"
        for batch in consumer.poll(timeout_ms=200).values():
            records.extend(batch)
    return records


def test_a_corrupt_batch_on_disk_is_reported_with_topic_partition_and_offset(own_broker, tmp_path):
    _brokers, port = own_broker
    create_topic(port)
    produce_batches(port, 0, batches=3, size=10)
    segment = tmp_path / "data" / f"{TOPIC}-0" / "00000000000000000000.log"
    data = bytearray(segment.read_bytes())
    position = data.index(b"batch1-record4")
    with open(segment, "r+b") as f:  # the broker's page cache sees it: it sends these bytes
        f.seek(position)
        f.write(b"X")
    tp = TopicPartition(TOPIC, 0)
    with Consumer(f"127.0.0.1:{port}", auto_offset_reset="earliest", fetch_max_wait_ms=200) as consumer:
        consumer.assign([tp])
        first = consumer.poll(timeout_ms=5000)[tp]
        assert [r.offset for r in first] == list(range(10)), "the records before the damage arrive"
        with pytest.raises(CorruptRecordError, match=rf"{TOPIC}-0 at offset 10 .*CRC mismatch") as info:
            consumer.poll(timeout_ms=5000)
        assert (info.value.topic, info.value.partition, info.value.offset) == (TOPIC, 0, 10)
        assert consumer.position(tp) == 10
        with pytest.raises(CorruptRecordError):  # still there on the next try
            consumer.poll(timeout_ms=5000)
        consumer.seek(tp, 20)
        assert [r.offset for r in poll_until(consumer, 10, [])] == list(range(20, 30))


def test_a_batch_whose_crc_holds_but_whose_records_do_not_decode_is_a_corrupt_record_error(own_broker,
                                                                                            tmp_path):
    _brokers, port = own_broker
    create_topic(port)
    produce_batches(port, 0, batches=3, size=10)
    segment = tmp_path / "data" / f"{TOPIC}-0" / "00000000000000000000.log"
    data = bytearray(segment.read_bytes())
    position = scan_batches(data).positions[1]
    batch = data[position:position + scan_batches(data).sizes[1]]
    struct.pack_into("<ii", batch, 24, 10, 11)  # last_offset_delta, record_count: one record too many
    struct.pack_into("<I", batch, 16, crc32c(bytes(batch[20:])))  # ... under a CRC that holds
    with open(segment, "r+b") as f:
        f.seek(position)
        f.write(batch)
    tp = TopicPartition(TOPIC, 0)
    with Consumer(f"127.0.0.1:{port}", auto_offset_reset="earliest", fetch_max_wait_ms=200) as consumer:
        consumer.assign([tp])
        first = consumer.poll(timeout_ms=5000).get(tp, [])
        assert [r.offset for r in first] == list(range(10)), "the records before the bad batch arrive"
        with pytest.raises(CorruptRecordError, match=rf"{TOPIC}-0 at offset 10 ") as info:
            consumer.poll(timeout_ms=5000)
        assert (info.value.topic, info.value.partition, info.value.offset) == (TOPIC, 0, 10)
        assert consumer.position(tp) == 10


def test_a_broker_restart_mid_stream_loses_and_repeats_no_record(own_broker, tmp_path):
    brokers, port = own_broker
    create_topic(port, partitions=2)
    produce_batches(port, 0, batches=4, size=25)
    produce_batches(port, 1, batches=4, size=25)
    tps = [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)]
    with Consumer(f"127.0.0.1:{port}", auto_offset_reset="earliest", fetch_max_wait_ms=200,
                  max_partition_fetch_bytes=1024, reconnect_timeout_ms=30_000) as consumer:
        consumer.assign(tps)
        records = poll_until(consumer, 60, [])
        first = brokers[0]
        for pid in [*first.worker_pids().values(), first.process.pid]:
            os.kill(pid, signal.SIGKILL)  # no goodbye: connections reset, fetches in flight lost
        first.process.wait(timeout=10)
        for _ in range(3):  # polls on while the broker is away: reconnects are refused meanwhile
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(batch)
        second, _ = start_broker(tmp_path / "data", tmp_path / "broker-2.log", port=port)
        brokers.append(second)
        produce_batches(port, 0, batches=2, size=25, start=4)
        produce_batches(port, 1, batches=2, size=25, start=4)
        poll_until(consumer, 300, records)
    for tp in tps:
        offsets = [r.offset for r in records if r.partition == tp.partition]
        assert offsets == list(range(150)), f"{tp}: lost, repeated or reordered records"
        values = [r.value for r in records if r.partition == tp.partition]
        assert values == [b"batch%d-record%d" % (b, i) for b in range(6) for i in range(25)]


def test_an_unreachable_broker_is_a_clear_error_in_bounded_time():
    port = free_ports(1)
    with Consumer(f"127.0.0.1:{port}", reconnect_timeout_ms=500, retry_backoff_ms=50) as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        started = time.monotonic()
        pattern = rf"127.0.0.1:{port}.*gave up .* after \d+ attempts"
        with pytest.raises(BrokerNotAvailableError, match=pattern):
            consumer.poll(timeout_ms=60_000)
        assert time.monotonic() - started < 10, "the error must come after about reconnect_timeout_ms"


def test_a_broker_that_dies_mid_stream_is_a_clear_error_in_bounded_time(own_broker):
    brokers, port = own_broker
    create_topic(port)
    produce_batches(port, 0, batches=1, size=10)
    tp = TopicPartition(TOPIC, 0)
    with Consumer(f"127.0.0.1:{port}", auto_offset_reset="earliest", fetch_max_wait_ms=200,
                  reconnect_timeout_ms=800, retry_backoff_ms=50) as consumer:
        consumer.assign([tp])
        assert len(poll_until(consumer, 10, [])) == 10
        assert brokers[0].stop() == 0
        started = time.monotonic()
        pattern = rf"{TOPIC}-0.*gave up .* after \d+ attempts"
        with pytest.raises(BrokerNotAvailableError, match=pattern) as info:
            while time.monotonic() - started < 30:
                assert consumer.poll(timeout_ms=500) == {}
        assert "not reachable" in str(info.value) or "lost the data connection" in str(info.value)
        assert consumer.position(tp) == 10


def in_thread(call) -> tuple[threading.Thread, list]:
    """Run ``call`` in a daemon thread; the list gets its result or exception."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as e:  # noqa: BLE001 - reported by the test
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


@pytest.fixture
def silent_front_end():
    """The port of a ZeroMQ ROUTER that takes requests and never answers."""
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    yield port
    router.close()


PATIENT = {"reconnect_timeout_ms": 60_000, "request_timeout_ms": 60_000}


def test_poll_returns_near_its_timeout_while_the_broker_is_away(own_broker):
    brokers, port = own_broker
    create_topic(port)
    with Consumer(f"127.0.0.1:{port}", auto_offset_reset="earliest", **PATIENT) as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        assert brokers[0].stop() == 0  # gone before the partition had a position
        for _ in range(3):
            started = time.monotonic()
            assert consumer.poll(timeout_ms=200) == {}
            assert time.monotonic() - started < 3, "poll(timeout_ms=200) waited for the broker"


def test_poll_returns_near_its_timeout_while_metadata_goes_unanswered(silent_front_end):
    with Consumer(f"127.0.0.1:{silent_front_end}", **PATIENT) as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        for _ in range(3):
            started = time.monotonic()
            assert consumer.poll(timeout_ms=200) == {}
            assert time.monotonic() - started < 3, "poll(timeout_ms=200) waited for the metadata"


@pytest.mark.parametrize("call", ["poll", "iteration", "position", "seek_to_end"])
@pytest.mark.parametrize("broker", ["stopped", "silent"])
def test_close_from_another_thread_ends_a_call_waiting_for_the_broker(request, call, broker):
    if broker == "stopped":
        brokers, port = request.getfixturevalue("own_broker")
        create_topic(port)
    else:
        port = request.getfixturevalue("silent_front_end")
    consumer = Consumer(f"127.0.0.1:{port}", auto_offset_reset="earliest", **PATIENT)
    tp = TopicPartition(TOPIC, 0)
    consumer.assign([tp])
    if broker == "stopped":
        assert brokers[0].stop() == 0
    thread, outcome = in_thread({"poll": lambda: consumer.poll(timeout_ms=60_000),
                                 "iteration": lambda: list(consumer),
                                 "position": lambda: consumer.position(tp),
                                 "seek_to_end": lambda: consumer.seek_to_end(tp)}[call])
    time.sleep(0.3)  # the call is waiting now
    closing, closed = in_thread(consumer.close)
    closing.join(5)
    thread.join(5)
    assert closed == [None], "close() waited for the call"
    assert not thread.is_alive(), f"{call} went on after close()"
    if call in ("poll", "iteration"):
        assert outcome in ([{}], [[]])
    else:
        assert isinstance(outcome[0], RuntimeError) and "closed" in str(outcome[0])


def test_wakeup_ends_an_iteration_waiting_for_metadata_that_goes_unanswered(silent_front_end):
    with Consumer(f"127.0.0.1:{silent_front_end}", **PATIENT) as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        thread, outcome = in_thread(lambda: list(consumer))
        time.sleep(0.3)
        consumer.wakeup()
        thread.join(5)
        assert not thread.is_alive() and outcome == [[]]
