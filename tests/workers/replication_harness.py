"""Brokers made of one real worker process each, for the replication tests of the workers.

Each :class:`ReplicaBroker` is a worker process (``worker_harness.WorkerProcess``) with its own
data directory, run directory, fake arbiter and ``broker_id``.  The test plays the controller:
it sends ``replica_role`` controls itself (:meth:`ReplicaBroker.role`) and reads the leaders'
``isr_change`` proposals (:meth:`ReplicaArbiter.expect_isr_change`); the followers fetch from the
leader's real data port.  No ZooKeeper, no arbiter process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from typing import Any

import zmq
from worker_harness import TIMEOUT_S, FakeArbiter, WorkerProcess

from hpbroker.workers import backend, heartbeat


class ReplicaArbiter(FakeArbiter):
    """A fake arbiter that keeps the workers' ``isr_change`` proposals aside as they come (so
    that they never stand in the way of an ack or a response)."""

    def __init__(self, run_dir: str) -> None:
        super().__init__(run_dir)
        self.isr_changes: list[dict[str, Any]] = []

    def _raw(self, timeout_s: float) -> tuple[bytes, backend.Relay | backend.Control]:
        if not self.router.poll(max(1, int(timeout_s * 1000))):
            raise TimeoutError(f"nothing from a worker within {timeout_s} s")
        identity, *frames = self.router.recv_multipart()
        return identity, backend.decode(frames)

    def receive(self, timeout_s: float = TIMEOUT_S) -> tuple[bytes, backend.Relay | backend.Control]:
        if self._inbox:
            return self._inbox.popleft()
        deadline = time.monotonic() + timeout_s
        while True:
            item = self._raw(deadline - time.monotonic())
            if isinstance(item[1], backend.Control) and item[1].op == "isr_change":
                self.isr_changes.append(item[1].body)
                continue
            return item

    def control(self, slot: int, op: str, **body: Any) -> dict[str, Any]:
        """Send a control and wait for its ack; what arrives before it is kept for later."""
        ident = self.next_correlation_id()
        self.send_frames(slot, backend.encode_control(op, id=ident, **body))
        deadline = time.monotonic() + 30
        held = []
        while True:
            identity, message = self.receive(max(0.001, deadline - time.monotonic()))
            acked = isinstance(message, backend.Control) and message.op == "ack"
            if acked and message.body.get("id") == ident:
                self._inbox.extendleft(reversed(held))
                return message.body
            held.append((identity, message))

    def expect_isr_change(self, isr: list[int], timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
        """The first proposal of ``isr`` (already received, or arriving within ``timeout_s``);
        anything else that arrives meanwhile is kept for later."""
        deadline = time.monotonic() + timeout_s
        while True:
            for proposal in self.isr_changes:
                if proposal["isr"] == isr:
                    return proposal
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no isr_change to {isr} within {timeout_s} s; got {self.isr_changes}")
            try:
                identity, message = self._raw(remaining)
            except TimeoutError:
                continue
            if isinstance(message, backend.Control) and message.op == "isr_change":
                self.isr_changes.append(message.body)
            else:
                self._inbox.append((identity, message))


class ReplicaBroker:
    """Broker ``broker_id``: one worker (slot 0) serving ``partitions``, its own directories."""

    def __init__(self, broker_id: int, base_dir: str, *, partitions: list[tuple[str, int]],
                 log: dict[str, Any] | None = None, **config: Any) -> None:
        self.broker_id = broker_id
        self.run_dir = tempfile.mkdtemp(prefix=f"hpbr{broker_id}-", dir="/tmp")
        self.arbiter = ReplicaArbiter(self.run_dir)
        self.data_dir = os.path.join(base_dir, f"broker-{broker_id}")
        self.partitions = partitions
        self.log = log
        self.config = {"replica_fetch_wait_max_ms": 200, **config}
        self.worker: WorkerProcess | None = None

    def start(self) -> ReplicaBroker:
        """Start (or restart, after :meth:`kill`) the worker process."""
        if self.worker is not None:
            self.worker.close()
        self.worker = WorkerProcess(self.arbiter, self.data_dir, partitions=self.partitions, log=self.log,
                                    broker_id=self.broker_id, **self.config)
        self.worker.start()
        return self

    @property
    def address(self) -> list[Any]:
        assert self.worker is not None
        return ["127.0.0.1", self.worker.port]

    def role(self, topic: str, partition: int, role: str, *, epoch: int, leader: int,
             leader_address: list[Any] | None, replicas: list[int], isr: list[int],
             min_insync_replicas: int = 1, lag_time_max_ms: int = 30_000,
             leader_port: int | None = None) -> dict[str, Any]:
        """Send a ``replica_role`` control and wait for its ack (returned); ``leader_port`` (the
        leader's front-end port) only when given."""
        extra = {} if leader_port is None else {"leader_port": leader_port}
        return self.arbiter.control(0, "replica_role", topic=topic, partition=partition, role=role,
                                    leader_epoch=epoch, leader=leader, leader_address=leader_address,
                                    replicas=replicas, isr=isr, min_insync_replicas=min_insync_replicas,
                                    replica_lag_time_max_ms=lag_time_max_ms, **extra)

    def call(self, request: Any, timeout_s: float = TIMEOUT_S) -> tuple[Any, Any]:
        return self.arbiter.call(0, request, timeout_s)

    def partition_entry(self, topic: str, partition: int) -> dict[str, Any] | None:
        """The partition's entry in the worker's latest heartbeat."""
        _age, content = heartbeat.read_heartbeat(self.run_dir, 0)
        for entry in (content or {}).get("partitions", []):
            if (entry["topic"], entry["partition"]) == (topic, partition):
                return entry
        return None

    def pause(self) -> None:
        assert self.worker is not None
        self.worker.signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.worker is not None
        self.worker.signal(signal.SIGCONT)

    def stop(self) -> int:
        """Stop the worker gracefully (SIGTERM), as a broker's stop does; its exit status."""
        assert self.worker is not None
        self.worker.signal(signal.SIGTERM)
        return self.worker.wait()

    def kill(self) -> None:
        if self.worker is not None and self.worker.status is None:
            with contextlib.suppress(ProcessLookupError):
                self.worker.signal(signal.SIGCONT)
            self.worker.kill()

    def close(self) -> None:
        if self.worker is not None:
            self.kill()
            self.worker.close()
        with contextlib.suppress(zmq.ZMQError):
            self.arbiter.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)


def wait_until(condition: Callable[[], Any], timeout_s: float = TIMEOUT_S,
               what: str = "the condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout_s} s")
        time.sleep(0.02)


def segment_bytes(directory: str) -> bytes:
    """The bytes of every segment file of the partition in ``directory``, in offset order."""
    names = sorted(name for name in os.listdir(directory) if name.endswith(".log"))
    out = bytearray()
    for name in names:
        with open(os.path.join(directory, name), "rb") as f:
            out += f.read()
    return bytes(out)


TOPIC = "orders"  # the partition every ReplicaBroker of the replication tests serves (orders-0)


def lead(leader: ReplicaBroker, followers: list[ReplicaBroker], *, epoch: int = 1,
         isr: list[int] | None = None, **options) -> None:
    """Make ``leader`` lead orders-0 in ``epoch`` and ``followers`` follow it."""
    replicas = [leader.broker_id] + [f.broker_id for f in followers]
    isr = replicas if isr is None else isr
    ack = leader.role(TOPIC, 0, "leader", epoch=epoch, leader=leader.broker_id, leader_address=leader.address,
                      replicas=replicas, isr=isr, **options)
    assert ack["error"] is None, ack
    for follower in followers:
        ack = follower.role(TOPIC, 0, "follower", epoch=epoch, leader=leader.broker_id,
                            leader_address=leader.address, replicas=replicas, isr=isr, **options)
        assert ack["error"] is None, ack
