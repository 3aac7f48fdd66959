"""A partition answers an idempotent producer's retry once the stored copy is flushed, with the
stored copy's offsets, in request order, in the version asked (in process: a real log, the
group commits run by hand)."""

from __future__ import annotations

import os
import time

from hpbroker import protocol, records
from hpbroker.errors import OutOfOrderSequenceError, StorageError
from hpbroker.io import LogConfig, PartitionLog
from hpbroker.workers.partitions import DeadlineQueue, Flusher, Partition

PRODUCE = protocol.ApiKey.PRODUCE


def idempotent(sequence: int, count: int = 2, *, producer_id: int = 7, epoch: int = 0) -> bytes:
    values = [f"{producer_id}:{sequence + i}".encode() for i in range(count)]
    return records.build_batch(values, producer="p", base_sequence=sequence, producer_id=producer_id,
                               producer_epoch=epoch)


def open_partition(tmp_path, **config) -> Partition:
    log = PartitionLog(tmp_path / "t-0", LogConfig(flush_ms=0, flush_fsync=True, **config),
                       flush_on_append=False)
    return Partition("t", 0, log, Flusher(), DeadlineQueue(), set())


def produce(partition: Partition, replies: list, payload: bytes, correlation_id: int,
            version: int = 1) -> None:
    partition.produce(memoryview(payload), 1, correlation_id, replies.append, time.monotonic() + 30, 30_000,
                      version=version)


def decoded(reply, version: int = 1):
    frames = [reply.head] + ([reply.payload] if reply.payload else [])
    return protocol.decode_response(PRODUCE, frames, version=version)


def complete(partition: Partition) -> None:
    for job in list(partition.flushes):
        job.run()  # as the flusher's thread would
    partition.complete_flushes()


def test_a_retry_while_the_first_copy_is_in_flight_is_answered_after_it_with_its_offsets(tmp_path):
    partition, replies = open_partition(tmp_path), []
    try:
        batch = idempotent(0, 3)
        produce(partition, replies, batch, 1)
        assert len(partition.flushes) == 1 and replies == []
        produce(partition, replies, batch, 2)
        assert replies == [], "the stored copy is not flushed yet"
        assert partition.log.log_end_offset == 3 and partition.duplicate_records == 3
        complete(partition)
        answers = [decoded(r) for r in replies]
        assert [(h.correlation_id, h.error_code, b.base_offset, b.duplicate) for h, b in answers] == [
            (1, 0, 0, 0), (2, 0, 0, 1)]
        assert partition.produced_records == 3
        assert len(records.decode_records(partition.log.read_bytes(0, 1 << 20))) == 3, "stored once"
    finally:
        partition.log.close()


def test_a_retry_of_a_flushed_request_is_answered_at_once(tmp_path):
    partition, replies = open_partition(tmp_path), []
    try:
        produce(partition, replies, idempotent(0), 1)
        complete(partition)
        produce(partition, replies, idempotent(2), 2)
        complete(partition)
        produce(partition, replies, idempotent(0), 3)
        header, body = decoded(replies[-1])
        assert (header.correlation_id, body.base_offset, body.duplicate) == (3, 0, 1)
    finally:
        partition.log.close()


def test_a_version_0_request_gets_a_version_0_answer_for_a_duplicate(tmp_path):
    partition, replies = open_partition(tmp_path), []
    try:
        produce(partition, replies, idempotent(0), 1, version=0)
        complete(partition)
        produce(partition, replies, idempotent(0), 2, version=0)
        header, body = decoded(replies[-1], version=0)
        assert (header.correlation_id, header.error_code, body.base_offset) == (2, 0, 0)
        assert len(replies[-1].head) == len(replies[0].head)
    finally:
        partition.log.close()


def test_a_sequence_error_waits_behind_the_requests_before_it(tmp_path):
    partition, replies = open_partition(tmp_path), []
    try:
        produce(partition, replies, idempotent(0), 1)
        produce(partition, replies, idempotent(5), 2)
        assert replies == [], "decided, but answered in order"
        complete(partition)
        codes = [(h.correlation_id, h.error_code) for h, _ in map(decoded, replies)]
        assert codes == [(1, 0), (2, OutOfOrderSequenceError.code)]
        assert partition.log.log_end_offset == 2
    finally:
        partition.log.close()


def test_a_write_failure_fails_the_retry_with_the_original_and_the_next_retry_is_stored(tmp_path):
    partition, replies = open_partition(tmp_path), []
    log = partition.log
    try:
        batch = idempotent(0, 2)
        produce(partition, replies, batch, 1)
        produce(partition, replies, batch, 2)
        job = partition.flushes[0]
        fd = log.segments[-1].log.fd
        read_only = os.open(log.segments[-1].path, os.O_RDONLY)
        saved = os.dup(fd)
        os.dup2(read_only, fd)
        try:
            job.run()  # its writev fails: nothing acknowledged
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            os.close(read_only)
        partition.complete_flushes()
        assert [h.error_code for h, _ in map(decoded, replies)] == [StorageError.code] * 2
        assert log.resume_writes()
        produce(partition, replies, batch, 3)
        complete(partition)
        header, body = decoded(replies[-1])
        assert (header.error_code, body.base_offset, body.duplicate) == (0, 0, 0), "stored, not a duplicate"
    finally:
        log.close()
