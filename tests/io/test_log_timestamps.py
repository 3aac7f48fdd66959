"""Record timestamps from a wrong clock: a batch stamped too far ahead of the broker's clock is
refused before anything changes, and a segment that holds such a timestamp from before the bound
does not keep itself and every later segment from time-based retention (KAFKA-7910)."""

from __future__ import annotations

import time

import pytest
from storage_helpers import TEST_CONFIG, Clock, make_batch, read_all

from hpbroker.errors import InvalidTimestampError
from hpbroker.io import PartitionLog

HOUR_MS = 3_600_000


@pytest.fixture
def wall_clock():
    """A settable clock that starts at the real time (segment files' mtimes are real)."""
    return Clock(time.time_ns() // 1_000_000)


def test_a_batch_stamped_beyond_the_bound_is_refused_and_nothing_changes(tmp_path, wall_clock):
    log = PartitionLog(tmp_path / "p-0", TEST_CONFIG, clock=wall_clock)
    now = wall_clock()
    log.append(make_batch(2, timestamp=now + HOUR_MS - 1000))  # within the default hour
    with pytest.raises(InvalidTimestampError, match=r"ahead of the broker's clock .*allows 3600000") as info:
        log.append(make_batch(1, timestamp=now) + make_batch(1, timestamp=now + HOUR_MS + 5000))
    assert info.value.code == 19 and not info.value.retriable
    assert (log.log_end_offset, log.pending_records) == (2, 2), "no batch of the request was appended"
    log.flush()
    assert [offset for offset, _ in read_all(log)] == [0]
    log.reconfigure(TEST_CONFIG.replace(message_timestamp_after_max_ms=2**63 - 1))
    log.append(make_batch(1, timestamp=now + 100 * 365 * 24 * HOUR_MS))  # no bound
    log.close()


def test_a_far_future_timestamp_does_not_hold_back_retention_of_later_segments(tmp_path, wall_clock):
    unbounded = TEST_CONFIG.replace(message_timestamp_after_max_ms=2**63 - 1, retention_ms=10 * HOUR_MS)
    log = PartitionLog(tmp_path / "p-0", unbounded, clock=wall_clock)
    now = wall_clock()
    log.append(make_batch(1, timestamp=now + 50 * 365 * 24 * HOUR_MS))  # written before any bound
    log.roll()
    log.append(make_batch(1, timestamp=now))
    log.roll()
    log.append(make_batch(1, timestamp=now))
    log.flush()
    wall_clock.advance(11 * HOUR_MS)
    assert log.delete_old_segments() == 0, "without a bound, the future timestamp keeps both"
    log.reconfigure(unbounded.replace(message_timestamp_after_max_ms=HOUR_MS))
    assert log.delete_old_segments() == 2, "aged by when it was written: both expired segments go"
    assert log.log_start_offset == 2
    log.close()
