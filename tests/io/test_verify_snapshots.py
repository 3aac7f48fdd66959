"""``hpbroker check`` (hpbroker.io.verify) on producer state snapshots: a good one passes
silently; one that does not parse, or lies past the log end, is a note (the next open removes it
and rebuilds the state from the log), never a problem."""

from __future__ import annotations

from hpbroker.io import LogConfig, PartitionLog
from hpbroker.io.producer_state import list_snapshots, snapshot_file_name
from hpbroker.io.verify import check_partition
from hpbroker.records import build_batch


def _log_with_snapshots(directory) -> list[int]:
    log = PartitionLog(directory, LogConfig(segment_bytes=4096))
    for sequence in range(8):
        log.append(build_batch([b"x" * 1000], producer="p", base_sequence=sequence, producer_id=3,
                               producer_epoch=0))
    log.close()
    return list_snapshots(str(directory))


def test_valid_snapshots_are_not_mentioned(tmp_path):
    directory = tmp_path / "t-0"
    assert _log_with_snapshots(directory)
    report = check_partition(str(directory))
    assert report.ok and report.notes == [], report


def test_a_snapshot_that_does_not_parse_or_lies_past_the_log_end_is_a_note(tmp_path):
    directory = tmp_path / "t-0"
    offsets = _log_with_snapshots(directory)
    newest = directory / snapshot_file_name(offsets[-1])
    data = bytearray(newest.read_bytes())
    data[-1] ^= 0xFF
    newest.write_bytes(bytes(data))
    oldest = (directory / snapshot_file_name(offsets[0])).read_bytes()
    (directory / snapshot_file_name(1000)).write_bytes(oldest)
    report = check_partition(str(directory))
    assert report.ok, report.problems
    assert any(note.startswith(f"{newest.name}: a producer state snapshot that does not parse (CRC mismatch")
               for note in report.notes), report.notes
    past = f"{snapshot_file_name(1000)}: a producer state snapshot past the log end offset 8"
    assert any(note.startswith(past)
               for note in report.notes), report.notes


def test_an_unreadable_snapshot_is_a_note_and_the_open_rebuilds_the_state_without_it(tmp_path):
    """A snapshot that cannot be read (here a directory in its place: EISDIR, as EIO would be)
    is reported, and the next open rebuilds the producer state from the log instead of failing."""
    directory = tmp_path / "t-0"
    offsets = _log_with_snapshots(directory)
    newest = directory / snapshot_file_name(offsets[-1])
    newest.unlink()
    newest.mkdir()
    report = check_partition(str(directory))
    assert report.ok, report.problems
    assert any(note.startswith(f"{newest.name}: a producer state snapshot that cannot be read")
               for note in report.notes), report.notes
    with PartitionLog(directory, LogConfig(segment_bytes=4096)) as log:
        retry = build_batch([b"x" * 1000], producer="p", base_sequence=7, producer_id=3, producer_epoch=0)
        info = log.append(retry)
        assert info.duplicate and info.first_offset == 7


def test_a_snapshot_below_the_log_start_is_a_note(tmp_path):
    directory = tmp_path / "t-0"
    _log_with_snapshots(directory)
    (directory / snapshot_file_name(0)).write_bytes(b"")  # below the first segment once it is gone
    for path in sorted(directory.glob("00000000000000000000.*")):
        if path.suffix != ".snapshot":
            path.unlink()
    report = check_partition(str(directory))
    assert any(note.startswith(f"{snapshot_file_name(0)}: a producer state snapshot below the log start")
               for note in report.notes), report.notes
