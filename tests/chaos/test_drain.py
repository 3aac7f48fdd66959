"""The final drain against a real broker: it reads every partition from its log start to its end
offset and says which partitions it read completely; one whose end offset was not known before
its records arrived is still complete once known (no spin until the deadline); one that never
answers is reported incomplete, never silently short."""

from __future__ import annotations

import time

import pytest
from group_harness import create_topic, produce
from harness import start_broker

from chaos.history import read_histories
from chaos.workload import drain
from hpbroker.client import Consumer

TOPIC = "drained"
TOPICS = {TOPIC: {"acks": "all", "partitions": 2}}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    directory = tmp_path_factory.mktemp("drain")
    process, port = start_broker(directory / "data", directory / "broker.log")
    try:
        create_topic(port, TOPIC, 2)
        produce(f"127.0.0.1:{port}", TOPIC, 2, 20)
        yield f"127.0.0.1:{port}"
    finally:
        process.stop()


def test_every_partition_is_read_to_its_end_and_said_complete(broker, tmp_path):
    result = drain(broker, TOPICS, tmp_path, timeout_s=60)
    assert result.complete_partitions() == {TOPIC: [0, 1]} and result.incomplete() == []
    assert dict(result) == {f"{TOPIC}-0": 20, f"{TOPIC}-1": 20}
    assert {tp.partition: end for tp, end in result.ends.items()} == {0: 20, 1: 20}
    assert len(read_histories(tmp_path).topics[TOPIC].poll_offset) == 40


def test_records_read_before_the_end_offset_was_known_still_complete_the_partition(
        broker, tmp_path, monkeypatch):
    """The first ask of each end offset fails (a broker not answering yet) and the records all
    arrive meanwhile: the drain must not wait for more records that will never come."""
    real = Consumer.end_offsets
    failed = set()

    def first_ask_fails(self, partitions):
        partitions = list(partitions)
        if any(tp not in failed for tp in partitions):
            failed.update(partitions)
            time.sleep(1.0)  # the fetches deliver every record meanwhile
            raise TimeoutError("no answer yet")
        return real(self, partitions)

    monkeypatch.setattr(Consumer, "end_offsets", first_ask_fails)
    started = time.monotonic()
    result = drain(broker, TOPICS, tmp_path, timeout_s=120)
    assert result.complete_partitions() == {TOPIC: [0, 1]}, result.incomplete()
    assert time.monotonic() - started < 60  # asked again after 5 s, then done: not the whole 120 s


def test_a_partition_that_never_answers_is_reported_incomplete(broker, tmp_path):
    topics = {**TOPICS, "never-created": {"acks": "all", "partitions": 1}}
    result = drain(broker, topics, tmp_path, timeout_s=15)
    assert result.complete_partitions() == {TOPIC: [0, 1], "never-created": []}
    [line] = result.incomplete()
    assert line.startswith("never-created-0: end offset never answered")
