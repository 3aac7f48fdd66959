"""``hpbroker topics``, ``produce`` and ``consume`` as a user runs them, against a real broker."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from hpbroker.timestamps import parse_time_ms


def hpbroker(port: int, *args: str, stdin: bytes = b"", timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpbroker.cli", *args, "--bootstrap", f"127.0.0.1:{port}"],
                          input=stdin, capture_output=True, timeout=timeout_s)


def test_topics_are_created_listed_described_and_deleted(broker, topic_name):
    _process, port = broker
    created = hpbroker(port, "topics", "create", topic_name, "--partitions", "3", "--config",
                       "retention_ms=3600000")
    assert created.returncode == 0, created.stderr
    again = hpbroker(port, "topics", "create", topic_name, "--partitions", "3")
    assert again.returncode == 1 and b"TopicAlreadyExistsError" in again.stderr
    assert topic_name in hpbroker(port, "topics", "list").stdout.decode().split()
    described = hpbroker(port, "topics", "describe", topic_name).stdout.decode()
    assert "PartitionCount: 3" in described and "retention_ms=3600000" in described
    assert described.count("serving") == 3
    assert hpbroker(port, "topics", "delete", topic_name).returncode == 0
    gone = hpbroker(port, "topics", "describe", topic_name)
    assert gone.returncode == 1 and b"UnknownTopicOrPartitionError" in gone.stderr


def test_lines_produced_come_back_with_their_keys_in_order(broker, topic_name):
    _process, port = broker
    assert hpbroker(port, "topics", "create", topic_name, "--partitions", "2").returncode == 0
    lines = [f"user{i % 3}:GET /page/{i} 200" for i in range(50)] + ["no separator here", ""]
    produced = hpbroker(port, "produce", topic_name, "--key-separator", ":", "--compression", "lz4",
                        "--header", "source=cli", stdin="\n".join(lines).encode() + b"\n")
    assert produced.returncode == 0, produced.stderr
    assert b"produced 52 records" in produced.stderr
    consumed = hpbroker(port, "consume", topic_name, "--from-beginning", "--max-records", "52",
                        "--format", "json")
    assert consumed.returncode == 0, consumed.stderr
    records = [json.loads(line) for line in consumed.stdout.decode().splitlines()]
    assert len(records) == 52
    by_partition = {}
    for record in records:
        by_partition.setdefault(record["partition"], []).append(record)
    for partition_records in by_partition.values():
        assert [r["offset"] for r in partition_records] == list(range(len(partition_records)))
    pairs = sorted((r["key"] or "", r["value"]) for r in records)
    expected = sorted([(f"user{i % 3}", f"GET /page/{i} 200") for i in range(50)]
                      + [("", "no separator here"), ("", "")])
    assert sum(r["key"] is None for r in records) == 2
    assert pairs == expected
    keyed_partitions = {}
    for record in records:
        if record["key"] is not None:
            keyed_partitions.setdefault(record["key"], set()).add(record["partition"])
    assert all(len(partitions) == 1 for partitions in keyed_partitions.values()), "a key, one partition"
    assert all(r["headers"] == {"source": "cli"} for r in records)


def test_consume_from_an_offset_or_a_time_in_text(broker, topic_name):
    _process, port = broker
    assert hpbroker(port, "topics", "create", topic_name, "--partitions", "1").returncode == 0
    assert hpbroker(port, "produce", topic_name, stdin=b"first\nsecond\n").returncode == 0
    time.sleep(0.05)
    middle_ms = int(time.time() * 1000)
    time.sleep(0.05)
    assert hpbroker(port, "produce", topic_name, stdin=b"third\n").returncode == 0
    from_offset = hpbroker(port, "consume", topic_name, "--offset", "1", "--max-records", "2")
    assert [line.split()[-1] for line in from_offset.stdout.decode().splitlines()] == ["second", "third"]
    assert from_offset.stdout.decode().startswith("0 1 ")
    from_time = hpbroker(port, "consume", topic_name, "--from-time", str(middle_ms), "--max-records", "1")
    assert from_time.stdout.decode().split()[-1] == "third"
    idle = hpbroker(port, "consume", topic_name, "--from-beginning", "--timeout-ms", "300",
                    "--format", "value")
    assert idle.returncode == 0 and idle.stdout == b"first\nsecond\nthird\n"
    via_frontend = hpbroker(port, "consume", topic_name, "--from-beginning", "--timeout-ms", "300",
                            "--format", "value", "--fetch-via", "frontend")
    assert via_frontend.returncode == 0 and via_frontend.stdout == b"first\nsecond\nthird\n"


def test_an_unknown_topic_is_a_clear_error(broker):
    _process, port = broker
    for args in (("produce", "no-such-topic"), ("consume", "no-such-topic", "--max-records", "1")):
        result = hpbroker(port, *args, stdin=b"x\n")
        assert result.returncode == 1 and b"UnknownTopicOrPartitionError" in result.stderr, result.stderr


@pytest.mark.parametrize(("text", "ms"), [("1700000000000", 1_700_000_000_000),
                                          ("2023-11-14T22:13:20", 1_700_000_000_000),
                                          ("2023-11-14T23:13:20+01:00", 1_700_000_000_000)])
def test_start_times_parse_as_ms_or_iso_8601(text, ms):
    assert parse_time_ms(text) == ms


def test_a_bad_start_time_is_refused_by_name():
    with pytest.raises(ValueError, match="--from-time 'yesterday'"):
        parse_time_ms("yesterday", "--from-time")


def test_an_offset_outside_the_log_is_an_error_naming_its_bounds(broker, topic_name):
    _process, port = broker
    assert hpbroker(port, "topics", "create", topic_name, "--partitions", "1").returncode == 0
    assert hpbroker(port, "produce", topic_name, stdin=b"a\nb\n").returncode == 0
    result = hpbroker(port, "consume", topic_name, "--offset", "5", "--max-records", "1")
    assert result.returncode == 1 and b"OffsetOutOfRangeError" in result.stderr, result.stderr


def test_a_closed_pipe_ends_consume_quietly(broker, topic_name):
    _process, port = broker
    assert hpbroker(port, "topics", "create", topic_name, "--partitions", "1").returncode == 0
    assert hpbroker(port, "produce", topic_name, stdin=b"x\n" * 20000).returncode == 0
    pipeline = subprocess.run(["bash", "-o", "pipefail", "-c",
                               f"{sys.executable} -m hpbroker.cli consume {topic_name} --from-beginning "
                               f"--max-records 20000 --bootstrap 127.0.0.1:{port} | head -1"],
                              capture_output=True, timeout=60)
    assert pipeline.stdout.count(b"\n") == 1
    # Killed by SIGPIPE, as `yes | head -1` ends: status 141 under pipefail, and nothing on stderr.
    assert pipeline.returncode == 128 + signal.SIGPIPE and pipeline.stderr == b"", pipeline.stderr


def test_an_unusable_bootstrap_address_is_one_clear_line(broker):
    result = subprocess.run([sys.executable, "-m", "hpbroker.cli", "topics", "list", "--bootstrap",
                             "bad host:9092"], capture_output=True, timeout=60)
    assert result.returncode == 1 and result.stderr.count(b"\n") == 1, result.stderr


@pytest.mark.parametrize("text", ["--5", "²", "1e3", ""])
def test_text_that_only_looks_like_a_number_is_refused_by_name(text):
    with pytest.raises(ValueError, match="--to-time"):
        parse_time_ms(text, "--to-time")


def test_a_time_between_two_milliseconds_falls_in_the_earlier():
    assert parse_time_ms("2023-11-14T22:13:20.0009") == 1_700_000_000_000
