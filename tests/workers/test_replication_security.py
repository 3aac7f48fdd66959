"""Replication between secured brokers: a follower authenticates on its leader's data port with
a token it mints for its own principal (hpbroker.replica.fetcher, hpbroker.security.data_port),
and its replica fetches need cluster_action on the cluster."""

from __future__ import annotations

import pytest
from replication_harness import TOPIC, lead, wait_until
from worker_harness import TcpClient, make_batch, produce_request

from hpbroker import protocol
from hpbroker.protocol import ApiKey

KEY = bytes(range(32))
SECURE = {"security": "curve", "server_key_file": "unused.key_secret", "allowlist_dir": "unused"}
CLUSTER_ACTION = {"principal": "broker-1", "operation": "cluster_action", "resource_type": "cluster",
                  "pattern_type": "literal", "name": "cluster"}


def _secure(broker, acls, data_port_auth="token"):
    state = {"enabled": True, "token_key": KEY.hex(), "principals": ["broker-0", "broker-1"],
             "super_users": [], "acls": acls, "data_port_auth": data_port_auth,
             "own_principal": f"broker-{broker.broker_id}"}
    assert broker.arbiter.control(0, "security", **state)["error"] is None


def _log_end(broker):
    entry = broker.partition_entry(TOPIC, 0)
    return entry["log_end_offset"] if entry else -1


@pytest.mark.parametrize("data_port_auth", ["token", "loopback"])
def test_follower_with_cluster_action_replicates_through_an_authenticated_connection(brokers, data_port_auth):
    leader, follower = brokers(2, **SECURE, data_port_auth=data_port_auth)
    for broker in (leader, follower):
        _secure(broker, [CLUSTER_ACTION], data_port_auth)
    lead(leader, [follower])
    header, response = leader.call(produce_request(TOPIC, 0, make_batch("a"), acks=-1))
    assert (header.error_code, response.base_offset) == (0, 0)
    wait_until(lambda: _log_end(follower) == 3, what="the follower's log end at 3")


def _log_end(broker):
    entry = broker.partition_entry(TOPIC, 0)
    return entry["log_end_offset"] if entry else -1


def test_follower_without_cluster_action_gets_nothing_until_it_is_granted(brokers):
    leader, follower = brokers(2, **SECURE)
    for broker in (leader, follower):
        _secure(broker, [])
    lead(leader, [follower])
    header, _ = leader.call(produce_request(TOPIC, 0, make_batch("a"), acks=1))
    assert header.error_code == 0
    leader.arbiter.relay(0, produce_request(TOPIC, 0, make_batch("b"), acks=-1, timeout_ms=60_000))
    assert leader.arbiter.nothing_within(1.5), "acks=-1 answered while the follower was refused"
    assert _log_end(follower) == 0
    _secure(leader, [CLUSTER_ACTION])  # the leader's workers learn the new ACLs
    wait_until(lambda: _log_end(follower) == 6, what="the follower's log end at 6 once allowed")


def test_loopback_data_port_refuses_a_replica_fetch_without_a_token_and_nothing_moves(brokers):
    # Loopback data ports serve consumers without a token, but a replica fetch moves the leader's
    # high watermark and ISR: a local process posing as follower 1 must not.
    leader, follower = brokers(2, **SECURE, data_port_auth="loopback")
    for broker in (leader, follower):
        _secure(broker, [], "loopback")  # the real follower is refused (28): it never catches up
    lead(leader, [follower])
    assert leader.call(produce_request(TOPIC, 0, make_batch("a"), acks=1))[0].error_code == 0
    leader.arbiter.relay(0, produce_request(TOPIC, 0, make_batch("b"), acks=-1, timeout_ms=60_000))
    wait_until(lambda: (leader.partition_entry(TOPIC, 0) or {}).get("log_end_offset") == 6,
               what="the leader's log end at 6")
    consumer = TcpClient(leader.worker.port)  # a consumer fetch needs no token
    consumer.send(protocol.FetchRequest(TOPIC, 0, 0, max_wait_ms=0), 1)
    assert consumer.response(ApiKey.FETCH)[0].error_code == 0
    consumer.close()
    poser = TcpClient(leader.worker.port)
    poser.send(protocol.FetchRequest(TOPIC, 0, 6, max_wait_ms=0, replica_id=follower.broker_id,
                                     current_leader_epoch=1), 1)  # "caught up and durable at 6"
    header, _ = poser.response(ApiKey.FETCH)
    assert header.error_code in (27, 28), header
    assert poser.is_closed_by_peer()
    assert leader.arbiter.nothing_within(1.5), "acks=-1 answered on a replica fetch without a token"
    assert _log_end(follower) == 0
