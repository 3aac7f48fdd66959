"""What the heartbeat file and the slot table say of time: nothing the arbiter judges liveness by
compares a file's times with the wall clock (hpbroker.workers.liveness watches changes on the
monotonic clock), and the informational wall-clock age read_heartbeat gives is never negative."""

from __future__ import annotations

import dataclasses
import os
import time

from hpbroker.workers import heartbeat
from hpbroker.workers.slots import Slot, SlotState

HOUR_S = 3600


def test_a_heartbeat_written_before_a_backward_step_reads_age_zero_not_negative(tmp_path):
    assert heartbeat.write_heartbeat(str(tmp_path), 0, ready=True, partitions=[]) is None
    future = time.time() + HOUR_S  # written an hour ahead of the wall clock as it reads now
    os.utime(heartbeat.heartbeat_path(str(tmp_path), 0), (future, future))
    age, content = heartbeat.read_heartbeat(str(tmp_path), 0)
    assert age == 0.0
    assert content["ready"] is True and content["pid"] == os.getpid()


def test_a_heartbeat_age_is_wall_clock_and_a_missing_one_is_infinite(tmp_path):
    assert heartbeat.read_heartbeat(str(tmp_path), 0) == (float("inf"), None)
    assert heartbeat.write_heartbeat(str(tmp_path), 0, ready=False, partitions=[]) is None
    past = time.time() - 60
    os.utime(heartbeat.heartbeat_path(str(tmp_path), 0), (past, past))
    age, _content = heartbeat.read_heartbeat(str(tmp_path), 0)
    assert 60 <= age < 60 + 30


def test_a_slot_keeps_monotonic_times_only():
    assert "ready_wall" not in {f.name for f in dataclasses.fields(Slot)}
    slot = Slot(0)
    slot.forked(1234, 1.0)
    slot.became_ready(2.5)
    assert (slot.state, slot.forked_at, slot.ready_at) == (SlotState.SERVING, 1.0, 2.5)
