"""A secured broker under ZooKeeper: its session carries the cluster's credentials, its fetch
tokens are signed with the cluster's token key, and ACLs written to ZooKeeper reach its
front-end and its workers without a restart.  A real broker process, a real ZooKeeper."""

from __future__ import annotations

import re

import pytest
import zmq
from curve_probe import Probe, make_keys
from harness import start_broker, wait_until

from hpbroker import protocol
from hpbroker.coord.acl_store import add_acls, remove_acls
from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.session import connect
from hpbroker.coord.zk_security import get_or_create_token_key, load_credentials
from hpbroker.security import tokens
from hpbroker.security.acls import AclEntry

WORKERS = 2


@pytest.fixture
def secured(tmp_path, zookeeper, chroot):
    """A secured broker in ``chroot``: (broker, port, keys, cluster session); the chroot's
    nodes, which carry the cluster's ACL, removed with its credentials afterwards."""
    keys = make_keys(tmp_path)
    credentials_file = tmp_path / "zookeeper.credentials"
    credentials_file.write_text("hpbroker:cluster-secret\n")
    credentials_file.chmod(0o600)
    connect_string = zookeeper.connect_string + chroot
    env = {**keys.env(), "HPBROKER_ZOOKEEPER": connect_string,
           "HPBROKER_ZOOKEEPER_CREDENTIALS_FILE": str(credentials_file), "HPBROKER_BROKER_ID": "1"}
    broker, port = start_broker(tmp_path / "data", tmp_path / "broker.log", workers=WORKERS, env=env)
    session = connect(connect_string, session_timeout_s=10.0, credentials=load_credentials(credentials_file))
    context = zmq.Context()
    try:
        yield broker, port, keys, session, context
    finally:
        broker.stop()
        context.destroy(linger=0)
        session.client.delete("/", recursive=True)
        session.close()


def topic_error(probe: Probe, topic: str) -> int:
    header, response = probe.ask(protocol.MetadataRequest([topic]))
    assert header.error_code == 0
    (described,) = response.topics
    return described.error_code


def test_tokens_use_the_cluster_key_and_acls_follow_zookeeper(secured):
    broker, port, keys, session, context = secured
    server_key = keys.pair("broker")[0]
    alice = Probe(context, port, server_key, keys.pair("alice"))
    assert alice.metadata().brokers

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

    broker, port, keys, session, context = secured
    intruder = connect(zookeeper.connect_string + chroot, session_timeout_s=10.0)
    try:
        (child, *_) = session.client.get_children("/")
        with pytest.raises(NoAuthError):
            intruder.client.create(f"/{child}/planted", b"x")
        with pytest.raises(NoAuthError):
            intruder.client.get(ZkPaths().token_key)
    finally:
        intruder.close()
