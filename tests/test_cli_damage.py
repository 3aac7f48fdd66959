"""``hpbroker check`` and ``dump-log`` over damage that cannot be framed (a length field hit,
garbage written over batches): both resynchronise on the next valid batch, as recovery does,
report the damaged run once with its file, position and offset, and count every valid batch."""

from __future__ import annotations

import struct

import pytest

from hpbroker.broker.topics import TopicStore
from hpbroker.cli import main
from hpbroker.io import LogConfig, PartitionLog
from hpbroker.records import build_batch, scan_batches

TOPIC = "orders"
BATCHES = 40
RECORDS = 5


@pytest.fixture
def data_dir(tmp_path):
    """A stopped broker's data directory: one partition, one segment of 40 batches, closed cleanly."""
    directory = tmp_path / "data"
    directory.mkdir()
    TopicStore(directory).create(TOPIC, 1, {})
    with PartitionLog(directory / f"{TOPIC}-0", LogConfig(index_interval_bytes=300)) as log:
        for i in range(BATCHES):
            log.append(build_batch([f"record {i}-{j}".encode() for j in range(RECORDS)]))
    return directory


def _segment(data_dir):
    return data_dir / f"{TOPIC}-0" / "00000000000000000000.log"


def _garble_batches_10_and_11(data_dir) -> tuple[int, int]:
    """Overwrite batch 10's length field and batch 11's header: no batch can be framed from
    batch 10's position until batch 12.  (batch 10's position, batch 12's position)"""
    segment = _segment(data_dir)
    data = bytearray(segment.read_bytes())
    scan = scan_batches(data)
    struct.pack_into("<i", data, scan.positions[10] + 8, 0x7FFF0000)
    data[scan.positions[11] : scan.positions[11] + 30] = b"\xa5" * 30
    segment.write_bytes(bytes(data))
    return scan.positions[10], scan.positions[12]


def test_check_resynchronises_after_unframeable_bytes_and_counts_the_valid_batches(data_dir, capsys):
    damaged_at, resumed_at = _garble_batches_10_and_11(data_dir)
    status = main(["check", str(data_dir)])
    out = capsys.readouterr().out
    assert status == 1
    problems = [line for line in out.splitlines() if line.startswith("  ")]
    assert len(problems) == 1, out
    assert f"00000000000000000000.log position {damaged_at}, offset 50:" in problems[0]
    assert f"resynchronised at position {resumed_at}, offset 60" in problems[0]
    assert out.startswith(f"{TOPIC}-0: 1 PROBLEMS (1 segments, {BATCHES - 2} valid batches, "), \
        "every valid batch, after the damage too, is counted"


def test_a_clean_partition_reports_its_batch_count(data_dir, capsys):
    assert main(["check", str(data_dir)]) == 0
    assert f"{BATCHES} batches" in capsys.readouterr().out


def test_dump_log_lists_the_damaged_run_once_and_every_batch_after_it(data_dir, capsys):
    damaged_at, resumed_at = _garble_batches_10_and_11(data_dir)
    status = main(["dump-log", str(_segment(data_dir))])
    out = capsys.readouterr().out
    assert status == 1
    lines = out.splitlines()
    [damaged] = [line for line in lines if line.startswith("DAMAGED")]
    assert damaged.startswith(f"DAMAGED at position {damaged_at}: ")
    assert f"({resumed_at - damaged_at} bytes that are not a batch)" in damaged
    listed = [line for line in lines if line.startswith("baseOffset:")]
    assert len(listed) == BATCHES - 2
    assert listed[10].startswith("baseOffset: 60 ")
    assert listed[-1].startswith(f"baseOffset: {BATCHES * RECORDS - 5} ")
    assert lines[-1] == (f"{BATCHES - 2} batches, {(BATCHES - 2) * RECORDS} records; NOT VALID: 1 of them, "
                         f"or the tail, fail")
