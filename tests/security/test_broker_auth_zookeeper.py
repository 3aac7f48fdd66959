"""A secured broker under ZooKeeper: its session carries the cluster's credentials, its fetch
tokens are signed with the cluster's token key, and ACLs written to ZooKeeper reach its
front-end and its workers without a restart.  A real broker process, a real ZooKeeper."""

from __future__ import annotations

import re

import pytest
from curve_probe import Probe, secured_broker
from harness import wait_until

from hpbroker import protocol
from hpbroker.coord.acl_store import add_acls, remove_acls
from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.session import connect
from hpbroker.coord.zk_security import get_or_create_token_key
from hpbroker.security import tokens
from hpbroker.security.acls import AclEntry

WORKERS = 2


@pytest.fixture
def secured(tmp_path, zookeeper, chroot):
    """A secured broker in ``chroot`` (curve_probe.secured_broker)."""
    with secured_broker(tmp_path, zookeeper.connect_string + chroot, workers=WORKERS,
                        env={"HPBROKER_BROKER_ID": "1"}) as broker:
        yield broker


def topic_error(probe: Probe, topic: str) -> int:
    header, response = probe.ask(protocol.MetadataRequest([topic]))
    assert header.error_code == 0
    (described,) = response.topics
    return described.error_code


def test_tokens_use_the_cluster_key_and_acls_follow_zookeeper(secured):
    broker, session = secured.process, secured.session
    alice = secured.probe("alice")

    # The fetch token is signed with the cluster's key, the one in ZooKeeper.
    header, issued = alice.ask(protocol.FetchTokenRequest())
    assert header.error_code == 0 and issued.principal == "alice"
    assert session.client.exists(ZkPaths().token_key) is not None  # made by the broker at start
    key = get_or_create_token_key(session)
    assert tokens.verify(key, issued.token, issued.expires_at_ms - 1000) == ("alice", issued.expires_at_ms)

    # No ACL: alice may not even describe the topic.  An ACL written to ZooKeeper is in force
    # without a restart, at the front-end and in every worker.
    assert topic_error(alice, "orders") == 28
    add_acls(session, [AclEntry("alice", "describe", "topic", "literal", "orders")])
    wait_until(lambda: topic_error(alice, "orders") != 28, timeout_s=15, what="the ACL in force")
    wait_until(lambda: len(re.findall(r"security state: 3 principals, 1 ACLs", broker.log())) >= WORKERS,
               timeout_s=15, what="every worker's new security state")
    remove_acls(session, [AclEntry("alice", "describe", "topic", "literal", "orders")])
    wait_until(lambda: topic_error(alice, "orders") == 28, timeout_s=15, what="the ACL removed")
    alice.close()


def test_a_session_without_the_cluster_credentials_cannot_write_the_brokers_nodes(secured, zookeeper, chroot):
    from kazoo.exceptions import NoAuthError

    session = secured.session
    intruder = connect(zookeeper.connect_string + chroot, session_timeout_s=10.0)
    try:
        (child, *_) = session.client.get_children("/")
        with pytest.raises(NoAuthError):
            intruder.client.create(f"/{child}/planted", b"x")
        with pytest.raises(NoAuthError):
            intruder.client.get(ZkPaths().token_key)
    finally:
        intruder.close()
