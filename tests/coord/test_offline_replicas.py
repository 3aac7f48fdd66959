"""Replicas a broker reports offline (its worker slot crash-looping; ``offline_partitions`` in its
registration): the controller treats the broker as gone for those partitions only, and as back
once the report is withdrawn.  The registration's bytes without offline replicas are unchanged."""

from __future__ import annotations

import json

import pytest
from test_controller import PATHS, Controllers, active, create_topic, leadership, wait_leadership

from hpbroker.coord.registry import BrokerRegistration, decode_broker, encode_broker

pytestmark = pytest.mark.zookeeper


@pytest.fixture
def controllers(sessions):
    made = Controllers(sessions)
    yield made
    for controller, _ in made.made:
        controller.close()


def _register(zk, broker_id: int, offline: dict[str, tuple[int, ...]] | None = None) -> None:
    data = encode_broker(BrokerRegistration(broker_id, "127.0.0.1", 9092 + broker_id, (9192 + broker_id,),
                                            offline_partitions=offline or {}))
    if zk.client.exists(PATHS.broker(broker_id)):
        zk.client.set(PATHS.broker(broker_id), data)
    else:
        zk.client.create(PATHS.broker(broker_id), data, ephemeral=True, makepath=True)


def test_offline_partitions_round_trip_and_are_absent_when_none():
    plain = BrokerRegistration(1, "h", 1, (2,), {"t": (0, 1)})
    assert "offline_partitions" not in json.loads(encode_broker(plain))
    reporting = BrokerRegistration(1, "h", 1, (2,), {"t": (0, 1)}, offline_partitions={"t": (1,)})
    decoded = decode_broker(encode_broker(reporting))
    assert decoded == reporting and decoded.offline("t", 1) and not decoded.offline("t", 0)
    assert decode_broker(encode_broker(plain)).offline_partitions == {}


def test_a_replica_reported_offline_loses_leadership_and_isr_and_comes_back(controllers, zk):
    for broker_id in (0, 1, 2):
        _register(zk, broker_id)
    create_topic(zk, "t", {0: [1, 2, 0], 1: [2, 0, 1]})
    active(controllers(auto_leader_rebalance=False))
    wait_leadership(zk, "t", (1, 0, [1, 2, 0]))
    wait_leadership(zk, "t", (2, 0, [2, 0, 1]), partition=1)

    _register(zk, 1, {"t": (0,)})  # broker 1 stays registered; only its replica of t-0 is offline
    wait_leadership(zk, "t", (2, 1, [2, 0]))
    wait_leadership(zk, "t", (2, 0, [2, 0, 1]), partition=1)  # its other replica keeps its place

    _register(zk, 1)  # back: it rejoins as a follower, added to the ISR by the leader, not the controller
    _register(zk, 0, {"t": (0,)})  # and a change elsewhere proves a pass ran since
    wait_leadership(zk, "t", (2, 1, [2]))
    assert leadership(zk, "t") == (2, 1, [2])
