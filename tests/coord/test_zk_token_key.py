"""The cluster's token key against a real ZooKeeper: a key node that was not private to the
cluster since its creation (planted while the tree was open, or opened later) is never adopted:
a starting broker replaces it by a fresh key when no other broker is registered, and otherwise
(brokers run with it), or for a tool, stops with an error pointing to ``hpbroker zookeeper
secure``; that always writes a fresh one and ``--unsecure`` deletes it."""

from __future__ import annotations

import logging

import pytest
from kazoo.security import OPEN_ACL_UNSAFE

from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.zk_migration import secure_tree
from hpbroker.coord.zk_security import ZkCredentials, get_or_create_token_key, private_acl, tool_group_acl
from hpbroker.errors import CoordinationError

pytestmark = pytest.mark.zookeeper

PATHS = ZkPaths()
CLUSTER = ZkCredentials("hpbroker", "a-long-cluster-password-0123")
PLANTED = b"A" * 32


def test_a_key_kept_private_since_its_creation_is_the_same_for_every_broker(sessions):
    first = get_or_create_token_key(sessions(credentials=CLUSTER), PATHS)
    assert get_or_create_token_key(sessions(credentials=CLUSTER), PATHS) == first


def _plant(sessions, how):
    """A key node that was not private since its creation; the broker's session."""
    stranger = sessions()  # before ZooKeeper ACLs were on: anyone could create it
    stranger.client.create(PATHS.token_key, PLANTED, acl=OPEN_ACL_UNSAFE, makepath=True)
    broker = sessions(credentials=CLUSTER)
    if how == "made private later":  # what `zookeeper secure` once did, or a setAcl by hand
        broker.client.set_acls(PATHS.token_key, private_acl(CLUSTER))
    return broker


def _register(session, broker_id):
    session.client.create(PATHS.broker(broker_id), b"{}", ephemeral=True, makepath=True)


def _unchanged(session):
    value, stat = session.client.get(PATHS.token_key)
    return value == PLANTED


@pytest.mark.parametrize("how", ["open", "made private later"])
def test_a_starting_broker_refuses_an_untrusted_key_while_other_brokers_run_with_it(sessions, how):
    broker = _plant(sessions, how)
    _register(sessions(), 1)  # a running broker, holding the key it read at its start
    _register(broker, 2)  # the starting broker registers before it reads the key: not counted
    with pytest.raises(CoordinationError, match=r"brokers \['1'\] are running with it.*hpbroker zookeeper "
                                                r"secure"):
        get_or_create_token_key(broker, PATHS)
    assert _unchanged(broker)


@pytest.mark.parametrize("how", ["open", "made private later"])
def test_a_tool_never_replaces_an_untrusted_key(sessions, how):
    tool = _plant(sessions, how)  # no broker registered: still not the tool's to replace
    with pytest.raises(CoordinationError, match="not using it; run `hpbroker zookeeper secure`"):
        get_or_create_token_key(tool, PATHS, tool=True)
    with pytest.raises(CoordinationError, match="hpbroker zookeeper secure"):
        tool_group_acl(tool, PATHS, "orders-readers")  # `hpbroker groups reset-offsets`
    assert _unchanged(tool)
    assert tool.client.exists(PATHS.group("orders-readers")) is None


@pytest.mark.parametrize("how", ["open", "made private later"])
def test_a_planted_key_is_replaced_by_a_fresh_private_one_when_no_other_broker_runs(sessions, caplog, how):
    broker = _plant(sessions, how)
    _register(broker, 2)  # itself only
    with caplog.at_level(logging.WARNING, logger="hpbroker.coord.zk_security"):
        key = get_or_create_token_key(broker, PATHS)
    assert key != PLANTED and len(key) == 32
    assert any("replacing it with a fresh key" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records)
    acl, stat = broker.client.get_acls(PATHS.token_key)
    assert acl == private_acl(CLUSTER) and stat.aversion == 0
    assert get_or_create_token_key(sessions(credentials=CLUSTER), PATHS) == key  # others read the new one
    assert get_or_create_token_key(broker, PATHS) == key  # and it is trusted from then on


def test_secure_always_writes_a_fresh_key_and_unsecure_deletes_it(sessions):
    admin = sessions(credentials=CLUSTER)
    old = get_or_create_token_key(admin, PATHS)
    report = secure_tree(admin, PATHS)
    assert PATHS.token_key in report.changed
    assert any("fresh token key" in note for note in report.notes)
    new = get_or_create_token_key(admin, PATHS)
    assert new != old
    assert secure_tree(admin, PATHS, dry_run=True) and get_or_create_token_key(admin, PATHS) == new
    report = secure_tree(admin, PATHS, unsecure=True)
    assert PATHS.token_key in report.changed
    assert admin.client.exists(PATHS.token_key) is None
