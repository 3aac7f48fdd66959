"""A partition state watch whose start failed (here: ZooKeeper refuses to let the session read the
node) is started by the next ``watch()``: the failed attempt leaves no reservation behind."""

from __future__ import annotations

import queue

import pytest
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE, make_digest_acl

from hpbroker.coord.partition_state import PartitionState, PartitionStateWatch, create_states
from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.registry import TopicRegistration, TopicRegistry

pytestmark = pytest.mark.zookeeper

PATHS = ZkPaths()
STATE = PartitionState(1, 3, (1, 2), 7)


def test_a_watch_that_failed_to_start_is_started_by_the_next_call(sessions, zk):
    TopicRegistry(zk).publish(TopicRegistration("orders", 1, {}, created_by=0, replicas={0: (1, 2)}))
    create_states(zk, PATHS, "orders", {0: STATE})
    path = PATHS.partition_state("orders", 0)
    zk.client.add_auth("digest", "admin:secret")
    zk.client.set_acls(path, [make_digest_acl("admin", "secret", all=True)])  # nobody else reads it
    seen: queue.Queue = queue.Queue()
    watch = PartitionStateWatch(sessions(), PATHS, lambda *event: seen.put(event))
    try:
        with pytest.raises(NoAuthError):
            watch.watch("orders", 0)
        assert watch.watched() == [] and seen.empty()
        zk.client.set_acls(path, OPEN_ACL_UNSAFE)
        watch.watch("orders", 0)
        assert seen.get(timeout=10) == ("orders", 0, STATE, 0)
        assert watch.watched() == [("orders", 0)]
    finally:
        watch.close()
