"""``hpbroker produce``'s idempotence flags against a real broker."""

from __future__ import annotations

from test_cli_client import hpbroker
from test_producer_idempotence import create_topic, headers_of


def test_produce_is_idempotent_unless_told_not_to_be(broker, connection, topic_name):
    _process, port = broker
    create_topic(connection, topic_name)
    produced = hpbroker(port, "produce", topic_name, "--max-in-flight", "2", stdin=b"a\nb\n")
    assert produced.returncode == 0, produced.stderr
    produced = hpbroker(port, "produce", topic_name, "--no-idempotence", stdin=b"c\n")
    assert produced.returncode == 0, produced.stderr
    assert [h.idempotent for h in headers_of(connection, topic_name)] == [True, False]


def test_a_bad_max_in_flight_is_refused_by_name(broker):
    _process, port = broker
    refused = hpbroker(port, "produce", "any", "--max-in-flight", "6", stdin=b"a\n")
    assert refused.returncode != 0
    assert b"max_in_flight_requests_per_partition must be an int in [1, 5], got 6" in refused.stderr
