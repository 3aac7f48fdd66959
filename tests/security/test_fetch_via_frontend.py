"""The encrypted fetch path: a consumer with ``fetch_via="frontend"`` against a broker with
``security = "curve"`` reads through the CurveZMQ front-end, with no fetch token, exactly what was
produced; a principal without ``consume`` is refused (error 28); and with ``data_port_auth =
"loopback"`` a consumer that cannot reach the data ports still reads through the front-end."""

from __future__ import annotations

import itertools
import time

import pytest
from harness import poll_records, start_broker

from hpbroker import protocol
from hpbroker.client.admin import Admin
from hpbroker.client.connection import BrokerAddress
from hpbroker.client.consumer import Consumer, TopicPartition
from hpbroker.client.fetcher import FetchConfig
from hpbroker.client.frontend_fetcher import FrontendConnections, FrontendFetcher
from hpbroker.client.producer import Producer
from hpbroker.errors import AuthorizationError, BrokerNotAvailableError
from hpbroker.security.client import ClientSecurity
from hpbroker.security.keys import allow_key, generate_key_pair

_topics = itertools.count()


def make_keys(root):
    keydir, allowlist = root / "keys", root / "allow"
    for name in ("broker", "alice", "bob"):
        generate_key_pair(keydir, name)
        allow_key(keydir / f"{name}.key", allowlist)
    env = {"HPBROKER_SECURITY": "curve", "HPBROKER_SERVER_KEY_FILE": str(keydir / "broker.key_secret"),
           "HPBROKER_ALLOWLIST_DIR": str(allowlist), "HPBROKER_SUPER_USERS": "alice"}
    return keydir, env


def security(keydir, name: str) -> ClientSecurity:
    return ClientSecurity.from_files(keydir / f"{name}.key_secret", keydir / "broker.key")


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """``(bootstrap, keydir)`` of a standalone secured broker: ``alice`` a super user, ``bob``
    allowlisted with no ACL (a standalone broker has none: he may do nothing)."""
    root = tmp_path_factory.mktemp("via-frontend")
    keydir, env = make_keys(root)
    broker, port = start_broker(root / "data", root / "broker.log", workers=2, env=env)
    try:
        yield f"127.0.0.1:{port}", keydir
    finally:
        assert broker.stop() == 0, broker.log()


@pytest.fixture(autouse=True)
def no_client_environment(monkeypatch):
    for variable in ("HPBROKER_CLIENT_KEY_FILE", "HPBROKER_CLIENT_SERVER_KEY_FILE", "HPBROKER_CLIENT_CONFIG"):
        monkeypatch.delenv(variable, raising=False)


def fill(bootstrap: str, alice: ClientSecurity, partitions: int, per_partition: int) -> str:
    topic = f"via-{next(_topics)}"
    with Admin(bootstrap, security=alice) as admin:
        admin.create_topic(topic, partitions)
    producer = Producer(bootstrap, security=alice, acks=1, audit_topic=None)
    try:
        futures = [producer.send_future(topic, f"{p}-{i}".encode(), partition=p)
                   for i in range(per_partition) for p in range(partitions)]
        for future in futures:
            future.result(30)
    finally:
        producer.close()
    return topic




def test_a_secured_broker_is_read_through_the_frontend_without_a_fetch_token(secured):
    bootstrap, keydir = secured
    alice = security(keydir, "alice")
    topic = fill(bootstrap, alice, 2, 500)
    tps = [TopicPartition(topic, p) for p in range(2)]
    with Consumer(bootstrap, security=alice, auto_offset_reset="earliest", fetch_via="frontend",
                  fetch_max_wait_ms=200, max_partition_fetch_bytes=4096) as consumer:
        consumer.assign(tps)
        records = poll_records(consumer, 1000)
        assert consumer.poll(timeout_ms=300) == {}
        assert consumer.end_offsets(tps) == {tps[0]: 500, tps[1]: 500}
        assert consumer._fetch_tokens is None  # the data ports were never used
    for p in range(2):
        mine = [r for r in records if r.partition == p]
        assert [r.offset for r in mine] == list(range(500))
        assert [r.value for r in mine] == [f"{p}-{i}".encode() for i in range(500)]


def test_a_principal_without_consume_is_refused_on_the_frontend(secured):
    bootstrap, keydir = secured
    topic = fill(bootstrap, security(keydir, "alice"), 1, 3)
    bob = security(keydir, "bob")
    connections = FrontendConnections(client_id="bob", security=bob)
    host, port = bootstrap.split(":")
    try:
        fetcher = FrontendFetcher(topic, 0, connections, BrokerAddress(host, int(port)),
                                  FetchConfig(fetch_max_wait_ms=0))
        for send in (lambda: fetcher.fetch(0), lambda: fetcher.list_offsets(protocol.EARLIEST_TIMESTAMP)):
            send()
            deadline = time.monotonic() + 10
            while (answer := fetcher.receive()) is None:
                assert time.monotonic() < deadline, "no answer"
                time.sleep(0.01)
            assert isinstance(answer.error, AuthorizationError), answer
            assert "bob" in answer.error.message
        fetcher.close()
    finally:
        connections.close()
    with Consumer(bootstrap, security=bob, auto_offset_reset="earliest", fetch_via="frontend",
                  reconnect_timeout_ms=5000) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        with pytest.raises(AuthorizationError):
            poll_records(consumer, 1, timeout_s=15)


def test_with_loopback_data_ports_a_consumer_elsewhere_reads_through_the_frontend(tmp_path):
    """The front-end on 127.0.0.2, the data ports on 127.0.0.1 alone: the data ports the metadata
    names (on 127.0.0.2) cannot be reached, the front-end can."""
    keydir, env = make_keys(tmp_path)
    broker, port = start_broker(tmp_path / "data", tmp_path / "broker.log", workers=1, host="127.0.0.2",
                                env={**env, "HPBROKER_DATA_PORT_AUTH": "loopback"})
    try:
        bootstrap, alice = f"127.0.0.2:{port}", security(keydir, "alice")
        topic = fill(bootstrap, alice, 1, 50)
        tp = TopicPartition(topic, 0)
        with Consumer(bootstrap, security=alice, auto_offset_reset="earliest", fetch_via="frontend",
                      fetch_max_wait_ms=200) as consumer:
            consumer.assign([tp])
            assert [r.value for r in poll_records(consumer, 50)] == [f"0-{i}".encode() for i in range(50)]
        with Consumer(bootstrap, security=alice, auto_offset_reset="earliest", reconnect_timeout_ms=1500,
                      fetch_max_wait_ms=200) as consumer:
            consumer.assign([tp])
            with pytest.raises(BrokerNotAvailableError, match="not reachable"):
                poll_records(consumer, 1, timeout_s=15)
    finally:
        assert broker.stop() == 0, broker.log()
