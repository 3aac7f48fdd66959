"""Leadership: a replica this broker reports offline is told its leader but no address to fetch
from, so a worker on probation neither follows nor rejoins the ISR; reported back, it follows."""

from __future__ import annotations

from hpbroker.broker.config import BrokerConfig
from hpbroker.broker.topics import Topic
from hpbroker.coord.cluster import ClusterSnapshot
from hpbroker.coord.partition_state import PartitionState
from hpbroker.coord.registry import BrokerRegistration
from hpbroker.workers.leadership import Leadership


def test_a_replica_reported_offline_follows_no_address_until_reported_back(tmp_path):
    held = {"t": Topic("t", 1, {}, replicas={0: (1, 2)})}
    cluster = ClusterSnapshot(brokers={2: BrokerRegistration(2, "127.0.0.1", 9000, (9001,))})
    sent: list[dict] = []
    leadership = Leadership(BrokerConfig(data_dir=str(tmp_path), broker_id=1, workers=1), 1,
                            send_control=lambda slot, op, body: sent.append(body) or True,
                            assigned=lambda slot: {("t", 0)}, topic=held.get, is_serving=lambda slot: True,
                            cluster=lambda: cluster)
    leadership.set_offline({"t": (0,)})
    leadership.on_state("t", 0, PartitionState(2, 1, (2,), 1))
    leadership.sync(0.0)
    assert sent[-1]["role"] == "follower" and sent[-1]["leader"] == 2 and sent[-1]["leader_address"] is None
    count = len(sent)
    leadership.set_offline({"t": (0,)})  # unchanged: nothing sent again
    leadership.sync(1.0)
    assert len(sent) == count
    leadership.set_offline({})
    leadership.sync(2.0)
    assert sent[-1]["role"] == "follower" and sent[-1]["leader_address"] == ["127.0.0.1", 9001]
