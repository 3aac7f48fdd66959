"""``hpbroker check DATA_DIR``: a clean data directory passes; damage in a segment, a torn tail,
a wrong index entry, a gap between segments are each reported with file, position and offset."""

from __future__ import annotations

import re
import struct
import subprocess
import sys

import pytest
from harness import start_broker

from hpbroker.broker.topics import TopicStore
from hpbroker.cli import main
from hpbroker.io import LogConfig, PartitionLog
from hpbroker.records import build_batch

TOPIC = "orders"
PARTITIONS = 2
BATCHES = 60
RECORDS = 5  # per batch


@pytest.fixture
def data_dir(tmp_path):
    """A stopped broker's data directory: two partitions of several small segments, closed cleanly."""
    directory = tmp_path / "data"
    TopicStore(directory.mkdir() or directory).create(TOPIC, PARTITIONS, {"segment_bytes": 2048})
    config = LogConfig(segment_bytes=2048, index_interval_bytes=300)
    for partition in range(PARTITIONS):
        with PartitionLog(directory / f"{TOPIC}-{partition}", config) as log:
            for i in range(BATCHES):
                log.append(build_batch([f"record {i}-{j} of {partition}".encode() for j in range(RECORDS)],
                                       timestamps=1_700_000_000_000 + i * 1000, producer="check-test"))
    return directory


def segments(partition_dir, suffix=".log"):
    return sorted(partition_dir.glob(f"*{suffix}"))


def check(data_dir, capsys, *extra) -> tuple[int, str]:
    status = main(["check", str(data_dir), *extra])
    return status, capsys.readouterr().out


def test_a_clean_data_directory_passes(data_dir, capsys):
    assert len(segments(data_dir / f"{TOPIC}-0")) > 3, "the fixture should roll several segments"
    status, out = check(data_dir, capsys)
    assert status == 0, out
    lines = out.splitlines()
    assert lines[0].startswith(f"{TOPIC}-0: OK (") and f"offsets 0..{BATCHES * RECORDS - 1}" in lines[0]
    assert lines[1].startswith(f"{TOPIC}-1: OK (")
    assert lines[-1].startswith(f"checked {PARTITIONS} partitions of 1 topics")
    assert "2 OK, 0 with" in lines[-1]


def test_a_flipped_byte_is_reported_with_its_segment_position_and_offset(data_dir, capsys):
    segment = segments(data_dir / f"{TOPIC}-0")[1]
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0x01
    segment.write_bytes(bytes(data))
    status, out = check(data_dir, capsys)
    assert status == 1
    assert f"{TOPIC}-0: 1 PROBLEMS" in out and f"{TOPIC}-1: OK" in out
    (problem,) = [line for line in out.splitlines() if line.startswith("  ")]
    base = int(segment.stem)
    position, offset = re.search(rf"{segment.name} position (\d+), offset (\d+): ", problem).groups()
    assert int(position) < len(data) // 2 < int(position) + 200 and int(offset) >= base
    assert (int(offset) - base) % RECORDS == 0
    assert "CRC mismatch" in problem or "record" in problem


def test_a_truncated_segment_is_reported(data_dir, capsys):
    last = segments(data_dir / f"{TOPIC}-1")[-1]
    data = last.read_bytes()
    last.write_bytes(data[:-7])
    status, out = check(data_dir, capsys)
    assert status == 1
    problems = [line.strip() for line in out.splitlines() if line.startswith("  ")]
    assert any(p.startswith(f"{last.name} position ") and "cut off" in p for p in problems), out
    # The clean close said the log ended further: that is reported too.
    assert any(p.startswith("clean-shutdown") for p in problems), out


def test_a_corrupted_index_entry_is_reported(data_dir, capsys):
    index = segments(data_dir / f"{TOPIC}-0", ".index")[0]
    entries = bytearray(index.read_bytes())
    assert len(entries) >= 16, "the fixture should index several batches per segment"
    relative, position = struct.unpack_from("<II", entries, 8)
    struct.pack_into("<II", entries, 8, relative, position + 1)
    index.write_bytes(bytes(entries))
    status, out = check(data_dir, capsys)
    assert status == 1
    expected = (f"  {index.name} position 8, offset {relative}: entry 1 points at position {position + 1} "
                f"of the .log, where no batch starts")
    assert expected in out.splitlines(), out


def test_time_index_and_segment_gaps_are_reported(data_dir, capsys):
    partition = data_dir / f"{TOPIC}-1"
    time_index = segments(partition, ".timeindex")[0]
    entries = bytearray(time_index.read_bytes())
    timestamp, relative = struct.unpack_from("<qI", entries, 12)
    struct.pack_into("<qI", entries, 12, timestamp + 5, relative)
    time_index.write_bytes(bytes(entries))
    middle = segments(partition)[2]
    for suffix in (".log", ".index", ".timeindex"):
        middle.with_suffix(suffix).unlink()
    status, out = check(data_dir, capsys)
    assert status == 1
    assert (f"  {time_index.name} position 12, offset {relative}: entry 1 says timestamp {timestamp + 5} at "
            f"offset {relative}, the largest timestamp of the segment up to that batch is {timestamp}") in out
    assert "a gap: the previous segment ends at offset" in out


def test_a_malformed_topic_store_fails_the_check(data_dir, capsys):
    (data_dir / "topics.json").write_text("{not json")
    status, out = check(data_dir, capsys)
    assert status == 1 and "topics.json: the topic store" in out and "malformed" in out


def test_dump_log_and_check_agree_on_a_bad_batch(data_dir, capsys):
    segment = segments(data_dir / f"{TOPIC}-0")[0]
    data = bytearray(segment.read_bytes())
    data[100] ^= 0x10
    segment.write_bytes(bytes(data))
    assert main(["dump-log", str(segment)]) == 1
    assert "valid: false (" in capsys.readouterr().out


@pytest.mark.slow
def test_a_running_broker_makes_the_check_refuse(tmp_path, capsys):
    broker, _ = start_broker(tmp_path / "data", tmp_path / "broker.log")
    try:
        result = subprocess.run([sys.executable, "-m", "hpbroker.cli", "check", str(tmp_path / "data")],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2
        assert f"is in use by a running broker (process {broker.process.pid})" in result.stderr
        forced = subprocess.run([sys.executable, "-m", "hpbroker.cli", "check", "--force",
                                 str(tmp_path / "data")], capture_output=True, text=True, timeout=60)
        assert forced.returncode == 0, forced.stdout + forced.stderr
        assert "warning:" in forced.stderr and "checked 0 partitions" in forced.stdout
    finally:
        assert broker.stop() == 0
    assert main(["check", str(tmp_path / "data")]) == 0


def test_a_missing_directory_cannot_be_checked(tmp_path, capsys):
    assert main(["check", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err
