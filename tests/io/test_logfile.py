"""LogFile: chunked scanning and header walks over a real file, and the package's import layering."""

from __future__ import annotations

import subprocess
import sys

import pytest
from storage_helpers import make_batch, stamped

from hpbroker import _core
from hpbroker.errors import CorruptRecordError
from hpbroker.io.logfile import LogFile


def _file_of(tmp_path, batches: list[bytes], tail: bytes = b"") -> tuple[LogFile, list[int]]:
    data, positions, offset = b"", [], 0
    for batch in batches:
        positions.append(len(data))
        data += stamped(batch, offset)
        offset += _core.read_header(batch).record_count
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(data + tail)
    return LogFile(str(path), create=False), positions


def _batches() -> list[bytes]:
    return [make_batch(1 + i % 3, value_bytes=[10, 150, 400, 40][i % 4], tag=i) for i in range(30)]


@pytest.mark.parametrize("chunk_bytes", [60, 100, 333, 1 << 20])
@pytest.mark.parametrize("tail", [b"", b"\0" * 70, b"\1" * 7], ids=["clean", "zeros", "short-garbage"])
def test_chunked_scan_finds_every_batch_whatever_the_chunk_size(tmp_path, chunk_bytes, tail):
    batches = _batches()
    log_file, positions = _file_of(tmp_path, batches, tail)
    seen: list[int] = []

    def on_batches(chunk_position, result):
        seen.extend(chunk_position + p for p in result.positions)

    outcome = log_file.scan(0, 0, on_batches, chunk_bytes=chunk_bytes)
    log_file.close()
    assert seen == positions
    assert outcome.valid_end == sum(len(b) for b in batches)
    assert outcome.next_offset == sum(_core.read_header(b).record_count for b in batches)
    assert (outcome.stop_reason is None) == (tail == b"")


def _forged_length(batch: bytes, batch_length: int) -> bytes:
    forged = bytearray(batch)
    forged[8:12] = batch_length.to_bytes(4, "little")
    return bytes(forged)


@pytest.mark.parametrize("claimed", [3000, 10**9], ids=["within-the-file", "past-the-end"])
def test_a_corrupt_length_never_makes_the_scan_read_more_than_a_chunk(tmp_path, monkeypatch, claimed):
    from hpbroker.io import logfile

    batches = _batches()
    next_offset = sum(_core.read_header(b).record_count for b in batches)
    tail = _forged_length(stamped(make_batch(1), next_offset), claimed) + b"\1" * 3500
    log_file, positions = _file_of(tmp_path, batches, tail)
    forged_at = positions[-1] + len(batches[-1])
    reads: list[int] = []  # sizes of the reads at or after the forged batch
    pread_full = logfile.pread_full

    def counting(fd, length, position):
        if position >= forged_at:
            reads.append(length)
        return pread_full(fd, length, position)

    monkeypatch.setattr(logfile, "pread_full", counting)
    outcome = log_file.scan(0, 0, lambda *_: None, chunk_bytes=100)
    log_file.close()
    assert outcome.valid_end == forged_at
    assert max(reads) <= 100, f"read {max(reads)} bytes at once for a batch that claims {claimed + 12}"
    expected = "CRC mismatch" if claimed == 3000 else "ends inside a batch"
    assert expected in outcome.stop_reason and f"position {outcome.valid_end}" in outcome.stop_reason


def test_scan_reads_a_valid_batch_larger_than_a_chunk_whole_and_accepts_it(tmp_path):
    batches = [make_batch(1, tag=1), make_batch(3, value_bytes=5000, tag=2), make_batch(1, tag=3)]
    log_file, positions = _file_of(tmp_path, batches)
    seen: list[int] = []
    outcome = log_file.scan(0, 0, lambda at, result: seen.extend(at + p for p in result.positions),
                            chunk_bytes=1000)
    log_file.close()
    assert (seen, outcome.stop_reason, outcome.next_offset) == (positions, None, 5)


def test_scan_reports_a_torn_last_batch(tmp_path):
    batches = _batches()
    log_file, positions = _file_of(tmp_path, batches[:-1], stamped(batches[-1], 0)[:-1])
    outcome = log_file.scan(0, 0, lambda *_: None, chunk_bytes=100)
    log_file.close()
    assert outcome.valid_end == positions[-1] + len(batches[-2])
    assert "ends inside a batch" in outcome.stop_reason


def test_header_walk_yields_every_batch_and_rejects_garbage(tmp_path):
    batches = _batches()
    log_file, positions = _file_of(tmp_path, batches, b"\0" * 100)
    end = positions[-1] + len(batches[-1])
    assert [p for p, _ in log_file.headers(0, end)] == positions
    log_file.size = end + 100
    with pytest.raises(CorruptRecordError):
        list(log_file.headers(positions[5], end + 100))
    log_file.close()


def test_append_of_more_buffers_than_iov_max_writes_them_all(open_log):
    log = open_log(segment_bytes=1 << 20)
    batches = [make_batch(1, value_bytes=5, tag=i) for i in range(1500)]  # 3000 iovecs in one flush
    for batch in batches:
        log.append(batch)
    log.flush()
    assert log.segments[-1].size_in_bytes == sum(len(b) for b in batches)
    records = _core.decode_records(log.read_bytes(0, 1 << 20))
    assert [r.offset for r in records] == list(range(1500))


def test_storage_imports_neither_zmq_nor_kazoo():
    code = ("import sys, hpbroker.io, hpbroker.io.loader; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('zmq', 'kazoo')); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
