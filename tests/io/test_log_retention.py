"""Retention: deleting whole closed segments by age and by size, and the delayed descriptor close."""

from __future__ import annotations

import os

import pytest
from storage_helpers import START_MS, make_batch, read_all

from hpbroker.errors import OffsetOutOfRangeError

HOUR_MS = 3600 * 1000


def _fill(log, clock, count: int, step_ms: int = HOUR_MS) -> None:
    """``count`` batches of one 266-byte record, one every ``step_ms``: three per 1024-byte segment."""
    for _ in range(count):
        log.append(make_batch(1, value_bytes=200, timestamp=clock.now_ms))
        clock.advance(step_ms)
    log.flush()


def _log_names(log) -> list[str]:
    return sorted(name for name in os.listdir(log.directory) if name.endswith(".log"))


def test_segments_older_than_retention_ms_are_deleted(open_log, clock):
    log = open_log(segment_bytes=1024, retention_ms=10 * HOUR_MS)
    _fill(log, clock, 10)  # segments [0,3) [3,6) [6,9) [9,10), max timestamps at hours 2, 5, 8, 9
    assert [s.base_offset for s in log.segments] == [0, 3, 6, 9]
    assert log.delete_old_segments(now_ms=START_MS + 12 * HOUR_MS) == 0, "hour 2 is not older than 12 - 10"
    assert log.delete_old_segments(now_ms=START_MS + 12 * HOUR_MS + 1) == 1
    assert log.log_start_offset == 3
    assert log.delete_old_segments(now_ms=START_MS + 100 * HOUR_MS) == 2
    assert [s.base_offset for s in log.segments] == [9], "the active segment is never deleted"
    assert log.log_start_offset == 9
    assert _log_names(log) == ["00000000000000000009.log"]
    assert {name[:20] for name in os.listdir(log.directory) if name[0].isdigit()} == {f"{9:020d}"}


def test_retention_makes_the_unlinks_durable_before_it_returns(open_log, clock, disk_events):
    log = open_log(segment_bytes=1024, retention_bytes=0)
    _fill(log, clock, 10)
    disk_events.events.clear()
    assert log.delete_old_segments() == 3
    events = [(op, path) for op, path, _ in disk_events.events]
    unlinks = [i for i, (op, path) in enumerate(events) if op == "unlink" and not path.endswith(".snapshot")]
    assert len(unlinks) == 9, events
    assert ("fsync", log.directory) in events[unlinks[-1] :], "else log_start_offset may go back"


def test_time_retention_stops_at_the_first_segment_to_keep(open_log, clock):
    log = open_log(segment_bytes=1024, retention_ms=10 * HOUR_MS, message_timestamp_after_max_ms=2**63 - 1)
    log.append(make_batch(1, value_bytes=200, timestamp=START_MS + 50 * HOUR_MS))  # a record from the future
    _fill(log, clock, 8)
    assert log.delete_old_segments(now_ms=START_MS + 30 * HOUR_MS) == 0
    assert log.log_start_offset == 0


def test_a_segment_without_timestamps_is_aged_by_its_file_modification_time(open_log, clock):
    log = open_log(segment_bytes=1024, retention_ms=10 * HOUR_MS)
    _fill(log, clock, 7)  # segments [0,3) [3,6) [6,7)
    first = log.segments[0]
    first.max_timestamp = -1  # what a segment holding no timestamp reports
    now_ms = START_MS + 100 * HOUR_MS  # the other closed segment is long expired

    def modified(ms_before_now: int) -> None:
        modified_ns = (now_ms - ms_before_now) * 1_000_000
        os.utime(first.path, ns=(modified_ns, modified_ns))

    modified(HOUR_MS)
    assert log.delete_old_segments(now_ms=now_ms) == 0, "-1 is not a time: never expire on it"
    modified(10 * HOUR_MS)
    assert log.delete_old_segments(now_ms=now_ms) == 0
    modified(10 * HOUR_MS + 1)
    assert log.delete_old_segments(now_ms=now_ms) == 2
    assert log.log_start_offset == 6


def test_oldest_segments_are_deleted_while_the_rest_still_holds_retention_bytes(open_log, clock):
    log = open_log(segment_bytes=1024)
    _fill(log, clock, 10)
    sizes = [s.size_in_bytes for s in log.segments]
    assert len(sizes) == 4 and sizes[0] == sizes[1] == sizes[2] == 3 * sizes[3]
    log.close()
    log = open_log(segment_bytes=1024, retention_bytes=sum(sizes) - sizes[0] - 1)
    assert log.delete_old_segments() == 1, "dropping the second would leave too little"
    assert log.size_in_bytes == sum(sizes) - sizes[0]
    assert log.log_start_offset == 3
    log.close()
    log = open_log(segment_bytes=1024, retention_bytes=sizes[2] + sizes[3])
    assert log.delete_old_segments() == 1, "the log minus a segment may hold exactly retention_bytes"
    assert log.log_start_offset == 6


def test_size_retention_never_deletes_the_active_segment(open_log, clock):
    log = open_log(segment_bytes=1024, retention_bytes=0)
    _fill(log, clock, 10)
    assert log.delete_old_segments() == 3
    assert [s.base_offset for s in log.segments] == [9]
    log.append(make_batch(1))
    log.flush()
    assert log.log_end_offset == 11


def test_unlimited_retention_deletes_nothing(open_log, clock):
    log = open_log(segment_bytes=1024, retention_ms=-1, retention_bytes=-1)
    _fill(log, clock, 10)
    assert log.delete_old_segments(now_ms=START_MS + 10**12) == 0


def test_read_below_the_log_start_after_retention_raises_with_the_range(open_log, clock):
    log = open_log(segment_bytes=1024, retention_bytes=0)
    _fill(log, clock, 10)
    log.delete_old_segments()
    with pytest.raises(OffsetOutOfRangeError, match=r"offset 8 is outside .*\[9, 10\]") as info:
        log.read(8, 1000)
    assert (info.value.log_start_offset, info.value.log_end_offset) == (9, 10)
    assert [offset for offset, _ in read_all(log)] == [9]


def test_deleted_segment_stays_readable_through_old_slices_until_the_delay(open_log, clock):
    log = open_log(segment_bytes=1024, retention_bytes=0, file_delete_delay_ms=60_000)
    _fill(log, clock, 10)
    file_slice = log.read(0, 10_000)
    expected = os.pread(file_slice.fd, file_slice.length, file_slice.position)
    assert log.delete_old_segments(now_ms=clock.now_ms) == 3
    assert not os.path.exists(file_slice.path)
    assert os.pread(file_slice.fd, file_slice.length, file_slice.position) == expected
    clock.advance(59_999)  # the fixture's log measures the delay on this clock too
    log.delete_old_segments()
    assert os.pread(file_slice.fd, file_slice.length, file_slice.position) == expected
    clock.advance(1)
    log.delete_old_segments()
    with pytest.raises(OSError):
        os.fstat(file_slice.fd)


def test_retention_survives_a_reopen(open_log, clock):
    log = open_log(segment_bytes=1024, retention_bytes=0)
    _fill(log, clock, 10)
    log.delete_old_segments()
    log.close()
    log = open_log(segment_bytes=1024)
    assert (log.log_start_offset, log.log_end_offset) == (9, 10)
