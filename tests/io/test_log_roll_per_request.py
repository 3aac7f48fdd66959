"""A produce request lands whole in one segment: the log decides whether to roll once per request
(Kafka's maybeRoll per append), so a crash or a failed flush keeps all of a request or none of it,
and an idempotent producer's resend is then stored whole or answered as a duplicate, never
refused as out of order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from storage_helpers import START_MS, TEST_CONFIG, make_batch, read_all

from hpbroker import _core
from hpbroker.errors import RecordTooLargeError, StorageError
from hpbroker.io import PartitionLog
from hpbroker.io.producer_state import list_snapshots

VALUE_BYTES = 600  # TEST_CONFIG rolls at 4096 bytes: a few of these records fill a segment


def idempotent(sequence: int, count: int = 1, *, producer_id: int = 7) -> bytes:
    return _core.build_batch([b"%d:" % (sequence + i) + b"x" * VALUE_BYTES for i in range(count)],
                             timestamps=START_MS, producer="p", base_sequence=sequence,
                             producer_id=producer_id, producer_epoch=0)


def plain(tag: int, count: int = 1) -> bytes:
    return make_batch(count, value_bytes=VALUE_BYTES, tag=tag)


def segment_spans(log: PartitionLog) -> list[tuple[int, int]]:
    return [(segment.base_offset, segment.next_offset) for segment in log.segments]


def near_full(log: PartitionLog) -> None:
    """Fill the active segment to within one request of its segment_bytes, flushed."""
    log.append(idempotent(0, 4))  # offsets 0..3, about 2.5 KB of the 4 KB
    log.flush()
    assert log.segment_count == 1 and log.segments[-1].size_in_bytes > TEST_CONFIG.segment_bytes // 2


# The request: three batches (offsets 4..6), each of which would still fit the first segment
# alone, but not all three.
REQUEST = idempotent(4) + idempotent(5) + idempotent(6)


@pytest.mark.parametrize("kind", ["idempotent", "plain"])
def test_a_request_that_would_cross_the_segment_boundary_lands_whole_in_a_new_segment(open_log, log_dir,
                                                                                      kind):
    log = open_log()
    near_full(log)
    request = REQUEST if kind == "idempotent" else plain(1) + plain(2) + plain(3)
    info = log.append(request)
    assert (info.first_offset, info.last_offset) == (4, 6)
    assert segment_spans(log) == [(0, 4), (4, 4)], "rolled before the request: none of it in the old segment"
    assert list_snapshots(log_dir) == [4], "the roll's snapshot lies below the whole request"
    log.flush()
    assert segment_spans(log) == [(0, 4), (4, 7)]
    assert [offset for offset, _ in read_all(log)] == [0, 4, 5, 6]


def test_a_request_larger_than_segment_bytes_gets_a_segment_to_itself(open_log):
    log = open_log()
    log.append(plain(0))
    request = b"".join(idempotent(i) for i in range(8))  # about 5 KB: more than a segment
    assert len(request) > TEST_CONFIG.segment_bytes
    info = log.append(request)
    assert (info.first_offset, info.last_offset) == (1, 8)
    log.append(plain(9))
    log.flush()
    assert segment_spans(log) == [(0, 1), (1, 9), (9, 10)], "the next request rolls again"
    assert log.segments[1].size_in_bytes == len(request)


def test_a_request_whose_timestamps_pass_segment_ms_rolls_before_its_first_batch(open_log):
    log = open_log(segment_ms=1000)
    log.append(make_batch(1, timestamp=START_MS))
    late = make_batch(1, timestamp=START_MS + 5000)
    info = log.append(make_batch(1, timestamp=START_MS) + late)  # its second batch is too late
    log.flush()
    assert segment_spans(log) == [(0, 1), (1, 3)] and info.first_offset == 1


def test_a_request_no_segment_could_hold_is_refused_with_nothing_appended(open_log, monkeypatch):
    log = open_log()
    monkeypatch.setattr("hpbroker.io.log.MAX_SEGMENT_BYTES", 2 * len(idempotent(0)))
    with pytest.raises(RecordTooLargeError, match="cannot lie in one segment"):
        log.append(idempotent(0) + idempotent(1) + idempotent(2))
    assert log.log_end_offset == 0 and log.producer_state.get(7) is None


@pytest.mark.parametrize("flushed", [False, True], ids=["crash-before-flush", "crash-after-flush"])
def test_a_crash_after_a_roll_then_a_resend_stores_the_request_once(open_log, log_dir, flushed):
    log = open_log()
    near_full(log)
    log.append(REQUEST)
    if flushed:
        log.flush()
    log._abandon()  # kill -9: the pending batches are lost
    log = open_log()
    info = log.append(REQUEST)
    assert (info.first_offset, info.last_offset, info.duplicate) == (4, 6, flushed)
    log.flush()
    assert [offset for offset, _ in read_all(log)] == [0, 4, 5, 6]
    assert log.append(idempotent(7)).first_offset == 7


def test_a_failed_flush_after_a_roll_then_a_resend_stores_the_request_once(log_dir, clock):
    with PartitionLog(log_dir, TEST_CONFIG, clock=clock, flush_on_append=False) as log:
        near_full(log)
        log.append(REQUEST)
        job = log.begin_flush()
        fd = log.segments[-1].log.fd
        read_only = os.open(log.segments[-1].path, os.O_RDONLY)
        saved = os.dup(fd)
        os.dup2(read_only, fd)  # the flush's writev fails
        try:
            job.run()
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            os.close(read_only)
        with pytest.raises(StorageError):
            log.complete_flush(job)
        assert log.resume_writes()
        info = log.append(REQUEST)
        assert (info.first_offset, info.last_offset, info.duplicate) == (4, 6, False)
        log.flush()
        assert [offset for offset, _ in read_all(log)] == [0, 4, 5, 6]


def test_a_kill_9_after_a_roll_then_a_resend_stores_the_request_once(log_dir, tmp_path):
    request_path = tmp_path / "request"
    request_path.write_bytes(REQUEST)
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from storage_helpers import TEST_CONFIG
        from test_log_roll_per_request import near_full
        from hpbroker.io import PartitionLog
        log = PartitionLog({log_dir!r}, TEST_CONFIG)
        near_full(log)
        info = log.append(open({str(request_path)!r}, "rb").read())
        print(log.segment_count, log.high_watermark, info.first_offset, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert done.stdout.split() == ["2", "4", "4"], "rolled, nothing of the request readable yet"
    with PartitionLog(log_dir, TEST_CONFIG) as log:
        assert log.log_end_offset == 4
        info = log.append(REQUEST)
        assert (info.first_offset, info.last_offset, info.duplicate) == (4, 6, False)
        log.flush()
        assert [offset for offset, _ in read_all(log)] == [0, 4, 5, 6]
