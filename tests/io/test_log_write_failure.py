"""The *writes failed* state of a partition log: a full disk or a failed fdatasync refuses appends,
drops what was not acknowledged, keeps serving the acknowledged records, and resumes by itself
once the disk allows it, after re-reading the tail from the disk."""

from __future__ import annotations

import errno
import os

import pytest
from small_fs import KINDS, fill, small_filesystem
from storage_helpers import TEST_CONFIG, make_batch, make_unwritable, read_all, read_around_damage, stamped

from hpbroker.errors import StorageError
from hpbroker.io import PartitionLog, _writer

FS_BYTES = 4 << 20


@pytest.mark.parametrize("kind", KINDS)
def test_a_full_disk_refuses_appends_keeps_reads_and_resumes_once_space_is_freed(tmp_path, clock, kind):
    with small_filesystem(kind, tmp_path, FS_BYTES) as mnt:
        fill(mnt / "filler", leave_bytes=512 << 10)
        config = TEST_CONFIG.replace(segment_bytes=128 << 10, flush_fsync=True, flush_messages=1)
        log = PartitionLog(mnt / "orders-0", config, clock=clock)
        try:
            acknowledged: list[tuple[int, bytes]] = []
            failure = None
            for i in range(2000):  # about 8 MiB at most: far more than the free space
                batch = make_batch(4, value_bytes=1000, tag=i)
                try:
                    info = log.append(batch)  # flush_messages=1: written and fdatasync'd here
                except StorageError as e:
                    failure = e
                    break
                acknowledged.append((info.first_offset, stamped(batch, info.first_offset)))
            assert failure is not None, "the filesystem never filled"
            assert "no space left on device" in failure.message and "retriable" in failure.message
            assert isinstance(failure.__cause__, OSError) and failure.__cause__.errno == errno.ENOSPC
            assert not log.writable and not log.offline and log.write_failure is not None
            end = acknowledged[-1][0] + 4
            assert log.high_watermark == log.log_end_offset == end, "nothing unacknowledged is kept"
            active = log.segments[-1]
            assert os.stat(active.path).st_size == active.size_in_bytes, "a torn write is cut at once"
            assert read_all(log) == acknowledged
            with pytest.raises(StorageError, match="no space left on device"):
                log.append(make_batch(1))
            assert not log.resume_writes(), "still full"

            os.unlink(mnt / "filler")
            assert log.resume_writes() and log.writable
            batch = make_batch(2, tag=9999)
            assert log.append(batch).first_offset == end, "offsets stay contiguous"
            assert read_all(log) == acknowledged + [(end, stamped(batch, end))]
        finally:
            log.close()
        with PartitionLog(mnt / "orders-0", config, clock=clock) as reopened:
            assert read_all(reopened) == acknowledged + [(end, stamped(batch, end))]


def test_a_log_opened_on_a_full_disk_serves_reads_and_resumes_writes_later(tmp_path, clock):
    with small_filesystem("tmpfs", tmp_path, 1 << 20) as mnt:
        config = TEST_CONFIG.replace(flush_fsync=True)
        log = PartitionLog(mnt / "orders-0", config, clock=clock)
        batches = [make_batch(2, tag=i) for i in range(3)]
        for batch in batches:
            log.append(batch)
        log.flush()
        log._abandon()  # a crash: the checkpoint is behind the log end
        fill(mnt / "filler")
        log = PartitionLog(mnt / "orders-0", config, clock=clock)
        try:
            assert not log.writable and "no space left on device" in log.write_failure.message
            assert read_all(log) == [(2 * i, stamped(b, 2 * i)) for i, b in enumerate(batches)]
            os.unlink(mnt / "filler")
            assert log.resume_writes()
            assert log.append(make_batch(1)).first_offset == 6
        finally:
            log.close()


def test_a_failed_fdatasync_is_never_acknowledged_and_its_bytes_are_cut(log_dir, clock):
    log = PartitionLog(log_dir, TEST_CONFIG.replace(flush_fsync=True), clock=clock, flush_on_append=False)
    try:
        kept = make_batch(2, tag=1)
        log.append(kept)
        log.complete_flush(log.begin_flush())
        log.append(make_batch(3, tag=2))
        job = log.begin_flush()
        fd, path = log.segments[-1].log.fd, log.segments[-1].path
        pipe_r, pipe_w = os.pipe()

        def fail_the_sync(operation: str, traced_fd: int) -> None:
            if operation == "writev" and traced_fd == fd:
                os.dup2(pipe_r, fd)  # fdatasync of a pipe: EINVAL, after the batch was written

        _writer.set_trace(fail_the_sync)
        try:
            job.run()
        finally:
            _writer.set_trace(None)
        assert isinstance(job.error, OSError) and job.written == job.size
        writable = os.open(path, os.O_RDWR | os.O_APPEND)  # as the log opened it
        os.dup2(writable, fd)
        for extra in (writable, pipe_r, pipe_w):
            os.close(extra)
        assert os.stat(path).st_size > log.segments[-1].size_in_bytes, "the unsynced batch is in the file"

        with pytest.raises(StorageError, match="re-read and verified"):
            log.complete_flush(job)
        assert not log.writable and not log.offline
        assert log.high_watermark == log.log_end_offset == 2
        assert os.stat(path).st_size == log.segments[-1].size_in_bytes, "its bytes are cut"
        assert read_all(log) == [(0, stamped(kept, 0))]
        with pytest.raises(StorageError):
            log.append(make_batch(1))

        assert log.resume_writes()
        again = make_batch(1, tag=3)
        log.append(again)
        log.complete_flush(log.begin_flush())
        assert read_all(log) == [(0, stamped(kept, 0)), (2, stamped(again, 2))]
    finally:
        log.close()


def test_a_failed_flush_drops_the_flushes_after_it(log_dir, clock):
    log = PartitionLog(log_dir, TEST_CONFIG, clock=clock, flush_on_append=False)
    try:
        log.append(make_batch(1, tag=1))
        first = log.begin_flush()
        log.append(make_batch(1, tag=2))
        second = log.begin_flush()
        log.append(make_batch(1, tag=3))  # pending
        fd = log.segments[-1].log.fd
        read_only = os.open(log.segments[-1].path, os.O_RDONLY)
        saved = os.dup(fd)
        os.dup2(read_only, fd)
        first.run()
        os.dup2(saved, fd)
        os.close(saved)
        os.close(read_only)
        assert isinstance(first.error, OSError)
        with pytest.raises(StorageError, match="complete_flush failed"):
            log.complete_flush(first)
        assert second.dropped and log.pending_records == 0 and log.log_end_offset == 0
        with pytest.raises(StorageError, match="re-read and verified"):
            log.complete_flush(second)
        assert log.resume_writes()
        log.append(make_batch(1, tag=4))
        log.flush()
        assert [offset for offset, _ in read_all(log)] == [0]
    finally:
        log.close()


def test_an_fdatasync_failing_again_keeps_writes_refused(log_dir, clock, monkeypatch):
    log = PartitionLog(log_dir, TEST_CONFIG, clock=clock)
    try:
        batch = make_batch(2)
        log.append(batch)
        log.flush()  # flush_fsync off: acknowledged in the page cache
        real = os.fdatasync

        def failing(fd: int) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", failing)
        with pytest.raises(StorageError, match="checkpoint failed"):
            log.checkpoint()
        assert not log.writable and read_all(log) == [(0, stamped(batch, 0))]
        assert not log.resume_writes(), "the re-read needs a working fdatasync first"
        monkeypatch.setattr(os, "fdatasync", real)
        assert log.resume_writes()
        assert read_all(log) == [(0, stamped(batch, 0))] and log.log_end_offset == 2
    finally:
        log.close()


def test_a_roll_that_failed_halfway_leaves_nothing_that_blocks_later_rolls(log_dir, clock, monkeypatch):
    from hpbroker.io import index

    log = PartitionLog(log_dir, TEST_CONFIG.replace(segment_bytes=1024, flush_messages=1), clock=clock)
    try:
        batches = [make_batch(1, value_bytes=300, tag=i) for i in range(3)]
        for batch in batches[:2]:
            log.append(batch)
        real_init = index.OffsetIndex.__init__

        def no_space(self, path):  # the new segment's .log exists, its index cannot be made
            raise OSError(errno.ENOSPC, "No space left on device", path)

        monkeypatch.setattr(index.OffsetIndex, "__init__", no_space)
        ends = log.log_end_offset
        with pytest.raises(StorageError, match="no space left on device"):
            for i in range(3, 10):
                log.append(make_batch(1, value_bytes=300, tag=i))
                ends = log.log_end_offset
        assert log.log_end_offset == log.high_watermark == ends
        monkeypatch.setattr(index.OffsetIndex, "__init__", real_init)
        assert log.resume_writes()
        before = read_all(log)
        for i in range(10, 20):  # rolls again, past the segment the failed roll began
            log.append(make_batch(1, value_bytes=300, tag=i))
        after = read_all(log)
        assert after[: len(before)] == before and [o for o, _ in after] == list(range(len(after)))
        assert log.segment_count > 2
    finally:
        log.close()


def test_a_log_whose_indexes_must_be_rebuilt_opens_for_reads_on_a_full_disk(tmp_path, clock, caplog):
    with small_filesystem("tmpfs", tmp_path, 1 << 20) as mnt:
        config = TEST_CONFIG.replace(segment_bytes=1024, index_interval_bytes=0)
        log = PartitionLog(mnt / "orders-0", config, clock=clock)
        for i in range(30):
            log.append(make_batch(2, tag=i))
        log.flush()
        stored = read_all(log)
        log.close()
        for name in os.listdir(mnt / "orders-0"):
            if name.endswith(".index"):
                os.unlink(mnt / "orders-0" / name)  # every index must be rebuilt, none can be written
        fill(mnt / "filler")
        log = PartitionLog(mnt / "orders-0", config, clock=clock)
        try:
            assert read_all(log) == stored
            assert "kept in memory only" in caplog.text
        finally:
            log.close()
        os.unlink(mnt / "filler")
        log = PartitionLog(mnt / "orders-0", config, clock=clock)
        try:
            assert read_all(log) == stored, "rebuilt again once there is space"
            assert all(os.path.getsize(mnt / "orders-0" / n) > 0 for n in os.listdir(mnt / "orders-0")
                       if n.endswith(".index"))
        finally:
            log.close()


def test_records_a_failed_write_back_lost_become_a_damaged_range_and_no_offset_is_reused(log_dir, clock):
    log = PartitionLog(log_dir, TEST_CONFIG.replace(flush_fsync=False, segment_bytes=1024), clock=clock)
    try:
        batches = [make_batch(2, value_bytes=150, tag=i) for i in range(9)]
        for batch in batches:
            log.append(batch)
        log.flush()  # acknowledged, in the page cache only
        closed = log.segments[:-1]
        assert closed, "a few segments were rolled"
        active = log.segments[-1]
        fd, path, end = active.log.fd, active.path, log.high_watermark
        last = len(stamped(batches[-1], 0))
        os.truncate(path, active.size_in_bytes - last + 5)  # the last batch's write-back failed
        make_unwritable(fd, path)
        log.append(make_batch(1))
        with pytest.raises(StorageError):
            log.flush()
        writable = os.open(path, os.O_RDWR | os.O_APPEND)  # the disk is back
        os.dup2(writable, fd)
        os.close(writable)
        assert log.resume_writes()
        assert log.segments[: len(closed)] == closed, "the closed segments are not opened again"
        assert log.log_end_offset == end, "no offset a reader was given is handed out again"
        assert [(r.first_offset, r.next_offset) for r in log.damaged_ranges] == [(end - 2, end)]
        log.append(make_batch(1, tag=99))
        log.flush()
        batches_read, skipped = read_around_damage(log)
        assert skipped == [(end - 2, end)]
        assert [o for o, _ in batches_read] == [*range(0, end - 2, 2), end]
    finally:
        log.close()


def test_a_roll_that_fails_in_the_middle_of_a_request_leaves_none_of_it_readable(log_dir, clock, monkeypatch):
    from hpbroker.io import index

    log = PartitionLog(log_dir, TEST_CONFIG.replace(segment_bytes=1024), clock=clock)
    try:
        first = make_batch(1, value_bytes=550, tag=0)
        log.append(first)
        log.flush()
        request = make_batch(1, value_bytes=300, tag=1) + make_batch(1, value_bytes=300, tag=2)

        def no_space(self, path):  # the roll's new segment cannot be made
            raise OSError(errno.ENOSPC, "No space left on device", path)

        monkeypatch.setattr(index.OffsetIndex, "__init__", no_space)
        with pytest.raises(StorageError, match="no space left on device"):
            log.append(request)  # its first batch would fit the active segment, the request does not: a roll
        assert log.high_watermark == log.log_end_offset == 1, "nothing of the refused request is readable"
        monkeypatch.undo()
        assert log.resume_writes()
        assert log.append(request).first_offset == 1
        log.flush()
        assert [offset for offset, _ in read_all(log)] == [0, 1, 2]
        assert [s.base_offset for s in log.segments] == [0, 1], "the request whole in the new segment"
    finally:
        log.close()
