"""A follower's log: append_replicated takes the leader's bytes as they are, begin_leader_epoch
records a new leader's epoch, truncate_fully_and_start_at empties the log to start elsewhere."""

from __future__ import annotations

import os

import pytest
from storage_helpers import START_MS, TEST_CONFIG, make_batch, make_unwritable, read_all, split_batches

from hpbroker import _core
from hpbroker.errors import CorruptRecordError, InvalidRecordError, RecordTooLargeError, StorageError
from hpbroker.io import PartitionLog, truncation
from hpbroker.io.checkpoint import RecoveryPointCheckpoint
from hpbroker.io.leader_epochs import LEADER_EPOCH_FILE_NAME, LeaderEpochCache
from hpbroker.io.producer_state import list_snapshots


def idempotent(producer_id: int, sequence: int, count: int = 1, *, epoch: int = 0, tag: str = "") -> bytes:
    values = [f"{producer_id}:{sequence + i}:{tag}".encode() * 10 for i in range(count)]
    return _core.build_batch(values, timestamps=START_MS, producer="p", base_sequence=sequence,
                             producer_id=producer_id, producer_epoch=epoch)


def fill_leader(leader: PartitionLog) -> None:
    """Several segments of batches in leader epochs 0, 3 and 7: plain, lz4 and idempotent ones."""
    for k in range(20):
        leader.append(make_batch(2, value_bytes=150, tag=k))
    leader.begin_leader_epoch(3)
    for k in range(12):
        leader.append(idempotent(41, 3 * k, 3), leader_epoch=3)
        lz4 = make_batch(3, value_bytes=100, tag=100 + k, compression=_core.CODEC_LZ4)
        leader.append(lz4, leader_epoch=3)
    leader.begin_leader_epoch(7)
    for k in range(10):
        leader.append(idempotent(41, 36 + 2 * k, 2), leader_epoch=7)
    leader.flush()


def replicate(leader: PartitionLog, follower: PartitionLog, *, max_bytes: int = 1) -> int:
    """Fetch the leader's flushed records from the follower's log end and append them as a
    follower does, flushing each (through a flush job when the follower pipelines); how many
    appends it took."""
    appends = 0
    while follower.log_end_offset < leader.high_watermark:
        info = follower.append_replicated(leader.read_bytes(follower.log_end_offset, max_bytes))
        assert info.first_offset <= info.last_offset
        job = follower.begin_flush()
        if job is None:
            follower.flush()
        else:
            follower.complete_flush(job)
        appends += 1
    return appends


def segment_bytes(log: PartitionLog) -> list[tuple[int, bytes]]:
    """``(base_offset, content)`` of every segment's ``.log`` file."""
    out = []
    for segment in log.segments:
        with open(segment.path, "rb") as f:
            out.append((segment.base_offset, f.read()))
    return out


def epoch_file(log: PartitionLog) -> bytes:
    with open(os.path.join(log.directory, LEADER_EPOCH_FILE_NAME), "rb") as f:
        return f.read()


def state(log: PartitionLog) -> tuple:
    return (log.log_start_offset, log.high_watermark, log.log_end_offset, log.leader_epochs.entries)


@pytest.fixture
def logs(tmp_path, clock):
    """``logs(**changes)``: a leader and a follower log, closed at teardown; ``flush_on_append``
    among the changes goes to the follower."""
    opened = []

    def make(flush_on_append: bool = True, **changes):
        config = TEST_CONFIG.replace(**changes)
        leader = PartitionLog(tmp_path / "leader" / "orders-3", config, clock=clock)
        follower = PartitionLog(tmp_path / "follower" / "orders-3", config, clock=clock,
                                flush_on_append=flush_on_append)
        opened.extend([leader, follower])
        return leader, follower

    yield make
    for log in opened:
        log.close()


@pytest.mark.parametrize("flush_on_append", [True, False])
def test_a_follower_fed_the_leaders_bytes_ends_byte_identical(logs, tmp_path, clock, flush_on_append):
    leader, follower = logs(flush_on_append=flush_on_append)
    fill_leader(leader)
    assert leader.segment_count >= 3
    replicate(leader, follower)  # one batch per fetch, as the leader appended them: same rolls
    assert segment_bytes(follower) == segment_bytes(leader)
    assert state(follower) == state(leader)
    assert follower.leader_epochs.entries == [(0, 0), (3, 40), (7, 112)]
    assert epoch_file(follower) == epoch_file(leader)
    follower.close()
    with PartitionLog(follower.directory, TEST_CONFIG, clock=clock) as reopened:
        assert segment_bytes(reopened) == segment_bytes(leader)
        assert state(reopened) == state(leader)
        assert reopened.producer_state == leader.producer_state


def test_bytes_fetched_many_batches_at_a_time_are_the_leaders_bytes(logs):
    leader, follower = logs()
    fill_leader(leader)
    assert replicate(leader, follower, max_bytes=3000) < leader.segment_count * 4
    assert b"".join(content for _, content in segment_bytes(follower)) == \
        b"".join(content for _, content in segment_bytes(leader))
    assert read_all(follower) == read_all(leader)
    assert state(follower) == state(leader) and follower.producer_state == leader.producer_state


def test_a_fetch_lands_whole_in_one_segment(logs):
    leader, follower = logs()
    for k in range(30):
        leader.append(make_batch(1, value_bytes=200, tag=k))
    leader.flush()
    follower.append_replicated(leader.read_bytes(0, 3000))
    follower.flush()
    chunk = b""
    while len(chunk) < 1500:  # batches from two of the leader's segments: more than the active one's rest
        chunk += leader.read_bytes(follower.log_end_offset + len(split_batches(chunk)), 1)
    assert follower.segments[-1].size_in_bytes + len(chunk) > TEST_CONFIG.segment_bytes
    info = follower.append_replicated(chunk)
    follower.flush()
    assert follower.segment_count == 2
    assert follower.segments[-1].base_offset == info.first_offset
    assert follower.read_bytes(info.first_offset, 1 << 20) == chunk


def test_a_replicated_append_is_pending_until_flushed(logs):
    leader, follower = logs()
    fill_leader(leader)
    info = follower.append_replicated(leader.read_bytes(0, 1000))
    assert (info.first_offset, follower.high_watermark) == (0, 0)
    assert follower.log_end_offset == info.last_offset + 1
    assert follower.pending_records == info.record_count
    follower.flush()
    assert follower.high_watermark == info.last_offset + 1 and follower.pending_records == 0


def test_a_mutable_buffer_is_copied_and_a_bytes_one_held(logs):
    leader, follower = logs(flush_on_append=False)
    fill_leader(leader)
    data = leader.read_bytes(0, 500)
    buffer = bytearray(data)
    follower.append_replicated(buffer)
    buffer[-1] ^= 0xFF  # the caller reuses its buffer before the flush
    follower.flush()
    assert follower.read_bytes(0, 1 << 20) == data


def test_an_empty_fetch_appends_nothing(logs):
    _leader, follower = logs()
    info = follower.append_replicated(b"")
    assert (info.first_offset, info.record_count, info.batch_count) == (0, 0, 0)
    assert follower.log_end_offset == 0 and follower.leader_epochs.entries == []


def test_a_batch_not_at_the_log_end_is_refused_and_nothing_appended(logs):
    leader, follower = logs()
    fill_leader(leader)
    follower.append_replicated(leader.read_bytes(0, 1))  # offsets 0..1
    before = state(follower), follower.pending_records
    with pytest.raises(InvalidRecordError, match="replicated batch at offset 4, log ends at 2"):
        follower.append_replicated(leader.read_bytes(4, 1000))
    with pytest.raises(InvalidRecordError, match="replicated batch at offset 0, log ends at 2"):
        follower.append_replicated(leader.read_bytes(0, 1000))
    with pytest.raises(InvalidRecordError, match="offset 0, log ends at 2"):
        follower.append_replicated(make_batch(1))  # a producer's batch, never given offsets
    gap = leader.read_bytes(2, 1) + leader.read_bytes(6, 1)  # 2..3, then 6..7: 4..5 missing
    with pytest.raises(CorruptRecordError, match="offset 4"):
        follower.append_replicated(gap)
    assert (state(follower), follower.pending_records) == before


def test_a_corrupt_batch_is_refused_and_nothing_appended(logs):
    leader, follower = logs()
    fill_leader(leader)
    data = bytearray(leader.read_bytes(0, 1500))
    batches = split_batches(bytes(data))
    assert len(batches) >= 3
    second = len(batches[0][1])
    data[second + 40] ^= 0x01  # inside the CRC'd range of the batch at offset 2
    with pytest.raises(CorruptRecordError, match="offset 2"):
        follower.append_replicated(data)
    with pytest.raises(CorruptRecordError):
        follower.append_replicated(bytes(data[: len(data) - 5]))  # a batch cut short
    assert state(follower) == (0, 0, 0, []) and follower.pending_records == 0


def test_an_older_leader_epoch_is_refused(logs):
    leader, follower = logs()
    fill_leader(leader)
    follower.append_replicated(leader.read_bytes(0, 1 << 20))  # the first segment: epoch 0 only
    end = follower.log_end_offset
    newer = bytearray(make_batch(1))
    _core.stamp_batch(newer, 0, end, 5)
    older = bytearray(make_batch(1, tag=1))
    _core.stamp_batch(older, 0, end + 1, 4)
    with pytest.raises(InvalidRecordError, match="leader epoch 4, older than the log's latest, 5"):
        follower.append_replicated(bytes(newer + older))  # older than a batch before it
    assert follower.log_end_offset == end and follower.leader_epochs.entries == [(0, 0)]
    follower.append_replicated(bytes(newer))
    assert follower.leader_epochs.entries == [(0, 0), (5, end)]
    _core.stamp_batch(older, 0, end + 1, 4)
    with pytest.raises(InvalidRecordError, match="leader epoch 4"):
        follower.append_replicated(bytes(older))  # older than the cache's latest
    assert follower.log_end_offset == end + 1


def test_an_epoch_begun_without_a_record_gives_way_to_the_new_leaders_older_batches(logs):
    leader, follower = logs()
    fill_leader(leader)  # epoch 3 begins at 40, epoch 7 at 112
    while follower.log_end_offset < 100:
        follower.append_replicated(leader.read_bytes(follower.log_end_offset, 1))
    follower.begin_leader_epoch(8)  # briefly the leader, with no append: the new leader's log decides
    assert follower.leader_epochs.entries[-1] == (8, follower.log_end_offset)
    with pytest.raises(InvalidRecordError, match="leader epoch 0, older than the log's latest, 3"):
        follower.append_replicated(_at(make_batch(1), follower.log_end_offset, 0))
    replicate(leader, follower)
    assert follower.leader_epochs.entries == leader.leader_epochs.entries == [(0, 0), (3, 40), (7, 112)]
    assert segment_bytes(follower) == segment_bytes(leader)


def _at(batch: bytes, base_offset: int, leader_epoch: int) -> bytes:
    """``batch`` as a leader's log stores it at ``base_offset`` in ``leader_epoch``."""
    copy = bytearray(batch)
    _core.stamp_batch(copy, 0, base_offset, leader_epoch)
    return bytes(copy)


def test_replicated_batches_need_not_fit_max_message_bytes(logs):
    leader, follower = logs()
    fill_leader(leader)
    follower.reconfigure(follower.config.replace(max_message_bytes=100))
    assert follower.append_replicated(leader.read_bytes(0, 1)).record_count == 2
    with pytest.raises(RecordTooLargeError):
        follower.append(make_batch(1, value_bytes=200))


def test_a_follower_that_becomes_leader_deduplicates_the_replicated_producers(logs, clock):
    leader, follower = logs()
    fill_leader(leader)
    replicate(leader, follower, max_bytes=2000)
    assert follower.producer_state == leader.producer_state
    last = idempotent(41, 54, 2)  # the producer's last batch, stored at the leader's end - 2
    follower.begin_leader_epoch(8)  # the follower is the new leader
    retry = follower.append(last, leader_epoch=8)
    assert retry.duplicate and (retry.first_offset, retry.last_offset) == (leader.log_end_offset - 2,
                                                                           leader.log_end_offset - 1)
    assert follower.log_end_offset == leader.log_end_offset
    follower.flush()
    follower.close()
    with PartitionLog(follower.directory, TEST_CONFIG, clock=clock) as reopened:
        assert reopened.append(last, leader_epoch=8).duplicate
        nxt = reopened.append(idempotent(41, 56, 1), leader_epoch=8)
        assert not nxt.duplicate and nxt.first_offset == leader.log_end_offset
        assert reopened.leader_epochs.entries[-1] == (8, leader.log_end_offset)


def test_replicated_appends_are_refused_while_writes_are_failed_or_closed(logs):
    leader, follower = logs()
    fill_leader(leader)
    follower.append_replicated(leader.read_bytes(0, 1))
    active = follower.segments[-1]
    make_unwritable(active.log.fd, active.path)
    with pytest.raises(StorageError):
        follower.flush()
    assert follower.log_end_offset == 0, "the unacknowledged records were dropped"
    with pytest.raises(StorageError):
        follower.append_replicated(leader.read_bytes(0, 1))
    with pytest.raises(StorageError):
        follower.begin_leader_epoch(9)
    follower.close()
    with pytest.raises(ValueError, match="closed"):
        follower.append_replicated(leader.read_bytes(0, 1))


# --- begin_leader_epoch ----------------------------------------------------------------------------


def test_begin_leader_epoch_records_a_newer_epoch_at_the_log_end_durably(open_log, log_dir):
    log = open_log()
    log.append(make_batch(3))
    log.begin_leader_epoch(2)
    assert log.leader_epochs.entries == [(0, 0), (2, 3)]
    assert LeaderEpochCache(log_dir).entries == [(0, 0), (2, 3)], "the file was written"
    log.begin_leader_epoch(2)  # the same epoch again: nothing changes
    assert log.leader_epochs.entries == [(0, 0), (2, 3)]
    with pytest.raises(ValueError, match="leader epoch 1 is older"):
        log.begin_leader_epoch(1)
    log.append(make_batch(1), leader_epoch=2)  # the leader's appends then match
    log.flush()
    assert log.leader_epochs.entries == [(0, 0), (2, 3)]
    assert _core.read_header(log.read_bytes(3, 1)).leader_epoch == 2
    log.begin_leader_epoch(4)  # no record in epoch 2 after it: the newer epoch still begins here
    log.begin_leader_epoch(6)
    assert log.leader_epochs.entries == [(0, 0), (2, 3), (6, 4)]


# --- truncate_fully_and_start_at -------------------------------------------------------------------


def test_truncate_fully_empties_the_log_and_appends_continue_from_the_new_start(log_dir, clock):
    with PartitionLog(log_dir, TEST_CONFIG, clock=clock) as log:
        fill_leader(log)
        assert log.segment_count >= 3 and list_snapshots(log_dir)
        log.truncate_fully_and_start_at(5000)
        assert (log.log_start_offset, log.high_watermark, log.log_end_offset, log.recovery_point) == \
            (5000, 5000, 5000, 5000)
        assert log.segment_count == 1 and log.leader_epochs.entries == [] and len(log.producer_state) == 0
        assert RecoveryPointCheckpoint(log_dir).read() == 5000
        assert LeaderEpochCache(log_dir).entries == [] and list_snapshots(log_dir) == []
        assert sorted(name for name in os.listdir(log_dir) if name.endswith(".log")) == \
            ["00000000000000005000.log"]
        assert log.read_bytes(5000, 1000) == b""
        info = log.append(idempotent(41, 0, 2, epoch=1), leader_epoch=9)  # a new epoch of the producer
        log.flush()
        assert (info.first_offset, info.last_offset) == (5000, 5001)
        assert log.leader_epochs.entries == [(9, 5000)]
    with PartitionLog(log_dir, TEST_CONFIG, clock=clock) as log:
        assert (log.log_start_offset, log.log_end_offset) == (5000, 5002)
        assert [offset for offset, _ in read_all(log)] == [5000]
        assert log.leader_epochs.entries == [(9, 5000)]
        assert log.append(idempotent(41, 0, 2, epoch=1), leader_epoch=9).duplicate


def test_truncate_fully_survives_a_crash_right_after(log_dir, clock):
    log = PartitionLog(log_dir, TEST_CONFIG, clock=clock)
    fill_leader(log)
    log.checkpoint()  # the recovery point at the old end, above the new start
    log.truncate_fully_and_start_at(7)
    log._abandon()
    with PartitionLog(log_dir, TEST_CONFIG, clock=clock) as log:
        assert (log.log_start_offset, log.high_watermark, log.log_end_offset) == (7, 7, 7)
        assert log.damaged_ranges == [] and log.leader_epochs.entries == [] and len(log.producer_state) == 0
        assert log.append(make_batch(1)).first_offset == 7


def test_truncate_fully_to_a_lower_offset_is_durable_too(log_dir, clock):
    log = PartitionLog(log_dir, TEST_CONFIG, clock=clock)
    fill_leader(log)
    log.truncate_fully_and_start_at(0)
    log.append(make_batch(2))
    log.flush()
    log._abandon()
    with PartitionLog(log_dir, TEST_CONFIG, clock=clock) as log:
        assert (log.log_start_offset, log.log_end_offset, log.segment_count) == (0, 2, 1)
        assert log.damaged_ranges == []


def test_truncate_fully_completes_pending_and_in_flight_flushes_first(log_dir, clock):
    with PartitionLog(log_dir, TEST_CONFIG, clock=clock, flush_on_append=False) as log:
        log.append(make_batch(2))
        job = log.begin_flush()
        log.append(make_batch(2, tag=1))
        log.truncate_fully_and_start_at(100)
        assert log.flushes_in_flight == () and log.pending_records == 0
        log.complete_flush(job)  # applied by the truncation: a no-op
        assert (log.log_start_offset, log.log_end_offset) == (100, 100)


def test_truncate_fully_refuses_a_negative_offset(open_log):
    log = open_log()
    log.append(make_batch(2))
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError):
            log.truncate_fully_and_start_at(bad)
    assert log.log_end_offset == 2


def test_a_disk_error_while_emptying_takes_the_log_offline_and_the_reopen_finds_a_suffix(
        log_dir, clock, monkeypatch):
    log = PartitionLog(log_dir, TEST_CONFIG, clock=clock)
    fill_leader(log)
    everything = read_all(log)
    bases, end, entries = [s.base_offset for s in log.segments], log.log_end_offset, log.leader_epochs.entries
    syncs, fsync_dir = [], truncation.fsync_dir

    def failing_fsync_dir(path):  # the snapshots' removal, the first segment's: then the disk fails
        syncs.append(path)
        if len(syncs) == 3:
            raise OSError(5, "Input/output error")
        fsync_dir(path)

    monkeypatch.setattr(truncation, "fsync_dir", failing_fsync_dir)
    with pytest.raises(StorageError, match="truncate_fully_and_start_at failed"):
        log.truncate_fully_and_start_at(10_000)
    assert log.offline
    log.close()
    monkeypatch.undo()
    with PartitionLog(log_dir, TEST_CONFIG, clock=clock) as log:
        assert (log.log_start_offset, log.log_end_offset) == (bases[2], end), "the newest segments stay"
        assert log.damaged_ranges == []
        assert read_all(log) == [(offset, batch) for offset, batch in everything if offset >= bases[2]]
        assert log.leader_epochs.entries[0][1] == bases[2] and log.leader_epochs.entries[-1] == entries[-1]


def test_an_epoch_begun_lazily_lost_in_a_crash_leaves_the_log_as_a_durable_entry_would(tmp_path, clock):
    """begin_leader_epoch(durable=False), then a crash before any record of the epoch was
    flushed: the reopened log has the older entries and no record of the epoch, exactly as
    with the entry written durably (the open drops an epoch that starts at the log end: it holds
    no record), and leads again the same way."""
    reopened = {}
    for durable in (True, False):
        log_dir = os.path.join(tmp_path, f"durable-{durable}")
        log = PartitionLog(log_dir, TEST_CONFIG, clock=clock)
        log.append(make_batch(10))
        log.flush()
        log.begin_leader_epoch(3, durable=durable)
        log.append(make_batch(2, tag=1), leader_epoch=3)  # pending: never flushed
        log._abandon()  # the crash
        with PartitionLog(log_dir, TEST_CONFIG, clock=clock) as log:
            assert log.log_end_offset == 10 and read_all(log)[-1][0] == 0, "no record of epoch 3"
            before = log.leader_epochs.entries
            log.begin_leader_epoch(5)  # leads again
            reopened[durable] = (before, log.leader_epochs.entries,
                                 [log.leader_epochs.end_offset_for(e, 10) for e in range(6)])
    assert reopened[True] == reopened[False]
    assert reopened[False][:2] == ([(0, 0)], [(0, 0), (5, 10)])


def test_an_epoch_begun_lazily_is_written_by_flush_leader_epochs_checkpoint_and_close(log_dir, clock):
    log = PartitionLog(log_dir, TEST_CONFIG, clock=clock)
    log.append(make_batch(1))
    log.flush()
    log.begin_leader_epoch(2, durable=False)
    assert LeaderEpochCache(log_dir).entries == [(0, 0)]
    assert log.flush_leader_epochs() and not log.flush_leader_epochs()
    assert LeaderEpochCache(log_dir).entries == [(0, 0), (2, 1)]
    log.append(make_batch(1, tag=1), leader_epoch=2)
    log.flush()
    log.begin_leader_epoch(4, durable=False)
    log.checkpoint()
    assert LeaderEpochCache(log_dir).entries == [(0, 0), (2, 1), (4, 2)]
    log.begin_leader_epoch(6, durable=False)  # epoch 4 held nothing: epoch 6 replaces it
    log.close()
    assert LeaderEpochCache(log_dir).entries == [(0, 0), (2, 1), (6, 2)]


def test_a_failed_epoch_write_at_the_flush_writes_no_record_of_the_epoch(log_dir, clock, monkeypatch):
    from hpbroker.io import leader_epochs

    with PartitionLog(log_dir, TEST_CONFIG, clock=clock) as log:
        log.append(make_batch(2))
        log.flush()
        log.begin_leader_epoch(5, durable=False)
        log.append(make_batch(1, tag=1), leader_epoch=5)

        def full_disk(path, data, **_kwargs):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(leader_epochs, "replace_atomically", full_disk)
        with pytest.raises(StorageError, match="no space left on device"):
            log.flush()
        assert log.write_failure is not None and (log.high_watermark, log.log_end_offset) == (2, 2)
        on_disk = os.path.getsize(log.segments[-1].path)
        assert on_disk == sum(len(batch) for _, batch in read_all(log)), "nothing of epoch 5 on disk"
        assert LeaderEpochCache(log_dir).entries == [(0, 0)]
        monkeypatch.undo()
        assert log.resume_writes()
        log.append(make_batch(1, tag=2), leader_epoch=5)
        log.flush()
        assert LeaderEpochCache(log_dir).entries == [(0, 0), (5, 2)]
