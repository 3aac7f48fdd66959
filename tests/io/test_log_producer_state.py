"""The partition log deduplicates idempotent producers at its single writer, and keeps that state
exact across restarts, crashes, lost or damaged snapshots, write failures, retention and expiry."""

from __future__ import annotations

import os
import shutil

import pytest
from storage_helpers import START_MS, TEST_CONFIG, make_batch, read_all, stamped

from hpbroker import _core
from hpbroker.errors import OutOfOrderSequenceError, ProducerFencedError, StorageError, UnknownProducerIdError
from hpbroker.io import PartitionLog
from hpbroker.io.producer_state import list_snapshots

DAY_MS = 24 * 60 * 60 * 1000


def idempotent(producer_id: int, epoch: int, sequence: int, count: int = 1, *, tag: str = "",
               timestamp: int = START_MS) -> bytes:
    """A batch of ``count`` records of producer ``producer_id``/``epoch`` from ``sequence``."""
    values = [f"{producer_id}:{epoch}:{sequence + i}:{tag}".encode() for i in range(count)]
    return _core.build_batch(values, timestamps=timestamp, producer="p", base_sequence=sequence,
                             producer_id=producer_id, producer_epoch=epoch)


def offsets_stored(log: PartitionLog) -> list[int]:
    return [offset for offset, _ in read_all(log)]


def test_a_retry_while_the_first_copy_is_pending_is_answered_with_its_offsets_and_stored_once(open_log):
    log = open_log()
    log.append(make_batch(2))  # offsets 0..1, no identity
    batch = idempotent(7, 0, 0, 3)
    first = log.append(batch)
    assert (first.first_offset, first.last_offset, first.duplicate) == (2, 4, False)
    assert log.high_watermark == 0, "the first copy is still pending"
    retry = log.append(batch)
    assert (retry.first_offset, retry.last_offset, retry.record_count, retry.duplicate) == (2, 4, 3, True)
    assert log.log_end_offset == 5 and log.pending_records == 5, "nothing appended by the retry"
    log.flush()
    assert log.append(batch).duplicate, "and after the flush"
    assert read_all(log)[1] == (2, stamped(batch, 2)) and log.high_watermark == 5


def test_a_retry_while_the_first_copy_is_in_a_flush_in_flight_is_a_duplicate(log_dir, clock):
    with PartitionLog(log_dir, TEST_CONFIG, clock=clock, flush_on_append=False) as log:
        batch = idempotent(7, 0, 0, 2)
        log.append(batch)
        job = log.begin_flush()
        info = log.append(batch)
        assert info.duplicate and (info.first_offset, info.last_offset) == (0, 1)
        log.complete_flush(job)
        assert offsets_stored(log) == [0] and log.log_end_offset == 2


def test_a_gap_an_older_epoch_and_an_unknown_id_are_refused_with_nothing_appended(log_dir, clock):
    with PartitionLog(log_dir, TEST_CONFIG, clock=clock, producer_id_issued=lambda pid: pid < 100) as log:
        log.append(idempotent(7, 1, 0, 2))
        end = log.log_end_offset
        with pytest.raises(OutOfOrderSequenceError, match="expected sequence 2"):
            log.append(idempotent(7, 1, 3))
        with pytest.raises(ProducerFencedError, match="epoch 0 is older than epoch 1"):
            log.append(idempotent(7, 0, 2))
        with pytest.raises(UnknownProducerIdError, match="producer id 100"):
            log.append(idempotent(100, 0, 0))
        with pytest.raises(OutOfOrderSequenceError, match="must start at sequence 0"):
            log.append(idempotent(7, 2, 5))
        assert log.log_end_offset == end and log.pending_records == end
        assert log.append(idempotent(7, 1, 2)).first_offset == end, "the right sequence goes on"


def test_a_request_mixing_a_stored_batch_and_a_new_one_is_out_of_order_and_appends_nothing(open_log):
    log = open_log()
    stored = idempotent(7, 0, 0, 2)
    log.append(stored)
    with pytest.raises(OutOfOrderSequenceError, match="mixes"):
        log.append(stored + make_batch(1))
    with pytest.raises(OutOfOrderSequenceError, match="mixes"):
        log.append(stored + idempotent(8, 0, 0))  # (stored + idempotent(7, 0, 2): the stored prefix rule)
    assert log.log_end_offset == 2
    both = log.append(idempotent(7, 0, 2) + idempotent(8, 0, 0) + make_batch(1) + idempotent(7, 0, 3))
    assert (both.first_offset, both.last_offset, both.batch_count) == (2, 5, 4)
    assert log.producer_state.get(7).runs == [(0, 2, 0, 2), (3, 3, 5, 5)]


def test_non_idempotent_batches_leave_no_state(open_log):
    log = open_log()
    for _ in range(3):
        log.append(make_batch(2))
    assert len(log.producer_state) == 0


def fill(log: PartitionLog, producer_id: int, batches: int, *, start: int = 0) -> list[bytes]:
    """Append ``batches`` batches of 2 records of ``producer_id`` from sequence ``start``."""
    sent = []
    for k in range(batches):
        batch = idempotent(producer_id, 0, start + 2 * k, 2, tag="x" * 200)
        log.append(batch)
        sent.append(batch)
    return sent


def assert_remembers(log: PartitionLog, producer_id: int, sent: list[bytes], first_offset: int,
                     next_sequence: int) -> None:
    """Every one of ``sent`` (stored from ``first_offset``, 2 records each, nothing between: one
    run) is a duplicate at its offsets, a gap is refused, and the next sequence is taken."""
    assert len(log.producer_state.get(producer_id).runs) == 1
    for k in range(len(sent)):
        info = log.append(sent[k])
        assert info.duplicate and info.first_offset == first_offset + 2 * k, k
    end = log.log_end_offset
    with pytest.raises(OutOfOrderSequenceError):
        log.append(idempotent(producer_id, 0, next_sequence + 1))
    assert log.append(idempotent(producer_id, 0, next_sequence)).first_offset == end


def test_the_state_survives_a_clean_close_through_its_snapshot(open_log, log_dir):
    log = open_log()
    sent = fill(log, 7, 12)  # rolls: 4096-byte segments
    end = log.log_end_offset
    log.close()
    assert list_snapshots(log_dir)[-1] == end and len(list_snapshots(log_dir)) == 2, "newest two kept"
    log = open_log()
    assert log._producers.loaded_from == end, "nothing replayed"
    assert_remembers(log, 7, sent, 0, 24)


def test_the_state_is_rebuilt_from_the_log_after_a_crash(open_log):
    log = open_log()
    sent = fill(log, 7, 12)
    log.flush()
    log._abandon()  # no snapshot at the log end: the one of the last roll, and the batches after it
    log = open_log()
    assert log._producers.loaded_from is not None and log._producers.loaded_from < log.log_end_offset
    assert_remembers(log, 7, sent, 0, 24)


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
def test_a_snapshot_deleted_or_corrupt_is_rebuilt_from_the_log(open_log, log_dir, how):
    log = open_log()
    sent = fill(log, 7, 12)
    log.close()
    for offset in list_snapshots(log_dir):
        path = os.path.join(log_dir, f"{offset:020d}.snapshot")
        if how == "deleted":
            os.unlink(path)
        else:
            with open(path, "r+b") as f:
                f.seek(15)
                f.write(b"\x7f")
    log = open_log()
    assert log._producers.loaded_from is None and list_snapshots(log_dir) == []
    assert_remembers(log, 7, sent, 0, 24)


def test_a_stale_snapshot_is_caught_up_from_the_log(open_log, log_dir, tmp_path):
    log = open_log(segment_bytes=1 << 20)  # no roll: only the close writes snapshots
    sent = fill(log, 7, 3)
    log.close()
    (stale,) = list_snapshots(log_dir)
    shutil.copy(os.path.join(log_dir, f"{stale:020d}.snapshot"), tmp_path / "stale")
    log = open_log(segment_bytes=1 << 20)
    sent += fill(log, 7, 4, start=6)
    log.close()
    for offset in list_snapshots(log_dir):
        os.unlink(os.path.join(log_dir, f"{offset:020d}.snapshot"))
    shutil.copy(tmp_path / "stale", os.path.join(log_dir, f"{stale:020d}.snapshot"))
    log = open_log(segment_bytes=1 << 20)
    assert log._producers.loaded_from == stale < log.log_end_offset
    assert_remembers(log, 7, sent, 0, 14)


def test_the_roll_before_a_request_snapshots_only_what_lies_below_it(open_log, log_dir):
    log = open_log(segment_bytes=1024)
    first, second = idempotent(7, 0, 0, 4, tag="y" * 150), idempotent(7, 0, 4, 4, tag="y" * 150)
    log.append(first)
    info = log.append(second + idempotent(7, 0, 8))  # too large for the first segment: rolls
    assert log.segment_count == 2 and (info.first_offset, info.last_offset) == (4, 8)
    assert list_snapshots(log_dir) == [4]
    log.flush()
    log._abandon()
    log = open_log(segment_bytes=1024)
    assert log._producers.loaded_from == 4
    assert log.append(second + idempotent(7, 0, 8)).duplicate
    assert log.append(idempotent(7, 0, 9)).first_offset == 9


def test_a_torn_tail_cut_at_open_leaves_the_state_and_its_retry_is_stored(open_log, log_dir):
    log = open_log(segment_bytes=1 << 20)
    kept, torn = idempotent(7, 0, 0, 2), idempotent(7, 0, 2, 2)
    log.append(kept)
    log.append(torn)
    log.flush()
    path = log.segments[-1].path
    log._abandon()  # a crash: no snapshot; the last batch was written only in part
    os.truncate(path, os.path.getsize(path) - 3)
    log = open_log(segment_bytes=1 << 20)
    assert log.log_end_offset == 2
    assert log.producer_state.get(7).runs == [(0, 1, 0, 1)]
    info = log.append(torn)
    assert not info.duplicate and info.first_offset == 2, "the retry of the cut batch is stored"


def test_a_snapshot_past_the_log_end_is_removed_at_open(open_log, log_dir):
    log = open_log(segment_bytes=1 << 20)
    kept, torn = idempotent(7, 0, 0, 2), idempotent(7, 0, 2, 2)
    log.append(kept)
    log.append(torn)
    log.close()  # the snapshot at 4 knows the torn batch
    path = log.segments[-1].path
    os.truncate(path, os.path.getsize(path) - 3)
    os.unlink(os.path.join(log_dir, "clean-shutdown"))
    with open(os.path.join(log_dir, "recovery-point-offset-checkpoint"), "w") as f:
        f.write("0\n2\n")  # as if only the first batch had been fsynced
    log = open_log(segment_bytes=1 << 20)
    assert log.log_end_offset == 2 and list_snapshots(log_dir) == []
    assert not log.append(torn).duplicate


def fail_next_flush(log: PartitionLog, job) -> None:
    """Run ``job`` with the segment's descriptor read-only, so its writev fails."""
    fd = log.segments[-1].log.fd
    read_only = os.open(log.segments[-1].path, os.O_RDONLY)
    saved = os.dup(fd)
    os.dup2(read_only, fd)
    try:
        job.run()
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        os.close(read_only)


def test_a_write_failure_forgets_the_dropped_batches_so_their_retry_is_stored(log_dir, clock):
    with PartitionLog(log_dir, TEST_CONFIG, clock=clock, flush_on_append=False) as log:
        acknowledged = idempotent(7, 0, 0, 2)
        log.append(acknowledged)
        log.complete_flush(log.begin_flush())
        dropped, pending = idempotent(7, 0, 2, 2), idempotent(7, 0, 4, 1)
        log.append(dropped)
        job = log.begin_flush()
        log.append(pending)
        fail_next_flush(log, job)
        with pytest.raises(StorageError):
            log.complete_flush(job)
        assert log.log_end_offset == 2
        assert log.resume_writes()
        assert log.producer_state.get(7).runs == [(0, 1, 0, 1)]
        info = log.append(dropped)
        assert not info.duplicate and info.first_offset == 2, "never stored: not a duplicate"
        assert log.append(pending).first_offset == 4
        assert log.append(acknowledged).duplicate
        log.flush()
        assert offsets_stored(log) == [0, 2, 4]


def test_retention_drops_producers_below_the_log_start_and_their_snapshots(open_log, log_dir):
    log = open_log(retention_bytes=0, segment_bytes=1024)
    log.append(idempotent(1, 0, 0, 2, tag="z" * 300))
    fill(log, 2, 12, start=0)
    assert log.segment_count > 3
    assert log.delete_old_segments() > 0
    assert log.producer_state.get(1) is None and log.producer_state.get(2) is not None
    assert all(offset >= log.log_start_offset for offset in list_snapshots(log_dir))
    assert log.append(idempotent(1, 0, 7)).first_offset == log.log_end_offset - 1, "any sequence again"


@pytest.mark.parametrize("crash", [True, False], ids=["crash", "clean-close"])
def test_a_producer_retention_dropped_stays_dropped_after_a_reopen(open_log, log_dir, crash):
    log = open_log(retention_bytes=5000)
    deleted = idempotent(7, 0, 0, tag="d" * 600)
    log.append(deleted)
    for k in range(20):  # plain batches: the snapshots of their rolls still hold producer 7
        log.append(make_batch(1, value_bytes=900, tag=k))
        log.flush()
    assert log.delete_old_segments() > 0 and log.log_start_offset > 0
    assert log.producer_state.get(7) is None
    assert any(offset >= log.log_start_offset for offset in list_snapshots(log_dir))
    if crash:
        log._abandon()  # the snapshots written before retention stay, producer 7 in them
    else:
        log.close()
    log = open_log(retention_bytes=5000)
    assert log.producer_state.get(7) is None, "its only batch was deleted by retention"
    info = log.append(deleted)
    assert not info.duplicate and info.first_offset == 21, "a retry of a deleted batch is stored again"


def test_a_producer_quiet_for_producer_id_expiration_ms_expires(open_log, clock):
    log = open_log(producer_id_expiration_ms=DAY_MS)
    log.append(idempotent(1, 0, 0, 2))
    clock.advance(DAY_MS // 2)
    log.append(idempotent(2, 0, 0, 2))
    clock.advance(DAY_MS // 2 + 1)
    log.delete_old_segments()
    assert log.producer_state.get(1) is None and log.producer_state.get(2) is not None
    assert not log.append(idempotent(1, 0, 0, 2)).duplicate, "forgotten: stored again"


def test_an_open_after_the_expiration_forgets_the_producers(open_log, clock):
    log = open_log(producer_id_expiration_ms=DAY_MS)
    log.append(idempotent(1, 0, 0, 2))
    log.close()
    clock.advance(DAY_MS + 1)
    log = open_log(producer_id_expiration_ms=DAY_MS)
    assert len(log.producer_state) == 0


def test_a_rebuild_steps_over_a_damaged_range_and_keeps_what_follows_it(open_log, log_dir):
    config = {"segment_bytes": 4096, "index_interval_bytes": 1000}
    log = open_log(**config)
    batches, sequences = [], {7: 0, 8: 0}
    for k in range(80):
        pid = 8 if 6 <= k <= 9 else 7  # producer 8 writes only right after the batch damaged below
        batches.append(idempotent(pid, 0, sequences[pid]))
        sequences[pid] += 1
        log.append(batches[-1])
    log.close()
    for offset in list_snapshots(log_dir):
        os.unlink(os.path.join(log_dir, f"{offset:020d}.snapshot"))
    assert log.segments[1].base_offset > 10
    with open(os.path.join(log_dir, f"{0:020d}.log"), "r+b") as f:
        f.seek(sum(map(len, batches[:5])) + 8)
        f.write((7).to_bytes(4, "little"))  # batch 5's length field: a damaged range
    log = open_log(**config)
    assert [(r.first_offset, r.next_offset) for r in log.damaged_ranges] == [(5, 6)]
    info = log.append(batches[9])
    assert info.duplicate and info.first_offset == 9, "the batches after the damage were replayed"
    assert log.append(batches[79]).duplicate
    assert log.append(idempotent(7, 0, sequences[7])).first_offset == 80


def newest_runs(stored: list[tuple[bytes, int, int]], count: int) -> list[tuple[bytes, int, int]]:
    """The ``(batch, first offset, last offset)`` of ``stored`` (one producer's, in the order
    stored) that lie in its newest ``count`` runs: a batch whose sequence and offset both follow
    the one stored before it is in that one's run."""
    starts = [0]
    for k in range(1, len(stored)):
        previous, (batch, first, _) = stored[k - 1], stored[k]
        header = _core.read_header(previous[0])
        if not (_core.read_header(batch).base_sequence == header.base_sequence + header.last_offset_delta + 1
                and first == previous[2] + 1):
            starts.append(k)
    return stored[starts[-count:][0]:]


@pytest.mark.parametrize("seed", range(4))
def test_random_retries_crashes_and_lost_snapshots_store_each_batch_exactly_once(log_dir, clock, seed):
    """A model run: producers send new batches and retry any batch of their newest five runs
    (batches stored one right after the other with consecutive sequences), among flushes, rolls,
    crashes (pending batches lost, then sent again), clean restarts and deleted snapshots; every
    retry of a stored batch is a duplicate at its offsets, every other send is stored."""
    import random

    rng = random.Random(seed)
    config = TEST_CONFIG.replace(segment_bytes=1024)
    producers = {pid: {"sent": [], "stored": []} for pid in (3, 5, 11)}  # stored: (batch, first, last)
    flushed = 0  # the high watermark the model expects
    log = PartitionLog(log_dir, config, clock=clock)
    try:
        for _step in range(400):
            action = rng.random()
            pid = rng.choice(list(producers))
            state = producers[pid]
            if action < 0.45:
                stored = state["stored"]
                if len(stored) < len(state["sent"]):  # lost in a crash: sent again, in order
                    batch = state["sent"][len(stored)]
                else:
                    sequence = sum(_core.read_header(b).last_offset_delta + 1 for b in state["sent"])
                    batch = idempotent(pid, 0, sequence, rng.randint(1, 4), tag="v" * rng.randint(0, 60))
                    state["sent"].append(batch)
                info = log.append(batch)
                assert not info.duplicate and info.first_offset == log.log_end_offset - info.record_count
                stored.append((batch, info.first_offset, info.last_offset))
            elif action < 0.75 and state["stored"]:
                batch, first, last = rng.choice(newest_runs(state["stored"], 5))
                info = log.append(batch)
                assert info.duplicate and (info.first_offset, info.last_offset) == (first, last)
            elif action < 0.85:
                log.flush()
                flushed = log.high_watermark
            elif action < 0.93:
                flushed = log.high_watermark  # a roll flushes too
                log._abandon()  # a crash: the pending batches are lost
                for state in producers.values():
                    state["stored"] = [s for s in state["stored"] if s[2] < flushed]
                log = PartitionLog(log_dir, config, clock=clock)
            else:
                log.close()
                flushed = log.high_watermark
                if rng.random() < 0.5:
                    for offset in list_snapshots(log_dir):
                        os.unlink(os.path.join(log_dir, f"{offset:020d}.snapshot"))
                log = PartitionLog(log_dir, config, clock=clock)
            assert log.log_end_offset >= flushed
        log.flush()
        expected = sorted((first, stamped(batch, first)) for state in producers.values()
                          for batch, first, _last in state["stored"])
        assert read_all(log) == expected
    finally:
        log.close()
