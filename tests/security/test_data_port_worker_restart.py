"""A secured consumer reads on across a worker restart.

A respawned worker serves its data port before the arbiter has handed it the broker's security
state; the connections it gets meanwhile are answered "not ready" (error 15, retriable), and the
consumer backs off and connects again instead of failing the partition.  Real ``hpbroker serve``
with ``security = "curve"``, one worker, killed with SIGKILL while the consumer reads.
"""

from __future__ import annotations

import time

from curve_probe import make_keys
from harness import SlotKiller, start_broker, wait_until

from hpbroker import protocol, records
from hpbroker.client.connection import BrokerAddress, BrokerConnection
from hpbroker.client.consumer import Consumer
from hpbroker.security.client import ClientSecurity


def _produce(connection: BrokerConnection, values: list[bytes], timeout_s: float = 30.0) -> None:
    """Append ``values`` to orders-0, retrying while its worker is not serving."""
    request = protocol.ProduceRequest("orders", 0, acks=1, timeout_ms=10_000,
                                      payload=records.build_batch(values))
    deadline = time.monotonic() + timeout_s
    while True:
        response = connection.wait_for(connection.send(request), 10)
        if not response.header.error_code:
            return
        assert response.header.error_code == 15 and time.monotonic() < deadline, response.header
        time.sleep(0.05)


def _read(consumer: Consumer, count: int, timeout_s: float = 60.0) -> list[bytes]:
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(values) < count:
        assert time.monotonic() < deadline, f"read only {values} in {timeout_s} s"
        for batch in consumer.poll(timeout_ms=500).values():
            values += [record.value for record in batch]
    return values


def test_secured_consumer_reads_on_across_a_worker_restart(tmp_path):
    keys = make_keys(tmp_path)
    env = {**keys.env(), "HPBROKER_SUPER_USERS": "alice"}
    broker, port = start_broker(tmp_path / "data", tmp_path / "broker.log", workers=1, env=env)
    security = ClientSecurity.from_files(keys.secrets / "alice.key_secret", keys.secrets / "broker.key")
    admin = BrokerConnection(BrokerAddress("127.0.0.1", port), security=security)
    consumer = None
    try:
        admin.call(protocol.CreateTopicRequest("orders", 1), timeout_s=10)
        _produce(admin, [b"a", b"b", b"c"])
        consumer = Consumer(f"127.0.0.1:{port}", security=security, auto_offset_reset="earliest",
                            retry_backoff_ms=20, retry_backoff_max_ms=200)
        consumer.assign([("orders", 0)])
        assert _read(consumer, 3) == [b"a", b"b", b"c"]
        for restart in range(3):  # each restart a new chance to meet a data port not ready yet
            killer = SlotKiller(broker, 0, 1, timeout_s=30)
            killer.run()  # kills the worker serving now
            assert len(killer.killed) == 1
            wait_until(lambda n=restart + 2: broker.log().count("forked worker slot=0") >= n, 30,
                       what="the worker respawned")
            values = [f"{restart}-{i}".encode() for i in range(3)]
            _produce(admin, values)
            assert _read(consumer, 3) == values  # no error: the partition was not given up
    finally:
        if consumer is not None:
            consumer.close()
        admin.close()
        broker.stop()
