"""PartitionLog: offsets, group-commit flushing, rolling, reading slices, bad input, disk errors."""

from __future__ import annotations

import os
import socket

import pytest
from storage_helpers import START_MS, files_of, make_batch, make_unwritable, read_all, split_batches, stamped

from hpbroker import _core
from hpbroker.errors import (
    CorruptRecordError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageError,
)
from hpbroker.io import AppendInfo, FileSlice, PartitionLog

# --- offsets ---------------------------------------------------------------------------------


def test_first_record_gets_offset_zero_and_offsets_are_contiguous(open_log):
    log = open_log()
    first = log.append(make_batch(3))
    assert first == AppendInfo(first_offset=0, last_offset=2, record_count=3, batch_count=1)
    assert log.append(make_batch(1)) == AppendInfo(3, 3, 1, 1)
    assert log.append(make_batch(2) + make_batch(4)) == AppendInfo(4, 9, 6, 2)
    assert log.log_end_offset == 10
    log.flush()
    assert [offset for offset, _ in read_all(log)] == [0, 3, 4, 6]


def test_stored_batches_are_the_producer_bytes_stamped_with_their_offsets(open_log):
    log = open_log()
    batches = [make_batch(2, tag=1), make_batch(1, tag=2, compression=_core.CODEC_LZ4), make_batch(5, tag=3)]
    for batch in batches:
        log.append(batch)
    log.flush()
    offsets = [0, 2, 3]
    assert read_all(log) == [(o, stamped(b, o)) for o, b in zip(offsets, batches, strict=True)]
    records = _core.decode_records(log.read_bytes(0, 1 << 20))
    assert [r.offset for r in records] == list(range(8))


def test_append_accepts_bytearray_and_memoryview(open_log):
    log = open_log()
    log.append(bytearray(make_batch(1)))
    log.append(memoryview(make_batch(2)))
    log.flush()
    assert [offset for offset, _ in read_all(log)] == [0, 1]


def test_changing_a_writable_buffer_after_append_does_not_reach_the_disk(open_log):
    log = open_log()
    batch = make_batch(1)
    buf = bytearray(batch)
    log.append(buf)
    buf[-1] ^= 0xFF
    log.flush()
    assert read_all(log) == [(0, stamped(batch, 0))]


@pytest.mark.parametrize(
    "wrap",
    [
        pytest.param(lambda buf: memoryview(buf).toreadonly(), id="read-only-view"),
        pytest.param(lambda buf: memoryview(memoryview(buf).toreadonly())[0:], id="view-of-a-read-only-view"),
        pytest.param(lambda buf: memoryview(buf).toreadonly().cast("B"), id="cast-read-only-view"),
    ],
)
def test_changing_the_buffer_under_a_read_only_view_does_not_reach_the_disk(open_log, log_dir, wrap):
    log = open_log(segment_bytes=1 << 20)
    log.append(make_batch(1, tag=0))
    batch = make_batch(1, tag=1)
    buf = bytearray(batch)
    log.append(wrap(buf))  # read-only, yet mutable underneath: the producer reuses its buffer
    buf[-1] ^= 0xFF
    for i in range(2, 10):
        log.append(make_batch(1, tag=i))
    log.flush()
    assert read_all(log)[1] == (1, stamped(batch, 1))
    log.close()
    assert open_log(segment_bytes=1 << 20).high_watermark == 10, "the acknowledged records survive a reopen"


def test_a_bytes_buffer_is_held_without_a_copy_until_the_flush(open_log):
    log = open_log()
    batch = make_batch(1, value_bytes=500)
    log.append(memoryview(batch)[0:])  # a view of bytes: immutable, so borrowed
    assert log._pending[0].body.obj is batch
    log.flush()
    assert read_all(log) == [(0, stamped(batch, 0))]


# --- flushing --------------------------------------------------------------------------------


def test_records_are_invisible_before_flush_and_visible_after(open_log):
    log = open_log()
    log.append(make_batch(2))
    assert (log.log_end_offset, log.high_watermark, log.pending_records) == (2, 0, 2)
    empty = log.read(0, 1000)
    assert (empty.length, empty.first_offset) == (0, 0)
    assert log.read_bytes(2, 1000) == b""
    log.flush()
    assert (log.high_watermark, log.pending_records, log.flush_deadline_ms) == (2, 0, None)
    assert split_batches(log.read_bytes(0, 1000))[0][0] == 0


def test_flush_happens_when_flush_messages_records_are_pending(open_log):
    log = open_log(flush_messages=5)
    log.append(make_batch(3))
    assert log.high_watermark == 0
    log.append(make_batch(2))
    assert (log.high_watermark, log.pending_records) == (5, 0)


def test_flush_happens_when_the_oldest_pending_append_reaches_flush_ms(open_log, clock):
    log = open_log(flush_ms=10)
    log.append(make_batch(1))
    assert log.flush_deadline_ms == clock.now_ms + 10
    clock.advance(5)
    log.append(make_batch(1))
    assert log.flush_deadline_ms == clock.now_ms + 5, "the deadline follows the oldest pending append"
    assert not log.flush_if_due()
    assert log.high_watermark == 0
    clock.advance(5)
    assert log.flush_if_due()
    assert log.high_watermark == 2
    assert not log.flush_if_due(), "nothing pending"


def test_append_flushes_when_its_deadline_has_passed(open_log, clock):
    log = open_log(flush_ms=10)
    log.append(make_batch(1))
    clock.advance(11)
    log.append(make_batch(1))
    assert (log.high_watermark, log.pending_records) == (2, 0)


def test_flush_if_due_takes_an_explicit_time(open_log, clock):
    log = open_log(flush_ms=10)
    log.append(make_batch(1))
    assert not log.flush_if_due(now_ms=clock.now_ms + 9)
    assert log.flush_if_due(now_ms=clock.now_ms + 10)


def test_flush_with_fsync_advances_the_recovery_point(open_log):
    log = open_log(flush_fsync=True)
    log.append(make_batch(4))
    assert log.recovery_point == 0
    log.flush()
    assert log.recovery_point == 4


def test_flush_without_fsync_leaves_the_recovery_point(open_log):
    log = open_log(flush_fsync=False)
    log.append(make_batch(4))
    log.flush()
    assert (log.high_watermark, log.recovery_point) == (4, 0)
    log.checkpoint()
    assert log.recovery_point == 4


def test_index_entries_reach_the_index_file_at_flush(open_log):
    log = open_log(index_interval_bytes=0)
    for _ in range(3):
        log.append(make_batch(1))
    index_path = log.segments[0].offset_index.path
    assert os.path.getsize(index_path) == 0
    log.flush()
    assert os.path.getsize(index_path) == 3 * 8


# --- rolling ---------------------------------------------------------------------------------


def test_segment_rolls_when_it_would_exceed_segment_bytes(open_log, log_dir):
    log = open_log(segment_bytes=1024)
    batch = make_batch(1, value_bytes=200)  # 266 bytes: three fit in 1024, a fourth does not
    for _ in range(7):
        log.append(batch)
    log.flush()
    assert [s.base_offset for s in log.segments] == [0, 3, 6]
    assert all(s.size_in_bytes <= 1024 for s in log.segments)
    assert sorted(name for name in os.listdir(log_dir) if name.endswith(".log")) == [
        "00000000000000000000.log", "00000000000000000003.log", "00000000000000000006.log"]


def test_roll_flushes_the_old_segment_and_checkpoints(open_log):
    log = open_log(segment_bytes=1024)
    batch = make_batch(1, value_bytes=200)
    for _ in range(4):
        log.append(batch)
    assert log.high_watermark == 3, "the roll flushed the three batches of the first segment"
    assert log.recovery_point == 3
    with open(os.path.join(log.directory, "recovery-point-offset-checkpoint")) as f:
        assert f.read() == "0\n3\n"


def test_batch_larger_than_segment_bytes_gets_a_segment_of_its_own(open_log):
    log = open_log(segment_bytes=1024)
    log.append(make_batch(1))
    log.append(make_batch(1, value_bytes=3000))
    log.append(make_batch(1))
    log.flush()
    assert [s.base_offset for s in log.segments] == [0, 1, 2]
    assert log.segments[1].size_in_bytes > 3000


def test_segment_rolls_when_a_batch_is_segment_ms_newer_than_its_first_batch(open_log, clock):
    log = open_log(segment_ms=1000)
    log.append(make_batch(1, timestamp=START_MS))
    log.append(make_batch(1, timestamp=START_MS + 1000))
    assert len(log.segments) == 1
    log.append(make_batch(1, timestamp=START_MS + 1001))
    assert [s.base_offset for s in log.segments] == [0, 2]
    log.append(make_batch(1, timestamp=START_MS + 1500))
    assert len(log.segments) == 2, "the new segment measures from its own first batch"


def test_old_timestamps_do_not_roll_a_segment_per_batch(open_log, clock):
    log = open_log(segment_ms=1000)
    clock.advance(10**9)  # the records are far older than the broker's clock
    for i in range(10):
        log.append(make_batch(1, timestamp=START_MS + i))
    assert len(log.segments) == 1


def test_empty_segment_never_rolls_by_time(open_log, clock):
    log = open_log(segment_ms=1000)
    clock.advance(10_000)
    log.append(make_batch(1, timestamp=clock.now_ms))
    assert len(log.segments) == 1


def test_time_roll_survives_a_reopen(open_log, clock):
    log = open_log(segment_ms=1000)
    log.append(make_batch(1, timestamp=START_MS))
    log.close()
    log = open_log(segment_ms=1000)
    log.append(make_batch(1, timestamp=START_MS + 1001))
    assert [s.base_offset for s in log.segments] == [0, 1]


def test_explicit_roll_of_an_empty_segment_does_nothing(open_log):
    log = open_log()
    log.roll()
    assert len(log.segments) == 1
    log.append(make_batch(1))
    log.roll()
    assert [s.base_offset for s in log.segments] == [0, 1]
    assert log.high_watermark == 1


# --- reading ---------------------------------------------------------------------------------


def _log_of_small_batches(open_log, count=60, **changes) -> tuple[PartitionLog, list[bytes]]:
    log = open_log(**changes)
    batches = [make_batch(2, value_bytes=10 + 7 * (i % 5), tag=i) for i in range(count)]
    for batch in batches:
        log.append(batch)
    log.flush()
    return log, batches


def test_read_returns_the_batch_containing_the_offset(open_log):
    log, batches = _log_of_small_batches(open_log)
    for offset in range(log.high_watermark):
        first_offset, data = split_batches(log.read_bytes(offset, 1))[0]
        assert first_offset == offset - offset % 2
        assert data == stamped(batches[offset // 2], first_offset)


def test_read_reads_every_segment_in_order(open_log):
    log, batches = _log_of_small_batches(open_log, count=150)
    assert len(log.segments) > 3
    assert read_all(log, max_bytes=700) == [(2 * i, stamped(b, 2 * i)) for i, b in enumerate(batches)]


def test_read_slice_covers_one_segment_and_continues_in_the_next(open_log):
    log, _ = _log_of_small_batches(open_log, count=150)
    first, second = log.segments[0], log.segments[1]
    tail = log.read(first.base_offset, 1 << 30)
    assert (tail.path, tail.position, tail.length) == (first.path, 0, first.size_in_bytes)
    following = log.read(first.next_offset, 100)
    assert (following.path, following.position) == (second.path, 0)
    assert following.first_offset == second.base_offset


def test_read_slice_is_ready_for_sendfile(open_log):
    log, batches = _log_of_small_batches(open_log)
    file_slice = log.read(10, 500)
    assert isinstance(file_slice, FileSlice) and file_slice.first_offset == 10
    sender, receiver = socket.socketpair()
    with sender, receiver:
        sent = 0
        while sent < file_slice.length:
            left = file_slice.length - sent
            sent += os.sendfile(sender.fileno(), file_slice.fd, file_slice.position + sent, left)
        sender.shutdown(socket.SHUT_WR)
        received = b"".join(iter(lambda: receiver.recv(1 << 16), b""))
    stored = [stamped(batch, 2 * i) for i, batch in enumerate(batches)][5:]  # offset 10 is batch 5
    whole = max(n for n in range(1, len(stored) + 1) if n == 1 or sum(map(len, stored[:n])) <= 500)
    assert received == b"".join(stored[:whole]), "the batches appended, stamped, and whole ones only"


def test_read_returns_whole_batches_within_max_bytes(open_log):
    log, _ = _log_of_small_batches(open_log, count=100, segment_bytes=1 << 20)
    sizes = [len(b) for _, b in read_all(log)]
    for offset in range(0, 40, 2):
        for max_bytes in (sizes[offset // 2], 100, 150, 333, 1000, 2500, 4096, 5000):
            data = log.read_bytes(offset, max_bytes)
            fitting, total = 0, 0
            for size in sizes[offset // 2:]:
                if total + size > max_bytes:
                    break
                total += size
                fitting += 1
            assert len(data) == max(total, sizes[offset // 2]), (offset, max_bytes)
            assert len(split_batches(data)) == max(fitting, 1)


@pytest.mark.parametrize("max_bytes", [1, 100, 300, 1000, 5000, 1 << 20])
def test_a_slice_says_which_offsets_it_holds(open_log, max_bytes):
    log, _ = _log_of_small_batches(open_log, count=150)
    for offset in range(log.high_watermark):
        file_slice = log.read(offset, max_bytes)
        batches = split_batches(log.read_bytes(offset, max_bytes))
        assert file_slice.first_offset == batches[0][0]
        assert file_slice.next_offset == _core.read_header(batches[-1][1]).next_offset, (offset, max_bytes)
    empty = log.read(log.high_watermark, max_bytes)
    assert empty.first_offset == empty.next_offset == log.high_watermark


def test_read_returns_the_first_batch_even_when_larger_than_max_bytes(open_log):
    log = open_log()
    log.append(make_batch(1, value_bytes=2000))
    log.append(make_batch(1))
    log.flush()
    data = log.read_bytes(0, 10)
    assert [offset for offset, _ in split_batches(data)] == [0]
    assert len(data) > 2000


def test_read_at_or_after_the_high_watermark_is_empty(open_log):
    log, _ = _log_of_small_batches(open_log, count=10)
    log.append(make_batch(3))  # pending: offsets 20..22
    for offset in (20, 21, 23):
        assert log.read(offset, 1000).length == 0


@pytest.mark.parametrize("offset", [-1, 24, 10**9])
def test_read_outside_the_log_raises_with_the_range(open_log, offset):
    log, _ = _log_of_small_batches(open_log, count=10)
    log.append(make_batch(3))
    with pytest.raises(OffsetOutOfRangeError, match=rf"offset {offset} is outside .*\[0, 23\]") as info:
        log.read(offset, 1000)
    assert (info.value.log_start_offset, info.value.log_end_offset) == (0, 23)


@pytest.mark.parametrize("max_bytes", [0, -5, 1.5])
def test_read_rejects_a_max_bytes_that_is_not_positive(open_log, max_bytes):
    log, _ = _log_of_small_batches(open_log, count=3)
    with pytest.raises(ValueError, match="max_bytes"):
        log.read(0, max_bytes)


def test_empty_log_reads_empty_at_zero(open_log):
    log = open_log()
    assert log.read(0, 100).length == 0
    with pytest.raises(OffsetOutOfRangeError):
        log.read(1, 100)


def test_on_flush_sees_every_flush_the_log_applies_with_its_bytes_records_and_times(open_log):
    log = open_log(flush_fsync=True)
    seen = []
    log.on_flush = seen.append
    for tag in range(120):  # rolls, each of which flushes the old segment
        log.append(make_batch(2, tag=tag))
        if tag % 7 == 0:
            log.flush()
    log.flush()
    assert len(log.segments) > 2 and len(seen) > 17
    assert sum(job.written for job in seen) == log.size_in_bytes
    assert sum(job.records for job in seen) == log.high_watermark == 240
    assert all(job.write_ns > 0 and job.sync_ns > 0 for job in seen)
    log.reconfigure(log.config.replace(flush_fsync=False))
    log.append(make_batch(1))
    log.flush()
    assert seen[-1].records == 1 and seen[-1].sync_ns == 0


def test_on_sync_sees_every_data_sync_outside_a_flush_job_even_without_flush_fsync(open_log):
    log = open_log(flush_fsync=False)
    jobs, syncs = [], []
    log.on_flush, log.on_sync = jobs.append, syncs.append
    log.append(make_batch(2))
    log.flush()  # written, not synced
    assert [job.fsync for job in jobs] == [False] and syncs == []
    log.checkpoint()  # syncs what the flush wrote
    assert len(syncs) == 1 and syncs[0] > 0
    log.checkpoint()  # nothing new to sync
    assert len(syncs) == 1
    log.append(make_batch(2, tag=1))
    log.flush()
    log.roll()  # syncs the flushed data of the old segment
    assert len(syncs) == 2 and len(log.segments) == 2
    log.append(make_batch(2, tag=2))
    log.roll()  # the pending batch: a flush job that syncs, seen by on_flush, not on_sync
    assert jobs[-1].fsync and jobs[-1].sync_ns > 0 and len(syncs) == 2
    log.append(make_batch(2, tag=3))
    log.flush()
    log.close()  # syncs the active segment
    assert len(syncs) == 3 and all(ns > 0 for ns in syncs)


# --- offset for timestamp --------------------------------------------------------------------


def test_offset_for_timestamp_finds_the_earliest_record_at_or_after(open_log):
    log = open_log()
    for i in range(50):  # batch i holds records at START_MS + 10*i and + 10*i + 5
        log.append(_core.build_batch([b"a", b"b"], timestamps=[START_MS + 10 * i, START_MS + 10 * i + 5]))
    log.flush()
    assert len(log.segments) == 1
    assert log.offset_for_timestamp(0) == 0
    assert log.offset_for_timestamp(START_MS) == 0
    assert log.offset_for_timestamp(START_MS + 1) == 1
    assert log.offset_for_timestamp(START_MS + 5) == 1
    assert log.offset_for_timestamp(START_MS + 6) == 2
    assert log.offset_for_timestamp(START_MS + 255) == 51
    assert log.offset_for_timestamp(START_MS + 495) == 99
    assert log.offset_for_timestamp(START_MS + 496) is None


def test_offset_for_timestamp_handles_timestamps_that_go_backwards(open_log):
    log = open_log(index_interval_bytes=0)
    timestamps = [100, 300, 200, 250, 500, 400, 450, 50, 600]
    for ts in timestamps:
        log.append(make_batch(1, timestamp=START_MS + ts))
    log.flush()
    for target in range(0, 700, 10):
        expected = next((i for i, ts in enumerate(timestamps) if ts >= target), None)
        assert log.offset_for_timestamp(START_MS + target) == expected, target


def test_offset_for_timestamp_searches_across_segments(open_log):
    log = open_log(segment_bytes=1024)
    for i in range(40):
        log.append(make_batch(1, value_bytes=100, timestamp=START_MS + 1000 * i))
    log.flush()
    assert len(log.segments) > 4
    for i in range(40):
        assert log.offset_for_timestamp(START_MS + 1000 * i - 500) == i
    assert log.offset_for_timestamp(START_MS + 40_000) is None


def test_offset_for_timestamp_ignores_pending_records(open_log):
    log = open_log()
    log.append(make_batch(1, timestamp=START_MS))
    log.flush()
    log.append(make_batch(1, timestamp=START_MS + 100))
    assert log.offset_for_timestamp(START_MS + 50) is None


# --- bad input -------------------------------------------------------------------------------


def _state(log: PartitionLog) -> tuple:
    return (log.log_end_offset, log.high_watermark, log.pending_records, files_of(log.directory))


def _flip(batch: bytes, position: int) -> bytes:
    damaged = bytearray(batch)
    damaged[position] ^= 0xFF
    return bytes(damaged)


@pytest.mark.parametrize(
    ("make_bad", "error"),
    [
        (lambda b: _flip(b, len(b) - 1), CorruptRecordError),  # CRC mismatch
        (lambda b: _flip(b, 20), CorruptRecordError),  # magic
        (lambda b: b[:-1], CorruptRecordError),  # torn
        (lambda b: b + b"\0" * 3, CorruptRecordError),  # trailing bytes
        (lambda b: b"", CorruptRecordError),  # nothing
        (lambda b: make_batch(1) + b[:30], CorruptRecordError),  # a good batch then a torn one
        (lambda b: make_batch(1, value_bytes=5000), RecordTooLargeError),
    ],
)
def test_rejected_input_leaves_the_log_untouched(open_log, make_bad, error):
    log = open_log(max_message_bytes=4096)
    log.append(make_batch(2))
    log.flush()
    log.append(make_batch(1))
    before = _state(log)
    with pytest.raises(error):
        log.append(make_bad(make_batch(3)))
    assert _state(log) == before
    log.flush()
    assert [offset for offset, _ in read_all(log)] == [0, 2]


def test_batch_whose_header_disagrees_with_its_records_is_invalid(open_log):
    log = open_log()
    bad = bytearray(make_batch(2))
    bad[40:48] = (int.from_bytes(bad[40:48], "little") + 1).to_bytes(8, "little")  # max_timestamp
    bad[16:20] = _core.crc32c(bytes(bad[20:])).to_bytes(4, "little")
    with pytest.raises(InvalidRecordError):
        log.append(bytes(bad))
    assert log.log_end_offset == 0


def test_max_message_bytes_counts_the_whole_batch(open_log):
    batch = make_batch(1, value_bytes=1000)
    log = open_log(max_message_bytes=len(batch))
    log.append(batch)
    log.close()
    with pytest.raises(RecordTooLargeError, match=f"exceeds the limit of {len(batch) - 1}"):
        open_log(max_message_bytes=len(batch) - 1).append(batch)


# --- errors and lifecycle --------------------------------------------------------------------


def test_a_write_error_refuses_appends_and_keeps_reads(open_log):
    log = open_log()
    kept = make_batch(1)
    log.append(kept)
    log.flush()
    log.append(make_batch(1))
    make_unwritable(log.segments[-1].log.fd, log.segments[-1].path)
    with pytest.raises(StorageError, match="flush failed") as info:
        log.flush()
    assert isinstance(info.value.__cause__, OSError)
    assert not log.offline and not log.writable
    assert log.read_bytes(0, 100) == stamped(kept, 0) and log.log_end_offset == 1
    with pytest.raises(StorageError, match="refuses writes"):
        log.append(make_batch(1))
    log.close()
    assert log.closed


def test_closed_log_refuses_calls(open_log):
    log = open_log()
    log.close()
    log.close()
    with pytest.raises(ValueError, match="closed"):
        log.append(make_batch(1))


def test_close_flushes_and_context_manager_closes(log_dir, clock):
    from storage_helpers import TEST_CONFIG

    with PartitionLog(log_dir, TEST_CONFIG, clock=clock) as log:
        log.append(make_batch(5))
    assert log.closed
    with PartitionLog(log_dir, TEST_CONFIG, clock=clock) as log:
        assert (log.log_end_offset, log.high_watermark, log.recovery_point) == (5, 5, 5)


def test_unopenable_directory_raises_storage_error(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_bytes(b"")
    with pytest.raises(StorageError, match="cannot open"):
        PartitionLog(not_a_dir / "t-0")


def test_an_immutable_buffer_is_held_without_a_copy(open_log):
    source = bytearray(make_batch(2))
    view = memoryview(source).toreadonly()
    log = open_log()
    log.append(view, immutable=True)  # the caller vouches nobody changes it before the flush
    held = log._pending[0].body
    assert held.obj is source or getattr(held.obj, "obj", None) is source, "no copy was made"
    log.flush()
    assert log.read_bytes(0, 1 << 20)[16:] == bytes(source)[16:]


def _descriptors_into(directory) -> list[str]:
    """The names of the files in ``directory`` this process holds open."""
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if os.path.dirname(target) == os.path.abspath(directory):
            names.append(os.path.basename(target))
    return sorted(names)


def test_a_closed_segment_holds_only_its_log_file_open(open_log, log_dir):
    log = open_log(segment_bytes=1024)
    for i in range(40):
        log.append(make_batch(2, tag=i))
    log.flush()
    assert log.segment_count >= 4
    active = log.segments[-1]
    indexes = [os.path.basename(active.offset_index.path), os.path.basename(active.time_index.path)]
    expected = sorted([".lock"] + [os.path.basename(s.path) for s in log.segments] + indexes)
    assert _descriptors_into(log_dir) == expected
    log.close()
    log = open_log(segment_bytes=1024)
    assert _descriptors_into(log_dir) == expected, "a reopened log holds the same"
    assert [offset for offset, _ in read_all(log)] == [2 * i for i in range(40)]
