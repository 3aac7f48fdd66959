"""A real broker refuses a produce whose records are stamped too far in the future (error 19,
nothing appended), by the topic's ``message_timestamp_after_max_ms``, which a topic may change."""

from __future__ import annotations

import time

import pytest
from harness import start_broker

from hpbroker import protocol
from hpbroker.client.connection import BrokerAddress, BrokerConnection
from hpbroker.errors import InvalidTimestampError
from hpbroker.records import build_batch

HOUR_MS = 3_600_000


@pytest.fixture
def connection(tmp_path):
    process, port = start_broker(tmp_path / "data", tmp_path / "broker.log", workers=1)
    connection = BrokerConnection(BrokerAddress("127.0.0.1", port))
    try:
        yield connection
    finally:
        connection.close()
        process.stop()


def _produce(connection, topic: str, timestamp_ms: int) -> int:
    batch = build_batch([b"a", b"b"], timestamps=timestamp_ms)
    return connection.call(protocol.ProduceRequest(topic, 0, payload=batch)).base_offset


def test_a_record_stamped_hours_ahead_is_refused_with_error_19_and_nothing_is_appended(connection):
    connection.call(protocol.CreateTopicRequest("clocks", 1))
    now = time.time_ns() // 1_000_000
    assert _produce(connection, "clocks", now) == 0
    with pytest.raises(InvalidTimestampError, match="message_timestamp_after_max_ms allows 3600000"):
        _produce(connection, "clocks", now + 3 * HOUR_MS)
    assert _produce(connection, "clocks", now + 10_000) == 2, "the refused batch took no offset"


def test_a_topic_may_allow_timestamps_further_ahead(connection):
    entry = protocol.TopicConfigEntry("message_timestamp_after_max_ms", str(24 * HOUR_MS))
    connection.call(protocol.CreateTopicRequest("replays", 1, [entry]))
    assert _produce(connection, "replays", time.time_ns() // 1_000_000 + 3 * HOUR_MS) == 0
