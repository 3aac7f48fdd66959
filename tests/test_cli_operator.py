"""The ``hpbroker`` command as an operator meets it, run as a real subprocess (against a real
broker where one is needed): records printed one per line whatever their bytes, errors named in
words, a bad flag answered with the subcommand's usage, and a closed pipe ending a command quietly."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from harness import start_broker

from hpbroker import protocol
from hpbroker.client.connection import BrokerAddress, BrokerConnection
from hpbroker.records import build_batch, stamp_batch

SIGPIPE_STATUS = 128 + signal.SIGPIPE  # what a shell reports for a command killed by SIGPIPE


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    root = tmp_path_factory.mktemp("broker")
    process, port = start_broker(root / "data", root / "broker.log")
    try:
        yield port
    finally:
        assert process.stop() == 0, process.log()


def hpbroker(*args: str, stdin: bytes = b"", timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpbroker.cli", *args], input=stdin, capture_output=True,
                          timeout=timeout_s)


def pipeline(command: str) -> subprocess.CompletedProcess:
    """``command`` in bash with pipefail: the status is the last failing command's."""
    return subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, timeout=120)


AWKWARD = [  # (key, value) pairs whose bytes would break a line-per-record listing
    (b"k1", b"first line\nsecond line"),
    (None, b"\x00\x1b[31mred\x7f"),
    (b"tab\tkey", b"carriage\r\nreturn and back\\slash"),
    (b"\xff", "caf\u00e9 \u65e5\u672c \u2028".encode() + b"\xf0\x9f"),
]


@pytest.fixture(scope="module")
def awkward_topic(broker):
    connection = BrokerConnection(BrokerAddress("127.0.0.1", broker))
    try:
        connection.call(protocol.CreateTopicRequest("awkward", 1))
        batch = build_batch([value for _key, value in AWKWARD], keys=[key for key, _value in AWKWARD])
        connection.call(protocol.ProduceRequest("awkward", 0, payload=batch))
    finally:
        connection.close()
    return "awkward"


def consume(broker: int, topic: str, fmt: str) -> subprocess.CompletedProcess:
    result = hpbroker("consume", topic, "--from-beginning", "--max-records", str(len(AWKWARD)),
                      "--format", fmt, "--bootstrap", f"127.0.0.1:{broker}")
    assert result.returncode == 0, result.stderr
    return result


def test_text_format_prints_one_line_per_record_with_its_bytes_escaped(broker, awkward_topic):
    lines = consume(broker, awkward_topic, "text").stdout.decode("utf-8").split("\n")
    assert lines[-1] == "" and len(lines) == len(AWKWARD) + 1
    tails = [line.split(" ", 3)[3] for line in lines[:-1]]  # after partition, offset and time
    assert tails == [
        r"key=k1 first line\nsecond line",
        r"\x00\x1b[31mred\x7f",
        r"key=tab\tkey carriage\r\nreturn and back\\slash",
        "key=\\xff caf\u00e9 \u65e5\u672c \\u2028\\xf0\\x9f",
    ]
    assert all(line.isprintable() for line in lines)


def test_raw_format_keeps_the_bytes_as_they_are(broker, awkward_topic):
    out = consume(broker, awkward_topic, "raw").stdout
    for offset, (key, value) in enumerate(AWKWARD):
        prefix = f"0 {offset} ".encode()
        start = out.index(b"\n" + prefix) + 1 if offset else 0
        assert out.startswith(prefix, start)
        line_tail = (b"" if key is None else b" key=" + key) + b" " + value + b"\n"
        assert line_tail in out[start:]
    assert out.endswith(AWKWARD[-1][1] + b"\n")


@pytest.mark.parametrize("args", [("consume", "no-such-topic", "--max-records", "1"),
                                  ("produce", "no-such-topic"),
                                  ("topics", "describe", "no-such-topic")])
def test_an_error_is_named_in_words_not_by_its_number(broker, args):
    result = hpbroker(*args, "--bootstrap", f"127.0.0.1:{broker}", stdin=b"x\n")
    assert result.returncode == 1, result.stderr
    message = result.stderr.decode()
    assert message.count("\n") == 1, message
    assert message.startswith(f"hpbroker {args[0]}: unknown topic or partition: topic 'no-such-topic' "
                              "does not exist"), message
    assert message.endswith(" (UnknownTopicOrPartitionError, error 6)\n"), message
    assert "says error" not in message


@pytest.mark.parametrize(("args", "usage"), [
    (("consume", "orders", "--bogus"), "usage: hpbroker consume "),
    (("topics", "create", "orders", "--partitions", "1", "--no-such-flag", "x"),
     "usage: hpbroker topics create "),
    (("groups", "list", "--bogus"), "usage: hpbroker groups list "),
    (("dump-log", "x.log", "--bogus"), "usage: hpbroker dump-log "),
])
def test_a_bad_flag_shows_the_usage_of_its_subcommand(args, usage):
    result = hpbroker(*args)
    message = result.stderr.decode()
    assert result.returncode == 2, message
    assert message.startswith(usage), message
    assert "unrecognized arguments: " in message and args[-1] in message
    assert "{version,up,serve" not in message  # not the top-level usage


def test_dump_log_into_a_closed_pipe_ends_quietly(tmp_path):
    data, offset = bytearray(), 0
    for i in range(2000):  # far more than a pipe holds
        batch = bytearray(build_batch([f"value-{i}-{j}".encode() for j in range(4)], producer="cli-test"))
        stamp_batch(batch, 0, offset)
        offset += 4
        data += batch
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(bytes(data))
    result = pipeline(f"{sys.executable} -m hpbroker.cli dump-log {segment} --records | head -3")
    assert result.stdout.count(b"\n") == 3
    assert result.stderr == b"", result.stderr.decode()
    assert result.returncode == SIGPIPE_STATUS  # as `yes | head` ends
