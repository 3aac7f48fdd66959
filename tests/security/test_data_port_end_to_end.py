"""A secured broker's data ports end to end: a real ``hpbroker serve`` with ``security =
"curve"``; the client gets a fetch token over its CurveZMQ connection and reads through the data
port; without a token, with another cluster's, or as a principal the ACLs do not allow, it is
refused.  Standalone broker: the super user ``alice`` may do everything, ``bob`` nothing."""

from __future__ import annotations

import socket
import time

import pytest
from curve_probe import secured_broker
from harness import wait_until

from hpbroker import protocol, records
from hpbroker.client.connection import BrokerAddress, BrokerConnection
from hpbroker.client.fetch_tokens import FetchTokens
from hpbroker.client.fetcher import FetchConfig, PartitionFetcher
from hpbroker.errors import AuthenticationError, AuthorizationError
from hpbroker.security import tokens
from hpbroker.security.client import ClientSecurity


@pytest.fixture
def secured(tmp_path):
    """``(port, keys, alice, bob)``: a broker holding orders-0 with 3 records; each client a
    secured BrokerConnection."""
    made = []
    with secured_broker(tmp_path, super_users="alice", workers=1) as broker:
        keys = broker.keys
        try:
            def connect(name):
                security = ClientSecurity.from_files(keys.secrets / f"{name}.key_secret",
                                                     keys.secrets / "broker.key")
                made.append(BrokerConnection(BrokerAddress("127.0.0.1", broker.port), security=security))
                return made[-1]

            alice, bob = connect("alice"), connect("bob")
            alice.call(protocol.CreateTopicRequest("orders", 1), timeout_s=10)
            produce = protocol.ProduceRequest("orders", 0, acks=1, timeout_ms=10_000,
                                              payload=records.build_batch([b"a", b"b", b"c"]))
            # the new partition's worker may still be opening it: its error is retriable
            wait_until(lambda: alice.wait_for(alice.send(produce), 10).header.error_code == 0, 10,
                       interval_s=0.05, what="the 3 records produced to orders-0")
            yield broker.port, keys, alice, bob
        finally:
            for connection in made:
                connection.close()


def _data_port(connection):
    metadata = connection.call(protocol.MetadataRequest(["orders"]), timeout_s=10)
    return metadata.topics[0].partitions[0].fetch_port


def _receive(fetcher, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while (completed := fetcher.receive()) is None:
        assert time.monotonic() < deadline, "no answer"
        time.sleep(0.005)
    return completed


def _fetcher(connection, port):
    tokens_ = FetchTokens(connection.security, lambda address: connection)
    return PartitionFetcher("orders", 0, "127.0.0.1", port, FetchConfig(fetch_max_wait_ms=0),
                            token=lambda fresh=False: tokens_.token_for(connection.address, fresh=fresh))


def test_secured_client_reads_through_the_data_port_with_a_token(secured):
    _, _, alice, _ = secured
    fetcher = _fetcher(alice, _data_port(alice))
    fetcher.fetch(0)
    completed = _receive(fetcher)
    assert completed.error is None and [r.value for r in completed.records] == [b"a", b"b", b"c"]
    fetcher.close()


def test_data_port_refuses_a_fetch_without_a_token_and_closes(secured):
    _, _, alice, _ = secured
    with socket.create_connection(("127.0.0.1", _data_port(alice)), timeout=10) as sock:
        frames = protocol.encode_request(protocol.FetchRequest("orders", 0, 0, 1 << 20, 0, 1), 1, "raw")
        sock.sendall(b"".join(protocol.frame_tcp(frames)))
        data = b""
        while chunk := sock.recv(65536):  # until the broker closes
            data += chunk
    header, _ = protocol.decode_response(protocol.ApiKey.FETCH, protocol.TcpFrameDecoder().feed(data)[0])
    assert header.error_code == AuthenticationError.code and "AuthenticateRequest" in header.error_message


def test_data_port_refuses_another_clusters_token(secured):
    _, _, alice, _ = secured
    forged = tokens.mint(bytes(32), "alice", 600_000, time.time_ns() // 1_000_000)[0]
    fetcher = PartitionFetcher("orders", 0, "127.0.0.1", _data_port(alice), FetchConfig(),
                               token=lambda fresh: forged)
    with pytest.raises(AuthenticationError, match="forged"):
        fetcher.fetch(0)


def test_principal_the_acls_do_not_allow_gets_28(secured):
    _, _, alice, bob = secured
    fetcher = _fetcher(bob, _data_port(alice))
    fetcher.fetch(0)
    completed = _receive(fetcher)
    assert isinstance(completed.error, AuthorizationError) and "'bob'" in str(completed.error)
    fetcher.close()


def test_consumer_with_security_reads_through_the_data_port(secured):
    from hpbroker.client.consumer import Consumer, ConsumerConfig

    if "security" not in ConsumerConfig.__dataclass_fields__:
        pytest.skip("ConsumerConfig takes no security yet")
    port, keys, alice, _ = secured
    security = ClientSecurity.from_files(keys.secrets / "alice.key_secret", keys.secrets / "broker.key")
    consumer = Consumer(f"127.0.0.1:{port}", security=security, auto_offset_reset="earliest",
                        consumer_timeout_ms=10_000)
    try:
        consumer.assign([("orders", 0)])
        values = []
        for record in consumer:
            values.append(record.value)
            if len(values) == 3:
                break
        assert values == [b"a", b"b", b"c"]
    finally:
        consumer.close()
