"""Each nemesis against a real cluster of three brokers (a topic with R = 3 and
min_insync_replicas 2): injected, it has the effect it claims (a process gone or stopped, a leader
moved, hosts unreachable, a ZooKeeper server down, a disk full, a clock moved); healed, every
partition is led again with a full ISR.  One cluster serves the whole module, the tests run in
the order of ``NEMESES`` and each leaves the cluster healed."""

from __future__ import annotations

import os
import random
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from chaos_probe import can_connect

from chaos.cluster import PORT, ChaosCluster, faketime_available, process_state
from chaos.nemesis import NEMESES, Fault

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]

TOPIC = "nemesis-test"
PARTITIONS = 3
SESSION_TIMEOUT_MS = 4000
HEAL_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = ChaosCluster.unavailable()
    if reason is not None:
        pytest.skip(f"a chaos cluster cannot run here: {reason}")
    if faketime_available() is None:
        pytest.skip("libfaketime is not installed (on Debian: apt-get install faketime)")
    started = time.monotonic()
    with ChaosCluster(tmp_path_factory.mktemp("chaos-nemesis"), brokers=3, data_size_mb=64,
                      session_timeout_ms=SESSION_TIMEOUT_MS, faketime_broker=3,
                      broker_settings={"replica_lag_time_max_ms": 3000}) as made:
        made.create_topic(TOPIC, PARTITIONS, replication_factor=3, min_insync_replicas=2)
        made.wait_in_sync([TOPIC], HEAL_TIMEOUT_S)
        print(f"\ncluster serving, topic in sync, in {time.monotonic() - started:.1f} s")
        yield made


def _inject(cluster: ChaosCluster, name: str, seed: int = 1) -> Fault:
    fault = NEMESES[name]().inject(cluster, random.Random(seed), [TOPIC])
    assert fault.nemesis == name and fault.end is None and abs(fault.start - time.time()) < 120
    evidence = NEMESES[name]().verify(cluster, fault)  # the check the campaign makes after each injection
    assert evidence and fault.evidence == evidence
    return fault


def _heal(cluster: ChaosCluster, fault: Fault) -> None:
    """Heal, then wait for a full ISR everywhere; prints how long each took."""
    started = time.monotonic()
    NEMESES[fault.nemesis]().heal(cluster, fault)
    healed = time.monotonic()
    assert fault.end is not None and fault.end >= fault.start
    cluster.wait_in_sync([TOPIC], HEAL_TIMEOUT_S)
    print(f"\n{fault.nemesis} on {fault.target}: heal {healed - started:.1f} s, "
          f"full ISR {time.monotonic() - healed:.1f} s later ({fault.detail})")


def _led_by(cluster: ChaosCluster, broker_id: int) -> list[int]:
    return [p for p, leader in cluster.leaders(TOPIC).items() if leader == broker_id]


def _wait_leadership_moves(cluster: ChaosCluster, away_from: int, via: int, timeout_s: float = 90) -> None:
    """Until broker ``via`` sees every partition led, and none by ``away_from``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            leaders = cluster.leaders(TOPIC, via=via)
        except RuntimeError:
            leaders = {}
        if leaders and all(b >= 0 and b != away_from for b in leaders.values()):
            return
        assert time.monotonic() < deadline, f"leadership still {leaders} {timeout_s} s after the fault"
        time.sleep(0.25)


def _gone(pid: int) -> bool:
    return process_state(pid) in (None, "Z", "X")


def test_kill_ends_a_leaders_processes_and_another_broker_leads(cluster):
    fault = _inject(cluster, "kill")
    victim = int(fault.target[1:])
    try:
        assert victim not in cluster.alive()
        pid = cluster.pid(victim)
        assert pid is not None and _gone(pid)
        witness = next(b for b in cluster.broker_ids if b != victim)
        _wait_leadership_moves(cluster, victim, witness)
    finally:
        _heal(cluster, fault)
    assert victim in cluster.alive() and cluster.pid(victim) != pid


def test_pause_stops_a_broker_until_its_session_expires_and_leadership_moves(cluster):
    fault = _inject(cluster, "pause", seed=2)
    victim = int(fault.target[1:])
    try:
        pids = [cluster.pid(victim), *cluster.worker_pids(victim)]
        assert len(pids) == 3 and all(process_state(pid) == "T" for pid in pids), \
            [(pid, process_state(pid)) for pid in pids]
        witness = next(b for b in cluster.broker_ids if b != victim)
        _wait_leadership_moves(cluster, victim, witness)
    finally:
        _heal(cluster, fault)
    assert fault.end - fault.start > SESSION_TIMEOUT_MS / 1000
    assert all(process_state(pid) not in ("T", None) for pid in pids)


def test_isolate_leader_cuts_a_leader_off_from_everyone_and_another_leads(cluster):
    fault = _inject(cluster, "isolate-leader", seed=3)
    victim = int(fault.target[1:])
    try:
        host = cluster.host(victim)
        other = next(b for b in cluster.broker_ids if b != victim)
        assert not can_connect(None, host.address, PORT, timeout_s=1.0)
        assert not can_connect(host, cluster.host(other).address, PORT, timeout_s=1.0)
        _wait_leadership_moves(cluster, victim, other)
    finally:
        _heal(cluster, fault)
    assert can_connect(None, cluster.host(victim).address, PORT)


def test_split_cuts_the_minority_off_from_the_majority_and_not_from_the_clients(cluster):
    fault = _inject(cluster, "split", seed=4)
    minority, majority = (side.split(",") for side in fault.target.split("|"))
    try:
        assert any(h.startswith("b") for h in minority) and any(h.startswith("b") for h in majority)
        assert sum(h.startswith("zk") for h in minority) <= 1
        assert sorted(minority + majority) == sorted(cluster.network.hosts)
        hosts = cluster.network.hosts

        def port(name: str) -> int:
            return PORT if name.startswith("b") else 2181

        for source in minority:
            for target in majority:
                assert not can_connect(hosts[source], hosts[target].address, port(target), timeout_s=1.0), \
                    f"{source} reaches {target} across the split"
                assert not can_connect(hosts[target], hosts[source].address, port(source), timeout_s=1.0), \
                    f"{target} reaches {source} across the split"
        for name in minority + majority:  # the clients' (root) namespace reaches both sides
            assert can_connect(None, hosts[name].address, port(name)), f"the root does not reach {name}"
        if len(majority) > 1:
            assert can_connect(hosts[majority[0]], hosts[majority[1]].address, port(majority[1]))
    finally:
        _heal(cluster, fault)
    assert cluster.network.blocked == []


def test_zk_kill_leaves_an_ensemble_of_two_that_still_serves(cluster):
    from kazoo.client import KazooClient

    fault = _inject(cluster, "zk-kill", seed=5)
    server = int(fault.target[2:])
    assert cluster.ensemble is not None
    try:
        assert cluster.ensemble.alive() == sorted({1, 2, 3} - {server})
        client = KazooClient(hosts=cluster.ensemble.connect_string, timeout=10.0)
        client.start(timeout=60)
        try:
            path = f"/nemesis-{uuid.uuid4().hex[:8]}"
            client.create(path, b"x")
            client.delete(path)
        finally:
            client.stop()
            client.close()
    finally:
        _heal(cluster, fault)
    assert cluster.ensemble.alive() == [1, 2, 3] and cluster.ensemble.mode(server) in ("leader", "follower")


def test_worker_kill_ends_one_worker_and_its_broker_serves_again_with_a_new_one(cluster):
    fault = _inject(cluster, "worker-kill", seed=6)
    broker_id = int(fault.target[1:])
    killed = int(fault.detail.split("worker pid ")[1].split()[0])
    try:
        assert _gone(killed) and broker_id in cluster.alive()
    finally:
        _heal(cluster, fault)
    workers = cluster.worker_pids(broker_id)
    assert len(workers) == 2 and killed not in workers and cluster.serving(broker_id)


def test_clock_jumps_the_faketime_brokers_wall_clock_and_back(cluster):
    fault = _inject(cluster, "clock", seed=7)
    assert fault.target == "b3"
    offset = int(fault.detail.split()[-2])
    assert 60 <= abs(offset) <= 3600

    def skew() -> float:
        """`date +%s` under the broker's environment, less the host's clock."""
        text = Path(f"/proc/{cluster.pid(3)}/environ").read_text()
        environ = dict(item.split("=", 1) for item in text.split("\0") if "=" in item)
        faked = {key: value for key, value in environ.items() if key.startswith(("LD_PRELOAD", "FAKETIME"))}
        output = subprocess.run(["date", "+%s"], capture_output=True, text=True, env={**os.environ, **faked})
        return int(output.stdout) - time.time()

    try:
        assert abs(skew() - offset) < 5
        time.sleep(1.0)  # the broker lives on the moved clock for a while (its loops sleep and poll)
    finally:
        _heal(cluster, fault)
    assert abs(skew()) < 5
    assert cluster.serving(3) and "Errno 22" not in cluster.log(3), "a sleep failed under libfaketime"


def test_disk_full_fills_a_brokers_data_tmpfs_and_healing_frees_it(cluster):
    fault = _inject(cluster, "disk-full", seed=8)
    broker_id = int(fault.target[1:])
    try:
        assert cluster.disk_free_bytes(broker_id) == 0
    finally:
        _heal(cluster, fault)
    assert cluster.disk_free_bytes(broker_id) > 32 * 2**20 and cluster.serving(broker_id)


def test_every_kind_is_listed_in_order():
    assert list(NEMESES) == ["kill", "pause", "isolate-leader", "split", "zk-kill", "worker-kill", "clock",
                             "disk-full"]
    assert all(kind.name == name for name, kind in NEMESES.items())
