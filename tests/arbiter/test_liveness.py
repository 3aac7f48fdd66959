"""HeartbeatWatch: a worker's silence is monotonic time since its heartbeat last changed, whatever
the file's times say."""

from __future__ import annotations

import os

from hpbroker.workers.heartbeat import heartbeat_path, write_heartbeat
from hpbroker.workers.liveness import HeartbeatWatch

HOUR_NS = 3600 * 10**9


def test_silence_counts_from_the_start_and_from_each_change(tmp_path):
    run_dir = str(tmp_path)
    write_heartbeat(run_dir, 0, ready=True, partitions=[])
    watch = HeartbeatWatch(run_dir)
    watch.start(0, 100.0)
    assert watch.silent_s(0, 100.5) == 0.5
    assert watch.silent_s(0, 103.0) == 3.0  # unchanged: silent since the start
    write_heartbeat(run_dir, 0, ready=True, partitions=[])
    assert watch.silent_s(0, 104.0) == 0.0  # a new heartbeat seen now
    assert watch.silent_s(0, 105.5) == 1.5


def test_file_times_far_in_the_past_or_future_are_only_changes(tmp_path):
    """A wall-clock step moves the times a worker's heartbeat gets: an hour back or ahead of the
    last is still a fresh heartbeat, and an unchanged file is silent however recent its mtime."""
    run_dir = str(tmp_path)
    path = heartbeat_path(run_dir, 1)
    write_heartbeat(run_dir, 1, ready=True, partitions=[])
    watch = HeartbeatWatch(run_dir)
    watch.start(1, 10.0)
    mtime_ns = os.stat(path).st_mtime_ns
    os.utime(path, ns=(mtime_ns - HOUR_NS, mtime_ns - HOUR_NS))  # touched by a worker an hour behind
    assert watch.silent_s(1, 12.0) == 0.0
    os.utime(path, ns=(mtime_ns + HOUR_NS, mtime_ns + HOUR_NS))  # and an hour ahead
    assert watch.silent_s(1, 13.0) == 0.0
    assert watch.silent_s(1, 20.0) == 7.0  # then nothing: silent, though its mtime is in the future


def test_a_missing_heartbeat_is_silent_and_a_forgotten_slot_is_not_watched(tmp_path):
    run_dir = str(tmp_path)
    watch = HeartbeatWatch(run_dir)
    watch.start(0, 1.0)
    assert watch.silent_s(0, 4.0) == 3.0
    assert watch.silent_s(2, 4.0) == 0.0  # never started
    watch.forget(0)
    assert watch.silent_s(0, 9.0) == 0.0
