"""Property: whatever the sequence of appends, flushes, reopens, crashes and torn tails, every
flushed batch wholly before the damage is read back with the same bytes and offsets, offsets stay
contiguous except across a damaged range, and none is handed out twice: a cut below the recovery
point (records that had reached the disk) is a damaged range, and the log goes on after it."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import START_MS, TEST_CONFIG, Clock, read_around_damage, stamped

from hpbroker import _core
from hpbroker.io import PartitionLog

batch_specs = st.tuples(
    st.integers(1, 4),  # records
    st.integers(0, 300),  # value bytes
    st.booleans(),  # lz4
    st.integers(0, 10_000),  # timestamp offset
)
operations = st.one_of(
    st.tuples(st.just("append"), st.lists(batch_specs, min_size=1, max_size=3)),
    st.tuples(st.just("flush")),
    st.tuples(st.just("advance"), st.integers(0, 10)),
    st.tuples(st.just("reopen")),
    st.tuples(st.just("crash"), st.none() | st.floats(0, 1)),
)


@dataclass
class Stored:
    offset: int
    next_offset: int
    data: bytes


def _build(spec, serial: int) -> bytes:
    records, value_bytes, lz4, ts = spec
    values = [b"%d/%d:" % (serial, i) + b"v" * value_bytes for i in range(records)]
    codec = _core.CODEC_LZ4 if lz4 else _core.CODEC_NONE
    return _core.build_batch(values, timestamps=START_MS + ts, compression=codec)


class Harness:
    """The log under test next to a model of what it must hold."""

    def __init__(self, directory: str, config) -> None:
        self.directory, self.config, self.clock = directory, config, Clock()
        self.log = PartitionLog(directory, config, clock=self.clock)
        self.appended: list[Stored] = []  # every batch still owed, flushed or pending
        self.gaps: list[tuple[int, int]] = []  # damaged ranges a crash below the recovery point made
        self.serial = 0

    def append(self, specs) -> None:
        buf = b""
        first = self.log.log_end_offset
        offset = first
        for spec in specs:
            batch = _build(spec, self.serial)
            self.serial += 1
            self.appended.append(Stored(offset, offset + spec[0], stamped(batch, offset)))
            offset += spec[0]
            buf += batch
        info = self.log.append(buf)
        assert (info.first_offset, info.last_offset) == (first, offset - 1)

    def flushed(self) -> list[Stored]:
        return [b for b in self.appended if b.next_offset <= self.log.high_watermark]

    def crash(self, cut: float | None) -> None:
        survivors = self.flushed()
        active = self.log.segments[-1]
        with open(os.path.join(self.directory, "recovery-point-offset-checkpoint")) as f:
            recovery_point = int(f.read().split()[1])
        self.log._abandon()
        # A crash tears only what was being written: the active segment's tail.  (Rolled
        # segments were fsynced; damage there is rot, which the log keeps and reports.)
        if cut is not None and active.size_in_bytes:
            victim = active
            cut_at = int(cut * victim.size_in_bytes)
            os.truncate(victim.path, cut_at)
            kept, position = [], 0
            for batch in survivors:
                if batch.offset >= victim.base_offset:
                    position += len(batch.data)
                    if position > cut_at:
                        break
                kept.append(batch)
            survivors = kept
        self.appended = survivors
        end = max([b.next_offset for b in survivors] + [b for _, b in self.gaps] + [0])
        if end < recovery_point:  # records that reached the disk were cut: never reused
            self.gaps.append((end, recovery_point))
        self.log = PartitionLog(self.directory, self.config, clock=self.clock)
        self.check()

    def reopen(self) -> None:
        self.log.close()  # flushes everything pending
        self.log = PartitionLog(self.directory, self.config, clock=self.clock)
        self.check()

    def check(self) -> None:
        expected = self.flushed()
        batches, skipped = read_around_damage(self.log, max_bytes=777)
        assert [(b.offset, b.data) for b in expected] == batches
        gaps = [gap for gap in self.gaps if gap[1] > self.log.log_start_offset and gap[0] < gap[1]]
        assert [(max(a, self.log.log_start_offset), b) for a, b in skipped] == \
            [gap for gap in gaps if gap[0] < self.log.high_watermark]
        next_offset = max([b.next_offset for b in self.appended] + [b for _, b in self.gaps] + [0])
        assert self.log.log_end_offset == next_offset
        for before, after in zip(self.appended, self.appended[1:], strict=False):
            assert self._bridged(before.next_offset, after.offset), \
                "offsets are contiguous except across damaged ranges"

    def _bridged(self, start: int, end: int) -> bool:
        """Whether offsets [start, end) are exactly a chain of the model's gaps (none: start == end)."""
        while start < end:
            start = next((b for a, b in self.gaps if a == start and a < b), None)
            if start is None:
                return False
        return start == end


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(operations, max_size=25),
    interval=st.sampled_from([0, 150, 4096]),
    flush_messages=st.integers(1, 12),
)
def test_flushed_batches_before_any_damage_survive_with_bytes_and_offsets(ops, interval, flush_messages):
    config = TEST_CONFIG.replace(segment_bytes=1024, index_interval_bytes=interval,
                                 flush_messages=flush_messages, flush_ms=5)
    with tempfile.TemporaryDirectory() as directory:
        harness = Harness(os.path.join(directory, "p-0"), config)
        try:
            for op in ops:
                if op[0] == "append":
                    harness.append(op[1])
                elif op[0] == "flush":
                    harness.log.flush()
                elif op[0] == "advance":
                    harness.clock.advance(op[1])
                    harness.log.flush_if_due()
                elif op[0] == "reopen":
                    harness.reopen()
                else:
                    harness.crash(op[1])
            harness.check()
            harness.reopen()
        finally:
            harness.log.close()
