"""A leader's ISR proposal never adds back a replica its broker reports offline
(``offline_partitions`` in its registration: its worker slot crash-loops), though the broker is
registered and a replica; the broker's other partitions are not affected."""

from __future__ import annotations

import pytest
from test_broker_replication import _seen
from test_controller import PATHS, create_topic, leadership

from hpbroker.coord.partition_state import PartitionState, create_states
from hpbroker.coord.registry import BrokerRegistration, encode_broker

pytestmark = pytest.mark.zookeeper


def _register(zk, broker_id: int, offline: dict[str, tuple[int, ...]] | None = None) -> None:
    data = encode_broker(BrokerRegistration(broker_id, "127.0.0.1", 9092 + broker_id, (9192 + broker_id,),
                                            offline_partitions=offline or {}))
    zk.client.create(PATHS.broker(broker_id), data, ephemeral=True, makepath=True)


def test_a_proposal_never_adds_a_replica_its_broker_reports_offline(zk, agent):
    _register(zk, 1)
    _register(zk, 2)
    _register(zk, 3, {"crashing": (0,)})  # only its replica of crashing-0 is offline
    create_topic(zk, "crashing", {0: [1, 2, 3], 1: [1, 2, 3]})
    create_states(zk, PATHS, "crashing", {0: PartitionState(1, 2, (1,), 0), 1: PartitionState(1, 2, (1,), 0)})
    replication = agent(1)
    replication.watch_topic("crashing", 2)
    _seen(replication, (1,))
    replication.propose_isr("crashing", 0, 2, (1, 2, 3), (1,))
    replication.propose_isr("crashing", 1, 2, (1, 2, 3), (1,))
    _seen(replication, (1, 2, 3))  # partition 1's: both writes are done
    assert leadership(zk, "crashing", partition=0) == (1, 2, [1, 2])
    assert leadership(zk, "crashing", partition=1) == (1, 2, [1, 2, 3])
