"""The broker's log lines: one per event, time, level, pid, logger and a merged context prefix;
``--log-format json`` makes each one a JSON object."""

from __future__ import annotations

import json
import logging
import re
import sys

import pytest
from harness import BROKER_TEST_ENV, BrokerProcess, Client, free_ports

from hpbroker import __version__, protocol
from hpbroker.broker.logging_setup import JsonFormatter, TextFormatter, setup_logging, split_context
from hpbroker.records import build_batch


@pytest.mark.parametrize(
    ("message", "context", "rest"),
    [
        ("[arbiter] all 2 workers serving", "arbiter", "all 2 workers serving"),
        ("[worker=2] [orders-3] opened the log", "orders-3 worker=2", "opened the log"),
        ("[worker=0] ready: 3 partitions", "worker=0", "ready: 3 partitions"),
        ("no context here [really]", "", "no context here [really]"),
        ("[zookeeper]registered", "zookeeper", "registered"),
    ],
)
def test_leading_groups_merge_into_one_context_with_the_process_last(message, context, rest):
    assert split_context(message) == (context, rest)


def _record(message: str, *args, exc_info=None) -> logging.LogRecord:
    record = logging.LogRecord("hpbroker.io.log", logging.WARNING, __file__, 1, message, args, exc_info)
    record.created, record.msecs = 1_700_000_000.0, 123.0
    return record


def test_text_lines_carry_time_level_pid_logger_and_context():
    line = TextFormatter().format(_record("[worker=1] [orders-3] cut %d bytes", 40))
    expected = r"2023-11-14T22:13:20\.123Z WARNING \d+ io\.log: \[orders-3 worker=1\] cut 40 bytes"
    assert re.fullmatch(expected, line), line


def test_json_lines_are_one_object_each_with_the_traceback_inside():
    try:
        raise ValueError("boom")
    except ValueError:
        record = _record("[arbiter] failed: %s", "x", exc_info=sys.exc_info())
    line = JsonFormatter().format(record)
    assert "\n" not in line
    event = json.loads(line)
    assert event["time"] == "2023-11-14T22:13:20.123Z" and event["level"] == "WARNING"
    assert event["logger"] == "hpbroker.io.log"
    assert (event["context"], event["message"]) == ("arbiter", "failed: x")
    assert "ValueError: boom" in event["exception"]


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="choose one of text, json"):
        setup_logging("INFO", "xml")


@pytest.mark.slow
def test_a_broker_logs_json_objects_with_partition_and_worker_context(tmp_path):
    port = free_ports(3)
    argv = [sys.executable, "-m", "hpbroker.cli", "serve", "--port", str(port), "--fetch-port", str(port + 1),
            "--workers", "2", "--data-dir", str(tmp_path / "data"), "--log-format", "json"]
    broker = BrokerProcess(argv, tmp_path / "broker.log", BROKER_TEST_ENV)
    client = Client(port)
    try:
        broker.wait_for_log("all 2 workers serving", timeout_s=20)
        header, _ = client.request(protocol.CreateTopicRequest("events", 2), timeout_s=20)
        assert header.error_code == 0
        header, _ = client.request(protocol.ProduceRequest("events", 1, payload=build_batch([b"v"])))
        assert header.error_code == 0
    finally:
        client.close()
        assert broker.stop() == 0, broker.log()
    # stdout and stderr together, as a service manager's journal has them: JSON objects only.
    events = [json.loads(line) for line in broker.log().splitlines()]
    assert events[0]["logger"] == "hpbroker.cli.server" and events[0]["message"].startswith(
        f"hpbroker {__version__}: broker 0 on tcp://127.0.0.1:{port} (ZeroMQ)")
    assert all(set(e) >= {"time", "level", "pid", "logger", "context", "message"} for e in events)
    contexts = {e["context"] for e in events}
    assert "arbiter" in contexts and {"worker=0", "worker=1"} <= contexts
    opened = [e for e in events if e["logger"] == "hpbroker.io.log" and e["message"].startswith("opened")]
    assert {e["context"] for e in opened} == {f"events-{p} worker={s}" for p, s in _owners("events", 2, 2)}


def _owners(topic: str, partitions: int, slots: int):
    from hpbroker.workers.ownership import owner_slot

    return [(p, owner_slot(topic, p, slots)) for p in range(partitions)]
