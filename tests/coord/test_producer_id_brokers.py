"""Real brokers sharing one ZooKeeper hand out producer ids that are unique cluster-wide, also
after a restart, and each counts the ids the other issued (their producers write everywhere)."""

from __future__ import annotations

import json

import pytest
from harness import Client, start_broker, wait_until

from hpbroker.coord.paths import ZkPaths
from hpbroker.protocol import InitProducerIdRequest

pytestmark = pytest.mark.zookeeper


def write_config(path, connect: str, broker_id: int) -> None:
    path.write_text(f'[broker]\nzookeeper = "{connect}"\nzookeeper_session_timeout_ms = 4000\n'
                    f"broker_id = {broker_id}\n")


def new_id(client: Client) -> int:
    header, body = client.request(InitProducerIdRequest())
    assert (header.error_code, body.producer_epoch) == (0, 0), header.error_message
    return body.producer_id


def test_brokers_on_one_zookeeper_never_hand_out_the_same_id(tmp_path, zk_connect, zk):
    brokers, clients = [], []
    try:
        for broker_id in (0, 1):
            write_config(tmp_path / f"broker-{broker_id}.toml", zk_connect, broker_id)
            process, port = start_broker(tmp_path / f"data-{broker_id}", tmp_path / f"broker-{broker_id}.log",
                                         config=tmp_path / f"broker-{broker_id}.toml")
            brokers.append((process, port))
            clients.append(Client(port))
        first = [new_id(client) for client in clients for _ in range(3)]
        assert first == [0, 1, 2, 1000, 1001, 1002]  # broker 1 started second: the next block
        # Broker 0 counts broker 1's ids as issued (its ceiling file covers broker 1's block) and
        # bumps their epoch.
        wait_until(lambda: (tmp_path / "data-0" / "producer-ids-issued").read_bytes() == b"0\n2000\n", 10,
                   what="broker 1's block in broker 0's ceiling")
        header, body = clients[0].request(InitProducerIdRequest(1001, 0))
        assert (header.error_code, body.producer_id, body.producer_epoch) == (0, 1001, 1)

        process, port = brokers[0]
        clients[0].close()
        assert process.stop() == 0
        process, port = start_broker(tmp_path / "data-0", tmp_path / "broker-0-again.log", port=port,
                                     config=tmp_path / "broker-0.toml")
        brokers[0] = (process, port)
        clients[0] = Client(port)
        assert new_id(clients[0]) == 2000  # a fresh block, after every block taken
        assert new_id(clients[1]) == 1003
        block = json.loads(zk.client.get(ZkPaths().producer_id_block)[0])
        assert block == {"version": 1, "broker": 0, "block_start": 2000, "block_end": 3000}
    finally:
        for client in clients:
            client.close()
        for process, _ in brokers:
            process.stop()
