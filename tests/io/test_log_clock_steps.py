"""A step of the wall clock (NTP, an operator setting the date) delays neither a group commit nor
the close of a deleted segment's descriptors: both are measured on the log's monotonic clock.

The first tests inject only the wall clock and let the real monotonic clock run (with small
delays and generous deadlines); the others inject both clocks and step them independently."""

from __future__ import annotations

import os
import time

import pytest
from storage_helpers import TEST_CONFIG, Clock, make_batch, read_all

from hpbroker.io import PartitionLog

HOUR_MS = 3600 * 1000
FLUSH_MS = 50
WAIT_S = 10.0  # generous: the flush is due after FLUSH_MS


@pytest.fixture
def wall_clock() -> Clock:
    return Clock()


@pytest.fixture
def logs():
    opened: list[PartitionLog] = []
    yield opened
    for log in opened:
        log.close()


def _open(logs, log_dir, wall_clock, **changes) -> PartitionLog:
    """A log with an injected wall clock and the real monotonic clock."""
    log = PartitionLog(log_dir, TEST_CONFIG.replace(**changes), clock=wall_clock)
    logs.append(log)
    return log


def _wait_until(condition, what: str) -> float:
    """Poll ``condition`` until it holds; the seconds it took (fails after WAIT_S)."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > WAIT_S:
            pytest.fail(f"{what}: not within {WAIT_S} s")
        time.sleep(0.005)
    return time.monotonic() - started


@pytest.mark.parametrize("step_ms", [-HOUR_MS, HOUR_MS])
def test_pending_records_are_flushed_flush_ms_after_their_append_whatever_the_wall_clock_does(
        logs, log_dir, wall_clock, step_ms):
    log = _open(logs, log_dir, wall_clock, flush_ms=FLUSH_MS)
    appended = time.monotonic()
    log.append(make_batch(2))
    wall_clock.advance(step_ms)
    flushed = log.flush_if_due()
    if time.monotonic() - appended < FLUSH_MS / 1000 * 0.9:  # else a stalled machine made it due
        assert not flushed, "a step of the wall clock does not make the flush due"
        assert log.high_watermark == 0
    _wait_until(log.flush_if_due, f"a flush {FLUSH_MS} ms after the append (wall clock stepped {step_ms})")
    assert log.high_watermark == 2
    assert [offset for offset, _ in read_all(log)] == [0], "the one batch, flushed"


def test_the_flush_deadline_is_on_the_monotonic_clock(logs, log_dir, wall_clock):
    from hpbroker.io.log import monotonic_ms
    log = _open(logs, log_dir, wall_clock, flush_ms=FLUSH_MS)
    before = monotonic_ms()
    log.append(make_batch(1))
    wall_clock.advance(-HOUR_MS)
    assert before + FLUSH_MS <= log.flush_deadline_ms <= monotonic_ms() + FLUSH_MS


def test_an_append_after_a_backward_step_flushes_what_is_overdue(logs, log_dir, wall_clock):
    log = _open(logs, log_dir, wall_clock, flush_ms=FLUSH_MS)
    log.append(make_batch(1))
    wall_clock.advance(-HOUR_MS)
    time.sleep(2 * FLUSH_MS / 1000)  # at least: the deadline has passed on the monotonic clock
    log.append(make_batch(1))
    assert (log.high_watermark, log.pending_records) == (2, 0)


def test_deleted_segment_descriptors_close_after_the_delay_when_the_wall_clock_steps_back(
        logs, log_dir, wall_clock):
    log = _open(logs, log_dir, wall_clock, segment_bytes=1024, retention_bytes=0,
                file_delete_delay_ms=FLUSH_MS)
    for _ in range(10):
        log.append(make_batch(1, value_bytes=200, timestamp=wall_clock.now_ms))
    log.flush()
    file_slice = log.read(0, 10_000)
    deleted = time.monotonic()
    assert log.delete_old_segments() == 3
    wall_clock.advance(-HOUR_MS)
    log.delete_old_segments()
    if time.monotonic() - deleted < FLUSH_MS / 1000 * 0.9:  # else a stalled machine let the delay pass
        os.fstat(file_slice.fd)  # still open: the delay has not passed

    def closed() -> bool:
        log.delete_old_segments()
        try:
            os.fstat(file_slice.fd)
        except OSError:
            return True
        return False

    _wait_until(closed, "the deleted segment's descriptors closed after file_delete_delay_ms")


def test_deleted_segment_stays_readable_through_a_forward_step_of_the_wall_clock(logs, log_dir, wall_clock):
    log = _open(logs, log_dir, wall_clock, segment_bytes=1024, retention_bytes=0, file_delete_delay_ms=60_000)
    for _ in range(10):
        log.append(make_batch(1, value_bytes=200, timestamp=wall_clock.now_ms))
    log.flush()
    file_slice = log.read(0, 10_000)
    expected = os.pread(file_slice.fd, file_slice.length, file_slice.position)
    assert log.delete_old_segments() == 3
    wall_clock.advance(HOUR_MS)
    log.delete_old_segments()
    assert os.pread(file_slice.fd, file_slice.length, file_slice.position) == expected


# --- both clocks injected ----------------------------------------------------------------------


def test_injected_clocks_are_independent(log_dir):
    wall, steady = Clock(), Clock(now_ms=1_000)
    with PartitionLog(log_dir, TEST_CONFIG.replace(flush_ms=10), clock=wall, monotonic_clock=steady) as log:
        log.append(make_batch(1))
        assert log.flush_deadline_ms == 1_010
        wall.advance(HOUR_MS)
        assert not log.flush_due(), "the wall clock does not move the deadline"
        wall.advance(-2 * HOUR_MS)
        steady.advance(10)
        assert log.flush_due()
        assert log.flush_if_due()
        assert log.high_watermark == 1
        assert log.flush_deadline_ms is None


def test_segment_roll_and_retention_stay_on_the_wall_clock(log_dir):
    wall, steady = Clock(), Clock(now_ms=0)
    config = TEST_CONFIG.replace(segment_bytes=1024, retention_ms=HOUR_MS, file_delete_delay_ms=0)
    with PartitionLog(log_dir, config, clock=wall, monotonic_clock=steady) as log:
        for _ in range(4):
            log.append(make_batch(1, value_bytes=200, timestamp=wall.now_ms))
        log.flush()
        assert log.segment_count == 2
        steady.advance(10 * HOUR_MS)
        assert log.delete_old_segments() == 0, "retention ignores the monotonic clock"
        wall.advance(HOUR_MS + 1)
        assert log.delete_old_segments() == 1
