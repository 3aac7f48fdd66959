"""The order of writes and syncs that the durability promises of hpbroker.io.log rest on, checked
on the calls the log makes to ``os`` (recorded by the ``disk_events`` fixture, in order)."""

from __future__ import annotations

import os
import threading

import pytest
from storage_helpers import TEST_CONFIG, make_batch

from hpbroker.io import PartitionLog

CHECKPOINT = "recovery-point-offset-checkpoint"
WRITES = ("write", "writev", "pwrite", "ftruncate")
SYNCS = ("fsync", "fdatasync")


def _open(log_dir, clock, pipelined: bool, **changes) -> PartitionLog:
    config = TEST_CONFIG.replace(flush_fsync=True, **changes)
    return PartitionLog(log_dir, config, clock=clock, flush_on_append=not pipelined)


def _flush(log: PartitionLog, pipelined: bool) -> None:
    """One group commit, the synchronous way or through a flusher thread."""
    if not pipelined:
        log.flush()
        return
    job = log.begin_flush()
    if job is not None:
        flusher = threading.Thread(target=job.run)
        flusher.start()
        flusher.join()
        log.complete_flush(job)


def _workload(log: PartitionLog, pipelined: bool) -> None:
    """Appends and flushes that roll, index and checkpoint, then a clean close."""
    for i in range(60):
        log.append(make_batch(1 + i % 3, value_bytes=40 + 7 * (i % 5), tag=i))
        if i % 4 == 3:
            _flush(log, pipelined)
        if i == 30:
            log.checkpoint()
    _flush(log, pipelined)
    log.close()


def _segment_base(path: str) -> int | None:
    name = os.path.basename(path)
    return int(name[:20]) if name[:20].isdigit() and name[20:21] == "." else None


@pytest.mark.parametrize("pipelined", [False, True], ids=["synchronous", "pipelined"])
def test_data_is_fdatasynced_before_the_high_watermark_moves_past_it(log_dir, clock, disk_events, pipelined):
    log = _open(log_dir, clock, pipelined, segment_bytes=1 << 20)
    disk_events.probe = lambda: log.high_watermark
    for round_ in range(3):
        log.append(make_batch(2, tag=round_))
        before = log.high_watermark
        disk_events.events.clear()
        _flush(log, pipelined)
        assert log.high_watermark == before + 2
        ops = [(op, os.path.basename(path)) for op, path, _ in disk_events.events]
        synced = ops.index(("fdatasync", f"{0:020d}.log"))
        assert ops.index(("writev", f"{0:020d}.log")) < synced
        moved = [hw for _, _, hw in disk_events.events[: synced + 1] if hw != before]
        assert not moved, "the high watermark moved before the data reached the disk"
    log.close()


@pytest.mark.parametrize("pipelined", [False, True], ids=["synchronous", "pipelined"])
def test_an_index_file_never_holds_an_entry_past_the_data_written(log_dir, clock, disk_events, pipelined):
    def entries_past_the_data() -> list[str]:
        found = []
        for name in os.listdir(log_dir):
            if name.endswith(".index"):
                with open(os.path.join(log_dir, name), "rb") as f:
                    index = f.read()
                size = os.path.getsize(os.path.join(log_dir, name[:20] + ".log"))
                positions = [int.from_bytes(index[i + 4 : i + 8], "little") for i in range(0, len(index), 8)]
                found += [f"{name}: position {p} of a {size}-byte log" for p in positions if p >= size]
        return found

    log = _open(log_dir, clock, pipelined, segment_bytes=2048, index_interval_bytes=0)
    disk_events.probe = entries_past_the_data
    _workload(log, pipelined)
    index_writes = [e for e in disk_events.events if e[0] == "write" and e[1].endswith(".index")]
    assert len(index_writes) >= 10, "the workload writes index entries"
    assert [e for e in disk_events.events if e[2]] == []


@pytest.mark.parametrize("pipelined", [False, True], ids=["synchronous", "pipelined"])
def test_segments_are_synced_before_the_checkpoint_or_the_clean_shutdown_marker_covers_them(
        log_dir, clock, disk_events, pipelined):
    checkpoint = os.path.join(log_dir, CHECKPOINT)

    def checkpointed() -> int | None:
        try:
            with open(checkpoint) as f:
                return int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            return None

    log = _open(log_dir, clock, pipelined, segment_bytes=1024)
    disk_events.probe = checkpointed
    _workload(log, pipelined)
    unsynced: set[str] = set()
    checkpoints = 0
    for op, path, value in disk_events.events:
        if op in WRITES:
            unsynced.add(path)
        elif op in SYNCS:
            unsynced.discard(path)
        marker_synced = (op, os.path.basename(path)) == ("fsync", "clean-shutdown")
        if (op, path) == ("replace", checkpoint) or marker_synced:
            checkpoints += 1
            covered = [p for p in unsynced if _segment_base(p) is not None and _segment_base(p) < value]
            assert not covered, f"{os.path.basename(path)} at offset {value} covers unsynced {covered}"
        if marker_synced:
            assert not [p for p in unsynced if _segment_base(p) is not None or p == checkpoint]
    rolls = len([n for n in os.listdir(log_dir) if n.endswith(".log")]) - 1
    assert rolls >= 3 and checkpoints >= rolls + 2, "every roll, the checkpoint() call and close checkpoint"


@pytest.mark.parametrize("pipelined", [False, True], ids=["synchronous", "pipelined"])
def test_a_leader_epoch_begun_lazily_is_durable_before_the_first_record_of_it_is_written(
        log_dir, clock, disk_events, pipelined):
    """begin_leader_epoch(durable=False) touches no file; the flush that writes the epoch's first
    record first replaces the leader-epoch file whole and durably (.tmp fsynced, renamed, the
    directory fsynced), so a crash leaves the old file or the new one, and never a record on
    disk whose epoch the file lacks."""
    log = _open(log_dir, clock, pipelined, segment_bytes=1 << 20)
    log.append(make_batch(2))
    _flush(log, pipelined)
    epochs_file = os.path.join(log_dir, "leader-epoch-checkpoint")
    disk_events.events.clear()
    log.begin_leader_epoch(5, durable=False)
    assert disk_events.events == [], "no disk call"
    assert log.leader_epochs.entries == [(0, 0), (5, 2)] and log.leader_epochs.dirty
    with open(epochs_file) as f:
        assert f.read() == "0\n1\n0 0\n", "the old file, whole"
    log.append(make_batch(1, tag=1), leader_epoch=5)
    assert disk_events.of(*WRITES, *SYNCS, "replace") == [], "pending: nothing written yet"
    _flush(log, pipelined)
    ops = [(op, path) for op, path, _ in disk_events.of(*WRITES, *SYNCS, "replace")]
    first_record = next(i for i, (op, path) in enumerate(ops) if op in WRITES and path.endswith(".log"))
    assert ops[:first_record] == [("write", epochs_file + ".tmp"), ("fsync", epochs_file + ".tmp"),
                                  ("replace", epochs_file), ("fsync", log_dir)]
    assert not log.leader_epochs.dirty
    with open(epochs_file) as f:
        assert f.read() == "0\n2\n0 0\n5 2\n"
    disk_events.events.clear()
    log.append(make_batch(1, tag=2), leader_epoch=5)
    _flush(log, pipelined)
    assert not [path for _op, path, _ in disk_events.events if path.startswith(epochs_file)], "once only"
    log.close()
