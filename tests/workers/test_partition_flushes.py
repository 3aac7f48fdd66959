"""Where a partition's group commits run, in process: on the loop or on the flusher's thread."""

from __future__ import annotations

import time

from hpbroker.io import LogConfig, PartitionLog
from hpbroker.records import build_batch
from hpbroker.workers.partitions import DeadlineQueue, Flusher, Partition


def _partition(tmp_path, *, fsync: bool) -> tuple[Partition, list]:
    config = LogConfig(flush_ms=0, flush_fsync=fsync)
    log = PartitionLog(tmp_path / "t-0", config, flush_on_append=False)
    return Partition("t", 0, log, Flusher(), DeadlineQueue(), set()), []


def _produce(partition: Partition, replies: list, values: list[bytes], correlation_id: int) -> None:
    partition.produce(memoryview(build_batch(values)), 1, correlation_id, replies.append,
                      time.monotonic() + 30, 30_000)


def test_a_commit_without_fdatasync_is_written_and_answered_before_produce_returns(tmp_path):
    partition, replies = _partition(tmp_path, fsync=False)  # the flusher's thread never started
    try:
        _produce(partition, replies, [b"a", b"b"], 1)
        assert partition.log.high_watermark == 2 and not partition.flushes
        assert len(replies) == 1, "answered at once: no thread ran the commit"
        _produce(partition, replies, [b"c"], 2)
        assert partition.log.high_watermark == 3 and len(replies) == 2
        assert (tmp_path / "t-0").exists()
    finally:
        partition.log.close()


def test_a_commit_with_fdatasync_goes_to_the_flusher_and_waits_for_it(tmp_path):
    partition, replies = _partition(tmp_path, fsync=True)
    try:
        _produce(partition, replies, [b"a"], 1)
        assert partition.log.high_watermark == 0 and len(partition.flushes) == 1 and replies == []
        partition.flushes[0].run()  # as the flusher's thread would
        partition.complete_flushes()
        assert partition.log.high_watermark == 1 and len(replies) == 1
    finally:
        partition.log.close()
