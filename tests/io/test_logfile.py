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
