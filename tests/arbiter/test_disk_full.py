"""A real broker whose data directory (run files included) lives on a small filesystem that produce
load fills: the broker stays up, producers get error 7 ("no space left on device"), fetch and
list-offsets keep serving every acknowledged record and nothing else, a worker killed meanwhile
comes back and serves reads, and writes resume by themselves once space is freed."""

from __future__ import annotations

import os
import signal
import time

import pytest
from harness import Client, pid_alive, start_broker, wait_until
from small_fs import KINDS, fill, small_filesystem, unfill

from hpbroker import protocol
from hpbroker.errors import StorageError
from hpbroker.records import build_batch, decode_records
from hpbroker.workers.ownership import owner_slot

TOPIC = "full"
PARTITIONS = 2
WORKERS = 2
FS_BYTES = 24 << 20
RECORD_BYTES = 4 << 10
RETENTION_MS = 5000
WORKER_TIMEOUT_MS = 4000  # a worker silent this long is aborted: heartbeats must not need space


def produce(client: Client, partition: int, tag: str) -> tuple[int, int, str]:
    """(error code, base offset, error message) of one acks=1 produce of 4 records."""
    values = [f"{tag}/{i}/".encode().ljust(RECORD_BYTES, b".") for i in range(4)]
    request = protocol.ProduceRequest(TOPIC, partition, timeout_ms=10_000,
                                      payload=build_batch(values, producer="disk-full"))
    header, response = client.request(request, timeout_s=20)
    return header.error_code, getattr(response, "base_offset", -1), header.error_message


def produce_until_full(client: Client, acknowledged: dict[int, list[bytes]], round_tag: str) -> str:
    """Produce to every partition until each refuses with error 7; the last refusal's message."""
    refused: dict[int, str] = {}
    deadline = time.monotonic() + 120
    for i in range(20_000):  # bounded: the filesystem holds far fewer batches
        assert time.monotonic() < deadline, f"the disk never filled: {refused}"
        partition = i % PARTITIONS
        if partition in refused:
            if len(refused) == PARTITIONS:
                return refused[partition]
            continue
        code, base_offset, message = produce(client, partition, f"{round_tag}-{i}")
        if code == StorageError.code:
            refused[partition] = message
            continue
        assert code == 0, message
        assert base_offset == len(acknowledged[partition]), "offsets stay contiguous"
        acknowledged[partition].extend(f"{round_tag}-{i}/{r}/".encode().ljust(RECORD_BYTES, b".")
                                       for r in range(4))
    raise AssertionError(f"the disk never filled: {refused}")


def fetch_all(client: Client, partition: int) -> tuple[list[bytes], int]:
    """(every record value from offset 0 to the high watermark, the high watermark)."""
    return fetch_from(client, partition, 0)


def fetch_from(client: Client, partition: int, start: int) -> tuple[list[bytes], int]:
    """(every record value from ``start`` to the high watermark, the high watermark)."""
    values: list[bytes] = []
    high_watermark = None
    while high_watermark is None or start + len(values) < high_watermark:
        offset = start + len(values)
        header, response = client.request(protocol.FetchRequest(TOPIC, partition, offset, max_wait_ms=0))
        assert header.error_code == 0, header
        high_watermark = response.high_watermark
        records = [r for r in decode_records(response.payload) if r.offset >= offset]
        if not records:
            break
        assert records[0].offset == offset
        values.extend(r.value for r in records)
    return values, high_watermark


def assert_serves_exactly(client: Client, acknowledged: dict[int, list[bytes]]) -> None:
    for partition in range(PARTITIONS):
        values, high_watermark = fetch_all(client, partition)
        assert high_watermark == len(acknowledged[partition]), "nothing unacknowledged is visible"
        assert values == acknowledged[partition]
        for timestamp, expected in ((protocol.LATEST_TIMESTAMP, high_watermark),
                                    (protocol.EARLIEST_TIMESTAMP, 0)):
            header, response = client.request(protocol.ListOffsetsRequest(TOPIC, partition, timestamp))
            assert (header.error_code, response.offset) == (0, expected), header


def wait_for_writes(client: Client, acknowledged: dict[int, list[bytes]], round_tag: str) -> None:
    """Produce to each partition until it takes the batch again (it resumes by itself)."""
    for partition in range(PARTITIONS):
        deadline = time.monotonic() + 30
        for n in range(10_000):  # bounded: at most 30 s of one attempt per 0.1 s
            tag = f"{round_tag}-{partition}-{n}"
            code, base_offset, message = produce(client, partition, tag)
            if code != StorageError.code:
                break
            assert time.monotonic() < deadline, f"partition {partition} never took writes again: {message}"
            time.sleep(0.1)
        assert (code, base_offset) == (0, len(acknowledged[partition])), message
        acknowledged[partition].extend(f"{tag}/{r}/".encode().ljust(RECORD_BYTES, b".") for r in range(4))


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_full_disk_keeps_the_broker_up_serving_reads_and_writes_resume_once_space_is_freed(tmp_path, kind):
    with small_filesystem(kind, tmp_path, FS_BYTES) as mnt:
        data_dir = mnt / "data"
        broker, port = start_broker(data_dir, tmp_path / "broker.log", workers=WORKERS,
                                    env={"HPBROKER_WORKER_TIMEOUT_MS": str(WORKER_TIMEOUT_MS)})
        client = Client(port)
        try:
            configs = [protocol.TopicConfigEntry("segment_bytes", str(256 << 10))]
            header, _ = client.request(protocol.CreateTopicRequest(TOPIC, PARTITIONS, configs))
            assert header.error_code == 0, header
            fill(mnt / "filler", leave_bytes=2 << 20)  # produce fills the last 2 MiB
            acknowledged: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
            message = produce_until_full(client, acknowledged, "a")
            assert "no space left on device" in message and "retriable" in message, message
            pids = broker.worker_pids()
            fill(mnt / "filler-2")  # whatever a cut write gave back: now nothing is left at all

            # Heartbeats cannot be written now: for longer than the worker timeout, no worker may die.
            broker.wait_for_log(r"cannot write the heartbeat's content", timeout_s=30)
            time.sleep(1.5 * WORKER_TIMEOUT_MS / 1000)
            assert broker.process.poll() is None, broker.log()
            assert broker.worker_pids() == pids, "no worker was aborted"
            assert "no heartbeat" not in broker.log()
            for partition in range(PARTITIONS):
                code, _, message = produce(client, partition, "refused")
                assert code == StorageError.code and "no space left on device" in message
            assert_serves_exactly(client, acknowledged)

            # A worker killed while the disk is full comes back and serves reads.
            slot = owner_slot(TOPIC, 0, WORKERS)
            os.kill(pids[slot], signal.SIGKILL)
            wait_until(lambda: broker.worker_pids()[slot] != pids[slot], 20, what="the slot respawned")
            broker.wait_for_log(rf"worker slot={slot} pid={broker.worker_pids()[slot]} serving", timeout_s=20)
            assert broker.process.poll() is None and not pid_alive(pids[slot])
            wait_until(lambda: _serves(client, acknowledged), 20, what="the respawned worker serving reads")
            assert produce(client, 0, "refused")[0] == StorageError.code

            unfill(mnt / "filler")
            unfill(mnt / "filler-2")
            wait_for_writes(client, acknowledged, "b")
            assert_serves_exactly(client, acknowledged)
        finally:
            client.close()
            code = broker.stop()
        assert code == 0, broker.log()


def _serves(client: Client, acknowledged: dict[int, list[bytes]]) -> bool:
    try:
        assert_serves_exactly(client, acknowledged)
    except AssertionError:
        return False
    return True


@pytest.mark.slow
def test_writes_resume_when_retention_frees_the_full_disk(tmp_path):
    with small_filesystem("tmpfs", tmp_path, FS_BYTES) as mnt:
        broker, port = start_broker(mnt / "data", tmp_path / "broker.log", workers=WORKERS,
                                    env={"HPBROKER_RETENTION_CHECK_INTERVAL_MS": "100"})
        client = Client(port)
        try:
            # Segments expire RETENTION_MS after their records' timestamps: the disk fills well
            # before (2 MiB in about a hundred requests), and retention frees it afterwards.  (A
            # topic's settings cannot be altered on a full disk: topics.json cannot be written.)
            configs = [protocol.TopicConfigEntry("segment_bytes", str(128 << 10)),
                       protocol.TopicConfigEntry("retention_ms", str(RETENTION_MS)),
                       protocol.TopicConfigEntry("file_delete_delay_ms", "0")]
            header, _ = client.request(protocol.CreateTopicRequest(TOPIC, PARTITIONS, configs))
            assert header.error_code == 0, header
            fill(mnt / "filler", leave_bytes=2 << 20)
            acknowledged: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
            produce_until_full(client, acknowledged, "a")
            fill(mnt / "filler-2")  # the fillers stay: only retention gives space back
            wait_for_writes(client, acknowledged, "b")
            for partition in range(PARTITIONS):
                header, earliest = client.request(
                    protocol.ListOffsetsRequest(TOPIC, partition, protocol.EARLIEST_TIMESTAMP))
                assert header.error_code == 0 and earliest.offset > 0, "retention deleted segments"
                values, high_watermark = fetch_from(client, partition, earliest.offset)
                assert high_watermark == len(acknowledged[partition])
                assert values == acknowledged[partition][earliest.offset:]
            assert broker.process.poll() is None
        finally:
            client.close()
            code = broker.stop()
        assert code == 0, broker.log()
