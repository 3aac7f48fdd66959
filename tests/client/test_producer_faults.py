"""The producer when the broker is not there, goes away, or restarts: clear errors in bounded
time, and every acknowledged record stored exactly once, in order."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import wait
from contextlib import closing

import pytest
from harness import free_ports, start_broker

from hpbroker import protocol
from hpbroker.client.connection import BrokerAddress, BrokerConnection
from hpbroker.client.producer import Producer, ProducerClosedError
from hpbroker.errors import BrokerNotAvailableError
from hpbroker.records import decode_records


class OwnBroker:
    """A broker of this test alone, which the test may stop and start again on the same port and
    data directory."""

    def __init__(self, root) -> None:
        self.root = root
        self.starts = 0
        self.process, self.port = None, None
        self.start()

    def start(self) -> None:
        self.starts += 1
        self.process, self.port = start_broker(self.root / "data", self.root / f"broker-{self.starts}.log",
                                               port=self.port)

    def stop(self) -> None:
        assert self.process.stop() == 0, self.process.log()

    def connection(self) -> BrokerConnection:
        return BrokerConnection(BrokerAddress("127.0.0.1", self.port))


@pytest.fixture
def own_broker(tmp_path):
    broker = OwnBroker(tmp_path)
    yield broker
    broker.process.stop()


def read_partition(connection: BrokerConnection, topic: str, partition: int) -> list:
    records, offset = [], 0
    while True:
        response = connection.call(protocol.FetchRequest(topic, partition, offset, max_bytes=4 << 20,
                                                         max_wait_ms=0))
        if not len(response.payload):
            return records
        records += [r for r in decode_records(response.payload) if r.offset >= offset]
        offset = records[-1].offset + 1
        if offset >= response.high_watermark:
            return records


def test_an_unreachable_broker_is_a_clear_error_in_bounded_time():
    port = free_ports(1)
    producer = Producer(f"127.0.0.1:{port}", max_block_ms=600, retry_backoff_ms=50)
    try:
        started = time.monotonic()
        with pytest.raises(BrokerNotAvailableError, match=f"127.0.0.1:{port}.*max_block_ms 600"):
            producer.send("orders", b"v")
        assert time.monotonic() - started < 5
    finally:
        producer.close(timeout_s=5)


def test_records_fail_with_broker_not_available_after_the_delivery_timeout(own_broker, topic_name):
    with closing(own_broker.connection()) as connection:
        connection.call(protocol.CreateTopicRequest(topic_name, 2))
    producer = Producer(f"127.0.0.1:{own_broker.port}", delivery_timeout_ms=1500, retry_backoff_ms=50)
    try:
        assert producer.send_future(topic_name, b"before").result(10).offset == 0
        own_broker.stop()
        started = time.monotonic()
        futures = [producer.send_future(topic_name, b"after", partition=p) for p in range(2)]
        producer.send(topic_name, b"plain")
        wait(futures, 15)
        assert time.monotonic() - started < 10
        for future in futures:
            error = future.exception(0)
            assert isinstance(error, BrokerNotAvailableError), error
            assert "not delivered within delivery_timeout_ms 1500" in str(error)
        with pytest.raises(BrokerNotAvailableError, match="1 records sent without a future"):
            producer.flush(10)
    finally:
        producer.close(timeout_s=5)


def test_flush_and_close_are_bounded_by_their_timeout(own_broker, topic_name):
    with closing(own_broker.connection()) as connection:
        connection.call(protocol.CreateTopicRequest(topic_name, 1))
    producer = Producer(f"127.0.0.1:{own_broker.port}", delivery_timeout_ms=60_000)
    producer.send_future(topic_name, b"first").result(10)
    own_broker.stop()
    future = producer.send_future(topic_name, b"stuck")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="flush did not finish within 0.5 s"):
        producer.flush(timeout_s=0.5)
    with pytest.raises(TimeoutError):
        producer.close(timeout_s=0.5)
    assert time.monotonic() - started < 8
    assert isinstance(future.exception(5), ProducerClosedError)
    with pytest.raises(ProducerClosedError):
        producer.send(topic_name, b"late")


def stream_through(own_broker: OwnBroker, topic: str, fault) -> None:
    """Send keyed records from a thread while ``fault()`` runs, then check that each acknowledged
    record is stored once, at the offset its future gave, and that each partition holds them in
    send order; with the retries and the delivery timeout given, every record is acknowledged."""
    partitions = 2
    with closing(own_broker.connection()) as connection:
        connection.call(protocol.CreateTopicRequest(topic, partitions))
    producer = Producer(f"127.0.0.1:{own_broker.port}", linger_ms=2, batch_bytes=8192,
                        delivery_timeout_ms=30_000, request_timeout_ms=5000, retry_backoff_ms=50)
    futures = []
    stop = threading.Event()

    def produce():
        i = 0
        while not stop.is_set():
            futures.append(producer.send_future(topic, b"%07d" % i, key=b"%d" % (i % 10)))
            i += 1
            if i % 200 == 0:
                time.sleep(0.002)

    sender = threading.Thread(target=produce)
    sender.start()
    try:
        time.sleep(0.5)
        fault()
        time.sleep(0.8)
    finally:
        stop.set()
        sender.join(10)
    try:
        producer.flush(30)
    finally:
        producer.close(timeout_s=10)
    acknowledged = {}
    for i, future in enumerate(futures):
        metadata = future.result(0)  # retried until the broker is back: none fails
        acknowledged[metadata.partition, metadata.offset] = b"%07d" % i
    assert len(acknowledged) == len(futures)
    with closing(own_broker.connection()) as connection:
        for partition in range(partitions):
            records = read_partition(connection, topic, partition)
            values = [r.value for r in records]
            assert len(values) == len(set(values)), "a record is stored twice"
            mine = [(r.offset, r.value) for r in records if (partition, r.offset) in acknowledged]
            assert all(acknowledged[partition, offset] == value for offset, value in mine)
            assert [v for _, v in mine] == sorted(v for _, v in mine)
            assert len(mine) == sum(1 for p, _ in acknowledged if p == partition)


def test_a_broker_restart_mid_stream_loses_and_duplicates_no_acknowledged_record(own_broker, topic_name):
    """The broker stops and starts again on the same port and data: the producer reconnects and
    goes on, and what it had in flight is found in the log or sent again."""

    def restart():
        own_broker.stop()
        time.sleep(0.3)
        own_broker.start()

    stream_through(own_broker, topic_name, restart)


def test_a_worker_killed_mid_stream_loses_and_duplicates_no_acknowledged_record(own_broker, topic_name):
    """kill -9 of the worker serving a partition: the broker answers what it had in flight with
    error 15 (appended or not, nobody knows), respawns the worker, and the producer goes on."""

    def kill_worker():
        pid = own_broker.process.worker_pids()[0]
        os.kill(pid, signal.SIGKILL)
        own_broker.process.wait_for_log(r"forked worker slot=0", count=2)

    stream_through(own_broker, topic_name, kill_worker)


def test_leaving_a_with_block_by_an_exception_closes_in_bounded_time(own_broker, topic_name):
    """The broker is gone and the with block raises: the exception comes out after a short close
    (the unsent record fails with ProducerClosedError), not after delivery_timeout_ms."""
    with closing(own_broker.connection()) as connection:
        connection.call(protocol.CreateTopicRequest(topic_name, 1))
    with (pytest.raises(ValueError, match="the application failed"),
          Producer(f"127.0.0.1:{own_broker.port}", delivery_timeout_ms=60_000) as producer):
        producer.send_future(topic_name, b"first").result(10)
        own_broker.stop()
        future = producer.send_future(topic_name, b"stuck")
        raise ValueError("the application failed")
    assert isinstance(future.exception(0), ProducerClosedError)
    assert not producer._thread.is_alive()


def test_a_request_sent_after_a_reconnect_is_not_taken_for_lost(own_broker, topic_name, caplog):
    """The I/O thread is busy (here: in a callback) while the broker restarts, then sends on the
    new connection before it reads the old connection's disconnect: that request was not lost,
    and the producer must not treat its outcome as unknown."""
    import logging

    import zmq

    with closing(own_broker.connection()) as connection:
        connection.call(protocol.CreateTopicRequest(topic_name, 2))
    producer = Producer(f"127.0.0.1:{own_broker.port}", linger_ms=0, retry_backoff_ms=50)
    later = []

    def restart_then_send(metadata, error):
        own_broker.stop()
        own_broker.start()
        assert producer._sender.connection.socket.poll(20_000, zmq.POLLOUT), "no reconnect"
        later.append(producer.send_future(topic_name, b"after the restart", partition=1))

    caplog.set_level(logging.DEBUG, logger="hpbroker.client.producer")
    caplog.set_level(logging.DEBUG, logger="hpbroker.client.appended_lookup")
    try:
        producer.send_future(topic_name, b"connected", partition=0).result(10)
        producer.send(topic_name, b"before the restart", partition=0, callback=restart_then_send)
        producer.flush(60)
        assert later and later[0].result(30).offset == 0
        producer.flush(30)
    finally:
        producer.close(timeout_s=10)
    assert "outcome of an earlier attempt was unknown" not in caplog.text
    assert "lost with request" not in caplog.text
    with closing(own_broker.connection()) as connection:
        assert [r.value for r in read_partition(connection, topic_name, 1)] == [b"after the restart"]
