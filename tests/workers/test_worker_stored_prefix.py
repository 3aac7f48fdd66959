"""A real worker process, killed with -9 after a produce request of three idempotent batches, whose
disk then holds only the request's first batch (what a power loss in the middle of the flush's
writev leaves): the producer's resend of the whole request is stored once and contiguous, and
answered from the stored batch's offset with duplicate 0; with another producer's records after
the stored batch, the resend is error 20 and nothing is appended.  And the partition in process:
the resend waits for its new part's flush, and counts the stored prefix as duplicate records."""

from __future__ import annotations

import os
import signal
import time

from worker_harness import fetch_request, produce_request, values_of

from hpbroker import protocol, records
from hpbroker.errors import OutOfOrderSequenceError
from hpbroker.io import LogConfig, PartitionLog
from hpbroker.workers.partitions import DeadlineQueue, Flusher, Partition

PRODUCE = protocol.ApiKey.PRODUCE
LOG = {"flush_fsync": True}


def idempotent(sequence: int, count: int, *, producer_id: int = 7) -> bytes:
    values = [f"{producer_id}:{sequence + i}".encode() for i in range(count)]
    return records.build_batch(values, producer="p", base_sequence=sequence, producer_id=producer_id,
                               producer_epoch=0)


FIRST = idempotent(0, 2, producer_id=5)  # offsets 0..1, another producer
BATCHES = [idempotent(0, 2), idempotent(2, 3), idempotent(5, 1)]  # offsets 2..3, 4..6, 7
REQUEST = b"".join(BATCHES)


def issue_ids_below(data_dir: str, ceiling: int) -> None:
    """What the arbiter writes before it answers an InitProducerId (docs/PROTOCOL.md)."""
    os.makedirs(data_dir, exist_ok=True)
    tmp = os.path.join(data_dir, "producer-ids-issued.tmp")
    with open(tmp, "w") as f:
        f.write(f"0\n{ceiling}\n")
    os.replace(tmp, os.path.join(data_dir, "producer-ids-issued"))


def stored_values(arbiter) -> list[bytes]:
    header, response = arbiter.call(0, fetch_request("orders", 0, 0))
    assert header.error_code == 0
    return values_of(response.payload)


def crash_after_the_first_batch(start_worker, arbiter, data_dir):
    """Store FIRST and REQUEST, kill -9 the worker, cut the segment after REQUEST's first batch,
    start the worker again."""
    issue_ids_below(data_dir, 1000)
    worker = start_worker(log=LOG)
    header, response = arbiter.call(0, produce_request("orders", 0, FIRST))
    assert (header.error_code, response.base_offset) == (0, 0)
    header, response = arbiter.call(0, produce_request("orders", 0, REQUEST))
    assert (header.error_code, response.base_offset, response.duplicate) == (0, 2, 0)
    worker.signal(signal.SIGKILL)  # no clean close: no snapshot at the log end
    assert worker.wait() == -signal.SIGKILL
    path = os.path.join(worker.directory("orders", 0), "00000000000000000000.log")
    assert os.path.getsize(path) == len(FIRST) + len(REQUEST)
    os.truncate(path, len(FIRST) + len(BATCHES[0]))  # the disk kept the writev's first batch only
    start_worker(log=LOG)
    assert stored_values(arbiter) == [b"5:0", b"5:1", b"7:0", b"7:1"]


def test_a_resend_after_the_disk_kept_only_its_first_batch_stores_the_rest_after_it(start_worker, arbiter,
                                                                                     data_dir):
    crash_after_the_first_batch(start_worker, arbiter, data_dir)
    header, response = arbiter.call(0, produce_request("orders", 0, REQUEST))
    assert (header.error_code, response.base_offset, response.duplicate) == (0, 2, 0)
    assert stored_values(arbiter) == [b"5:0", b"5:1"] + [f"7:{s}".encode() for s in range(6)]
    header, response = arbiter.call(0, produce_request("orders", 0, REQUEST))
    assert (header.error_code, response.base_offset, response.duplicate) == (0, 2, 1), "now stored whole"
    header, response = arbiter.call(0, produce_request("orders", 0, idempotent(6, 1)))
    assert (header.error_code, response.base_offset, response.duplicate) == (0, 8, 0)


def test_a_resend_after_another_producer_wrote_behind_its_first_batch_is_out_of_order(start_worker, arbiter,
                                                                                      data_dir):
    crash_after_the_first_batch(start_worker, arbiter, data_dir)
    header, response = arbiter.call(0, produce_request("orders", 0, idempotent(2, 1, producer_id=5)))
    assert (header.error_code, response.base_offset) == (0, 4)
    header, _ = arbiter.call(0, produce_request("orders", 0, REQUEST))
    assert header.error_code == OutOfOrderSequenceError.code
    assert "ends at offset 3, not at the log end 5" in header.error_message, header.error_message
    assert stored_values(arbiter) == [b"5:0", b"5:1", b"7:0", b"7:1", b"5:2"], "nothing appended"


def test_the_partition_counts_the_stored_prefix_as_duplicate_records(tmp_path):
    directory = str(tmp_path / "orders-0")
    config = LogConfig(flush_ms=0, flush_fsync=True)
    log = PartitionLog(directory, config)
    log.append(FIRST)
    log.append(REQUEST)
    log.flush()
    path = log.segments[-1].path
    log._abandon()  # kill -9
    os.truncate(path, len(FIRST) + len(BATCHES[0]))
    partition = Partition("orders", 0, PartitionLog(directory, config, flush_on_append=False), Flusher(),
                          DeadlineQueue(), set())
    replies: list = []
    try:
        partition.produce(memoryview(REQUEST), 1, 9, replies.append, time.monotonic() + 30, 30_000, version=1)
        assert replies == [], "answered once the new part is flushed"
        for job in list(partition.flushes):
            job.run()  # as the flusher's thread would
        partition.complete_flushes()
        header, body = protocol.decode_response(PRODUCE, [replies[0].head], version=1)
        assert (header.correlation_id, header.error_code, body.base_offset, body.duplicate) == (9, 0, 2, 0)
        assert (partition.produced_records, partition.duplicate_records) == (4, 2)
    finally:
        partition.log.close()
