"""The producer state table on its own: the deduplication rules, expiry, retention, the snapshot
codec and files, and the issued-ceiling file (docs/FORMAT.md, hpbroker.io.producer_state)."""

from __future__ import annotations

import os
import struct

import pytest

from hpbroker import _core
from hpbroker.errors import OutOfOrderSequenceError, ProducerFencedError, UnknownProducerIdError
from hpbroker.io.producer_replay import ReplayedBatch
from hpbroker.io.producer_state import (
    MAX_RUNS_PER_PRODUCER,
    IssuedProducerIds,
    ProducerStateManager,
    ProducerStateTable,
    SnapshotCorruptError,
    decode_snapshot,
    encode_snapshot,
    list_snapshots,
    read_issued_ceiling,
    write_issued_ceiling,
    write_snapshot,
)


def check(table, *batches, issued=None):
    """``batches``: (producer_id, epoch, base_sequence, record_count) each (-1 id: no identity)."""
    return table.check([b[0] for b in batches], [b[1] for b in batches], [b[2] for b in batches],
                       [b[3] - 1 for b in batches], issued)


def stored(table, pid, epoch, first_seq, count, first_offset, timestamp=1000):
    table.update(pid, epoch, first_seq, first_seq + count - 1, first_offset, first_offset + count - 1,
                 timestamp)


def test_a_new_producer_is_accepted_at_any_sequence_and_its_next_batch_must_follow():
    table = ProducerStateTable()
    assert check(table, (7, 0, 40, 5)) is None
    stored(table, 7, 0, 40, 5, first_offset=100)
    assert check(table, (7, 0, 45, 2)) is None
    with pytest.raises(OutOfOrderSequenceError, match="expected sequence 45"):
        check(table, (7, 0, 46, 1))  # a gap
    with pytest.raises(OutOfOrderSequenceError):
        check(table, (7, 0, 42, 5))  # a partial overlap: across the end of what is stored


def test_a_range_inside_a_remembered_run_is_a_duplicate_at_the_offsets_the_run_gives_it():
    table = ProducerStateTable()
    for k in range(3):
        stored(table, 7, 0, 10 * k, 10, first_offset=1000 + 100 * k)  # apart: a run each
    assert [run[2] for run in table.get(7).runs] == [1000, 1100, 1200]
    assert check(table, (7, 0, 10, 10)) == (10, 19, 1100, 1109)
    assert check(table, (7, 0, 12, 5)) == (12, 16, 1102, 1106), "any range inside one run"
    with pytest.raises(OutOfOrderSequenceError, match="not one right after the other"):
        check(table, (7, 0, 10, 10), (7, 0, 20, 10))  # two runs: stored, but not as one request
    with pytest.raises(OutOfOrderSequenceError, match="expected sequence 30"):
        check(table, (7, 0, 15, 10))  # across a run's end


def test_batches_following_in_sequence_and_offset_extend_the_newest_run():
    table = ProducerStateTable()
    for k in range(20):
        stored(table, 7, 0, 3 * k, 3, first_offset=50 + 3 * k)
    assert table.get(7).runs == [(0, 59, 50, 109)]
    assert check(table, (7, 0, 0, 3)) == (0, 2, 50, 52), "the first batch, twenty batches ago"
    assert check(table, (7, 0, 0, 3), (7, 0, 3, 57)) == (0, 59, 50, 109), "a whole request stored"
    stored(table, 7, 0, 60, 1, first_offset=111)  # an offset between: another producer's batch
    stored(table, 7, 0, 62, 1, first_offset=112)  # a sequence skipped (state lost between)
    assert table.get(7).runs == [(0, 59, 50, 109), (60, 60, 111, 111), (62, 62, 112, 112)]


def test_only_the_newest_five_runs_are_remembered():
    table = ProducerStateTable()
    for k in range(MAX_RUNS_PER_PRODUCER + 1):
        stored(table, 7, 0, 2 * k, 2, first_offset=10 * k)  # a run each: others write between
    assert len(table.get(7).runs) == MAX_RUNS_PER_PRODUCER
    assert check(table, (7, 0, 2, 2)) == (2, 3, 10, 11)
    with pytest.raises(OutOfOrderSequenceError):
        check(table, (7, 0, 0, 2))  # older than the runs remembered


def test_epochs_fence_the_older_and_a_newer_one_starts_at_zero():
    table = ProducerStateTable()
    stored(table, 7, 3, 0, 5, first_offset=0)
    with pytest.raises(ProducerFencedError, match="epoch 2 is older than epoch 3"):
        check(table, (7, 2, 5, 1))
    with pytest.raises(ProducerFencedError):
        check(table, (7, 2, 0, 5))  # even a copy of what that epoch stored
    with pytest.raises(OutOfOrderSequenceError, match="must start at sequence 0"):
        check(table, (7, 4, 5, 1))
    assert check(table, (7, 4, 0, 1)) is None
    stored(table, 7, 4, 0, 1, first_offset=5)
    entry = table.get(7)
    assert entry.epoch == 4 and entry.runs == [(0, 0, 5, 5)], "the new epoch restarts the entry"


def test_an_id_never_issued_is_unknown_and_an_issued_one_is_checked_once():
    table = ProducerStateTable()
    asked = []

    def issued(pid):
        asked.append(pid)
        return pid < 10

    with pytest.raises(UnknownProducerIdError, match="producer id 10"):
        check(table, (10, 0, 0, 1), issued=issued)
    assert check(table, (9, 0, 0, 1), issued=issued) is None
    stored(table, 9, 0, 0, 1, first_offset=0)
    assert check(table, (9, 0, 1, 1), issued=issued) is None
    assert asked == [10, 9], "a producer with state is never looked up"


def test_a_request_mixing_stored_and_new_batches_is_out_of_order():
    table = ProducerStateTable()
    stored(table, 7, 0, 0, 5, first_offset=0)
    with pytest.raises(OutOfOrderSequenceError, match="mixes"):
        check(table, (7, 0, 0, 5), (7, 0, 5, 5))
    with pytest.raises(OutOfOrderSequenceError, match="mixes"):
        check(table, (7, 0, 0, 5), (-1, -1, -1, 3))  # a stored batch and one without identity
    with pytest.raises(OutOfOrderSequenceError, match="mixes"):
        check(table, (8, 0, 0, 1), (7, 0, 0, 5))


def test_batches_of_one_request_follow_each_other():
    table = ProducerStateTable()
    assert check(table, (7, 0, 0, 5), (7, 0, 5, 5), (8, 0, 0, 1), (7, 0, 10, 1)) is None
    with pytest.raises(OutOfOrderSequenceError, match="earlier batch"):
        check(table, (7, 0, 0, 5), (7, 0, 6, 5))
    with pytest.raises(OutOfOrderSequenceError, match="earlier batch"):
        check(table, (7, 0, 0, 5), (7, 1, 0, 5))


def test_batches_without_identity_are_not_checked():
    table = ProducerStateTable()
    assert check(table, (-1, -1, -1, 3), (-1, -1, 5, 1)) is None
    assert len(table) == 0


def test_expiry_and_retention_drop_producers():
    table = ProducerStateTable()
    stored(table, 1, 0, 0, 1, first_offset=0, timestamp=1000)
    stored(table, 2, 0, 0, 1, first_offset=1, timestamp=5000)
    stored(table, 3, 0, 0, 1, first_offset=2, timestamp=5000)
    stored(table, 3, 0, 1, 1, first_offset=50, timestamp=5000)
    assert table.expire(before_ms=1001) == [1]
    assert table.drop_below(10) == [2], "3's last batch is above the log start"
    assert sorted(table.entries) == [3]


def sample_table():
    table = ProducerStateTable()
    stored(table, 1, 0, 0, 3, first_offset=0, timestamp=1_700_000_000_000)
    stored(table, 1, 0, 3, 2, first_offset=10, timestamp=1_700_000_000_001)
    stored(table, 2**40, 7, 100, 1, first_offset=20, timestamp=5)
    return table


def test_snapshot_round_trips():
    table = sample_table()
    decoded = decode_snapshot(encode_snapshot(table), 21)
    assert decoded == table and decoded.last_offset == 20
    assert decode_snapshot(encode_snapshot(ProducerStateTable())) == ProducerStateTable()


def test_snapshot_round_trips_runs():
    table = ProducerStateTable()
    for k in range(12):  # producer 3 alone for 12 batches: one run
        stored(table, 3, 2, 4 * k, 4, first_offset=4 * k, timestamp=1_700_000_000_000 + k)
    for k in range(7):  # producer 4 between others: a run each, the newest five kept
        stored(table, 4, 0, k, 1, first_offset=100 + 2 * k)
    assert table.get(3).runs == [(0, 47, 0, 47)] and len(table.get(4).runs) == 5
    data = encode_snapshot(table)
    assert len(data) == 10 + (21 + 32) + (21 + 5 * 32), "the layout of batches, a run in each place"
    decoded = decode_snapshot(data, 113)
    assert decoded == table and decoded.get(3).last_timestamp == 1_700_000_000_011
    assert decoded.get(3).runs == [(0, 47, 0, 47)]
    assert decoded.get(4).runs == [(k, k, 100 + 2 * k, 100 + 2 * k) for k in range(2, 7)]
    assert decode_snapshot(encode_snapshot(decoded), 113) == table


def test_a_snapshot_of_one_entry_per_batch_reads_as_merged_runs():
    body = (struct.pack("<I", 1) + struct.pack("<qiqB", 5, 0, 1000, 3) + struct.pack("<qqqq", 0, 2, 10, 12)
            + struct.pack("<qqqq", 3, 3, 13, 13) + struct.pack("<qqqq", 4, 5, 20, 21))
    table = decode_snapshot(struct.pack("<HI", 0, _core.crc32c(body)) + body, 22)
    assert table.get(5).runs == [(0, 3, 10, 13), (4, 5, 20, 21)]
    assert check(table, (5, 0, 1, 3)) == (1, 3, 11, 13)


def test_snapshot_bytes_are_the_documented_layout():
    table = ProducerStateTable()
    stored(table, 5, 1, 0, 3, first_offset=10, timestamp=1_700_000_000_000)
    data = encode_snapshot(table)
    body = (struct.pack("<I", 1) + struct.pack("<qiqB", 5, 1, 1_700_000_000_000, 1)
            + struct.pack("<qqqq", 0, 2, 10, 12))
    assert data == struct.pack("<HI", 0, _core.crc32c(body)) + body
    assert len(data) == 2 + 4 + 4 + 21 + 32


@pytest.mark.parametrize("damage", ["flip", "cut", "extra", "version", "empty"])
def test_a_damaged_snapshot_is_refused(damage):
    data = bytearray(encode_snapshot(sample_table()))
    if damage == "flip":
        data[20] ^= 1
    elif damage == "cut":
        data = data[:-1]
    elif damage == "extra":
        data += b"\0"
    elif damage == "version":
        data[0] = 1
    else:
        data = bytearray()
    with pytest.raises(SnapshotCorruptError):
        decode_snapshot(bytes(data))


def test_a_snapshot_naming_offsets_at_or_past_its_own_is_refused():
    with pytest.raises(SnapshotCorruptError, match="impossible run"):
        decode_snapshot(encode_snapshot(sample_table()), 20)


def replay_of(batches):
    def replay(start):
        return iter([b for b in batches if b.base_offset >= start])

    return replay


def test_load_takes_the_newest_valid_snapshot_and_replays_after_it(tmp_path):
    directory = str(tmp_path)
    table = sample_table()
    write_snapshot(directory, 21, table)
    newer = sample_table()
    stored(newer, 9, 0, 0, 1, first_offset=30)
    path = write_snapshot(directory, 31, newer)
    with open(path, "r+b") as f:
        f.seek(12)
        f.write(b"\xff")  # the newest is corrupt: removed, the one before it used
    batches = [ReplayedBatch(1, 0, 5, 21, 24, 1_700_000_000_500),
               ReplayedBatch(9, 0, 0, 30, 30, 1_800_000_000_000)]
    manager = ProducerStateManager(directory, name="t")
    manager.load(0, 40, now_ms=1_700_000_000_600, expiration_ms=10_000_000, unexpired_offset=0,
                 replay=replay_of(batches))
    assert list_snapshots(directory) == [21]
    assert manager.loaded_from == 21
    assert manager.table.get(1).runs[-1] == (5, 8, 21, 24)
    assert manager.table.get(9).last_timestamp == 1_700_000_000_600, "never later than the clock"
    assert manager.table.get(2**40) is None, "expired at the load (timestamp 5)"


def test_load_deletes_snapshots_outside_the_log_and_replays_from_the_unexpired_segment(tmp_path):
    directory = str(tmp_path)
    for offset in (5, 50, 60):
        write_snapshot(directory, offset, ProducerStateTable())
    manager = ProducerStateManager(directory)
    starts = []

    def replay(start):
        starts.append(start)
        return iter(())

    manager.load(10, 40, now_ms=0, expiration_ms=1, unexpired_offset=30, replay=replay)
    assert list_snapshots(directory) == [] and starts == [30] and manager.loaded_from is None


def test_take_snapshot_keeps_the_newest_two_and_truncate_head_drops_below_the_start(tmp_path):
    directory = str(tmp_path)
    manager = ProducerStateManager(directory)
    stored(manager.table, 1, 0, 0, 1, first_offset=0)
    stored(manager.table, 2, 0, 0, 1, first_offset=15)
    for offset in (10, 20, 30):
        assert manager.take_snapshot(offset)
    assert list_snapshots(directory) == [20, 30]
    assert not [n for n in os.listdir(directory) if n.endswith(".tmp")]
    manager.truncate_head(25)
    assert list_snapshots(directory) == [30]
    assert sorted(manager.table.entries) == [], "both producers' last batches are below 25"


def test_take_snapshot_is_best_effort(tmp_path):
    manager = ProducerStateManager(str(tmp_path / "gone"))
    assert manager.take_snapshot(10) is False


def test_the_issued_ceiling_file(tmp_path):
    assert read_issued_ceiling(str(tmp_path)) == 0, "no file: no id issued yet"
    (tmp_path / "producer-ids-issued").write_text("0\n2000\n")
    assert read_issued_ceiling(str(tmp_path)) == 2000
    for bad in ("1\n2000\n", "0\n-5\n", "0\n", "0\n12x\n", ""):
        (tmp_path / "producer-ids-issued").write_text(bad)
        with pytest.raises(ValueError):
            read_issued_ceiling(str(tmp_path))


def test_the_issued_ceiling_written_is_the_one_read(tmp_path):
    write_issued_ceiling(str(tmp_path), 1000)
    assert (tmp_path / "producer-ids-issued").read_bytes() == b"0\n1000\n"
    write_issued_ceiling(str(tmp_path), 2000)
    assert read_issued_ceiling(str(tmp_path)) == 2000 and os.listdir(tmp_path) == ["producer-ids-issued"]


def test_issued_ids_re_read_the_file_only_on_a_miss(tmp_path):
    issued = IssuedProducerIds(str(tmp_path))
    assert not issued(0) and issued.reads == 1
    (tmp_path / "producer-ids-issued").write_text("0\n1000\n")
    assert issued(999) and issued.reads == 2
    assert issued(5) and issued.reads == 2, "below the ceiling read: no read"
    assert not issued(1000) and issued.reads == 3
    (tmp_path / "producer-ids-issued").write_text("garbage")
    assert issued(10) and not issued(2000), "a bad file keeps the ceiling read before"


def test_the_documented_snapshot_bytes_decode_as_documented():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "FORMAT.md").read_text()
    block = doc.split("Worked example, `00000000000000000013.snapshot`", 1)[1].split("```", 2)[1]
    data = bytearray()
    for line in block.strip().splitlines():
        for token in line.split():
            if len(token) != 2 or not all(c in "0123456789abcdef" for c in token):
                break
            data.append(int(token, 16))
    assert len(data) == 63
    version, crc, count = struct.unpack_from("<HII", data)  # read as the table says, not by the code
    assert (version, count) == (0, 1) and crc == _core.crc32c(bytes(data[6:]))
    assert struct.unpack_from("<qiqBqqqq", data, 10) == (5, 1, 1_700_000_000_000, 1, 0, 2, 10, 12)
    table = decode_snapshot(bytes(data), 13)
    assert table.get(5).runs == [(0, 2, 10, 12)] and table.get(5).epoch == 1
