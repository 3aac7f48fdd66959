"""The cluster's token key against a real ZooKeeper: a key node that was not private to the
cluster since its creation (planted while the tree was open, or opened later) is replaced by a
fresh key, never adopted; ``hpbroker zookeeper secure`` always writes a fresh one and
``--unsecure`` deletes it."""

from __future__ import annotations

import logging

import pytest
from kazoo.security import OPEN_ACL_UNSAFE

from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.zk_migration import secure_tree
from hpbroker.coord.zk_security import ZkCredentials, get_or_create_token_key, private_acl

pytestmark = pytest.mark.zookeeper

PATHS = ZkPaths()
CLUSTER = ZkCredentials("hpbroker", "a-long-cluster-password-0123")
PLANTED = b"A" * 32


def test_a_key_kept_private_since_its_creation_is_the_same_for_every_broker(sessions):
    first = get_or_create_token_key(sessions(credentials=CLUSTER), PATHS)
    assert get_or_create_token_key(sessions(credentials=CLUSTER), PATHS) == first


@pytest.mark.parametrize("how", ["open", "made private later"])
def test_a_planted_key_is_replaced_by_a_fresh_private_one(sessions, caplog, how):
    stranger = sessions()  # before ZooKeeper ACLs were on: anyone could create it
    stranger.client.create(PATHS.token_key, PLANTED, acl=OPEN_ACL_UNSAFE, makepath=True)
    broker = sessions(credentials=CLUSTER)
    if how == "made private later":  # what `zookeeper secure` once did: the ACL set, the value kept
        broker.client.set_acls(PATHS.token_key, private_acl(CLUSTER))
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
