"""Idempotent produce against a real broker: a resent batch is stored once, across a slow
flush, a worker or whole-broker kill -9 between the send and the retry, and a producer state
snapshot that is missing or stale at the restart.

Requests are built by hand (hpbroker.protocol, hpbroker.records) so each test controls exactly
when the first copy is sent, when it is flushed and when the retry comes; the end-to-end case
with the public Producer is the last test.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from harness import Client, pid_alive, start_broker, wait_until

from hpbroker import protocol
from hpbroker.client import Producer
from hpbroker.records import build_batch, decode_records

TOPIC = "orders"


def _create(client: Client, name: str = TOPIC, **settings: str) -> None:
    configs = [protocol.TopicConfigEntry(key, value) for key, value in settings.items()]
    header, _ = client.request(protocol.CreateTopicRequest(name, 1, configs), timeout_s=20)
    assert header.error_code == 0, header.error_message


def _init_producer(client: Client) -> tuple[int, int]:
    header, response = client.request(protocol.InitProducerIdRequest(), timeout_s=20)
    assert header.error_code == 0, header.error_message
    return response.producer_id, response.producer_epoch


def _batch(values: list[bytes], producer_id: int, epoch: int, sequence: int) -> bytes:
    return build_batch(values, producer="e2e", base_sequence=sequence, producer_id=producer_id,
                       producer_epoch=epoch)


def _produce(client: Client, payload: bytes, *, timeout_s: float = 20.0, name: str = TOPIC):
    request = protocol.ProduceRequest(name, 0, acks=1, timeout_ms=30_000, payload=payload)
    return client.request(request, timeout_s=timeout_s)


def _read_all(client: Client, name: str = TOPIC) -> list[tuple[int, bytes]]:
    """Every record of partition 0, as (offset, value), from the start to the high watermark."""
    out: list[tuple[int, bytes]] = []
    offset = 0
    while True:
        header, response = client.request(protocol.FetchRequest(name, 0, offset, max_wait_ms=0), timeout_s=20)
        assert header.error_code == 0, header.error_message
        records = [r for r in decode_records(bytes(response.payload)) if r.offset >= offset]
        out += [(r.offset, r.value) for r in records]
        if not records or records[-1].offset + 1 >= response.high_watermark:
            return out
        offset = records[-1].offset + 1


def _kill_workers(broker) -> None:
    pids = list(broker.worker_pids().values())
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not any(pid_alive(pid) for pid in pids), 10, what="the workers to die")


def _kill_broker(broker) -> None:
    """kill -9 of every process of the broker at once (workers first, so none of them sees its
    arbiter die and closes its logs cleanly)."""
    workers = list(broker.worker_pids().values())
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    broker.process.kill()
    broker.process.wait(timeout=10)
    wait_until(lambda: not any(pid_alive(pid) for pid in workers), 10, what="the workers to die")
    broker.stop()


@pytest.fixture
def data(tmp_path) -> Path:
    return tmp_path / "data"


def _restart(tmp_path: Path, data: Path, port: int, n: int):
    return start_broker(data, tmp_path / f"broker-{n}.log", port=port, workers=1)[0]


def test_a_retry_while_the_first_copy_waits_for_its_flush_is_answered_with_its_offsets(tmp_path, data):
    broker, port = start_broker(data, tmp_path / "broker.log", workers=1)
    client = Client(port)
    try:
        _create(client, flush_ms="3000", flush_messages="1000000")
        pid, epoch = _init_producer(client)
        payload = _batch([b"a", b"b", b"c"], pid, epoch, 0)
        request = protocol.ProduceRequest(TOPIC, 0, acks=1, timeout_ms=30_000, payload=payload)
        first = client.send(request)
        time.sleep(0.3)  # the first copy is appended and waits for its flush
        second = client.send(request)
        h1, r1 = client.receive(protocol.ApiKey.PRODUCE, first, timeout_s=20)
        h2, r2 = client.receive(protocol.ApiKey.PRODUCE, second, timeout_s=20)
        assert (h1.error_code, r1.base_offset, r1.duplicate) == (0, 0, 0)
        assert (h2.error_code, r2.base_offset, r2.duplicate) == (0, 0, 1)
        assert _read_all(client) == [(0, b"a"), (1, b"b"), (2, b"c")]
    finally:
        client.close()
        assert broker.stop() == 0, broker.log()


@pytest.mark.parametrize("kill", ["worker", "broker"])
def test_a_retry_after_kill_9_between_send_and_retry_is_stored_once(tmp_path, data, kill):
    """The first copy was flushed (fdatasync'd) and its answer lost to a kill -9: after the
    restart the state is rebuilt from the log (no clean close wrote a snapshot) and the retry is
    answered with the stored copy's offsets."""
    broker, port = start_broker(data, tmp_path / "broker.log", workers=1)
    client = Client(port)
    try:
        _create(client)
        pid, epoch = _init_producer(client)
        header, response = _produce(client, _batch([b"x0"], pid, epoch, 0))
        assert header.error_code == 0 and response.base_offset == 0
        retried = _batch([b"x1", b"x2"], pid, epoch, 1)
        header, response = _produce(client, retried)
        assert header.error_code == 0 and response.base_offset == 1  # this answer is "lost"
        if kill == "worker":
            _kill_workers(broker)
            broker.wait_for_log(r"all 1 workers serving", count=2, timeout_s=30)
        else:
            _kill_broker(broker)
            client.close()
            broker = _restart(tmp_path, data, port, 1)
            client = Client(port)
        assert not list(data.glob("*/*.snapshot")) or kill == "worker"
        header, response = wait_until(lambda: _retry_answer(client, retried), 30, what="the retry's answer")
        assert (header.error_code, response.base_offset, response.duplicate) == (0, 1, 1)
        header, response = _produce(client, _batch([b"x3"], pid, epoch, 3))
        assert (header.error_code, response.base_offset, response.duplicate) == (0, 3, 0)
        assert _read_all(client) == [(0, b"x0"), (1, b"x1"), (2, b"x2"), (3, b"x3")]
    finally:
        client.close()
        assert broker.stop() == 0, broker.log()


def _retry_answer(client: Client, payload: bytes):
    """The answer to ``payload`` once the partition serves again (None while it restarts)."""
    header, response = _produce(client, payload)
    return None if header.error_code == 15 else (header, response)


def test_a_batch_lost_unflushed_by_kill_9_is_stored_by_its_retry(tmp_path, data):
    """Never flushed, never acknowledged: the retry is new, not a duplicate."""
    broker, port = start_broker(data, tmp_path / "broker.log", workers=1)
    client = Client(port)
    try:
        _create(client, flush_ms="60000", flush_messages="1000000")
        pid, epoch = _init_producer(client)
        payload = _batch([b"lost"], pid, epoch, 0)
        client.send(protocol.ProduceRequest(TOPIC, 0, acks=1, timeout_ms=60_000, payload=payload))
        time.sleep(0.3)
        _kill_workers(broker)
        broker.wait_for_log(r"all 1 workers serving", count=2, timeout_s=30)
        alter = protocol.AlterTopicConfigRequest(TOPIC, [protocol.TopicConfigEntry("flush_ms", "1")])
        assert client.request(alter, timeout_s=20)[0].error_code == 0
        header, response = wait_until(lambda: _retry_answer(client, payload), 30, what="the retry's answer")
        assert (header.error_code, response.base_offset, response.duplicate) == (0, 0, 0)
        assert [value for _, value in _read_all(client)] == [b"lost"]
    finally:
        client.close()
        assert broker.stop() == 0, broker.log()


@pytest.mark.parametrize("snapshot", ["deleted", "stale"])
def test_duplicates_are_found_when_the_snapshot_is_missing_or_stale(tmp_path, data, snapshot):
    """A clean stop writes a snapshot at the log end.  Deleted: the state is rebuilt from the
    log.  Stale: the snapshot taken at a roll is kept and the batches after it are re-read."""
    broker, port = start_broker(data, tmp_path / "broker.log", workers=1)
    client = Client(port)
    try:
        _create(client, segment_bytes="4096")
        pid, epoch = _init_producer(client)
        payloads = [_batch([bytes([i]) * 1000], pid, epoch, i) for i in range(12)]  # rolls several times
        for i, payload in enumerate(payloads):
            header, response = _produce(client, payload)
            assert header.error_code == 0 and response.base_offset == i
        client.close()
        if snapshot == "deleted":
            assert broker.stop() == 0, broker.log()
            snapshots = list(data.glob("*/*.snapshot"))
            assert snapshots, "a clean stop leaves a producer state snapshot"
            for path in snapshots:
                path.unlink()
        else:
            _kill_broker(broker)  # no snapshot at the log end: only those written at the rolls
            ends = sorted(int(path.stem) for path in data.glob("*/*.snapshot"))
            assert ends and ends[-1] < 12, ends
        broker = _restart(tmp_path, data, port, 1)
        client = Client(port)
        for i in (10, 11):  # the last batches: below the newest snapshot they would be in it
            header, response = _produce(client, payloads[i])
            assert (header.error_code, response.base_offset, response.duplicate) == (0, i, 1)
        header, response = _produce(client, _batch([b"next"], pid, epoch, 12))
        assert (header.error_code, response.base_offset, response.duplicate) == (0, 12, 0)
        assert len(_read_all(client)) == 13
    finally:
        client.close()
        assert broker.stop() == 0, broker.log()


def test_bad_producer_input_gets_its_error_and_appends_nothing(tmp_path, data):
    broker, port = start_broker(data, tmp_path / "broker.log", workers=1)
    client = Client(port)
    try:
        _create(client)
        pid, epoch = _init_producer(client)
        assert _produce(client, _batch([b"0"], pid, epoch, 0))[0].error_code == 0
        cases = {
            20: _batch([b"gap"], pid, epoch, 5),  # the sequence jumps
            22: _batch([b"forged"], pid + 10_000, 0, 0),  # an id the broker never issued
        }
        for code, payload in cases.items():
            header, _ = _produce(client, payload)
            assert header.error_code == code, (code, header)
        # An epoch going backwards: bump it, write with the new one, then the old one is fenced.
        header, response = client.request(protocol.InitProducerIdRequest(pid, epoch), timeout_s=20)
        assert header.error_code == 0 and (response.producer_id, response.producer_epoch) == (pid, epoch + 1)
        assert _produce(client, _batch([b"new epoch"], pid, epoch + 1, 0))[0].error_code == 0
        assert _produce(client, _batch([b"old epoch"], pid, epoch, 1))[0].error_code == 21
        assert [value for _, value in _read_all(client)] == [b"0", b"new epoch"]
    finally:
        client.close()
        assert broker.stop() == 0, broker.log()


def test_the_measured_case_slow_flush_short_timeout_and_retries_stores_one_copy(tmp_path, data):
    """The producer's requests time out (1.5 s) long before the topic flushes (every 4 s): it
    resends, and the broker answers each resend with the first copy's offsets once flushed."""
    broker, port = start_broker(data, tmp_path / "broker.log", workers=1)
    client = Client(port)
    try:
        _create(client, flush_ms="4000", flush_messages="1000000")
        with Producer(f"127.0.0.1:{port}", request_timeout_ms=1500, delivery_timeout_ms=60_000,
                      retry_backoff_ms=100) as producer:
            futures = [producer.send_future(TOPIC, f"r{i}".encode(), partition=0) for i in range(500)]
            producer.flush(60)
            acknowledged = [future.result(timeout=1) for future in futures]
        assert sorted(m.offset for m in acknowledged) == list(range(500))
        records = _read_all(client)
        assert len(records) == 500
        assert [value for _, value in records] == [f"r{i}".encode() for i in range(500)]
    finally:
        client.close()
        assert broker.stop() == 0, broker.log()
