"""Altering a replicated topic through different brokers in quick succession: each request's
changes are applied to the settings ZooKeeper holds, so none undoes another (a broker's own copy
of the settings may lag the alter another broker just made)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from kazoo.client import KazooClient

from hpbroker import protocol
from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.registry import decode_topic
from hpbroker.errors import InvalidConfigError

pytestmark = pytest.mark.zookeeper


def _alter(client, name: str, configs: dict[str, str]) -> protocol.ResponseHeader:
    entries = [protocol.TopicConfigEntry(k, v) for k, v in configs.items()]
    header, _ = client.request(protocol.AlterTopicConfigRequest(name, entries), timeout_s=40)
    return header


def _node_config(cluster, name: str) -> dict:
    zk = KazooClient(cluster.connect)
    zk.start(timeout=10)
    try:
        data, _ = zk.get(ZkPaths().topic(name))
        return dict(decode_topic(name, data).config)
    finally:
        zk.stop()
        zk.close()


def test_alters_through_two_brokers_in_quick_succession_all_land(cluster):
    for broker_id in (0, 1):
        cluster.start(broker_id)
    cluster.create_topic("settings", 1, 2, via=0)
    cluster.wait_for_leaders("settings", 1, via=0, isr_size=2)
    cluster.wait_for_leaders("settings", 1, via=1, isr_size=2)
    # two at once, one through each broker: neither broker's copy has the other's change yet
    rounds = [({"retention_ms": "60000"}, {"segment_bytes": "1048576"}),
              ({"min_insync_replicas": "2"}, {"retention_bytes": "100000000"})]
    for first, second in rounds:
        with ThreadPoolExecutor(2) as pool:
            headers = list(pool.map(lambda job: _alter(cluster.client(job[0]), "settings", job[1]),
                                    [(0, first), (1, second)]))
        assert [h.error_code for h in headers] == [0, 0], [h.error_message for h in headers]
    assert _node_config(cluster, "settings") == {"retention_ms": 60000, "segment_bytes": 1048576,
                                                 "min_insync_replicas": 2, "retention_bytes": 100000000}
    header = _alter(cluster.client(0), "settings", {"retention_bytes": ""})  # removed
    assert header.error_code == 0, header.error_message
    header = _alter(cluster.client(1), "settings", {"retention_ms": "not a number"})
    assert header.error_code == InvalidConfigError.code
    assert _node_config(cluster, "settings") == {"retention_ms": 60000, "segment_bytes": 1048576,
                                                 "min_insync_replicas": 2}
