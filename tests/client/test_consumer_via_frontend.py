"""The consumer with ``fetch_via="frontend"``: fetches and ListOffsets through the broker's ZeroMQ
front-end instead of its data ports, against a real broker without security (the secured broker:
tests/security/test_fetch_via_frontend.py).  It reads exactly what the data ports give, a long
poll parked on one partition holds back no other, and errors are those of the data ports."""

from __future__ import annotations

import time

import pytest
from harness import create_topic_on, numbered_values, poll_records, produce_values, start_broker, wait_until

from hpbroker import Consumer, TopicPartition
from hpbroker.client.connection import BrokerAddress, BrokerConnection
from hpbroker.client.fetcher import FetchConfig
from hpbroker.client.frontend_fetcher import FrontendConnections, FrontendFetcher
from hpbroker.errors import InvalidConfigError, OffsetOutOfRangeError, UnknownTopicOrPartitionError
from hpbroker.records import CODEC_LZ4

VIA = {"fetch_via": "frontend", "fetch_max_wait_ms": 200}










def receive(fetcher: FrontendFetcher, timeout_s: float = 10.0):
    """The answer to ``fetcher``'s request in flight."""
    deadline = time.monotonic() + timeout_s
    while (answer := fetcher.receive()) is None:
        assert time.monotonic() < deadline, f"no answer to {fetcher.waiting_for()}"
        time.sleep(0.01)
    return answer


def test_reads_exactly_what_the_data_ports_read(connection, bootstrap, topic_name):
    create_topic_on(connection, topic_name, 3)
    for round_ in range(4):
        for p in range(3):
            produce_values(connection, topic_name, p, numbered_values(f"p{p}-", 50, round_ * 50),
                    compression=CODEC_LZ4 if round_ % 2 else 0)
    tps = [TopicPartition(topic_name, p) for p in range(3)]
    read = {}
    for via in ("data_port", "frontend"):
        with Consumer(bootstrap, auto_offset_reset="earliest", fetch_via=via, max_partition_fetch_bytes=1024,
                      fetch_max_wait_ms=200) as consumer:
            consumer.assign(tps)
            records = poll_records(consumer, 600)
            assert consumer.poll(timeout_ms=300) == {}  # nothing more, nothing twice
            if via == "frontend":
                assert len(consumer._frontends) == 1  # the partitions of one broker share a connection
        read[via] = sorted((r.partition, r.offset, r.value) for r in records)
    assert read["frontend"] == read["data_port"]
    for p in range(3):
        assert [v for q, _, v in read["frontend"] if q == p] == numbered_values(f"p{p}-", 200)


def test_columns_and_iteration_through_the_frontend(connection, bootstrap, topic_name):
    create_topic_on(connection, topic_name, 1)
    produce_values(connection, topic_name, 0, numbered_values("v", 300))
    tp = TopicPartition(topic_name, 0)
    with Consumer(bootstrap, auto_offset_reset="earliest", columns=("value",), **VIA) as consumer:
        consumer.assign([tp])
        got: list = []
        deadline = time.monotonic() + 15
        while len(got) < 300 and time.monotonic() < deadline:
            for columns in consumer.poll(timeout_ms=500).values():
                got += [columns.values[i] for i in range(len(columns))]
        assert got == numbered_values("v", 300)
    with Consumer(bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=1000, **VIA) as consumer:
        consumer.assign([tp])
        assert [r.offset for r in consumer] == list(range(300))


def test_a_long_poll_on_one_partition_does_not_delay_another(connection, bootstrap, topic_name):
    create_topic_on(connection, topic_name, 2)
    idle, busy = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)
    long_poll_ms = 20_000
    with Consumer(bootstrap, auto_offset_reset="latest", fetch_via="frontend",
                  fetch_max_wait_ms=long_poll_ms) as consumer:
        consumer.assign([idle, busy])
        assert consumer.position(idle) == consumer.position(busy) == 0
        assert consumer.poll(timeout_ms=300) == {}  # both fetches now parked in the broker
        states = consumer._states
        assert wait_until(lambda: all(s.fetcher is not None and s.fetcher.in_flight for s in states.values()),
                          timeout_s=10)
        for round_ in range(3):
            produce_values(connection, topic_name, 1, numbered_values(f"r{round_}-", 5))
            started = time.monotonic()
            polled = consumer.poll(timeout_ms=long_poll_ms)
            elapsed = time.monotonic() - started
            assert list(polled) == [busy]
            assert [r.value for r in polled[busy]] == numbered_values(f"r{round_}-", 5)
            assert elapsed < long_poll_ms / 1000 / 4, f"partition 1 waited {elapsed:.1f} s behind partition 0"
        produce_values(connection, topic_name, 0, [b"at last"])
        assert [r.value for r in consumer.poll(timeout_ms=long_poll_ms)[idle]] == [b"at last"]


def test_offsets_are_listed_through_the_frontend(connection, bootstrap, topic_name):
    create_topic_on(connection, topic_name, 2)
    before_ms = int(time.time() * 1000)
    produce_values(connection, topic_name, 0, numbered_values("a", 7))
    produce_values(connection, topic_name, 1, numbered_values("b", 3))
    tps = [TopicPartition(topic_name, p) for p in range(2)]
    with Consumer(bootstrap, **VIA) as consumer:
        assert consumer.beginning_offsets(tps) == {tps[0]: 0, tps[1]: 0}
        assert consumer.end_offsets(tps) == {tps[0]: 7, tps[1]: 3}
        assert consumer.offsets_for_times({tps[0]: before_ms, tps[1]: int(time.time() * 1000) + 60_000}) == \
            {tps[0]: 0, tps[1]: None}
        consumer.assign(tps)
        consumer.seek_to_end()
        assert consumer.position(tps[0]) == 7
        assert len(consumer._frontends) == 0  # the lookups' connections went with their fetchers
        produce_values(connection, topic_name, 0, [b"new"])
        assert [r.value for r in poll_records(consumer, 1)] == [b"new"]


def test_errors_are_those_of_the_data_ports(connection, bootstrap, topic_name):
    create_topic_on(connection, topic_name, 1)
    produce_values(connection, topic_name, 0, numbered_values("x", 10))
    tp = TopicPartition(topic_name, 0)
    with Consumer(bootstrap, **VIA) as consumer:  # a partition the topic does not have
        consumer.assign([TopicPartition(topic_name, 5)])
        with pytest.raises(UnknownTopicOrPartitionError, match="no partition 5"):
            poll_records(consumer, 1, timeout_s=10)
    with Consumer(bootstrap, auto_offset_reset="earliest", **VIA) as consumer:  # out of range: reset
        consumer.assign([tp])
        consumer.seek(tp, 1000)
        assert [r.value for r in poll_records(consumer, 10)] == numbered_values("x", 10)
    with Consumer(bootstrap, auto_offset_reset="error", **VIA) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 1000)
        with pytest.raises(OffsetOutOfRangeError) as raised:
            poll_records(consumer, 1, timeout_s=10)
        assert (raised.value.log_start_offset, raised.value.log_end_offset) == (0, 10)


def test_the_frontend_answers_unknown_partitions_and_out_of_range_offsets(broker, connection, topic_name):
    """One level down: the relayed fetch's own errors (6 and 5, with the log's bounds), in version 0."""
    create_topic_on(connection, topic_name, 1)
    produce_values(connection, topic_name, 0, numbered_values("y", 4))
    connections = FrontendConnections(client_id="via-frontend-test")
    address = BrokerAddress("127.0.0.1", broker[1])
    try:
        answers = {}
        for name, partition, offset in (("unknown", 3, 0), ("out of range", 0, 99), ("ok", 0, 2)):
            fetcher = FrontendFetcher(topic_name, partition, connections, address,
                                      FetchConfig(fetch_max_wait_ms=0))
            fetcher.fetch(offset)
            answers[name] = receive(fetcher)
            fetcher.close()
        assert isinstance(answers["unknown"].error, UnknownTopicOrPartitionError)
        error = answers["out of range"].error
        assert isinstance(error, OffsetOutOfRangeError)
        assert (error.log_start_offset, error.log_end_offset) == (0, 4)
        assert [r.value for r in answers["ok"].records] == [b"y2", b"y3"] and answers["ok"].error is None
        assert len(connections) == 0  # the last fetcher closed the shared connection
    finally:
        connections.close()


def test_an_unknown_fetch_via_is_refused_by_name(bootstrap):
    with pytest.raises(InvalidConfigError, match="fetch_via"):
        Consumer(bootstrap, fetch_via="zmq")


def test_a_broker_restart_costs_a_refetch_not_the_request_timeout(tmp_path):
    """A fetch parked in a broker that restarts is never answered; the connection's monitor sees
    the disconnect and the fetch is sent again at once, long before it would be overdue."""
    broker, port = start_broker(tmp_path / "data", tmp_path / "broker.log", workers=1)
    try:
        connection = BrokerConnection(BrokerAddress("127.0.0.1", port))
        create_topic_on(connection, "restarted", 1)
        produce_values(connection, "restarted", 0, numbered_values("before", 3))
        connection.close()
        tp = TopicPartition("restarted", 0)
        long_poll_ms = 20_000
        with Consumer(f"127.0.0.1:{port}", auto_offset_reset="earliest", fetch_via="frontend",
                      fetch_max_wait_ms=long_poll_ms, request_timeout_ms=30_000) as consumer:
            consumer.assign([tp])
            assert [r.value for r in poll_records(consumer, 3)] == numbered_values("before", 3)
            assert consumer.poll(timeout_ms=300) == {}  # the next fetch parked in the broker
            assert broker.stop() == 0, broker.log()
            broker, port = start_broker(tmp_path / "data", tmp_path / "broker.log", workers=1, port=port)
            started = time.monotonic()
            connection = BrokerConnection(BrokerAddress("127.0.0.1", port))
            produce_values(connection, "restarted", 0, numbered_values("after", 2))
            connection.close()
            after = poll_records(consumer, 2, timeout_s=long_poll_ms / 1000)
            assert [r.value for r in after] == numbered_values("after", 2)
            assert time.monotonic() - started < long_poll_ms / 1000 / 2
    finally:
        broker.stop()
