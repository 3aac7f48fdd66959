"""A secured replicated cluster end to end: three real brokers with ``security = "curve"``, the
cluster's one shared key pair ``brokers`` (allowed ``cluster_action`` on the cluster by an ACL,
not a super user), ZooKeeper digest credentials, and clients ``alice`` (ACLs on topic prefix
``orders`` and group ``billing``) and ``bob`` (on the allowlist, no ACLs).

- alice creates ``orders`` (replication factor 3, min_insync_replicas 2) and every partition
  reaches a full ISR: followers fetch from their leaders' data ports with fetch tokens their own
  workers mint for ``brokers``, so broker-to-broker authentication works;
- alice produces with acks=all, a consumer of group ``billing`` reads everything and commits;
- the leader of a partition is killed (kill -9): a broker of its ISR takes over, alice keeps
  producing acks=all, and every acknowledged record is read back at its offset;
- bob may neither produce to ``orders`` nor consume as ``billing``.

Real ``hpbroker serve`` processes, a real ZooKeeper, the real clients."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import pytest
import zmq
from cluster.conftest import Cluster, _show_broker_logs
from curve_probe import Keys
from harness import BROKER_START_TIMEOUT_S, BrokerProcess, Client, credentials_file, wait_until

from hpbroker import protocol
from hpbroker.cli import main as cli_main
from hpbroker.client import Admin, Consumer, Producer, TopicPartition
from hpbroker.coord.acl_store import read_acls
from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.session import connect
from hpbroker.coord.zk_security import load_credentials
from hpbroker.errors import AuthorizationError, HPBrokerError, TopicAlreadyExistsError
from hpbroker.security.acls import AclEntry
from hpbroker.security.client import ClientSecurity

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]

TOPIC = "orders"
GROUP = "billing"
PARTITIONS = 3
BROKERS = (0, 1, 2)
WORKERS = 2
FIRST_RECORDS = 600  # produced and consumed before any kill
ACROSS_KILL = 1_500  # produced from the kill on (at RATE: still sending while the leader changes)
RATE = 250  # records a second at most: the machine is shared
CHUNK = 50  # records sent before waiting for their acknowledgements


class CurveClient(Client):
    """:class:`harness.Client` as a CurveZMQ client (``security``)."""

    def __init__(self, port: int, security: ClientSecurity) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        security.apply(self.socket)
        self.socket.connect(f"tcp://127.0.0.1:{port}")
        self._ids = itertools.count(1)
        self._early: dict[int, list[bytes]] = {}


class SecuredCluster(Cluster):
    """:class:`cluster.conftest.Cluster` whose brokers run with ``security = "curve"`` and whose
    metadata requests go as ``alice``."""

    def __init__(self, tmp_path: Path, connect_string: str, keys: Keys, credentials: Path) -> None:
        quoted = {name.removeprefix("HPBROKER_").lower(): f'"{value}"'
                  for name, value in keys.env(server="brokers").items()}
        super().__init__(tmp_path, connect_string, {
            "zookeeper_session_timeout_ms": 4000, "replica_lag_time_max_ms": 3000, **quoted,
            "zookeeper_credentials_file": f'"{credentials}"'})
        self.keys = keys

    def security(self, name: str) -> ClientSecurity:
        return ClientSecurity.from_files(self.keys.secrets / f"{name}.key_secret",
                                         self.keys.secrets / "brokers.key")

    def start(self, broker_id: int, *, workers: int = WORKERS) -> BrokerProcess:
        """Started once every worker holds the security state (its data port serves)."""
        process = super().start(broker_id, workers=workers)
        process.wait_for_log(r"\[worker=\d+\] security state: ", timeout_s=BROKER_START_TIMEOUT_S,
                             count=workers)
        return process

    def client(self, broker_id: int) -> Client:
        if broker_id not in self._clients:
            self._clients[broker_id] = CurveClient(self.ports[broker_id], self.security("alice"))
        return self._clients[broker_id]


@pytest.fixture
def secured(tmp_path, zookeeper, chroot):
    """The three brokers running, the ACLs given with ``hpbroker acls add`` before they start
    (so each reads them with its first read).  Every broker is stopped at the end and must exit
    0; the chroot's nodes (the cluster's ACL: nobody else may) are removed with the credentials."""
    connect_string = zookeeper.connect_string + chroot
    keys = Keys(tmp_path, ["brokers", "alice", "bob"], allowed=["brokers", "alice", "bob"])
    credentials = credentials_file(tmp_path)
    grants = [("brokers", "cluster_action", "--cluster"),
              ("alice", "create,produce,consume", "--topic-prefix", TOPIC),
              ("alice", "consume", "--group", GROUP)]
    for principal, operations, *resource in grants:
        assert cli_main(["acls", "add", "--principal", principal, "--operation", operations, *resource,
                         "--zookeeper", connect_string,
                         "--zookeeper-credentials-file", str(credentials)]) == 0
    session = connect(connect_string, session_timeout_s=10.0, credentials=load_credentials(credentials))
    made = SecuredCluster(tmp_path, connect_string, keys, credentials)
    try:
        brokers_acl = AclEntry("brokers", "cluster_action", "cluster", "literal", "cluster")
        assert brokers_acl in set(read_acls(session))
        for broker_id in BROKERS:
            made.start(broker_id)
        made.session = session
        yield made
    finally:
        _show_broker_logs(tmp_path)  # shown only when the test fails
        try:
            made.close()
        finally:
            session.client.delete("/", recursive=True)
            session.close()


def _create_topic(cluster: SecuredCluster) -> None:
    with Admin(cluster.bootstrap(), security=cluster.security("alice")) as admin:
        def created() -> bool:
            try:
                admin.create_topic(TOPIC, PARTITIONS, {"min_insync_replicas": 2}, replication_factor=3)
            except TopicAlreadyExistsError:
                return True  # an earlier attempt did it
            except HPBrokerError as e:  # e.g. 17: a broker has not read the ACLs yet
                if not e.retriable:
                    raise
                return False
            return True
        wait_until(created, 60, interval_s=0.5, what=f"alice to create {TOPIC}")


def _read_to_end(cluster: SecuredCluster, partition: int, end: int) -> dict[int, bytes]:
    """Every record of ``orders``-``partition`` below ``end``, read as alice: offset -> value."""
    alice = cluster.security("alice")
    with Consumer(cluster.bootstrap(), security=alice, consumer_timeout_ms=3000) as consumer:
        tp = TopicPartition(TOPIC, partition)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        records: dict[int, bytes] = {}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(records) < end:
            for record in consumer:
                assert record.offset not in records, f"offset {record.offset} read twice"
                records[record.offset] = record.value
                if len(records) >= end:
                    break
        return records


class AckedProducer(threading.Thread):
    """alice producing ``record N`` round-robin over the partitions with acks=all, ``CHUNK`` at a
    time and ``RATE`` a second at most, until ``allowance`` records were sent (the test raises
    it: :meth:`allow`) or it is stopped; what was acknowledged is in :attr:`acknowledged`."""

    def __init__(self, cluster: SecuredCluster, allowance: int) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.stop = threading.Event()
        self.lock = threading.Condition()
        self.allowance = allowance
        self.sent = 0
        self.acknowledged: dict[int, dict[int, bytes]] = {p: {} for p in range(PARTITIONS)}
        self.failures: list[BaseException] = []

    def allow(self, more: int) -> None:
        """Send ``more`` records after those sent so far."""
        with self.lock:
            self.allowance = self.sent + more
            self.lock.notify_all()

    def count(self, partition: int | None = None) -> int:
        with self.lock:
            if partition is not None:
                return len(self.acknowledged[partition])
            return sum(len(a) for a in self.acknowledged.values())

    def run(self) -> None:
        settings = {"acks": "all", "request_timeout_ms": 3000, "delivery_timeout_ms": 120_000,
                    "linger_ms": 2, "audit_topic": None, "name": "alice-orders"}
        try:
            with Producer(self.cluster.bootstrap(), security=self.cluster.security("alice"),
                          **settings) as producer:
                while not self.stop.is_set():
                    with self.lock:
                        if self.sent >= self.allowance:
                            self.lock.wait(0.1)
                            continue
                        first = self.sent
                        self.sent += CHUNK
                    started = time.monotonic()
                    futures = [(i, producer.send_future(TOPIC, b"record %d" % i, partition=i % PARTITIONS))
                               for i in range(first, first + CHUNK)]
                    for i, future in futures:
                        metadata = future.result(150)
                        with self.lock:
                            self.acknowledged[metadata.partition][metadata.offset] = b"record %d" % i
                    self.stop.wait(max(0.0, CHUNK / RATE - (time.monotonic() - started)))
        except BaseException as e:  # reported by the test
            self.failures.append(e)


def test_a_secured_cluster_replicates_serves_alice_and_fails_over(secured):
    cluster = secured
    _create_topic(cluster)
    cluster.wait_for_leaders(TOPIC, PARTITIONS, via=0, isr_size=3, timeout_s=90)  # full from creation

    producer = AckedProducer(cluster, FIRST_RECORDS)
    producer.start()
    try:
        wait_until(lambda: producer.failures or producer.count() >= FIRST_RECORDS, 90,
                   what=f"{FIRST_RECORDS} records acknowledged")
        assert not producer.failures, producer.failures
        with producer.lock:
            first = {p: dict(a) for p, a in producer.acknowledged.items()}

        # Every broker holds every partition's records, and the ISR is full: each follower's
        # replica fetches, with a token for ``brokers`` minted by its own worker, were accepted
        # by the leader's data port.  (A new topic's ISR is full before any fetch: it alone
        # proves nothing.)
        def replicated() -> bool:
            return all(first[p][max(first[p])] in cluster.segment_bytes(b, TOPIC, p)
                       for b in BROKERS for p in range(PARTITIONS))

        wait_until(replicated, 60, interval_s=0.2, what="the first records on every broker")
        cluster.wait_for_leaders(TOPIC, PARTITIONS, via=0, isr_size=3, timeout_s=60)

        # Group billing reads what was acknowledged so far, and commits.
        consumer = Consumer(cluster.bootstrap(), security=cluster.security("alice"), group=GROUP,
                            topics=[TOPIC], zookeeper=cluster.connect, session_timeout_ms=4000,
                            enable_auto_commit=False, auto_offset_reset="earliest")
        try:
            read: dict[int, dict[int, bytes]] = {p: {} for p in range(PARTITIONS)}

            def caught_up() -> bool:
                for tp, records in consumer.poll(timeout_ms=200).items():
                    for record in records:
                        read[tp.partition][record.offset] = record.value
                return all(set(first[p]) <= set(read[p]) for p in range(PARTITIONS))

            wait_until(caught_up, 90, interval_s=0, what="group billing to read the first records")
            for p in range(PARTITIONS):
                assert all(read[p][o] == v for o, v in first[p].items()), f"partition {p}: wrong values"
            consumer.commit()
            committed = {p: consumer.committed(TopicPartition(TOPIC, p)) for p in range(PARTITIONS)}
            assert all(committed[p] >= max(first[p]) + 1 for p in range(PARTITIONS)), committed
        finally:
            consumer.close()

        # Kill -9 the leader of partition 0: a broker of its ISR takes over.
        before = cluster.metadata(0, TOPIC).partitions[0]
        assert len(before.isr) == 3, before
        leader, survivor = before.leader, next(b for b in BROKERS if b != before.leader)
        acked_before = producer.count(0)
        producer.allow(ACROSS_KILL)
        cluster.kill(leader)

        seen = []

        def new_leader() -> protocol.PartitionMetadata | None:  # (not its id: broker 0 is falsy)
            partition = cluster.metadata(survivor, TOPIC).partitions[0]
            seen[:] = [partition]
            return partition if partition.leader >= 0 and partition.leader != leader else None

        try:
            elected = wait_until(new_leader, 60, interval_s=0.1,
                                 what=f"a new leader of partition 0 (broker {leader} killed)")
        except AssertionError as e:
            raise AssertionError(f"{e}; broker {survivor} last said {seen}") from None
        assert elected.leader in before.isr, (elected, before.isr)
        wait_until(lambda: producer.failures or producer.count() >= FIRST_RECORDS + ACROSS_KILL, 150,
                   what="every record sent from the kill on acknowledged")
        assert producer.count(0) > acked_before  # partition 0 too, by its new leader
        assert not producer.failures, producer.failures
    finally:
        producer.stop.set()
        producer.join(180)
    assert not producer.is_alive(), "the producer did not finish"
    assert not producer.failures, producer.failures

    # Nothing acknowledged is lost: every partition read to its end, as alice.
    for partition in range(PARTITIONS):
        wanted = producer.acknowledged[partition]
        stored = _read_to_end(cluster, partition, max(wanted) + 1)
        missing = [o for o in sorted(wanted) if stored.get(o) != wanted[o]]
        assert not missing, f"partition {partition}: {len(missing)} acknowledged records lost: {missing[:5]}"
        values = list(stored.values())
        assert len(values) == len(set(values)), f"partition {partition}: a record is stored twice"


def test_bob_on_the_allowlist_without_acls_may_neither_produce_nor_consume(secured):
    cluster = secured
    _create_topic(cluster)
    cluster.wait_for_leaders(TOPIC, PARTITIONS, via=0, isr_size=3, timeout_s=90)
    bob = cluster.security("bob")
    with Producer(cluster.bootstrap(), security=bob, acks="all", audit_topic=None,
                  delivery_timeout_ms=30_000) as producer, pytest.raises(AuthorizationError, match=TOPIC):
        producer.send_future(TOPIC, b"from bob", partition=0).result(60)
    with pytest.raises(AuthorizationError, match="bob"):
        Consumer(cluster.bootstrap(), security=bob, group=GROUP, topics=[TOPIC],
                 zookeeper=cluster.connect, session_timeout_ms=4000)
    assert cluster.session.client.exists(ZkPaths().consumer_ids(GROUP)) is None
    # Nothing of bob's was appended.
    with Consumer(cluster.bootstrap(), security=cluster.security("alice")) as alice:
        ends = alice.end_offsets([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
    assert set(ends.values()) == {0}, ends
    # Nor may bob read orders outside a group.
    with Consumer(cluster.bootstrap(), security=bob, consumer_timeout_ms=3000) as consumer, \
            pytest.raises(AuthorizationError, match=TOPIC):
        consumer.assign([TopicPartition(TOPIC, 0)])
        consumer.seek(TopicPartition(TOPIC, 0), 0)
        list(consumer)
