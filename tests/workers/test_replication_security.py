"""Replication between secured brokers: a follower authenticates on its leader's data port with
a token it mints for its own principal (hpbroker.replica.fetcher, hpbroker.security.data_port),
and its replica fetches need cluster_action on the cluster."""

from __future__ import annotations

from replication_harness import TOPIC, lead, wait_until
from worker_harness import make_batch, produce_request

KEY = bytes(range(32))
SECURE = {"security": "curve", "server_key_file": "unused.key_secret", "allowlist_dir": "unused"}
CLUSTER_ACTION = {"principal": "broker-1", "operation": "cluster_action", "resource_type": "cluster",
                  "pattern_type": "literal", "name": "cluster"}


def _secure(broker, acls):
    state = {"enabled": True, "token_key": KEY.hex(), "principals": ["broker-0", "broker-1"],
             "super_users": [], "acls": acls, "data_port_auth": "token",
             "own_principal": f"broker-{broker.broker_id}"}
    assert broker.arbiter.control(0, "security", **state)["error"] is None


def _log_end(broker):
    entry = broker.partition_entry(TOPIC, 0)
    return entry["log_end_offset"] if entry else -1


def test_follower_with_cluster_action_replicates_through_an_authenticated_connection(brokers):
    leader, follower = brokers(2, **SECURE)
    for broker in (leader, follower):
        _secure(broker, [CLUSTER_ACTION])
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
