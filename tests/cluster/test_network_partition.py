"""A network partition (the 2013 Jepsen test of Kafka): the leader of a replicated partition is cut
off from ZooKeeper and from its followers while acks=all producers write on both sides.

Three brokers, each in a network namespace of its own (``netns``), joined by veth pairs to a
bridge where a ZooKeeper of this test listens; the topic has R = 3 and min_insync_replicas 2.
One producer runs beside the test (it reaches every broker through the bridge, and is
bootstrapped against a broker that stays reachable); another runs inside the leader's
namespace, so it keeps talking to the isolated leader.  The leader's veth is taken down: its
session expires, the controller elects another leader, and the outside producer's writes are
acknowledged by it; the isolated leader takes the inside producer's writes but must not
acknowledge any (its ISR cannot shrink without ZooKeeper, and its followers no longer fetch from
it).  The link is brought back: the old leader learns it was deposed, follows, truncates what it
took alone, and catches up.  Then every acknowledged record, from either producer, is read back
at the offset it was acknowledged with, exactly once, and the three replicas are byte-identical.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from pathlib import Path

import pytest
from harness import BROKER_TEST_ENV, BrokerProcess, Client, wait_until

from chaos import netns
from hpbroker import protocol
from hpbroker.client import Consumer, TopicPartition

pytestmark = pytest.mark.zookeeper

logger = logging.getLogger(__name__)

TOPIC = "partitioned"
PARTITIONS = 2
WORKERS = 2
PORT = 9092  # every broker has a namespace (and an address) of its own: the same ports for all
SESSION_TIMEOUT_MS = 3000
LAG_TIME_MAX_MS = 2000
PRODUCER = Path(__file__).resolve().parent / "acked_producer.py"
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def network():
    """A :class:`netns.Network`; the test is skipped, with the reason, where namespaces cannot be made."""
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(f"network namespaces cannot be used here: {reason}")
    with netns.Network() as made:
        yield made


@pytest.fixture
def bridge_zookeeper(tmp_path, network):
    """A ZooKeeper of this test's own, listening only on the bridge's address."""
    from hpbroker.coord.server import ZooKeeperServer

    server = ZooKeeperServer(tmp_path / "zookeeper", host=network.gateway)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class NamespacedCluster:
    """Brokers 0..2, broker b in the namespace (and on the address) of host ``b<b>``."""

    def __init__(self, tmp_path: Path, network: netns.Network, connect: str) -> None:
        self.tmp_path = tmp_path
        self.network = network
        self.connect = connect
        self.hosts = {b: network.add_host(f"b{b}") for b in range(3)}
        self.processes: dict[int, BrokerProcess] = {}
        self.producers: dict[str, tuple[BrokerProcess, Path, Path]] = {}  # name -> (process, out, stop)
        self._clients: dict[int, Client] = {}

    def start(self, broker_id: int) -> None:
        config = self.tmp_path / f"broker-{broker_id}.toml"
        config.write_text(f"[broker]\nbroker_id = {broker_id}\nzookeeper = \"{self.connect}\"\n"
                          f"zookeeper_session_timeout_ms = {SESSION_TIMEOUT_MS}\n"
                          f"replica_lag_time_max_ms = {LAG_TIME_MAX_MS}\n")
        host = self.hosts[broker_id]
        argv = host.argv(sys.executable, "-m", "hpbroker.cli", "serve", "--host", host.address,
                         "--port", str(PORT), "--fetch-port", str(PORT + 1), "--workers", str(WORKERS),
                         "--data-dir", str(self.data_dir(broker_id)), "--config", str(config))
        self.processes[broker_id] = BrokerProcess(argv, self.tmp_path / f"broker-{broker_id}.log",
                                                  BROKER_TEST_ENV)

    def wait_serving(self, broker_id: int) -> None:
        self.processes[broker_id].wait_for_log(rf"all {WORKERS} workers serving", timeout_s=30)

    def address(self, broker_id: int) -> str:
        return f"{self.hosts[broker_id].address}:{PORT}"

    def bootstrap(self, *broker_ids: int) -> str:
        return ",".join(self.address(b) for b in broker_ids)

    def client(self, broker_id: int) -> Client:
        if broker_id not in self._clients:
            self._clients[broker_id] = Client(PORT, host=self.hosts[broker_id].address)
        return self._clients[broker_id]

    def metadata(self, via: int, topic: str) -> protocol.TopicMetadata:
        header, response = self.client(via).request(protocol.MetadataRequest([topic]))
        assert header.error_code == 0, header.error_message
        return response.topics[0]

    def states(self, via: int) -> list[tuple[int, int, list[int]]] | None:
        """(leader, leader epoch, ISR) of each partition as broker ``via`` sees it; None while one
        has no leader."""
        metadata = self.metadata(via, TOPIC)
        if metadata.error_code or len(metadata.partitions) != PARTITIONS:
            return None
        partitions = sorted(metadata.partitions, key=lambda p: p.partition)
        if any(p.error_code or p.leader < 0 for p in partitions):
            return None
        return [(p.leader, p.leader_epoch, sorted(p.isr)) for p in partitions]

    def data_dir(self, broker_id: int) -> Path:
        return self.tmp_path / f"data-{broker_id}"

    def segment_bytes(self, broker_id: int, partition: int) -> bytes:
        directory = self.data_dir(broker_id) / f"{TOPIC}-{partition}"
        return b"".join(path.read_bytes() for path in sorted(directory.glob("*.log")))

    def start_producer(self, name: str, bootstrap: str, partitions: list[int], *,
                       inside: int | None = None) -> None:
        """An ``acked_producer.py`` process writing to ``partitions``, in broker ``inside``'s
        namespace when given."""
        out, stop = self.tmp_path / f"{name}.jsonl", self.tmp_path / f"{name}.stop"
        argv = [sys.executable, str(PRODUCER), bootstrap, TOPIC, ",".join(map(str, partitions)), name,
                str(out), str(stop)]
        if inside is not None:
            argv = self.hosts[inside].argv(*argv)
        process = BrokerProcess(argv, self.tmp_path / f"{name}.log", {"PYTHONPATH": str(REPO_ROOT)})
        self.producers[name] = (process, out, stop)

    def settled(self, name: str) -> list[dict]:
        """Every record producer ``name`` has settled so far (acked_producer.py's lines)."""
        out = self.producers[name][1]
        if not out.exists():
            return []
        lines = out.read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]

    def acknowledged(self, name: str, *, after: float = 0.0, partition: int | None = None) -> list[dict]:
        return [r for r in self.settled(name) if "offset" in r and r["at"] > after
                and (partition is None or r["partition"] == partition)]

    def stop_producers(self) -> None:
        for _process, _out, stop in self.producers.values():
            stop.touch()
        for name, (process, _out, _stop) in self.producers.items():
            code = process.wait_exit(60)
            assert code == 0, f"producer {name} exited {code}:\n{process.log()[-3000:]}"

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        for name in self.hosts.values():
            self.network.heal(name.name)
        for process, _out, stop in self.producers.values():
            stop.touch()
            process.stop()
        failures = []
        for broker_id, process in list(self.processes.items()):
            code = process.stop()
            if code != 0:
                failures.append(f"broker {broker_id} exited {code}:\n{process.log()[-3000:]}")
        self.processes.clear()
        assert not failures, "\n".join(failures)


@pytest.fixture
def cluster(tmp_path, network, bridge_zookeeper):
    made = NamespacedCluster(tmp_path, network, bridge_zookeeper.connect_string)
    try:
        yield made
    finally:
        made.close()


def _read_partition(bootstrap: str, partition: int) -> list[tuple[int, str]]:
    """Every record of the partition, from offset 0 until none comes for 3 s."""
    with Consumer(bootstrap, consumer_timeout_ms=3000) as consumer:
        tp = TopicPartition(TOPIC, partition)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        return [(record.offset, record.value.decode()) for record in consumer]


def test_a_leader_cut_off_acknowledges_nothing_and_no_acknowledged_write_is_lost_after_healing(
        cluster, network):
    for broker_id in range(3):
        cluster.start(broker_id)
    for broker_id in range(3):
        cluster.wait_serving(broker_id)
    header, _ = cluster.client(0).request(protocol.CreateTopicRequest(
        TOPIC, PARTITIONS, [protocol.TopicConfigEntry("min_insync_replicas", "2")], replication_factor=3),
        timeout_s=40)
    assert header.error_code == 0, header.error_message
    states = wait_until(lambda: (s := cluster.states(0)) and all(len(isr) == 3 for _, _, isr in s) and s,
                        30, interval_s=0.1, what="every partition led, ISR of 3")
    old_leader, old_epoch, _ = states[0]
    others = [b for b in range(3) if b != old_leader]
    witness = others[0]  # a broker on the majority side, asked for metadata throughout
    cluster.start_producer("outside", cluster.bootstrap(*others, old_leader), list(range(PARTITIONS)))
    # Only to the partition the isolated broker leads: what it would acknowledge is what it took alone.
    cluster.start_producer("inside", cluster.bootstrap(old_leader, *others), [0], inside=old_leader)
    wait_until(lambda: all(len(cluster.acknowledged(name)) >= 100 for name in ("outside", "inside")), 30,
               interval_s=0.1, what="both producers acknowledged before the cut")

    network.cut(f"b{old_leader}")
    cut_at = time.time()
    isolated_size = len(cluster.segment_bytes(old_leader, 0))
    logger.info("cut broker %d (leader of %s-0 in epoch %d) off at %.3f", old_leader, TOPIC, old_epoch,
                cut_at)

    def new_leader():
        state = cluster.states(witness)
        return state and state[0][0] != old_leader and state[0]
    new_leader_id, new_epoch, new_isr = wait_until(new_leader, 30, interval_s=0.1,
                                                   what="a new leader of partition 0")
    elected_at = time.time()
    assert new_epoch > old_epoch and old_leader not in new_isr, (new_leader_id, new_epoch, new_isr)
    logger.info("broker %d leads %s-0 in epoch %d (ISR %s) %.1f s after the cut", new_leader_id, TOPIC,
                new_epoch, new_isr, elected_at - cut_at)
    wait_until(lambda: len(cluster.acknowledged("outside", after=elected_at, partition=0)) >= 100, 30,
               interval_s=0.1, what="writes acknowledged by the new leader")
    # Stay cut long enough for the isolated leader to want its followers out of its ISR.
    wait_until(lambda: time.time() >= max(cut_at + SESSION_TIMEOUT_MS / 1000 + 3 * LAG_TIME_MAX_MS / 1000,
                                           elected_at + 1), 30, interval_s=0.1, what="the cut to last")
    grown = len(cluster.segment_bytes(old_leader, 0)) - isolated_size
    heal_at = time.time()
    network.heal(f"b{old_leader}")
    logger.info("healed at %.3f; the isolated leader stored %d bytes of %s-0 meanwhile", heal_at, grown,
                TOPIC)
    # Answers to requests it took before the cut may still arrive just after it; none later.
    acknowledged_while_cut = [r for r in cluster.acknowledged("inside", after=cut_at + 1.0)
                              if r["at"] < heal_at]

    wait_until(lambda: (s := cluster.states(witness)) and all(len(isr) == 3 for _, _, isr in s), 60,
               interval_s=0.1, what="the old leader back in every ISR")
    wait_until(lambda: len(cluster.acknowledged("inside", after=heal_at)) >= 50, 60, interval_s=0.1,
               what="the inside producer acknowledged again after healing")
    cluster.stop_producers()

    assert not acknowledged_while_cut, (
        f"the isolated leader acknowledged {len(acknowledged_while_cut)} acks=all writes while cut off: "
        f"{acknowledged_while_cut[:5]}")
    assert grown > 0, "the isolated leader took no write while cut off: the scenario did not happen"
    assert re.search(rf"\[{TOPIC}-0 worker=\d+\] truncated to offset", cluster.processes[old_leader].log()), \
        "the deposed leader did not truncate what it took alone"

    for partition in range(PARTITIONS):
        wait_until(lambda p=partition: len({cluster.segment_bytes(b, p) for b in range(3)}) == 1, 30,
                   interval_s=0.2, what=f"the three replicas of {TOPIC}-{partition} byte-identical")
    bootstrap = cluster.bootstrap(witness)
    for partition in range(PARTITIONS):
        records = _read_partition(bootstrap, partition)
        offsets = [offset for offset, _ in records]
        assert offsets == list(range(len(offsets))), f"{TOPIC}-{partition}: offsets with gaps or repeats"
        stored = dict(records)
        values = [value for _, value in records]
        assert len(values) == len(set(values)), f"{TOPIC}-{partition}: a record is stored twice"
        for name in ("outside", "inside"):
            wanted = cluster.acknowledged(name, partition=partition)
            assert wanted or (name, partition) == ("inside", 1), f"{name}: no ack on {partition}"
            lost = [r for r in wanted if stored.get(r["offset"]) != r["value"]]
            assert not lost, (f"{TOPIC}-{partition}: {len(lost)} of the {len(wanted)} records acknowledged "
                              f"to {name} are not where they were acknowledged: {lost[:5]}")
