"""Opening a log after a crash or damage: a torn tail past the recovery point cut, damage below
it contained as damaged ranges (every valid batch after them kept, no offset reused), index
rebuilding, directory cleanup, the recovery-point checkpoint, and what survives a kill -9."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from storage_helpers import (
    START_MS,
    TEST_CONFIG,
    files_of,
    make_batch,
    read_all,
    read_around_damage,
    stamped,
)

from hpbroker import _core
from hpbroker.errors import CorruptRecordError, DamagedRangeError
from hpbroker.io import PartitionLog

CHECKPOINT = "recovery-point-offset-checkpoint"


def _segment_file(log_dir: str, base_offset: int, suffix: str) -> str:
    return os.path.join(log_dir, f"{base_offset:020d}{suffix}")


def _write(open_log, count: int, **changes) -> list[tuple[int, bytes]]:
    """``count`` two-record batches of varying sizes, closed cleanly; the batches as stored."""
    log = open_log(**changes)
    for i in range(count):
        log.append(make_batch(2, value_bytes=30 + 11 * (i % 7), tag=i, timestamp=START_MS + i))
    log.close()
    log = open_log(**changes)
    stored = read_all(log)
    log.close()
    return stored


def _append_to(path: str, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def _cut(path: str, size: int) -> None:
    os.truncate(path, size)


def _warnings(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


# --- the tail of the active segment ----------------------------------------------------------


def _crashed_before_any_checkpoint(log_dir: str) -> None:
    """What a crash leaves when nothing was checkpointed yet: no marker, the recovery point 0."""
    os.unlink(os.path.join(log_dir, CLEAN_SHUTDOWN))
    with open(os.path.join(log_dir, CHECKPOINT), "w") as f:
        f.write("0\n0\n")


def test_recover_truncates_a_torn_tail(open_log, log_dir, caplog):
    stored = _write(open_log, 20, segment_bytes=1 << 20)
    path = _segment_file(log_dir, 0, ".log")
    full = os.path.getsize(path)
    _cut(path, full - 10)
    _crashed_before_any_checkpoint(log_dir)
    log = open_log(segment_bytes=1 << 20)
    assert read_all(log) == stored[:-1]
    assert log.log_end_offset == log.high_watermark == stored[-1][0]
    assert os.path.getsize(path) == full - len(stored[-1][1])
    warning = _warnings(caplog)
    assert f"truncating {path} at position {full - len(stored[-1][1])}" in warning
    assert f"cutting {len(stored[-1][1]) - 10} bytes" in warning
    log.append(make_batch(1))
    log.flush()
    assert read_all(log)[-1][0] == stored[-1][0], "offsets past the recovery point were never on disk"


def test_a_tail_cut_below_the_recovery_point_is_a_damaged_range_and_its_offsets_are_never_reused(
        open_log, log_dir, caplog):
    stored = _write(open_log, 20, segment_bytes=1 << 20)  # closed cleanly: all 40 records were on disk
    path = _segment_file(log_dir, 0, ".log")
    full = os.path.getsize(path)
    _cut(path, full - 10)
    log = open_log(segment_bytes=1 << 20)
    assert os.path.getsize(path) == full - 10, "bytes that reached the disk are never cut"
    assert log.log_end_offset == 40
    [damaged] = log.damaged_ranges
    assert (damaged.first_offset, damaged.next_offset) == (stored[-1][0], 40)
    assert (damaged.first_position, damaged.end_position) == (full - len(stored[-1][1]), full - 10)
    batches, skipped = read_around_damage(log)
    assert batches == stored[:-1] and skipped == [(38, 40)]
    with pytest.raises(DamagedRangeError, match="offsets \\[38, 40\\)") as info:
        log.read(39, 100)
    assert (info.value.first_offset, info.value.next_offset, info.value.code) == (38, 40, 18)
    assert f"{path}: offsets [38, 40) at positions [{full - len(stored[-1][1])}, {full - 10})" in caplog.text
    log.append(make_batch(1))
    log.flush()
    assert log.read_bytes(40, 1 << 20) == stamped(make_batch(1), 40), "appends go on at the recovery point"
    assert [s.base_offset for s in log.segments] == [0, 40]


@pytest.mark.parametrize(
    "tail",
    [
        pytest.param(os.urandom(333), id="garbage"),
        pytest.param(b"\0" * 4096, id="zeros"),
        pytest.param(stamped(make_batch(1), 40)[:30], id="header-cut-after-30-bytes"),
        pytest.param(stamped(make_batch(1), 40)[:5], id="header-cut-after-5-bytes"),
        pytest.param(stamped(make_batch(1), 41), id="valid-batch-with-wrong-offset"),
        pytest.param(stamped(make_batch(1), 40)[:-1], id="whole-header-torn-records"),
    ],
)
def test_recover_cuts_bytes_after_the_last_valid_batch(open_log, log_dir, tail, caplog):
    stored = _write(open_log, 20, segment_bytes=1 << 20)
    path = _segment_file(log_dir, 0, ".log")
    size = os.path.getsize(path)
    _append_to(path, tail)
    log = open_log(segment_bytes=1 << 20)
    assert read_all(log) == stored
    assert log.log_end_offset == 40
    assert os.path.getsize(path) == size
    assert f"cutting {len(tail)} bytes" in _warnings(caplog)


def test_recover_keeps_an_active_segment_truncated_to_nothing(open_log, log_dir):
    stored = _write(open_log, 30)
    last_base = max(int(n[:20]) for n in os.listdir(log_dir) if n.endswith(".log"))
    _cut(_segment_file(log_dir, last_base, ".log"), 0)
    log = open_log()
    assert log.log_end_offset == 60, "the log end never moves below the recovery point"
    assert [(r.first_offset, r.next_offset) for r in log.damaged_ranges] == [(last_base, 60)]
    assert read_around_damage(log) == ([b for b in stored if b[0] < last_base], [(last_base, 60)])


def test_second_open_after_recovery_changes_nothing(open_log, log_dir):
    _write(open_log, 40)
    last_base = max(int(n[:20]) for n in os.listdir(log_dir) if n.endswith(".log"))
    _append_to(_segment_file(log_dir, last_base, ".log"), os.urandom(100))
    os.unlink(_segment_file(log_dir, 0, ".index"))
    open_log().close()
    after_first = files_of(log_dir)
    open_log().close()
    assert files_of(log_dir) == after_first
    open_log()._abandon()  # not even a close is needed for nothing to change...
    del after_first["clean-shutdown"]  # ...but the marker of the clean close, which open takes
    assert files_of(log_dir) == after_first


# --- indexes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
@pytest.mark.parametrize("base_index", [0, -1], ids=["closed-segment", "active-segment"])
def test_recover_rebuilds_a_deleted_index(open_log, log_dir, suffix, base_index):
    stored = _write(open_log, 40)
    before = files_of(log_dir)
    base = sorted(int(n[:20]) for n in before if n.endswith(".log"))[base_index]
    os.unlink(_segment_file(log_dir, base, suffix))
    log = open_log()
    assert read_all(log) == stored
    log.close()
    assert files_of(log_dir) == before


def _corrupt_index(log_dir: str, kind: str) -> None:
    index = _segment_file(log_dir, 0, ".index")
    with open(index, "rb") as f:
        original = f.read()
    entries = len(original) // 8
    if kind == "random-bytes":
        damaged = os.urandom(len(original))
    elif kind == "cut-mid-entry":
        damaged = original[:-3]
    elif kind == "another-segments-index":
        with open(_segment_file(log_dir, 20, ".index"), "rb") as f:
            damaged = f.read()
    elif kind == "last-entry-at-the-wrong-batch":
        last_position = int.from_bytes(original[-4:], "little")
        damaged = original[:-4] + (last_position + 1).to_bytes(4, "little")
    elif kind == "last-entry-past-the-end":
        damaged = original[:-4] + (1 << 30).to_bytes(4, "little")
    elif kind == "entries-missing-at-the-end":
        damaged = original[: 8 * (entries // 2)]
    elif kind == "empty":
        damaged = b""
    else:
        raise AssertionError(kind)
    assert damaged != original
    with open(index, "wb") as f:
        f.write(damaged)


@pytest.mark.parametrize(
    "kind",
    ["random-bytes", "cut-mid-entry", "another-segments-index", "last-entry-at-the-wrong-batch",
     "last-entry-past-the-end", "entries-missing-at-the-end", "empty"],
)
def test_recover_rebuilds_a_corrupt_index_of_a_closed_segment(open_log, log_dir, kind):
    stored = _write(open_log, 40, segment_bytes=1024, index_interval_bytes=100)
    assert os.path.exists(_segment_file(log_dir, 20, ".index")), "the test needs several segments"
    before = files_of(log_dir)
    _corrupt_index(log_dir, kind)
    log = open_log(segment_bytes=1024, index_interval_bytes=100)
    assert read_all(log, max_bytes=150) == stored
    log.close()
    assert files_of(log_dir) == before


def test_recover_rebuilds_a_corrupt_time_index_of_a_closed_segment(open_log, log_dir):
    stored = _write(open_log, 40, segment_bytes=1024, index_interval_bytes=100)
    before = files_of(log_dir)
    time_index = _segment_file(log_dir, 0, ".timeindex")
    with open(time_index, "wb") as f:
        f.write(os.urandom(len(before[os.path.basename(time_index)])))
    log = open_log(segment_bytes=1024, index_interval_bytes=100)
    assert read_all(log) == stored
    assert log.offset_for_timestamp(START_MS + 5) == 10
    log.close()
    assert files_of(log_dir) == before


@pytest.mark.parametrize("lost", [1, 2])
def test_time_index_that_lost_its_last_entries_is_rebuilt_on_open(open_log, log_dir, clock, lost):
    log = open_log(segment_bytes=1024, index_interval_bytes=0)
    for i in range(12):
        log.append(make_batch(1, value_bytes=200, timestamp=START_MS + 1000 * i))
    log.close()
    before = files_of(log_dir)
    time_index = _segment_file(log_dir, 0, ".timeindex")
    assert len(before[os.path.basename(time_index)]) == 3 * 12, "one entry per batch of the closed segment"
    _cut(time_index, 12 * (3 - lost))  # still well formed, every entry true: only the tail is gone
    log = open_log(segment_bytes=1024, index_interval_bytes=0)
    assert log.segments[0].max_timestamp == START_MS + 2000
    assert log.offset_for_timestamp(START_MS + 2000) == 2
    assert log.offset_for_timestamp(START_MS + 1001) == 2
    log.close()
    assert files_of(log_dir) == before


def test_a_trusted_segment_indexed_more_densely_after_a_config_change_is_not_rebuilt(open_log, caplog):
    log = open_log(segment_bytes=1024, index_interval_bytes=1000)
    for i in range(12):
        log.append(make_batch(1, value_bytes=200, timestamp=START_MS + 1000 * i))
    log.close()
    log = open_log(segment_bytes=1024, index_interval_bytes=0)  # the tail gets entries of its own now
    assert "index check failed" not in _warnings(caplog)
    assert log.segments[0].max_timestamp == START_MS + 2000
    assert [log.offset_for_timestamp(START_MS + 1000 * i) for i in range(12)] == list(range(12))


def test_read_repairs_a_plausible_index_entry_that_points_at_the_wrong_batch(open_log, log_dir, caplog):
    stored = _write(open_log, 40, segment_bytes=1024, index_interval_bytes=0)
    before = files_of(log_dir)
    index = _segment_file(log_dir, 0, ".index")
    damaged = bytearray(before[os.path.basename(index)])
    position = int.from_bytes(damaged[8 * 3 + 4 : 8 * 4], "little")
    damaged[8 * 3 + 4 : 8 * 4] = (position + 1).to_bytes(4, "little")  # entry 3 now points inside a batch
    with open(index, "wb") as f:
        f.write(damaged)
    log = open_log(segment_bytes=1024, index_interval_bytes=0)  # the cheap checks at open pass
    assert read_all(log, max_bytes=1) == stored
    assert "rebuilding the indexes" in _warnings(caplog)
    log.close()
    assert files_of(log_dir) == before


def test_lowering_max_message_bytes_does_not_make_old_batches_corrupt(open_log, log_dir):
    log = open_log(max_message_bytes=1 << 16, flush_fsync=True)
    large = make_batch(3, value_bytes=8000)
    log.append(make_batch(1))
    log.append(large)
    log.flush()
    log._abandon()  # a crash: the next open scans the active segment in full
    log = open_log(max_message_bytes=4096)
    assert read_all(log) == [(0, stamped(make_batch(1), 0)), (1, stamped(large, 1))]


# --- damage inside the log ---------------------------------------------------------------------


def _corrupt_fourth_batch_of_first_segment(open_log, log_dir):
    """Three or more closed segments; a byte near the end of the first segment's fourth batch
    flipped (its CRC fails).  (stored batches, segment bases, the victim batch, its position)."""
    stored = _write(open_log, 40, segment_bytes=1024)
    bases = sorted(int(n[:20]) for n in os.listdir(log_dir) if n.endswith(".log"))
    assert len(bases) >= 3
    victim = [b for b in stored if b[0] < bases[1]][3]
    position = sum(len(b) for off, b in stored if off < victim[0])
    with open(_segment_file(log_dir, 0, ".log"), "r+b") as f:
        f.seek(position + len(victim[1]) - 3)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x55]))
    return stored, bases, victim, position


def test_corrupt_batch_in_a_closed_segment_is_contained_and_every_later_batch_stays(open_log, log_dir,
                                                                                      caplog):
    stored, bases, victim, position = _corrupt_fourth_batch_of_first_segment(open_log, log_dir)
    _crashed_before_any_checkpoint(log_dir)  # recover everything: every segment is scanned
    log = open_log(segment_bytes=1024)
    assert read_around_damage(log) == ([b for b in stored if b != victim], [(victim[0], victim[0] + 2)])
    assert log.log_end_offset == stored[-1][0] + 2
    assert sorted(int(n[:20]) for n in os.listdir(log_dir) if n.endswith(".log")) == bases
    [damaged] = log.damaged_ranges
    assert (damaged.first_position, damaged.end_position) == (position, position + len(victim[1]))
    errors = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    assert f"{bases[0]:020d}.log: offsets [{victim[0]}, {victim[0] + 2}) at positions [{position}, " in errors
    assert "CRC mismatch" in errors


def test_rot_in_a_trusted_segment_is_kept_and_reported_not_cut(open_log, log_dir, caplog):
    stored, bases, victim, position = _corrupt_fourth_batch_of_first_segment(open_log, log_dir)
    path = _segment_file(log_dir, 0, ".log")
    damaged = Path(path).read_bytes()
    os.unlink(_segment_file(log_dir, 0, ".index"))  # the index check fails: the segment is re-read
    log = open_log(segment_bytes=1024)
    assert Path(path).read_bytes() == damaged, "acknowledged bytes are never cut from a trusted segment"
    assert [s.base_offset for s in log.segments] == bases, "later segments stay"
    assert log.log_end_offset == stored[-1][0] + 2
    assert log.read_bytes(0, 1 << 20)[: len(stored[0][1])] == stored[0][1]  # before the damage: fine
    with pytest.raises(DamagedRangeError, match=f"{bases[0]:020d}.log.*positions \\[{position}, "):
        log.read_bytes(victim[0], 1 << 20)
    later = [b for b in stored if b[0] >= bases[1]]
    assert log.read_bytes(later[0][0], len(later[0][1])) == later[0][1]
    assert log.read_bytes(victim[0] + 2, 1 << 20)[: len(stored[4][1])] == stored[4][1], "after it: fine"
    assert "damaged range" in caplog.text
    log.append(make_batch(1))
    log.flush()
    assert log.high_watermark == stored[-1][0] + 3


def _damaged_closed_segment(open_log, log_dir, damage):
    """A closed segment of 40 equal batches (increasing timestamps, so opening checks only its
    tail), then ``damage(file, batch_size)`` applied to its ``.log``, and the log reopened."""
    log = open_log(segment_bytes=4096, index_interval_bytes=1000)
    batches = [make_batch(1, value_bytes=30, tag=i, timestamp=START_MS + i) for i in range(80)]
    for batch in batches:
        log.append(batch)
    log.close()
    size = len(batches[0])
    assert all(len(b) == size for b in batches) and log.segments[0].next_offset > 40
    with open(_segment_file(log_dir, 0, ".log"), "r+b") as f:
        damage(f, size)
    return open_log(segment_bytes=4096, index_interval_bytes=1000), batches, size


def _bad_length_at_batch_5(f, size):
    f.seek(5 * size + 8)
    f.write((7).to_bytes(4, "little"))


@pytest.mark.parametrize(("offset", "max_bytes"), [(4, 200), (5, 100), (5, 100_000), (3, 500)])
def test_a_read_that_meets_a_damaged_batch_names_the_file_and_position_and_keeps_the_log_online(
        open_log, log_dir, offset, max_bytes):
    log, batches, size = _damaged_closed_segment(open_log, log_dir, _bad_length_at_batch_5)
    path = _segment_file(log_dir, 0, ".log")
    where = rf"{path}: .*batch at position {5 * size}\b.*batch_length 7"
    if offset < 5:  # a read from before the damage gets the batches up to it
        assert log.read(offset, max_bytes).next_offset == 5
    with pytest.raises(DamagedRangeError, match=where):
        log.read(5, max_bytes)
    assert not log.offline
    assert log.read_bytes(0, size) == stamped(batches[0], 0), "reads before the damage go on"
    assert log.read_bytes(60, 1) == stamped(batches[60], 60), "and in other segments"
    log.append(make_batch(1))
    log.flush()
    assert log.high_watermark == 81, "producers go on"
    with pytest.raises(CorruptRecordError, match=f"position {5 * size}"):
        log.read(5, 100)  # the same answer again


def test_once_the_damage_is_known_a_read_before_it_gets_the_valid_prefix_and_its_offsets(open_log, log_dir):
    log, batches, size = _damaged_closed_segment(open_log, log_dir, _bad_length_at_batch_5)
    with pytest.raises(CorruptRecordError):
        log.read(5, 100)  # finds the damage
    file_slice = log.read(1, 100_000)
    assert (file_slice.position, file_slice.length) == (size, 4 * size)
    assert (file_slice.first_offset, file_slice.next_offset) == (1, 5)
    assert log.read_bytes(1, 100_000) == b"".join(stamped(b, i + 1) for i, b in enumerate(batches[1:5]))


def test_a_damaged_segment_is_not_rescanned_on_every_read(open_log, log_dir, monkeypatch):
    log, _, size = _damaged_closed_segment(open_log, log_dir, _bad_length_at_batch_5)
    from hpbroker.io.logfile import LogFile

    scans = []
    scan = LogFile.scan
    monkeypatch.setattr(LogFile, "scan", lambda self, *a, **k: scans.append(self.path) or scan(self, *a, **k))
    for _ in range(5):
        with pytest.raises(DamagedRangeError):
            log.read(5, 100)
    assert len(scans) == 2, "one rebuild: the valid batches before the damage, then those after it"


def test_offset_for_timestamp_over_records_that_fail_their_crc_names_the_file_and_position(open_log, log_dir):
    def flip_a_record_byte_of_batch_7(f, size):
        f.seek(7 * size + size - 3)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x55]))

    log, _, size = _damaged_closed_segment(open_log, log_dir, flip_a_record_byte_of_batch_7)
    path = _segment_file(log_dir, 0, ".log")
    assert log.offset_for_timestamp(START_MS + 6) == 6
    with pytest.raises(CorruptRecordError, match=rf"{path}: batch at position {7 * size} \(offset 7\)"):
        log.offset_for_timestamp(START_MS + 7)
    assert not log.offline
    assert log.offset_for_timestamp(START_MS + 60) == 60


@pytest.mark.parametrize("marker", [True, False], ids=["closed-cleanly", "crashed"])
def test_a_missing_segment_is_a_gap_and_no_later_segment_is_deleted(open_log, log_dir, caplog, marker):
    stored = _write(open_log, 40, segment_bytes=1024)
    bases = sorted(int(n[:20]) for n in os.listdir(log_dir) if n.endswith(".log"))
    for suffix in (".log", ".index", ".timeindex"):
        os.unlink(_segment_file(log_dir, bases[1], suffix))
    if not marker:
        _crashed_before_any_checkpoint(log_dir)
    log = open_log(segment_bytes=1024)
    assert [s.base_offset for s in log.segments] == [bases[0]] + bases[2:]
    gap = (bases[1], bases[2])
    assert read_around_damage(log) == ([b for b in stored if not bases[1] <= b[0] < bases[2]], [gap])
    with pytest.raises(DamagedRangeError) as info:
        log.read(bases[1] + 1, 100)
    assert (info.value.first_offset, info.value.next_offset) == gap
    assert f"starts at offset {bases[2]} but its predecessor ends at {bases[1]}" in caplog.text
    log.append(make_batch(1))
    log.flush()
    assert log.high_watermark == 81, "no offset is handed out twice"


# --- directory debris and the checkpoint --------------------------------------------------------


def test_open_removes_stray_indexes_and_leftover_files(open_log, log_dir):
    stored = _write(open_log, 5)
    debris = [f"{99:020d}.index", f"{99:020d}.timeindex", f"{0:020d}.log.deleted", "x.tmp",
              CHECKPOINT + ".tmp"]
    for name in debris + ["notes.txt"]:
        with open(os.path.join(log_dir, name), "w") as f:
            f.write("0\n999\n")
    log = open_log()
    assert read_all(log) == stored
    remaining = set(os.listdir(log_dir))
    assert not remaining & set(debris)
    assert "notes.txt" in remaining, "files that are not ours are left alone"


def test_open_makes_a_new_partition_directory_and_its_ancestors_durable(tmp_path, disk_events):
    data = tmp_path / "data"
    created = [str(data), str(data / "topics"), str(data / "topics" / "t-0")]
    with PartitionLog(created[-1], TEST_CONFIG) as log:
        opened_at = len(disk_events.events)
        log.append(make_batch(1))
        log.flush()
    events = [(op, path) for op, path, _ in disk_events.events[:opened_at]]
    for directory in created:  # each new directory's entry in its parent is fsynced before open returns
        made = events.index(("mkdir", directory))
        assert ("fsync", os.path.dirname(directory)) in events[made:], directory
    assert ("fsync", created[-1]) in events, "and the new directory's own entries (segment, checkpoint)"


def test_a_segment_the_open_creates_is_made_durable_even_when_the_checkpoint_needs_no_write(
        log_dir, open_log, disk_events):
    os.makedirs(log_dir)
    with open(os.path.join(log_dir, CHECKPOINT), "w") as f:
        f.write("0\n0\n")  # a directory whose segments are gone: the checkpoint is already right
    disk_events.events.clear()
    open_log()
    events = [(op, os.path.basename(path)) for op, path, _ in disk_events.events]
    assert ("fsync", os.path.basename(log_dir)) in events, "else the new segment may vanish with its records"


def test_open_of_an_existing_directory_syncs_no_parent(log_dir, open_log, disk_events):
    open_log().close()
    disk_events.events.clear()
    open_log()
    assert not [e for e in disk_events.of("fsync") if e[1] == os.path.dirname(log_dir)]


def _flip_a_record_byte(log_dir: str, stored, victim_index: int) -> None:
    """Damage that only a full scan finds: a byte of a batch's records (its CRC fails)."""
    position = sum(len(b) for _, b in stored[:victim_index]) + len(stored[victim_index][1]) - 3
    with open(_segment_file(log_dir, 0, ".log"), "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x55]))


def test_leftover_checkpoint_tmp_is_ignored(open_log, log_dir):
    stored = _write(open_log, 40, segment_bytes=1024)
    assert len([name for name in os.listdir(log_dir) if name.endswith(".log")]) > 3
    with open(os.path.join(log_dir, CHECKPOINT), "w") as f:
        f.write("0\n0\n")  # recover everything...
    with open(os.path.join(log_dir, CHECKPOINT + ".tmp"), "w") as f:
        f.write("0\n999\n")  # ...not what an interrupted write, never renamed into place, says
    _flip_a_record_byte(log_dir, stored, 3)
    log = open_log(segment_bytes=1024)
    assert [(r.first_offset, r.next_offset) for r in log.damaged_ranges] == [(6, 8)], \
        "the damaged first segment was scanned in full"
    assert not os.path.exists(os.path.join(log_dir, CHECKPOINT + ".tmp"))
    with open(os.path.join(log_dir, CHECKPOINT)) as f:
        assert f.read() == "0\n80\n"


@pytest.mark.parametrize("content", [b"", b"garbage", b"1\n5\n", b"0\n-5\n", b"0\n5", b"\xff" * 100])
def test_malformed_checkpoint_means_full_recovery(open_log, log_dir, caplog, content):
    stored = _write(open_log, 40, segment_bytes=1024)
    with open(os.path.join(log_dir, CHECKPOINT), "wb") as f:
        f.write(content)
    _flip_a_record_byte(log_dir, stored, 3)  # in the first segment, which a checkpoint would trust
    log = open_log(segment_bytes=1024)
    assert read_around_damage(log) == (stored[:3] + stored[4:], [(6, 8)]), "every segment was scanned in full"
    assert "malformed checkpoint" in _warnings(caplog)
    assert log.recovery_point == 80
    with open(os.path.join(log_dir, CHECKPOINT)) as f:
        assert f.read() == "0\n80\n"


def test_checkpoint_records_the_recovery_point_on_close(open_log, log_dir):
    log = open_log()
    log.append(make_batch(7))
    log.close()
    with open(os.path.join(log_dir, CHECKPOINT)) as f:
        assert f.read() == "0\n7\n"


# --- clean shutdown --------------------------------------------------------------------------

CLEAN_SHUTDOWN = "clean-shutdown"


def _active_log_of_many_batches(open_log, log_dir) -> tuple[list[tuple[int, bytes]], str]:
    log = open_log(segment_bytes=1 << 20, index_interval_bytes=4096)
    for i in range(300):
        log.append(make_batch(1, value_bytes=1000, tag=i, timestamp=START_MS + i))
    log.flush()
    stored = read_all(log)
    log.close()
    return stored, _segment_file(log_dir, 0, ".log")


def _counting_reads(monkeypatch) -> list[int]:
    from hpbroker.io import logfile

    counted: list[int] = []
    pread_full = logfile.pread_full

    def counting(fd, length, position):
        data = pread_full(fd, length, position)
        counted.append(len(data))
        return data

    monkeypatch.setattr(logfile, "pread_full", counting)
    return counted


def test_close_leaves_a_clean_shutdown_marker_that_open_removes_before_writing(open_log, log_dir,
                                                                             disk_events):
    log = open_log()
    log.append(make_batch(7))
    log.close()
    with open(os.path.join(log_dir, CLEAN_SHUTDOWN)) as f:
        assert f.read() == "0\n7\n"
    closing = [(op, os.path.basename(path)) for op, path, _ in disk_events.events]
    marker_written = closing.index(("fsync", CLEAN_SHUTDOWN))
    assert ("fsync", os.path.basename(log_dir)) in closing[marker_written:], "the marker is made durable"
    assert ("replace", CHECKPOINT) in closing[:marker_written], "after the checkpoint"
    disk_events.events.clear()
    log = open_log()
    assert not os.path.exists(os.path.join(log_dir, CLEAN_SHUTDOWN))
    log.append(make_batch(1))
    log.flush()
    opening = [(op, path) for op, path, _ in disk_events.events]
    removed = opening.index(("unlink", os.path.join(log_dir, CLEAN_SHUTDOWN)))
    synced = opening.index(("fsync", log_dir), removed)
    written = [e for e in opening[:synced] if e[0] in ("write", "writev", "ftruncate", "pwrite")
               and os.path.basename(e[1])[:1].isdigit()]
    assert not written, "nothing is written before the marker is gone for good"


def test_a_clean_reopen_does_not_reread_the_active_segment(open_log, log_dir, monkeypatch):
    stored, path = _active_log_of_many_batches(open_log, log_dir)
    counted = _counting_reads(monkeypatch)
    log = open_log(segment_bytes=1 << 20, index_interval_bytes=4096)
    assert sum(counted) < 16 << 10, f"read {sum(counted)} bytes of a {os.path.getsize(path)}-byte segment"
    assert read_all(log) == stored
    log._abandon()  # a crash: no marker
    counted.clear()
    log = open_log(segment_bytes=1 << 20, index_interval_bytes=4096)
    assert sum(counted) >= os.path.getsize(path), "after a crash the active segment is scanned in full"
    assert read_all(log) == stored


@pytest.mark.parametrize("marker", [None, b"", b"0\n299\n", b"garbage"],
                         ids=["missing", "empty", "other-offset", "malformed"])
def test_without_a_marker_matching_the_checkpoint_the_active_segment_is_recovered(open_log, log_dir, marker):
    stored, path = _active_log_of_many_batches(open_log, log_dir)
    marker_path = os.path.join(log_dir, CLEAN_SHUTDOWN)
    if marker is None:
        os.unlink(marker_path)
    else:
        with open(marker_path, "wb") as f:
            f.write(marker)
    victim = stored[100]
    with open(path, "r+b") as f:  # damage only a full scan finds
        f.seek(sum(len(b) for _, b in stored[:100]) + len(victim[1]) - 3)
        f.write(b"\xff\xfe")
    log = open_log(segment_bytes=1 << 20, index_interval_bytes=4096)
    victim_end = _core.read_header(victim[1]).next_offset
    assert read_around_damage(log) == (stored[:100] + stored[101:], [(victim[0], victim_end)]), \
        "the active segment was scanned in full"


def test_a_clean_reopen_still_checks_the_tail_of_the_active_segment(open_log, log_dir, caplog):
    stored, path = _active_log_of_many_batches(open_log, log_dir)
    _append_to(path, os.urandom(100))
    log = open_log(segment_bytes=1 << 20, index_interval_bytes=4096)
    assert read_all(log) == stored
    assert "cutting 100 bytes" in _warnings(caplog)


# --- crashes -----------------------------------------------------------------------------------


def test_flushed_records_survive_an_abandoned_log_and_pending_ones_are_lost(open_log):
    log = open_log(flush_fsync=False)
    for i in range(10):
        log.append(make_batch(1, tag=i))
    log.flush()
    log.append(make_batch(1, tag=99))  # pending, never flushed
    expected = read_all(log)
    log._abandon()  # like kill -9: no flush, no close, no checkpoint
    log = open_log(flush_fsync=False)
    assert log.log_end_offset == 10
    assert read_all(log) == expected


def test_abandoned_log_right_after_a_roll_reopens(open_log):
    log = open_log()
    log.append(make_batch(3))
    log.roll()
    log.append(make_batch(1))  # pending in the new, still empty, segment
    log._abandon()
    log = open_log()
    assert ([s.base_offset for s in log.segments], log.log_end_offset) == ([0, 3], 3)


def test_flushed_records_without_fsync_survive_kill_9(log_dir, tmp_path):
    script = textwrap.dedent(
        f"""
        import os, signal
        from hpbroker import _core
        from hpbroker.io import LogConfig, PartitionLog
        log = PartitionLog({log_dir!r}, LogConfig(flush_fsync=False, flush_messages=10**6, flush_ms=10**6,
                                                  segment_bytes=4096))
        for i in range(100):
            log.append(_core.build_batch([b"record %d" % i], timestamps={START_MS} + i))
        log.flush()
        log.append(_core.build_batch([b"pending"], timestamps={START_MS}))
        print(log.high_watermark, log.recovery_point, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    high_watermark, recovery_point = map(int, done.stdout.split())
    assert high_watermark == 100 and recovery_point < 100, "some acknowledged records were never fsynced"
    with PartitionLog(log_dir, TEST_CONFIG) as log:
        assert log.log_end_offset == 100
        records = _core.decode_records(b"".join(batch for _, batch in read_all(log)))
        assert [r.value for r in records] == [b"record %d" % i for i in range(100)]


def test_damage_found_in_the_middle_of_a_segment_is_found_again_by_every_later_open(open_log, log_dir):
    log, batches, size = _damaged_closed_segment(open_log, log_dir, _bad_length_at_batch_5)
    with pytest.raises(DamagedRangeError):
        log.read(5, 100)  # found by a read: the indexes are rebuilt around it
    assert [(r.first_offset, r.next_offset) for r in log.damaged_ranges] == [(5, 6)]
    with open(os.path.join(log_dir, "damaged-segments")) as f:
        assert f.read() == "0\n0\n", "the segment is listed"
    log.close()
    for crash in (False, True):
        log = open_log(segment_bytes=4096, index_interval_bytes=1000)
        assert [(r.first_offset, r.next_offset) for r in log.damaged_ranges] == [(5, 6)], \
            "known at open, before any read reaches it"
        slice_ = log.read(0, 1 << 20)
        assert slice_.next_offset == 5, "a read before the damage stops before its bytes"
        batches_read, skipped = read_around_damage(log)
        assert skipped == [(5, 6)] and [o for o, _ in batches_read] == [o for o in range(80) if o != 5]
        if crash:
            log._abandon()
        else:
            log.close()


def test_garbage_between_two_batches_is_a_range_of_no_offsets_and_stays_known(open_log, log_dir):
    def insert_garbage_before_batch_4(f, size):
        data = f.read()
        f.seek(0)
        f.write(data[: 4 * size] + b"\xa5" * 10 + data[4 * size :])

    log, batches, size = _damaged_closed_segment(open_log, log_dir, insert_garbage_before_batch_4)
    assert read_around_damage(log) == ([(i, stamped(b, i)) for i, b in enumerate(batches)], [])
    [damaged] = log.damaged_ranges  # found by the first read that walked into it
    assert (damaged.first_offset, damaged.next_offset, damaged.first_position) == (4, 4, 4 * size)
    log.close()
    log = open_log(segment_bytes=4096, index_interval_bytes=1000)
    assert [(r.first_offset, r.next_offset) for r in log.damaged_ranges] == [(4, 4)]
    assert log.read(0, 1 << 20).next_offset == 4, "the garbage is never sent"
    assert read_around_damage(log) == ([(i, stamped(b, i)) for i, b in enumerate(batches)], [])
