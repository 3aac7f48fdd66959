"""``hpbroker check DATA_DIR``: a clean data directory passes; damage in a segment, a torn tail,
a wrong index entry, a gap between segments are each reported with file, position and offset,
once; what a crash leaves and the next open repairs is a note."""

from __future__ import annotations

import os
import re
import shutil
import signal
import struct
import subprocess
import sys

import pytest
from harness import BROKER_TEST_ENV, BrokerProcess, Client, free_ports, pid_alive, start_broker, wait_until

from hpbroker import protocol
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


# --- what a crash leaves is not damage ---------------------------------------------------------------


def _crash(data_dir, partition_dirs):
    """The state a crash leaves: no clean-shutdown marker (the checkpoint as the last flush left it)."""
    for directory in partition_dirs:
        (directory / "clean-shutdown").unlink()


def test_a_torn_tail_after_a_crash_is_a_note_saying_what_the_next_open_truncates(data_dir, capsys):
    first, second = data_dir / f"{TOPIC}-0", data_dir / f"{TOPIC}-1"
    _crash(data_dir, [first, second])
    checkpoint = int((first / "recovery-point-offset-checkpoint").read_text().split()[1])
    (first / "recovery-point-offset-checkpoint").write_text(f"0\n{checkpoint - RECORDS}\n")
    last = segments(first)[-1]
    size = last.stat().st_size
    half = build_batch([b"never acknowledged"] * 3, producer="check-test")
    last.write_bytes(last.read_bytes() + half[: len(half) // 2])  # half a batch
    index = last.with_suffix(".index")
    entries = index.read_bytes()
    index.write_bytes(entries + struct.pack("<II", 10_000, size) + b"\x01\x02")  # an entry past the end, torn
    zeros = segments(second)[-1]
    zeros_size = zeros.stat().st_size
    zeros.write_bytes(zeros.read_bytes() + bytes(4096))  # a zero-filled tail
    status, out = check(data_dir, capsys)
    assert status == 0, out
    assert f"{TOPIC}-0: OK (" in out and f"offsets 0..{BATCHES * RECORDS - 1}" in out
    status, out = check(data_dir, capsys, "-v")
    assert status == 0, out
    assert (f"note: {last.name}: a torn tail (not closed cleanly): the next open truncates {len(half) // 2} "
            f"bytes at position {size}, offset {BATCHES * RECORDS} on (") in out
    assert f"note: {zeros.name}: a torn tail (not closed cleanly): the next open truncates 4096 bytes at " \
           f"position {zeros_size}, offset {BATCHES * RECORDS} on (" in out
    assert f"note: {index.name} and .timeindex: 1 entries past the valid end" in out

    # The next open cuts exactly that; what is left passes as closed cleanly.
    for partition in range(PARTITIONS):
        PartitionLog(data_dir / f"{TOPIC}-{partition}", LogConfig(segment_bytes=2048)).close()
    assert last.stat().st_size == size and zeros.stat().st_size == zeros_size
    status, out = check(data_dir, capsys, "-v")
    assert status == 0 and "torn tail" not in out, out


def test_a_torn_tail_is_a_problem_after_a_clean_shutdown_or_below_the_recovery_point(data_dir, capsys):
    first, second = data_dir / f"{TOPIC}-0", data_dir / f"{TOPIC}-1"
    _crash(data_dir, [second])  # the first partition was closed cleanly
    for directory in (first, second):
        last = segments(directory)[-1]
        last.write_bytes(last.read_bytes()[:-7])  # the last batch cut short: records that were on disk
    status, out = check(data_dir, capsys, "-v")
    assert status == 1 and "torn tail" not in out
    first_report, second_report = out.split(f"{TOPIC}-1: ")
    for report in (first_report, second_report):
        assert "is cut off after" in report
        assert "recovery-point-offset-checkpoint offset 300: the recovery point is past the log end" in report
    assert "clean-shutdown offset 300: says the log was closed at offset 300" in first_report


def test_a_clean_shutdown_marker_cut_short_while_closing_is_a_note(data_dir, capsys):
    (data_dir / f"{TOPIC}-0" / "clean-shutdown").write_bytes(b"")
    (data_dir / f"{TOPIC}-1" / "clean-shutdown").write_bytes(b"0\n29")
    status, out = check(data_dir, capsys, "-v")
    assert status == 0, out
    assert out.count("note: not closed cleanly (the clean-shutdown marker was cut short while closing") == 2
    (data_dir / f"{TOPIC}-1" / "clean-shutdown").write_bytes(b"garbage\n")
    status, out = check(data_dir, capsys)
    assert status == 1 and "clean-shutdown position 0: malformed: b'garbage\\n'" in out


def test_a_crashed_broker_leaves_nothing_the_check_calls_a_problem(tmp_path):
    port = free_ports(3)
    argv = [sys.executable, "-m", "hpbroker.cli", "serve", "--port", str(port), "--fetch-port", str(port + 1),
            "--workers", "2", "--data-dir", str(tmp_path / "data"), "--host", "127.0.0.1"]
    broker = BrokerProcess(argv, tmp_path / "broker.log", BROKER_TEST_ENV)
    client = Client(port)
    try:
        broker.wait_for_log(r"all 2 workers serving", timeout_s=20)
        assert client.request(protocol.CreateTopicRequest(TOPIC, 2))[0].error_code == 0
        for partition in range(2):
            batch = build_batch([b"acknowledged"] * 3, producer="check-test")
            header, _ = client.request(protocol.ProduceRequest(TOPIC, partition, payload=batch))
            assert header.error_code == 0
        pids = [broker.process.pid, *broker.worker_pids().values()]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    finally:
        client.close()
        broker.process.wait(timeout=10)
        broker.stop()
    wait_until(lambda: not any(pid_alive(pid) for pid in pids), 10, what="the killed broker to be gone")
    # A write torn by the crash: half of a batch that was never acknowledged.
    last = segments(tmp_path / "data" / f"{TOPIC}-1")[-1]
    last.write_bytes(last.read_bytes() + build_batch([b"in flight"])[:30])
    result = subprocess.run([sys.executable, "-m", "hpbroker.cli", "check", "-v", str(tmp_path / "data")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "a torn tail (not closed cleanly): the next open truncates 30 bytes" in result.stdout
    assert "2 OK, 0 with 0 problems" in result.stdout


# --- problems reported once, and where they are ----------------------------------------------------------


def test_a_wrong_base_offset_is_one_problem_and_the_batches_after_it_are_checked_from_where_it_should_be(
        data_dir, capsys):
    segment = segments(data_dir / f"{TOPIC}-0")[1]
    base = int(segment.stem)
    data = bytearray(segment.read_bytes())
    second = struct.unpack_from("<q", data, 0)[0]
    second_position = 12 + struct.unpack_from("<i", data, 8)[0]
    struct.pack_into("<q", data, second_position, second + 1000)  # outside the CRC
    segment.write_bytes(bytes(data))
    status, out = check(data_dir, capsys)
    assert status == 1
    problems = [line.strip() for line in out.splitlines() if line.startswith("  ")]
    assert len(problems) == 1, out
    assert problems[0].startswith(f"{segment.name} position {second_position}, offset {base + RECORDS}: ")
    assert main(["dump-log", str(segment)]) == 1
    assert capsys.readouterr().out.count("valid: false") == 1


def test_the_timestamp_of_a_batch_that_fails_its_crc_is_not_held_against_the_time_index(data_dir, capsys):
    segment = segments(data_dir / f"{TOPIC}-1")[0]
    data = bytearray(segment.read_bytes())
    struct.pack_into("<q", data, 40, 1_900_000_000_000)  # the first batch's max_timestamp, far ahead
    segment.write_bytes(bytes(data))
    status, out = check(data_dir, capsys)
    assert status == 1
    problems = [line.strip() for line in out.splitlines() if line.startswith("  ")]
    assert len(problems) == 1 and problems[0].startswith(f"{segment.name} position 0, offset 0: "), out


def test_a_partition_directory_missing_is_a_problem(data_dir, capsys):
    shutil.rmtree(data_dir / f"{TOPIC}-1")
    status, out = check(data_dir, capsys)
    assert status == 1
    assert f"{TOPIC}-1: 1 PROBLEMS\n  {TOPIC}-1/: missing: topics.json lists the partition" in out
    assert out.splitlines()[-1].startswith(f"checked {PARTITIONS} partitions of 1 topics")


def test_a_check_that_cannot_read_what_it_must_stops_with_status_2(data_dir):
    def run():
        return subprocess.run([sys.executable, "-m", "hpbroker.cli", "check", str(data_dir)],
                              capture_output=True, text=True, timeout=60)

    segment = segments(data_dir / f"{TOPIC}-1")[0]
    segment.unlink()
    segment.mkdir()  # cannot be read as a file, not even by root
    result = run()
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"hpbroker check: cannot check {data_dir}: {segment}: Is a directory" in result.stderr
    segment.rmdir()
    (data_dir / "topics.json").unlink()
    (data_dir / "topics.json").mkdir()
    result = run()
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "topics.json: Is a directory" in result.stderr
    if os.geteuid() != 0:
        (data_dir / "topics.json").rmdir()
        (data_dir / f"{TOPIC}-0").chmod(0)
        try:
            result = run()
        finally:
            (data_dir / f"{TOPIC}-0").chmod(0o755)
        assert result.returncode == 2 and "Permission denied" in result.stderr, result.stderr
