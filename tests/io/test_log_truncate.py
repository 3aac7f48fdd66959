"""PartitionLog.truncate_to and the leader epochs of appended batches, on real logs."""

from __future__ import annotations

import os

import pytest
from storage_helpers import START_MS, TEST_CONFIG, make_batch, read_all, stamped

from hpbroker import _core
from hpbroker.io import PartitionLog
from hpbroker.io.leader_epochs import LEADER_EPOCH_FILE_NAME
from hpbroker.io.producer_state import list_snapshots


def fill(log: PartitionLog, batches: int, *, records: int = 2, tag: int = 0) -> list[bytes]:
    """Append ``batches`` batches of ``records`` records each, flushed; returns them as sent."""
    sent = []
    for k in range(batches):
        batch = make_batch(records, value_bytes=200, tag=tag + k)
        log.append(batch)
        sent.append(batch)
    log.flush()
    return sent


def stored(sent: list[bytes], records: int = 2, start: int = 0) -> list[tuple[int, bytes]]:
    return [(start + k * records, stamped(batch, start + k * records)) for k, batch in enumerate(sent)]


def test_truncate_within_the_active_segment_then_append(open_log):
    log = open_log(segment_bytes=1 << 20)
    sent = fill(log, 10)
    assert log.truncate_to(8) == 8
    assert (log.log_end_offset, log.high_watermark, log.segment_count) == (8, 8, 1)
    assert log.recovery_point <= 8
    assert read_all(log) == stored(sent[:4])
    again = make_batch(2, tag=99)
    assert log.append(again).first_offset == 8
    log.flush()
    assert read_all(log) == stored(sent[:4]) + [(8, stamped(again, 8))]


def test_truncate_across_several_segments(open_log, log_dir):
    log = open_log()
    sent = fill(log, 60)
    assert log.segment_count > 3
    bases = [segment.base_offset for segment in log.segments]
    target = bases[1] + 2
    assert log.truncate_to(target) == target
    assert [segment.base_offset for segment in log.segments] == bases[:2]
    assert read_all(log) == stored(sent[: target // 2])
    assert all(int(name[:20]) <= bases[1] for name in os.listdir(log_dir) if name.endswith(".log"))
    assert log.read_bytes(target, 1000) == b""
    fill(log, 3, tag=500)
    assert log.log_end_offset == target + 6 and len(read_all(log)) == target // 2 + 3


def test_truncate_to_a_segment_base_leaves_it_empty(open_log):
    log = open_log()
    sent = fill(log, 60)
    base = log.segments[2].base_offset
    assert log.truncate_to(base) == base
    assert log.segment_count == 3 and log.segments[-1].size_in_bytes == 0
    assert read_all(log) == stored(sent[: base // 2])


def test_truncate_to_the_log_start_empties_the_log(open_log):
    log = open_log()
    fill(log, 30)
    assert log.truncate_to(0) == 0
    assert (log.log_start_offset, log.log_end_offset, log.segment_count) == (0, 0, 1)
    assert read_all(log) == []
    sent = fill(log, 2, tag=7)
    assert read_all(log) == stored(sent)


def test_truncate_to_the_log_end_changes_nothing(open_log):
    log = open_log()
    sent = fill(log, 30)
    end, count = log.log_end_offset, log.segment_count
    assert log.truncate_to(end) == end
    assert (log.log_end_offset, log.segment_count) == (end, count) and read_all(log) == stored(sent)


def test_truncate_to_the_log_end_drops_an_epoch_begun_there_without_a_record(open_log, log_dir):
    """A broker that led in epoch 1 without appending, then follows: the leader tells it to
    truncate to its own log end; the empty epoch must go, or its next fetch names it again."""
    log = open_log()
    log.append(make_batch(2))
    log.flush()
    log.begin_leader_epoch(1)
    assert log.leader_epochs.entries == [(0, 0), (1, 2)]
    assert log.truncate_to(log.log_end_offset) == 2
    assert log.leader_epochs.entries == [(0, 0)] and log.leader_epochs.latest_epoch == 0
    with open(os.path.join(log_dir, LEADER_EPOCH_FILE_NAME)) as f:
        assert f.read() == "0\n1\n0 0\n"


def test_truncate_inside_a_batch_cuts_the_whole_batch(open_log):
    log = open_log()
    sent = fill(log, 5, records=3)
    assert log.truncate_to(7) == 6  # offset 7 lies in the batch [6, 9): Kafka's batch boundary
    assert read_all(log) == stored(sent[:2], records=3)


def test_truncate_out_of_range_is_refused(open_log):
    log = open_log()
    fill(log, 3)
    for bad in (-1, 7, "2"):
        with pytest.raises(ValueError):
            log.truncate_to(bad)
    assert log.log_end_offset == 6


def test_truncate_completes_pending_records_first(open_log):
    log = open_log()
    fill(log, 2)
    log.append(make_batch(2, tag=3))
    assert log.pending_records == 2
    assert log.truncate_to(6) == 6 and log.high_watermark == 6 and log.pending_records == 0
    assert log.truncate_to(2) == 2 and log.pending_records == 0


def test_truncation_survives_a_clean_reopen(log_dir, clock):
    with PartitionLog(log_dir, TEST_CONFIG, clock=clock) as log:
        sent = fill(log, 60)
        target = log.segments[1].base_offset + 4
        log.truncate_to(target)
    with PartitionLog(log_dir, TEST_CONFIG, clock=clock) as log:
        assert log.log_end_offset == target and read_all(log) == stored(sent[: target // 2])
        assert log.append(make_batch(1)).first_offset == target


def test_truncation_survives_a_crash(log_dir, clock):
    log = PartitionLog(log_dir, TEST_CONFIG, clock=clock)
    sent = fill(log, 60)
    log.checkpoint()  # the recovery point above the cut: truncation must move it down
    target = log.segments[1].base_offset + 4
    log.truncate_to(target)
    log._abandon()
    with PartitionLog(log_dir, TEST_CONFIG, clock=clock) as log:
        assert log.log_end_offset == target and read_all(log) == stored(sent[: target // 2])
        assert log.damaged_ranges == []


def test_a_batch_cut_away_is_no_duplicate_any_more(open_log, log_dir):
    log = open_log()
    batches = [_core.build_batch([f"r{k}".encode() * 100], producer="p", base_sequence=k, producer_id=7,
                                 producer_epoch=0, timestamps=START_MS) for k in range(60)]
    for batch in batches:
        log.append(batch)
    log.flush()
    assert log.segment_count > 2 and list_snapshots(log_dir)
    assert log.append(batches[40]).duplicate
    log.truncate_to(40)
    assert all(offset <= 40 for offset in list_snapshots(log_dir))
    assert log.producer_state.get(7).last_sequence == 39
    again = log.append(batches[40])
    assert not again.duplicate and again.first_offset == 40
    assert log.append(batches[40]).duplicate


def test_appends_stamp_the_leader_epoch_and_record_where_it_began(open_log, log_dir):
    log = open_log()
    log.append(make_batch(2))
    log.append(make_batch(3), leader_epoch=2)
    log.append(make_batch(1), leader_epoch=2)
    log.append(make_batch(1), leader_epoch=5)
    log.flush()
    epochs = [_core.read_header(batch).leader_epoch for _, batch in read_all(log)]
    assert epochs == [0, 2, 2, 5]
    assert log.leader_epochs.entries == [(0, 0), (2, 2), (5, 6)]
    assert log.leader_epochs.end_offset_for(2, log.log_end_offset) == (2, 6)
    with pytest.raises(ValueError):
        log.append(make_batch(1), leader_epoch=4)
    assert log.log_end_offset == 7
    log.truncate_to(5)
    assert log.leader_epochs.entries == [(0, 0), (2, 2)]
    with open(os.path.join(log_dir, LEADER_EPOCH_FILE_NAME)) as f:
        assert f.read() == "0\n2\n0 0\n2 2\n"


def test_the_open_drops_leader_epochs_beyond_the_log(log_dir, clock):
    with PartitionLog(log_dir, TEST_CONFIG, clock=clock) as log:
        log.append(make_batch(2), leader_epoch=1)
    with open(os.path.join(log_dir, LEADER_EPOCH_FILE_NAME), "w") as f:
        f.write("0\n2\n1 0\n3 9\n")  # as a crash between the log's truncation and the cache's leaves it
    with PartitionLog(log_dir, TEST_CONFIG, clock=clock) as log:
        assert log.leader_epochs.entries == [(1, 0)]


def test_retention_moves_the_first_leader_epoch_up(open_log, clock):
    log = open_log(retention_bytes=8192)
    fill(log, 60)
    assert log.leader_epochs.entries == [(0, 0)]
    assert log.delete_old_segments() > 0
    assert log.leader_epochs.entries == [(0, log.log_start_offset)]


def test_truncate_completes_the_flushes_in_flight_first(log_dir, clock):
    with PartitionLog(log_dir, TEST_CONFIG, clock=clock, flush_on_append=False) as log:
        log.append(make_batch(2))
        job = log.begin_flush()
        log.append(make_batch(2, tag=1))
        assert log.truncate_to(2) == 2
        assert log.flushes_in_flight == () and log.pending_records == 0
        log.complete_flush(job)  # applied by the truncation: a no-op
        assert read_all(log) == [(0, stamped(make_batch(2), 0))]


def _index_state(segment) -> tuple:
    return (list(segment.offset_index.relative_offsets), list(segment.offset_index.positions),
            list(segment.time_index.timestamps), list(segment.time_index.relative_offsets),
            segment.max_timestamp, segment.first_batch_timestamp, segment.next_offset, segment.size_in_bytes)


@pytest.mark.parametrize("cut", [0, 1, 37, 120, 121, 238, 239])
def test_truncate_keeps_the_index_entries_below_the_cut_without_rescanning_the_segment(
        log_dir, clock, monkeypatch, tmp_path, cut):
    """A healthy active segment is cut Kafka's way: its index entries below the cut are kept and
    checked (Segment.load), not rebuilt by a scan of the whole file (Segment.recover), and they
    are exactly what such a scan gives: offsets, positions, the time index, max_timestamp."""
    from hpbroker.io.segment import Segment

    log = PartitionLog(log_dir, TEST_CONFIG.replace(segment_bytes=1 << 20, index_interval_bytes=300),
                       clock=clock)
    timestamps = [START_MS + (k * 7919) % 1000 for k in range(120)]  # going up and down
    for k, timestamp in enumerate(timestamps):
        log.append(make_batch(2, value_bytes=40 + k % 50, timestamp=timestamp, tag=k))
        if k % 7 == 6:
            log.flush()
    log.flush()
    full_scans = []
    original = Segment.recover
    monkeypatch.setattr(Segment, "recover", lambda self, *a: full_scans.append(self) or original(self, *a))
    assert log.truncate_to(cut) == cut - cut % 2
    assert full_scans == [], "no scan of the whole segment"
    kept = _index_state(log.segments[-1])
    log.checkpoint()
    copy = os.path.join(tmp_path, "copy")
    os.mkdir(copy)
    name = os.path.basename(log.segments[-1].path)
    with open(log.segments[-1].path, "rb") as src, open(os.path.join(copy, name), "wb") as dst:
        dst.write(src.read())
    scanned = Segment(copy, 0, log.config, create=False, now_ms=START_MS)
    scanned.recover(cut)
    try:
        assert kept == _index_state(scanned)
    finally:
        scanned.close()
    expected_max = max(timestamps[: cut // 2], default=-1)
    assert kept[4] == expected_max and kept[6] == cut - cut % 2
    if cut > 1:
        assert log.offset_for_timestamp(expected_max) is not None
    log._abandon()  # a crash: the next open trusts the index files as written
    monkeypatch.undo()
    with PartitionLog(log_dir, log.config, clock=clock) as reopened:
        assert reopened.log_end_offset == cut - cut % 2
        assert [offset for offset, _ in read_all(reopened)] == list(range(0, cut - cut % 2, 2))
        assert _index_state(reopened.segments[-1])[:6] == kept[:6]
