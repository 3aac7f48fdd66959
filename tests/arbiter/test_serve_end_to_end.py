"""``hpbroker serve`` as a real broker: the arbiter with the real I/O workers, end to end."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

import pytest
from harness import BrokerProcess, Client, free_ports, pid_alive, wait_until

from hpbroker import protocol
from hpbroker.records import build_batch, decode_records, stamp_batch
from hpbroker.workers.ownership import owner_slot

TOPIC = "events"
PARTITIONS = 4
WORKERS = 2


@pytest.fixture
def broker(tmp_path):
    port = free_ports(WORKERS + 1)
    argv = [sys.executable, "-m", "hpbroker.cli", "serve", "--port", str(port), "--fetch-port", str(port + 1),
            "--workers", str(WORKERS), "--data-dir", str(tmp_path / "data"), "--host", "127.0.0.1"]
    env = {"HPBROKER_HEARTBEAT_INTERVAL_MS": "50", "HPBROKER_WORKER_TIMEOUT_MS": "3000",
           "HPBROKER_GRACEFUL_TIMEOUT_MS": "5000"}
    process = BrokerProcess(argv, tmp_path / "broker.log", env)
    client = Client(port)
    try:
        process.wait_for_log(rf"all {WORKERS} workers serving", timeout_s=20)
        yield process, client, port
    finally:
        client.close()
        status = process.stop()
        assert status == 0, process.log()


def stored(batch: bytes, base_offset: int) -> bytes:
    """The batch as the log keeps it: stamped with its base offset."""
    copy = bytearray(batch)
    stamp_batch(copy, 0, base_offset)
    return bytes(copy)


def produce(client, partition, batch, timeout_s=10.0):
    """Produce, retrying while the partition's worker is (re)starting; the response body."""
    deadline = time.monotonic() + timeout_s
    while True:
        header, response = client.request(protocol.ProduceRequest(TOPIC, partition, payload=batch))
        if header.error_code == 0:
            return response
        assert header.error_code == 15 and time.monotonic() < deadline, header
        time.sleep(0.02)


def fetch_all(client, partition, high_watermark):
    """Every batch of the partition from offset 0, over ZeroMQ."""
    payload, offset = b"", 0
    while offset < high_watermark:
        header, response = client.request(protocol.FetchRequest(TOPIC, partition, offset, max_wait_ms=0))
        assert header.error_code == 0, header
        chunk = bytes(response.payload)
        assert chunk, f"no progress at offset {offset} of {high_watermark}"
        payload += chunk
        offset = decode_records(chunk)[-1].offset + 1
    return payload


def tcp_fetch(port, partition, offset):
    request = protocol.frame_tcp(protocol.encode_request(
        protocol.FetchRequest(TOPIC, partition, offset, max_bytes=1 << 20, max_wait_ms=0), 7, "tcp"))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(b"".join(bytes(part) for part in request))
        decoder = protocol.TcpFrameDecoder()
        while True:
            data = connection.recv(1 << 16)
            assert data, "the data port closed the connection"
            messages = decoder.feed(data)
            if messages:
                return protocol.decode_response(protocol.ApiKey.FETCH, messages[0])


def test_produce_then_fetch_over_zeromq_and_the_data_ports(broker):
    process, client, port = broker
    header, _ = client.request(protocol.CreateTopicRequest(TOPIC, PARTITIONS))
    assert header.error_code == 0, header
    expected = {}
    for partition in range(PARTITIONS):
        batches = [build_batch([b"p%d-b%d-r%d" % (partition, b, r) for r in range(10)], producer="e2e")
                   for b in range(3)]
        expected[partition] = b""
        for number, batch in enumerate(batches):
            response = produce(client, partition, batch)
            assert response.base_offset == 10 * number
            expected[partition] += stored(batch, response.base_offset)
    _, metadata = client.request(protocol.MetadataRequest([TOPIC]))
    (topic,) = metadata.topics
    assert [p.partition for p in topic.partitions] == list(range(PARTITIONS))
    for meta in topic.partitions:
        assert meta.fetch_port == port + 1 + owner_slot(TOPIC, meta.partition, WORKERS)
        assert fetch_all(client, meta.partition, 30) == expected[meta.partition]
        header, response = tcp_fetch(meta.fetch_port, meta.partition, 0)
        assert (header.error_code, response.high_watermark) == (0, 30)
        assert bytes(response.payload) == expected[meta.partition]


def test_every_acknowledged_record_survives_a_worker_killed_during_produces(broker):
    process, client, _ = broker
    header, _ = client.request(protocol.CreateTopicRequest(TOPIC, PARTITIONS))
    assert header.error_code == 0, header
    victim = process.worker_pids()[0]
    acked: dict[int, list[tuple[int, list[bytes]]]] = {p: [] for p in range(PARTITIONS)}
    outcomes = []
    for round_ in range(40):
        sent = {}
        for partition in range(PARTITIONS):  # one produce in flight per partition
            values = [b"round%d-p%d-r%d" % (round_, partition, r) for r in range(20)]
            sent[client.send(protocol.ProduceRequest(TOPIC, partition, payload=build_batch(values)))] = \
                (partition, values)
            if round_ == 15 and partition == 1:
                os.kill(victim, signal.SIGKILL)
        for correlation_id, (partition, values) in sent.items():
            header, response = client.receive(protocol.ApiKey.PRODUCE, correlation_id, timeout_s=10)
            outcomes.append(header.error_code)
            if header.error_code == 0:
                acked[partition].append((response.base_offset, values))
            else:
                assert header.error_code == 15, header
        if round_ >= 15 and 15 in outcomes:
            time.sleep(0.01)
    assert 15 in outcomes, "the kill did not interrupt anything"
    process.wait_for_log(r"worker slot=0 pid=\d+ serving", count=2, timeout_s=20)
    assert process.worker_pids()[0] != victim

    def all_served():
        _, metadata = client.request(protocol.MetadataRequest([TOPIC]))
        return all(p.error_code == 0 for p in metadata.topics[0].partitions)

    wait_until(all_served, what="every partition served again")
    for partition, entries in acked.items():
        assert entries, f"nothing acknowledged on partition {partition}"
        end = max(base + len(values) for base, values in entries)
        records = {r.offset: r.value for r in decode_records(fetch_all(client, partition, end))}
        for base, values in entries:
            assert [records.get(base + i) for i in range(len(values))] == values


def test_every_acknowledged_record_survives_kill_9_of_the_whole_broker(tmp_path):
    port = free_ports(WORKERS + 1)
    argv = [sys.executable, "-m", "hpbroker.cli", "serve", "--port", str(port), "--fetch-port", str(port + 1),
            "--workers", str(WORKERS), "--data-dir", str(tmp_path / "data"), "--host", "127.0.0.1"]
    env = {"HPBROKER_HEARTBEAT_INTERVAL_MS": "50", "HPBROKER_GRACEFUL_TIMEOUT_MS": "5000"}
    first = BrokerProcess(argv, tmp_path / "first.log", env)
    client = Client(port)
    acked: dict[int, list[tuple[int, list[bytes]]]] = {p: [] for p in range(PARTITIONS)}
    try:
        first.wait_for_log(rf"all {WORKERS} workers serving", timeout_s=20)
        header, _ = client.request(protocol.CreateTopicRequest(TOPIC, PARTITIONS))
        assert header.error_code == 0, header
        pending = {}
        for round_ in range(30):
            for partition in range(PARTITIONS):
                values = [b"r%d-p%d-%d" % (round_, partition, i) for i in range(25)]
                request = protocol.ProduceRequest(TOPIC, partition, payload=build_batch(values))
                pending[client.send(request)] = (partition, values)
            if round_ == 29:  # the whole broker dies with requests in flight: no flush, no goodbye
                # The arbiter first, so that it cannot fork a worker into a slot just emptied.
                for pid in [first.process.pid, *first.worker_pids().values()]:
                    os.kill(pid, signal.SIGKILL)
            for correlation_id, (partition, values) in list(pending.items())[: PARTITIONS * (round_ < 29)]:
                header, response = client.receive(protocol.ApiKey.PRODUCE, correlation_id, timeout_s=10)
                assert header.error_code == 0, header
                acked[partition].append((response.base_offset, values))
                del pending[correlation_id]
    finally:
        client.close()
        first.process.wait(timeout=10)
        first.stop()
    wait_until(lambda: not any(pid_alive(pid) for pid in first.worker_pids().values()), 10,
               what="every worker of the killed broker to be gone")
    second = BrokerProcess(argv, tmp_path / "second.log", env)
    client = Client(port)
    try:
        second.wait_for_log(rf"all {WORKERS} workers serving", timeout_s=30)
        for partition, entries in acked.items():
            assert len(entries) == 29
            end = max(base + len(values) for base, values in entries)
            records = {r.offset: r.value for r in decode_records(fetch_all(client, partition, end))}
            for base, values in entries:
                assert [records.get(base + i) for i in range(len(values))] == values
    finally:
        client.close()
        assert second.stop() == 0, second.log()
