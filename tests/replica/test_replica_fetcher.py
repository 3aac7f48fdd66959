"""ReplicaFetcher against a real broker's data port: the bytes fetched, several partitions on one
connection, error answers, connection loss, backoff and a broker restart.  Nothing blocks: each
test drives ``process`` from a poll loop with a deadline.

The broker here is standalone (unreplicated topics), so the fetcher is made with broker id -1:
its fetches are consumer fetches over the very same code path (framing, ordering, loss, backoff);
replica fetches proper need a leader, in the cluster tests."""

from __future__ import annotations

import itertools
import os
import select
import signal
import socket
import time

import pytest
from harness import free_ports, start_broker

from hpbroker import protocol
from hpbroker.client.connection import BrokerAddress, BrokerConnection
from hpbroker.client.fetcher import FetchConfig, PartitionFetcher
from hpbroker.client.metadata import ClusterMetadata
from hpbroker.client.producer import Producer
from hpbroker.errors import OffsetOutOfRangeError
from hpbroker.records import scan_batches
from hpbroker.replica.fetcher import BACKOFF_INITIAL_S, BACKOFF_MAX_S, ReplicaFetcher

CONSUMER = -1  # the broker id the fetcher sends as replica_id (module docstring)
_topics = itertools.count()


class Owner:
    """What a worker does with a ReplicaFetcher: polls it, calls process, keeps the answers, and
    sends a lost fetch again from where it was."""

    def __init__(self, port: int, *, host: str = "127.0.0.1", max_bytes: int = 1 << 20,
                 max_wait_ms: int = 200, resend_lost: bool = True) -> None:
        self.fetcher = ReplicaFetcher(CONSUMER, host, port, on_response=self._answered, now=time.monotonic(),
                                      on_lost=self._lost, request_timeout_ms=5000)
        self.max_bytes, self.max_wait_ms, self.resend_lost = max_bytes, max_wait_ms, resend_lost
        self.answers: list[tuple[str, int, protocol.ResponseHeader, protocol.FetchResponse]] = []
        self.lost: list[tuple[float, str, int]] = []
        self.offsets: dict[tuple[str, int], int] = {}
        self.longest_call_s = 0.0

    def fetch(self, topic: str, partition: int, offset: int) -> None:
        self.offsets[topic, partition] = offset
        self._timed(self.fetcher.fetch, topic, partition, offset, leader_epoch=-1, last_fetched_epoch=-1,
                    max_bytes=self.max_bytes, max_wait_ms=self.max_wait_ms)

    def _answered(self, topic, partition, header, response) -> None:
        self.answers.append((topic, partition, header, response))

    def _lost(self, topic: str, partition: int) -> None:
        self.lost.append((time.monotonic(), topic, partition))
        if self.resend_lost:
            self.fetch(topic, partition, self.offsets[topic, partition])

    def _timed(self, call, *args, **kwargs):
        started = time.monotonic()
        try:
            return call(*args, **kwargs)
        finally:
            self.longest_call_s = max(self.longest_call_s, time.monotonic() - started)

    def run_until(self, done, timeout_s: float = 15.0, what: str = "condition"):
        """Poll and process until ``done()`` is true; fail after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not done():
            now = time.monotonic()
            if now > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; lost {self.lost}, "
                                     f"answers {[(t, p, h) for t, p, h, _r in self.answers]}, connected "
                                     f"{self.fetcher.connected}, fd {self.fetcher.fileno()}, in flight "
                                     f"{self.fetcher.in_flight_count}")
            wake = self.fetcher.next_deadline()
            timeout_ms = max(0, min(50, (deadline - now) * 1000, 50 if wake is None else (wake - now) * 1000))
            events = 0
            fd = self.fetcher.fileno()
            if fd >= 0:
                poller = select.poll()
                poller.register(fd, self.fetcher.events())
                for _fd, revents in poller.poll(timeout_ms):
                    events = revents
            else:
                time.sleep(timeout_ms / 1000)
            self._timed(self.fetcher.process, events, time.monotonic())
        assert self.longest_call_s < 1.0, f"a call took {self.longest_call_s:.2f} s: it blocked"

    def take(self, topic: str, partition: int):
        """The next answer for the partition (run_until first)."""
        for i, answer in enumerate(self.answers):
            if answer[:2] == (topic, partition):
                return self.answers.pop(i)[2:]
        return None

    def close(self) -> None:
        self.fetcher.close()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    root = tmp_path_factory.mktemp("broker")
    process, port = start_broker(root / "data", root / "broker.log", workers=1)
    try:
        yield process, port
    finally:
        assert process.stop() == 0, process.log()


def _topic(port: int, partitions: int = 1) -> tuple[str, list]:
    """A new topic on the broker at ``port`` and its partitions' metadata (data port included)."""
    name = f"r{next(_topics)}"
    connection = BrokerConnection(BrokerAddress("127.0.0.1", port))
    try:
        connection.call(protocol.CreateTopicRequest(name, partitions))
        return name, ClusterMetadata(connection).partitions(name)
    finally:
        connection.close()


def _produce(port: int, topic: str, count: int, *, partition: int = 0, start: int = 0) -> None:
    with Producer(f"127.0.0.1:{port}", batch_bytes=2048, linger_ms=1) as producer:
        for i in range(start, start + count):
            value = b"value-%06d-" % i + b"x" * (i % 50)
            producer.send(topic, value, key=b"k%d" % (i % 5), partition=partition)
        producer.flush(20)


def _consumer_bytes(host: str, port: int, topic: str, partition: int, end: int) -> bytes:
    """The record batches of offsets 0..end as a consumer reads them (raw, checked)."""
    fetcher = PartitionFetcher(topic, partition, host, port, FetchConfig(fetch_max_wait_ms=100), raw=True)
    out = bytearray()
    offset = 0
    deadline = time.monotonic() + 15
    try:
        fetcher.fetch(0)
        while offset < end:
            assert time.monotonic() < deadline, "consumer fetch timed out"
            select.select([fetcher], [], [], 0.1)
            completed = fetcher.receive()
            if completed is None:
                continue
            assert completed.error is None
            out += completed.payload
            offset = completed.next_offset
    finally:
        fetcher.close()
    return bytes(out)


def test_fetched_batches_are_the_bytes_a_consumer_reads(broker):
    _process, port = broker
    topic, (info,) = _topic(port)
    _produce(port, topic, 3000)
    owner = Owner(info.fetch_port, host=info.host, max_bytes=8192)
    try:
        fetched = bytearray()
        offset = 0
        responses = 0
        while offset < 3000:
            owner.fetch(topic, 0, offset)
            assert owner.fetcher.in_flight(topic, 0)
            owner.run_until(lambda: owner.answers, what="a fetch response")
            header, response = owner.take(topic, 0)
            assert header.error_code == 0, header.error_message
            assert not owner.fetcher.in_flight(topic, 0)
            assert response.high_watermark == 3000 and response.log_start_offset == 0
            scan = scan_batches(response.payload, expected_offset=offset)
            assert scan.error is None and scan.valid_bytes == len(response.payload)
            fetched += response.payload
            offset = scan.next_offset
            responses += 1
        assert responses > 3, "max_bytes split the log over several responses"
        assert bytes(fetched) == _consumer_bytes(info.host, info.fetch_port, topic, 0, 3000)
        assert owner.lost == []
    finally:
        owner.close()


def test_partitions_share_the_connection_one_fetch_in_flight_each(broker):
    _process, port = broker
    topic, infos = _topic(port, partitions=3)
    assert len({info.fetch_port for info in infos}) == 1, "one worker serves them all"
    for partition in range(3):
        _produce(port, topic, 10 * (partition + 1), partition=partition)
    owner = Owner(infos[0].fetch_port, host=infos[0].host)
    try:
        for partition in range(3):
            owner.fetch(topic, partition, 0)
        with pytest.raises(RuntimeError, match=f"a fetch of {topic}-1 is already in flight"):
            owner.fetch(topic, 1, 5)
        assert owner.fetcher.in_flight_count == 3
        owner.run_until(lambda: len(owner.answers) == 3, what="three answers")
        assert [(t, p) for t, p, _h, _r in owner.answers] == [(topic, 0), (topic, 1), (topic, 2)], "in order"
        for _topic_name, partition, header, response in owner.answers:
            scan = scan_batches(response.payload, expected_offset=0)
            assert header.error_code == 0
            assert scan.next_offset == response.high_watermark == 10 * (partition + 1)
        assert owner.fetcher.connected and owner.fetcher.in_flight_count == 0
    finally:
        owner.close()


def test_an_error_answer_is_delivered_and_the_connection_kept(broker):
    _process, port = broker
    topic, (info,) = _topic(port)
    _produce(port, topic, 5)
    owner = Owner(info.fetch_port, host=info.host)
    try:
        owner.fetch(topic, 0, 99)
        owner.run_until(lambda: owner.answers, what="the error answer")
        header, response = owner.take(topic, 0)
        assert header.error_code == OffsetOutOfRangeError.code and response.high_watermark == 5
        fd = owner.fetcher.fileno()
        owner.fetch(topic, 0, 0)
        owner.run_until(lambda: owner.answers, what="a fetch after the error")
        header, response = owner.take(topic, 0)
        assert header.error_code == 0 and scan_batches(response.payload).next_offset == 5
        assert owner.fetcher.fileno() == fd and owner.lost == []
    finally:
        owner.close()


def test_nothing_listening_loses_the_fetch_and_reconnects_with_a_doubling_backoff():
    port = free_ports(1)  # nothing listens there
    owner = Owner(port)
    try:
        started = time.monotonic()
        owner.fetch("t", 0, 0)
        owner.run_until(lambda: len(owner.lost) >= 6, timeout_s=15, what="six connect failures")
        times = [started] + [at for at, _topic, _partition in owner.lost]
        gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
        for i, gap in enumerate(gaps[1:]):  # the first attempt goes at once
            expected = min(BACKOFF_INITIAL_S * 2 ** i, BACKOFF_MAX_S)
            assert gap >= expected * 0.99, f"attempt {i + 2} came {gap:.3f} s after, before {expected} s"
        assert {(topic, partition) for _at, topic, partition in owner.lost} == {("t", 0)}
        assert owner.answers == [] and owner.fetcher.fileno() == -1
    finally:
        owner.close()


def test_a_broker_killed_loses_the_fetch_in_flight_and_fetching_resumes_after_its_restart(tmp_path):
    process, port = start_broker(tmp_path / "data", tmp_path / "broker-1.log", workers=1)
    owner = None
    try:
        topic, (info,) = _topic(port)
        _produce(port, topic, 20)
        owner = Owner(info.fetch_port, host=info.host, max_wait_ms=10_000)
        owner.fetch(topic, 0, 0)
        owner.run_until(lambda: owner.answers, what="the first answer")
        _header, response = owner.take(topic, 0)
        assert scan_batches(response.payload).next_offset == 20
        owner.fetch(topic, 0, 20)  # parked at the log end: a long poll
        owner.run_until(lambda: owner.fetcher.connected and not owner.fetcher.wants_write, what="sent")
        # kill -9 the worker (the arbiter stopped first, so it respawns nobody), then the arbiter:
        # nobody answers the parked fetch
        os.kill(process.process.pid, signal.SIGSTOP)
        for pid in process.worker_pids().values():
            os.kill(pid, signal.SIGKILL)
        process.process.kill()
        process.wait_exit()
        process.stop()
        owner.run_until(lambda: owner.lost, what="the parked fetch lost with the connection")
        assert owner.lost[0][1:] == (topic, 0) and owner.answers == []
        owner.run_until(lambda: len(owner.lost) >= 2, what="a connect refused while the broker is down")
        process, _port = start_broker(tmp_path / "data", tmp_path / "broker-2.log", workers=1, port=port)
        _produce(port, topic, 7, start=20)
        owner.run_until(lambda: owner.answers, what="an answer from the restarted broker")
        header, response = owner.take(topic, 0)
        assert header.error_code == 0
        scan = scan_batches(response.payload, expected_offset=20)
        assert scan.error is None and scan.next_offset == 27
        assert bytes(response.payload) == _consumer_bytes(info.host, info.fetch_port, topic, 0, 27)[-len(
            response.payload):]
    finally:
        if owner is not None:
            owner.close()
        process.stop()


def test_a_fetch_is_refused_after_close_and_close_forgets_the_fetches_in_flight(broker):
    _process, port = broker
    topic, (info,) = _topic(port)
    owner = Owner(info.fetch_port, host=info.host, max_wait_ms=5000)
    owner.fetch(topic, 0, 0)
    owner.close()
    assert owner.fetcher.fileno() == -1 and owner.fetcher.in_flight_count == 0
    owner.fetcher.process(select.POLLIN, time.monotonic())
    assert owner.answers == [] and owner.lost == []
    with pytest.raises(RuntimeError, match="is closed"):
        owner.fetch(topic, 0, 0)


def test_a_response_that_is_not_the_fetchs_drops_the_connection_and_loses_the_fetch():
    """A leader answering out of order (here a stand-in that echoes a wrong correlation id)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        owner = Owner(listener.getsockname()[1], resend_lost=False)
        try:
            owner.fetch("t", 0, 0)
            owner.run_until(lambda: owner.fetcher.connected and not owner.fetcher.wants_write, what="sent")
            conn, _peer = listener.accept()
            with conn:
                frames = protocol.encode_response(protocol.FetchResponse(5, 0), correlation_id=999, version=1)
                conn.sendall(b"".join(protocol.frame_tcp(frames)))
                owner.run_until(lambda: owner.lost, what="the fetch lost")
            assert owner.answers == [] and owner.lost[0][1:] == ("t", 0)
            assert owner.fetcher.fileno() == -1
        finally:
            owner.close()


def test_a_leader_named_by_a_slow_resolving_host_name_never_blocks_the_loop(broker, monkeypatch):
    """The leader's host is a name whose lookup takes 1.5 s (a slow resolver): every call into the
    fetcher still returns at once, and the fetch is answered once the name is resolved."""
    _process, port = broker
    topic, (info,) = _topic(port)
    _produce(port, topic, 10)
    real = socket.getaddrinfo

    def slow(host, *args, **kwargs):
        if host == "leader.example":
            if kwargs.get("flags", 0) & socket.AI_NUMERICHOST:
                raise socket.gaierror(socket.EAI_NONAME, "not numeric")
            time.sleep(1.5)
            return real(info.host, *args, **kwargs)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    owner = Owner(info.fetch_port, host="leader.example")
    try:
        owner.fetch(topic, 0, 0)
        owner.run_until(lambda: owner.answers, what="the answer once the name is resolved")
        header, response = owner.take(topic, 0)
        assert header.error_code == 0 and response.high_watermark == 10
        assert owner.longest_call_s < 0.5, f"a call took {owner.longest_call_s:.2f} s"
    finally:
        owner.close()


def test_a_host_name_that_cannot_be_resolved_loses_the_fetch_and_is_tried_again(monkeypatch):
    def failing(host, *args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", failing)
    owner = Owner(9, host="nowhere.example", resend_lost=True)
    try:
        owner.fetch("t", 0, 0)
        owner.run_until(lambda: len(owner.lost) >= 2, what="the fetch lost twice")
        assert owner.answers == []
    finally:
        owner.close()
