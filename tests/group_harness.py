"""Consumer-group tests: a broker registered in ZooKeeper, topics and records, consumer processes
(``group_consumer.py``) whose output files say what each consumed, and the group as ZooKeeper
sees it.  The fixtures are in ``group_fixtures`` (``pytest_plugins = ["group_fixtures"]``)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

from harness import start_broker, wait_until

from hpbroker import Producer, protocol
from hpbroker.client.connection import BrokerAddress, BrokerConnection
from hpbroker.coord.groups import GroupRegistry
from hpbroker.coord.session import Session

CONSUMER_PROGRAM = Path(__file__).resolve().parent / "group_consumer.py"

_names = itertools.count()


def unique_name(prefix: str) -> str:
    return f"{prefix}{next(_names)}-{uuid.uuid4().hex[:6]}"


def expire(server_connect: str, session: Session, timeout_s: float = 10.0) -> None:
    """Make ZooKeeper expire ``session`` now (a second client attaches to it and closes it)."""
    from kazoo.client import KazooClient

    old = session.session_id
    thief = KazooClient(server_connect, client_id=session.client.client_id)
    thief.start(timeout=timeout_s)
    thief.stop()
    thief.close()
    wait_until(lambda: session.session_id not in (None, old) and session.client.connected, timeout_s,
               what="a new session after the forced expiry")


def start_registered_broker(tmp_path: Path, zk_connect: str, *, name: str = "broker",
                            port: int | None = None):
    """A real ``hpbroker serve`` registered in ZooKeeper at ``zk_connect``: ``(process, port)``."""
    config = tmp_path / f"{name}.toml"
    config.write_text(f'[broker]\nzookeeper = "{zk_connect}"\nzookeeper_session_timeout_ms = 4000\n')
    return start_broker(tmp_path / f"{name}-data", tmp_path / f"{name}.log", config=config, port=port)


def create_topic(port: int, topic: str, partitions: int) -> None:
    connection = BrokerConnection(BrokerAddress("127.0.0.1", port))
    try:
        connection.call(protocol.CreateTopicRequest(topic, partitions))
    finally:
        connection.close()


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int, *, start: int = 0) -> None:
    """``per_partition`` records into each partition, values ``b"<partition>:<n>"``."""
    with Producer(bootstrap, linger_ms=1) as producer:
        for n in range(start, start + per_partition):
            for p in range(partitions):
                producer.send(topic, b"%d:%d" % (p, n), partition=p)
        producer.flush()


def wait_topic_registered(registry: GroupRegistry, topic: str, partitions: int) -> None:
    wait_until(lambda: registry.partition_counts([topic]).get(topic) == partitions, 10,
               what=f"topic {topic} in the topic registry")


class ConsumerProcess:
    """One group member running ``group_consumer.py``; its records in ``out``, its log in ``log``."""

    def __init__(self, directory: Path, name: str, spec: dict) -> None:
        self.name = name
        self.out = directory / f"{name}.jsonl"
        self.log_path = directory / f"{name}.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        argv = [sys.executable, str(CONSUMER_PROGRAM), json.dumps({**spec, "out": str(self.out)})]
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.process.pid

    def lines(self) -> list[dict]:
        try:
            text = self.out.read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]

    def records(self) -> list[tuple[int, int, float]]:
        """``(partition, offset, received_at)`` of every record it handed out."""
        return [(line["p"], line["o"], line["t"]) for line in self.lines() if "p" in line]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def stop(self, timeout_s: float = 20.0) -> int:
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode


class ConsumerGroupRun:
    """Consumer processes of one group over one topic, and what they consumed together."""

    def __init__(self, directory: Path, bootstrap: str, zk_connect: str, group: str, topic: str,
                 **settings) -> None:
        self.directory = directory
        self.spec = {"bootstrap": bootstrap, "zookeeper": zk_connect, "group": group, "topics": [topic],
                     "settings": {"session_timeout_ms": 3000, "auto_commit_interval_ms": 300,
                                  "auto_offset_reset": "earliest", "fetch_max_wait_ms": 200,
                                  "rebalance_backoff_ms": 100, **settings}}
        self.members: dict[str, ConsumerProcess] = {}

    def start(self, name: str, delay_ms: int = 0, **settings) -> ConsumerProcess:
        spec = {**self.spec, "settings": {**self.spec["settings"], "consumer_id": name, **settings},
                "delay_ms": delay_ms}
        self.members[name] = ConsumerProcess(self.directory, name, spec)
        return self.members[name]

    def consumed(self, members=None) -> dict[int, set[int]]:
        """partition -> offsets handed out by any of ``members`` (all by default)."""
        found: dict[int, set[int]] = defaultdict(set)
        for member in members or self.members.values():
            for partition, offset, _ in member.records():
                found[partition].add(offset)
        return found

    def wait_consumed(self, ends: dict[int, int], timeout_s: float = 30.0, members=None) -> None:
        """Until offsets [0, ends[p]) of every partition p were handed out at least once."""
        def done():
            consumed = self.consumed(members)
            return all(consumed.get(p, set()) >= set(range(end)) for p, end in ends.items())

        try:
            wait_until(done, timeout_s, interval_s=0.1, what="every record to be consumed")
        except AssertionError:
            consumed = self.consumed(members)
            missing = {p: sorted(set(range(end)) - consumed.get(p, set()))[:10] for p, end in ends.items()}
            raise AssertionError(f"records never consumed (first 10 per partition): "
                                 f"{ {p: m for p, m in missing.items() if m} }\n{self.logs()}") from None

    def logs(self, tail: int = 40) -> str:
        return "\n".join(f"--- {name} (pid {m.pid}, exit {m.process.poll()}):\n"
                         + "\n".join(m.log().splitlines()[-tail:]) for name, m in self.members.items())

    def stop_all(self) -> dict[str, int]:
        return {name: member.stop() for name, member in self.members.items()}


def owners_by_member(registry: GroupRegistry) -> dict[str, list[tuple[str, int]]]:
    found: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for tp, owner in registry.owners().items():
        found[owner.consumer_id].append(tp)
    return dict(found)


def wait_balanced(registry: GroupRegistry, members: list[str], partitions: int, topic: str,
                  timeout_s: float = 30.0, what: str = "a balanced group",
                  run: ConsumerGroupRun | None = None) -> dict[str, list]:
    """Until exactly ``members`` own every partition of ``topic``, sizes differing by one at most,
    and each member's registration is there.  With ``run``, a failure shows its members' exit
    statuses and logs (a member missing from the group may have exited)."""
    def balanced():
        if sorted(registry.member_ids()) != sorted(members):
            return None
        owned = owners_by_member(registry)
        every = sorted(tp for tps in owned.values() for tp in tps)
        sizes = [len(owned.get(m, [])) for m in members]
        if set(owned) <= set(members) and every == [(topic, p) for p in range(partitions)] \
                and max(sizes) - min(sizes) <= 1:
            return owned
        return None

    started = time.monotonic()
    try:
        return wait_until(balanced, timeout_s, interval_s=0.1, what=what)
    except AssertionError:
        raise AssertionError(f"after {time.monotonic() - started:.1f} s: members {registry.member_ids()}, "
                             f"owners {owners_by_member(registry)}"
                             + ("" if run is None else f"\n{run.logs()}")) from None
