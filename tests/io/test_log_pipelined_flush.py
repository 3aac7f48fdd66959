"""Pipelined group commit: the owner appends while a flusher thread writes the previous group."""

from __future__ import annotations

import os
import threading

import pytest
from storage_helpers import TEST_CONFIG, make_batch, make_unwritable, read_all, stamped

from hpbroker.errors import StorageError
from hpbroker.io import PartitionLog, _writer
from hpbroker.io._writer import WriterThread


@pytest.fixture
def pipelined(log_dir, clock):
    opened = []

    def open_pipelined(**changes):
        log = PartitionLog(log_dir, TEST_CONFIG.replace(**changes), clock=clock, flush_on_append=False)
        opened.append(log)
        return log

    yield open_pipelined
    for log in opened:
        log.close()


def test_append_never_flushes_by_itself_when_the_owner_drives_flushes(pipelined):
    log = pipelined(flush_messages=1)
    log.append(make_batch(3))
    assert log.flush_due() and log.pending_records == 3 and log.high_watermark == 0


def test_records_in_flight_are_unreadable_until_the_flush_completes(pipelined):
    log = pipelined()
    first = make_batch(2, tag=1)
    log.append(first)
    job = log.begin_flush()
    assert job is not None and log.flushes_in_flight == (job,)
    assert log.begin_flush() is None, "nothing pending"
    second = make_batch(1, tag=2)
    log.append(second)
    assert log.pending_records == 3 and log.high_watermark == 0
    job.run()
    assert log.high_watermark == 0, "applying the job is the owner's step"
    log.complete_flush(job)
    assert log.high_watermark == 2 and log.pending_records == 1
    assert read_all(log) == [(0, stamped(first, 0))]
    log.flush()
    assert read_all(log) == [(0, stamped(first, 0)), (2, stamped(second, 2))]


def test_a_flusher_thread_writes_exactly_what_a_synchronous_log_writes(tmp_path, pipelined, clock):
    batches = [make_batch(1 + i % 5, value_bytes=40 + i, tag=i) for i in range(300)]
    log = pipelined(segment_bytes=16_384)
    begun = []
    writer = WriterThread()
    job = None
    for batch in batches:
        log.append(batch)
        if job is not None and job.done:
            log.complete_flush(job)
            job = None
        if job is None:
            job = log.begin_flush()
            begun.append(job)
            assert writer.submit(job.io)
    log.complete_flush(job)
    writer.stop(drain=True)
    assert len(begun) > 5 and len(log.segments) > 3, "many jobs, some completed by rolls"
    assert all(job.done and job.applied and job.error is None for job in begun)
    log.flush()
    with PartitionLog(os.path.join(tmp_path, "sync"), TEST_CONFIG.replace(segment_bytes=16_384),
                      clock=clock) as reference:
        for batch in batches:
            reference.append(batch)
        reference.flush()
        assert read_all(log) == read_all(reference)
        assert [s.base_offset for s in log.segments] == [s.base_offset for s in reference.segments]
    log.close()
    with PartitionLog(log.directory, TEST_CONFIG) as reopened:
        assert reopened.high_watermark == sum(1 + i % 5 for i in range(300))


def test_a_roll_waits_for_the_flush_in_flight(pipelined):
    log = pipelined(segment_bytes=600)
    log.append(make_batch(1, value_bytes=300, tag=1))
    job = log.begin_flush()
    threading.Timer(0.05, job.run).start()
    log.append(make_batch(1, value_bytes=400, tag=2))  # must roll: waits for the job, applies it
    assert log.flushes_in_flight == () and len(log.segments) == 2
    assert log.high_watermark == 1
    log.flush()
    assert [offset for offset, _ in read_all(log)] == [0, 1]


@pytest.mark.parametrize("flusher_runs_it", [True, False])
def test_roll_rolls_when_all_that_is_unwritten_is_the_flush_in_flight(pipelined, flusher_runs_it):
    log = pipelined()
    log.append(make_batch(2))
    job = log.begin_flush()
    assert log.segments[-1].size_in_bytes == 0 and log.pending_records == 2
    if flusher_runs_it:
        threading.Timer(0.05, job.run).start()
    log.roll()
    assert [s.base_offset for s in log.segments] == [0, 2]
    assert (log.high_watermark, log.flushes_in_flight, log.recovery_point) == (2, (), 2)


def test_close_waits_for_and_keeps_the_flush_in_flight(log_dir, pipelined):
    log = pipelined()
    log.append(make_batch(4))
    job = log.begin_flush()
    threading.Timer(0.05, job.run).start()
    log.close()
    with PartitionLog(log_dir, TEST_CONFIG) as reopened:
        assert reopened.high_watermark == 4


def _in_thread(call, timeout_s: float = 5.0) -> bool:
    """Run ``call`` on a daemon thread; True if it returned within ``timeout_s``."""
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return not thread.is_alive()


def test_close_runs_a_flush_job_that_no_flusher_ever_ran(log_dir, pipelined):
    log = pipelined()
    log.append(make_batch(3))
    job = log.begin_flush()
    gone = WriterThread()
    gone.stop(drain=False)
    assert not gone.submit(job.io), "the flusher is gone (the broker is shutting down)"
    assert _in_thread(log.close), "close() must not wait for a job nobody will run"
    assert job.done and job.applied
    with PartitionLog(log_dir, TEST_CONFIG) as reopened:
        assert reopened.high_watermark == 3, "the job's records were written, not dropped"


@pytest.mark.parametrize(("call", "high_watermark"), [("flush", 3), ("roll", 3), ("complete_flush", 2)])
def test_the_owner_runs_a_job_nobody_claimed(pipelined, call, high_watermark):
    log = pipelined()
    first, second = make_batch(2, tag=1), make_batch(1, tag=2)
    log.append(first)
    job = log.begin_flush()
    log.append(second)
    args = (job,) if call == "complete_flush" else ()
    assert _in_thread(lambda: getattr(log, call)(*args)), f"{call} waited for a job nobody runs"
    assert (log.high_watermark, log.flushes_in_flight, job.done) == (high_watermark, (), True)
    size = os.path.getsize(log.segments[0].path)
    job.run()  # the flusher turns up late: the job is done already
    assert os.path.getsize(log.segments[0].path) == size, "a job runs once"
    log.flush()
    assert read_all(log) == [(0, stamped(first, 0)), (2, stamped(second, 2))], "each batch written once"


def test_the_owner_waits_for_a_job_a_flusher_is_running_and_does_not_run_it_again(pipelined):
    log = pipelined()
    batch = make_batch(2)
    log.append(batch)
    job = log.begin_flush()
    segment = log.segments[-1]
    started, release = threading.Event(), threading.Event()

    def hold_after_write(operation, fd):  # the job is still running while this blocks
        if operation == "writev":
            started.set()
            release.wait(5)

    _writer.set_trace(hold_after_write)
    try:
        flusher = threading.Thread(target=job.run)
        flusher.start()
        assert started.wait(5)
        threading.Timer(0.05, release.set).start()
        log.flush()  # waits for the job being written, applies it
        flusher.join(5)
    finally:
        _writer.set_trace(None)
    assert read_all(log) == [(0, stamped(batch, 0))]
    assert os.path.getsize(segment.path) == len(batch), "written once"


def test_a_job_cut_off_by_an_abandoned_log_never_writes(log_dir, pipelined):
    log = pipelined()
    log.append(make_batch(1))
    job = log.begin_flush()
    path = log.segments[-1].path
    assert _in_thread(log._abandon)
    reused = os.open(os.devnull, os.O_RDWR)  # the descriptor numbers are free for anyone now
    try:
        job.run()  # the flusher turns up late
    finally:
        os.close(reused)
    assert job.done and job.written == 0
    assert os.path.getsize(path) == 0


def test_index_repair_during_a_flush_in_flight_scans_only_the_applied_bytes(pipelined, caplog):
    log = pipelined(segment_bytes=1 << 20, index_interval_bytes=0)
    batches = [make_batch(1, tag=i) for i in range(10)]
    for batch in batches:
        log.append(batch)
    log.flush()
    log.append(make_batch(1, tag=10))
    job = log.begin_flush()
    job.run()  # the flusher has written the batch; the owner has not applied it yet
    log.segments[-1].offset_index.positions[3] += 1  # the index disagrees with the log: a read repairs it
    assert log.read_bytes(3, 1) == stamped(batches[3], 3)
    assert "rebuilding the indexes" in caplog.text
    assert not log.offline
    log.complete_flush(job)
    assert [offset for offset, _ in read_all(log)] == list(range(11))


def test_a_failed_flush_refuses_appends_until_writes_resume(pipelined):
    log = pipelined()
    log.append(make_batch(1))
    job = log.begin_flush()
    make_unwritable(log.segments[-1].log.fd, log.segments[-1].path)  # under the flusher
    job.run()
    assert isinstance(job.error, OSError)
    with pytest.raises(StorageError, match="complete_flush failed"):
        log.complete_flush(job)
    assert not log.offline and not log.writable and log.log_end_offset == 0
    with pytest.raises(StorageError, match="refuses writes"):
        log.append(make_batch(1))


def test_a_job_the_log_already_applied_completes_as_a_no_op(pipelined):
    log = pipelined()
    log.append(make_batch(1))
    job = log.begin_flush()
    job.run()
    log.flush()  # applies the job in flight itself
    assert job.applied and log.high_watermark == 1
    log.complete_flush(job)
    assert log.high_watermark == 1


def test_completing_another_logs_job_is_refused(pipelined, tmp_path, clock):
    log = pipelined()
    other_dir = os.path.join(tmp_path, "other")
    with PartitionLog(other_dir, TEST_CONFIG, clock=clock, flush_on_append=False) as other:
        other.append(make_batch(1))
        foreign = other.begin_flush()
        foreign.run()
        with pytest.raises(ValueError, match="not one of this log's flushes in flight"):
            log.complete_flush(foreign)
        other.complete_flush(foreign)


def test_jobs_in_flight_write_in_the_order_begun_whoever_runs_them(pipelined):
    log = pipelined()
    batches = [make_batch(1, value_bytes=20 + i, tag=i) for i in range(3)]
    jobs = []
    for batch in batches:
        log.append(batch)
        jobs.append(log.begin_flush())
    assert log.flushes_in_flight == tuple(jobs) and log.pending_records == 3
    late = threading.Thread(target=jobs[2].run)  # claims the last job first: it must wait
    late.start()
    late.join(0.1)
    assert late.is_alive() and not jobs[2].done, "the last job waits for the ones before"
    threading.Thread(target=jobs[0].run).start()
    log.complete_flush(jobs[1])  # applies jobs 0 and 1 in order, running job 1 here
    late.join(5)
    assert [job.applied for job in jobs] == [True, True, False] and log.high_watermark == 2
    log.complete_flush(jobs[2])
    assert read_all(log) == [(i, stamped(batch, i)) for i, batch in enumerate(batches)]


def test_a_job_after_a_failed_one_writes_nothing(pipelined):
    log = pipelined()
    log.append(make_batch(1, tag=1))
    first = log.begin_flush()
    log.append(make_batch(1, tag=2))
    second = log.begin_flush()
    fd, path = log.segments[-1].log.fd, log.segments[-1].path
    size_before = os.fstat(fd).st_size
    make_unwritable(fd, path)
    first.run()
    assert isinstance(first.error, OSError)
    writable = os.open(path, os.O_WRONLY | os.O_APPEND)  # the disk is back
    os.dup2(writable, fd)
    os.close(writable)
    second.run()
    assert second.error is not None and "an earlier flush failed" in str(second.error)
    assert os.fstat(fd).st_size == size_before
    with pytest.raises(StorageError, match="complete_flush failed"):
        log.complete_flush(second)
    assert not log.writable and log.log_end_offset == 0
