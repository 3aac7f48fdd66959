"""Partition log append of pre-built 1 MiB batches, against this disk's raw write path.

Each round writes the same bytes (BATCHES batches of about 1 MiB of 100-byte records) into a
file or log opened, in a fresh directory, before the timing starts: the raw baselines with
``os.write`` (and ``os.fdatasync`` after every batch), the log with ``PartitionLog.append``
(which validates every record, stamps offsets, writes with ``writev`` and, by default,
fdatasyncs each flush), both with the flush on the appending thread (synchronous) and with each
group commit run by a native writer thread while the owner appends (pipelined, as the broker's
workers do).  Target: the log reaches >= 0.7 of the raw throughput, with and without fsync.  Ratios are
printed at the end of the run.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from bench.conftest import ratio, throughput
from hpbroker.io import LogConfig, PartitionLog
from hpbroker.io._writer import WriterThread
from hpbroker.records import BatchBuilder

BATCHES = 48
VALUE_BYTES = 100
ROUNDS = 9


@pytest.fixture(scope="module")
def batches():
    builder = BatchBuilder("bench", max_bytes=1 << 20)
    value = os.urandom(VALUE_BYTES)
    while builder.append(value):
        pass
    batch = builder.build()
    return [batch] * BATCHES


class Rounds:
    """Set-up for benchmark.pedantic: each round gets a freshly opened target in a fresh
    directory; the previous round's target is closed and removed first, outside the timing."""

    def __init__(self, root, opener, closer):
        self.root, self.opener, self.closer = root, opener, closer
        self.current = None

    def setup(self):
        self.finish()
        directory = tempfile.mkdtemp(dir=self.root)
        self.current = (directory, self.opener(directory))
        return (self.current[1],), {}

    def finish(self):
        if self.current is not None:
            directory, target = self.current
            self.closer(target)
            shutil.rmtree(directory, ignore_errors=True)
            self.current = None


def _open_raw(directory):
    return os.open(os.path.join(directory, "raw.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def _raw_write(fd, batches, fsync):
    for batch in batches:
        os.write(fd, batch)
        if fsync:
            os.fdatasync(fd)


def _log_append(log, batches):
    for batch in batches:
        log.append(batch)
    assert log.pending_records == 0


def _log_append_pipelined(log, batches, writer, depth=2):
    """The broker's pattern: append on the owner's thread, group commits on the writer's.  Up to
    ``depth`` jobs are in flight, so the writer always has the next group queued while the
    owner keeps appending; each job takes everything appended since the previous one."""
    jobs = []
    for batch in batches:
        log.append(batch)
        while jobs and jobs[0].done:
            log.complete_flush(jobs.pop(0))
        if len(jobs) < depth:
            job = log.begin_flush()
            writer.submit(job.io)
            jobs.append(job)
    for job in jobs:
        log.complete_flush(job)
    log.flush()
    assert log.pending_records == 0


def _records(batches):
    from hpbroker.records import read_header

    return sum(read_header(b).record_count for b in batches)


@pytest.mark.parametrize("fsync", [False, True], ids=["nofsync", "fsync"])
def test_raw_write(benchmark, batches, tmp_path, fsync):
    rounds = Rounds(tmp_path, _open_raw, os.close)
    benchmark.pedantic(lambda fd: _raw_write(fd, batches, fsync), setup=rounds.setup, rounds=ROUNDS)
    rounds.finish()
    throughput(benchmark, records=_records(batches), nbytes=sum(map(len, batches)))


@pytest.mark.parametrize("fsync", [False, True], ids=["nofsync", "fsync"])
def test_log_append(benchmark, batches, tmp_path, fsync):
    config = LogConfig(flush_fsync=fsync, flush_messages=1)
    rounds = Rounds(tmp_path, lambda d: PartitionLog(d, config), PartitionLog.close)
    benchmark.pedantic(lambda log: _log_append(log, batches), setup=rounds.setup, rounds=ROUNDS)
    rounds.finish()
    throughput(benchmark, records=_records(batches), nbytes=sum(map(len, batches)))


@pytest.mark.parametrize("fsync", [False, True], ids=["nofsync", "fsync"])
def test_log_append_pipelined(benchmark, batches, tmp_path, fsync):
    config = LogConfig(flush_fsync=fsync, flush_messages=1)
    rounds = Rounds(tmp_path, lambda d: PartitionLog(d, config, flush_on_append=False), PartitionLog.close)
    writer = WriterThread()
    benchmark.pedantic(lambda log: _log_append_pipelined(log, batches, writer), setup=rounds.setup,
                       rounds=ROUNDS)
    writer.stop(drain=True)
    rounds.finish()
    throughput(benchmark, records=_records(batches), nbytes=sum(map(len, batches)))


ratio("log append pipelined / raw write (no fsync)", "test_log_append_pipelined[nofsync]",
      "test_raw_write[nofsync]", 0.7)
ratio("log append pipelined / raw write+fdatasync", "test_log_append_pipelined[fsync]",
      "test_raw_write[fsync]", 0.7)
ratio("log append synchronous / raw write (no fsync)", "test_log_append[nofsync]", "test_raw_write[nofsync]")
ratio("log append synchronous / raw write+fdatasync", "test_log_append[fsync]", "test_raw_write[fsync]")
