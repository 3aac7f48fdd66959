"""The native group-commit I/O (hpbroker.io._writer): write jobs and the writer thread."""

from __future__ import annotations

import errno
import os
import select
import subprocess
import sys
import textwrap
import threading

import pytest

from hpbroker.io._writer import WriteJob, WriterThread, set_trace


@pytest.fixture
def out(tmp_path):
    fd = os.open(tmp_path / "out.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    yield fd
    os.close(fd)


def contents(fd: int) -> bytes:
    with open(os.readlink(f"/proc/self/fd/{fd}"), "rb") as f:
        return f.read()


@pytest.fixture
def traced():
    events: list[tuple[str, int]] = []
    set_trace(lambda op, fd: events.append((op, fd)))
    yield events
    set_trace(None)


def test_a_job_writes_every_buffer_in_order_past_iov_max(out, traced):
    buffers = [bytes([i % 251]) * (1 + i % 7) for i in range(3000)]  # more than IOV_MAX (1024)
    job = WriteJob(out, buffers, False)
    assert job.run() and job.done and job.error is None
    assert contents(out) == b"".join(buffers) and job.written == sum(map(len, buffers))
    assert [op for op, _ in traced] == ["writev"] * 3, "one writev per IOV_MAX buffers"


def test_a_job_fdatasyncs_after_writing_when_asked(out, traced):
    WriteJob(out, [b"abc", memoryview(b"xdefx")[1:4], bytearray(b"g")], True).run()
    assert contents(out) == b"abcdefg"
    assert traced == [("writev", out), ("fdatasync", out)]


def test_a_job_measures_its_writev_and_fdatasync_time(out):
    synced = WriteJob(out, [b"x" * 65536], True)
    assert (synced.write_ns, synced.sync_ns) == (0, 0), "nothing until the job is done"
    synced.run()
    assert synced.write_ns > 0 and synced.sync_ns > 0
    unsynced = WriteJob(out, [b"y" * 65536], False)
    unsynced.run()
    assert unsynced.write_ns > 0 and unsynced.sync_ns == 0
    cancelled = WriteJob(out, [b"z"], True)
    cancelled.cancel()
    assert (cancelled.write_ns, cancelled.sync_ns) == (0, 0)


def test_empty_buffers_and_empty_jobs_write_nothing_and_succeed(out, traced):
    job = WriteJob(out, [], True)
    assert job.run() and job.error is None and job.written == 0
    assert WriteJob(out, [b"", b"", b"a", b""], False).run()
    assert contents(out) == b"a"


def test_a_job_runs_once_whoever_calls_run(out):
    job = WriteJob(out, [b"once"], False)
    assert job.run() is True
    assert job.run() is False
    assert job.cancel() is False, "cancelling a done job changes nothing"
    assert contents(out) == b"once" and job.error is None


def test_a_cancelled_job_never_writes(out):
    job = WriteJob(out, [b"never"], False)
    assert job.cancel() is True and job.done
    assert job.run() is False
    assert contents(out) == b""
    assert job.error.errno == errno.ECANCELED and "cancelled" in str(job.error)


def test_a_failed_write_reports_its_errno(tmp_path):
    read_only = os.open(tmp_path / "ro", os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        job = WriteJob(read_only, [b"x"], True)
        job.run()
        assert job.error.errno == errno.EBADF and job.written == 0
    finally:
        os.close(read_only)


def test_a_job_after_another_waits_for_it_and_skips_if_it_failed(out, tmp_path):
    first = WriteJob(out, [b"1"], False)
    second = WriteJob(out, [b"2"], False, first)
    late = threading.Thread(target=second.run)
    late.start()
    late.join(0.1)
    assert late.is_alive() and not second.done, "the second job waits for the first"
    first.run()
    late.join(5)
    assert contents(out) == b"12"

    read_only = os.open(tmp_path / "ro", os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        failed = WriteJob(read_only, [b"x"], False)
        after = WriteJob(out, [b"3"], False, failed)
        failed.run()
        after.run()
        assert "an earlier flush failed" in str(after.error) and contents(out) == b"12"
    finally:
        os.close(read_only)


def test_a_job_holds_its_buffers_until_it_is_gone(out):
    data = bytearray(b"held")
    job = WriteJob(out, [data], False)
    with pytest.raises(BufferError):
        data.extend(b"more")  # the job's view pins the buffer: nobody can move it under a write
    job.run()
    del job
    data.extend(b"!")  # released with the job


def test_a_short_write_is_resumed_and_a_later_failure_keeps_the_count(tmp_path):
    """RLIMIT_FSIZE cuts a write short at the limit; the retry then fails with EFBIG."""
    script = textwrap.dedent(f"""
        import os, resource, signal
        from hpbroker.io._writer import WriteJob
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
        fd = os.open({str(tmp_path / "limited")!r}, os.O_WRONLY | os.O_CREAT, 0o644)
        job = WriteJob(fd, [b"a" * 600, b"b" * 600], False)
        job.run()
        print(job.written, job.error.errno)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30,
                            check=True)
    assert result.stdout.split() == ["1000", str(errno.EFBIG)]


def test_the_writer_thread_runs_jobs_in_order_and_wakes_the_loop_once(out):
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    writer = WriterThread(wake_w)
    try:
        jobs = [WriteJob(out, [str(i).encode()], False) for i in range(50)]
        for job in jobs:
            assert writer.submit(job)
        for job in jobs:
            job.wait()
        assert contents(out) == b"".join(str(i).encode() for i in range(50))
        assert select.select([wake_r], [], [], 5)[0], "the loop is woken"
        assert writer.notified and writer.take_notification() and not writer.notified
        woken = os.read(wake_r, 100)
        assert 1 <= len(woken) < 50, "one byte per turn of the loop, not one per job"
        writer.stop(drain=True)
        assert not writer.submit(WriteJob(out, [b"late"], False)), "a stopped writer takes no jobs"
    finally:
        writer.stop(drain=False)
        os.close(wake_r)
        os.close(wake_w)


def test_stopping_without_draining_leaves_queued_jobs_for_their_owner(out):
    writer = WriterThread()

    def stop_now(op, fd):  # on the writer thread, right after the first job's writev
        writer.request_stop(drain=False)

    blocker = WriteJob(out, [b"a"], False)
    queued = WriteJob(out, [b"b"], False, blocker)
    set_trace(stop_now)
    try:
        writer.submit(blocker)
        writer.submit(queued)
        blocker.wait()
        writer.stop(drain=False)
    finally:
        set_trace(None)
    assert not queued.done, "the queued job was left pending"
    assert not writer.submit(WriteJob(out, [b"late"], False)), "a stopping writer takes no jobs"
    assert queued.run() and contents(out) == b"ab"


def test_a_job_dropped_while_queued_is_skipped(out):
    writer = WriterThread()
    gate, release = threading.Event(), threading.Event()
    set_trace(lambda op, fd: (gate.set(), release.wait(5)))
    try:
        first = WriteJob(out, [b"a"], False)
        writer.submit(first)
        writer.submit(WriteJob(out, [b"dropped"], False))  # the only Python reference goes now
        assert gate.wait(5)
        release.set()
        writer.stop(drain=True)
    finally:
        set_trace(None)
    assert contents(out) == b"a"
