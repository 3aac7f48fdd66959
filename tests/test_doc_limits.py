"""The sizes and defaults the docs state in prose are the code's: FORMAT.md's smallest batch, and
the defaults PROTOCOL.md names for the limits a client meets."""

from __future__ import annotations

import re

import doc_tables

from hpbroker import records
from hpbroker.broker.config import BrokerConfig
from hpbroker.io import LogConfig


def test_format_md_states_the_size_of_the_smallest_batch():
    text = doc_tables.section("FORMAT.md", "## Batch")
    sentence = r"the smallest batch \(one empty record, no producer name\) is (\d+) bytes"
    stated = int(re.search(sentence, text)[1])
    for value in (b"", None):
        batch = records.build_batch([value])
        assert batch[22] == 0  # producer_length: no producer name
        assert len(batch) == stated


def test_protocol_md_states_the_defaults_of_the_limits_a_client_meets():
    broker, log = BrokerConfig(), LogConfig()
    heartbeat_ms, timeout_ms = broker.frontend_heartbeat_interval_ms, broker.frontend_heartbeat_timeout_ms
    text = (doc_tables.DOCS / "PROTOCOL.md").read_text()

    def stated(pattern: str) -> int:
        found = re.findall(pattern, text)
        assert found, pattern
        numbers = {int(re.sub(r"[,_]", "", number)) for number in found}
        assert len(numbers) == 1, (pattern, numbers)
        return numbers.pop()

    assert stated(r"`max_message_bytes` \(by default (\d+) bytes") == log.max_message_bytes
    assert stated(r"`max_message_bytes`, (\d+) bytes by default") == log.max_message_bytes
    assert stated(r"`fetch_max_wait_ms` \((\d+) by default\)") == broker.fetch_max_wait_ms
    assert stated(r"`fetch_max_wait_ms` \((\d+) s by default\)") * 1000 == broker.fetch_max_wait_ms
    assert stated(r"`heartbeat_interval_ms` \((\d+) by default\)") == broker.heartbeat_interval_ms
    assert stated(r"`max_connections` \(([\d,]+)\) connections per port") == broker.max_connections
    assert stated(r"`connections_max_idle_ms` \((\d+) min\)") * 60_000 == broker.connections_max_idle_ms
    assert stated(r"`frontend_max_connections` \(([\d,]+)\)") == broker.frontend_max_connections
    assert stated(r"`frontend_heartbeat_interval_ms` \((\d+) s;") * 1000 == heartbeat_ms
    assert stated(r"`frontend_heartbeat_timeout_ms` \((\d+) s\)") * 1000 == timeout_ms
    assert stated(r"`max_request_bytes` \(default (\d+) MiB\)") << 20 == broker.max_request_bytes
