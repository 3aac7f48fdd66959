"""The chaos cluster: libfaketime moves a running process's wall clock and not its monotonic
clock; three brokers serve from tmpfs data dirs in namespaces of their own, one under faketime;
a replicated topic gets a leader and a full ISR; the disk fills and frees; a start that fails
half-way leaves no process, mount or namespace behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from chaos_probe import can_connect

from chaos.cluster import PORT, ChaosCluster, faketime_available, process_state

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]

TOPIC = "cluster-test"
_CLOCKS = ("import sys, time\n"
           "for line in sys.stdin:\n"
           "    print(time.time(), time.monotonic(), flush=True)\n")


def _faketime_env(library: str, timestamp_file: Path) -> dict[str, str]:
    return {**os.environ, "LD_PRELOAD": library, "FAKETIME_TIMESTAMP_FILE": str(timestamp_file),
            "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def test_a_timestamp_file_moves_a_running_pythons_wall_clock_and_not_its_monotonic_clock(tmp_path):
    library = faketime_available()
    if library is None:
        pytest.skip("libfaketime is not installed (on Debian: apt-get install faketime)")
    timestamp_file = tmp_path / "faketime"
    timestamp_file.write_text("+0\n")
    process = subprocess.Popen([sys.executable, "-c", _CLOCKS], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, env=_faketime_env(library, timestamp_file))
    try:
        def clocks() -> tuple[float, float, float]:
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write("\n")
            process.stdin.flush()
            wall, monotonic = map(float, process.stdout.readline().split())
            return wall, monotonic, time.time()

        wall0, monotonic0, host0 = clocks()
        assert abs(wall0 - host0) < 5
        timestamp_file.write_text("+3600\n")
        wall1, monotonic1, host1 = clocks()
        assert 3595 < wall1 - host1 < 3605, "the wall clock did not jump forward by an hour"
        assert 0 <= monotonic1 - monotonic0 < 5, "the monotonic clock moved with the wall clock"
        timestamp_file.write_text("-120\n")
        wall2, monotonic2, host2 = clocks()
        assert -125 < wall2 - host2 < -115, "the wall clock did not jump back two minutes"
        assert 0 <= monotonic2 - monotonic1 < 5
    finally:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = ChaosCluster.unavailable()
    if reason is not None:
        pytest.skip(f"a chaos cluster cannot run here: {reason}")
    if faketime_available() is None:
        pytest.skip("libfaketime is not installed (on Debian: apt-get install faketime)")
    started = time.monotonic()
    with ChaosCluster(tmp_path_factory.mktemp("chaos-cluster"), brokers=3, data_size_mb=64,
                      faketime_broker=3) as made:
        print(f"cluster of 3 brokers and 3 ZooKeeper servers serving in {time.monotonic() - started:.1f} s")
        made.create_topic(TOPIC, 3, replication_factor=3, min_insync_replicas=2)
        yield made


def test_each_broker_serves_in_its_namespace_from_a_tmpfs_of_its_own(cluster):
    assert cluster.broker_ids == [1, 2, 3] and cluster.alive() == [1, 2, 3]
    addresses = [cluster.host(b).address for b in (1, 2, 3)]
    assert len(set(addresses)) == 3
    assert cluster.bootstrap() == ",".join(f"{a}:{PORT}" for a in addresses)
    mounts = {line.split()[1]: line.split() for line in Path("/proc/mounts").read_text().splitlines()}
    for broker_id in (1, 2, 3):
        assert cluster.serving(broker_id)
        assert can_connect(None, cluster.host(broker_id).address, PORT)
        entry = mounts[str(cluster.data_dir(broker_id))]
        assert entry[2] == "tmpfs" and "size=65536k" in entry[3], entry
        workers = cluster.worker_pids(broker_id)
        assert len(workers) == 2 and all(process_state(pid) in ("R", "S", "D") for pid in workers)
        assert cluster.slot_pids(broker_id) == workers  # the logged slots' workers are the children
        # The broker's network namespace is its host's: the pid runs in the same one as `ip netns exec`.
        assert os.readlink(f"/proc/{cluster.pid(broker_id)}/ns/net") == \
            subprocess.run(cluster.host(broker_id).argv("readlink", "/proc/self/ns/net"),
                           capture_output=True, text=True).stdout.strip()
    environ = Path(f"/proc/{cluster.pid(3)}/environ").read_bytes().split(b"\0")
    assert any(item.startswith(b"LD_PRELOAD=") and b"libfaketime" in item for item in environ)
    assert not any(item.startswith(b"LD_PRELOAD=") for item in
                   Path(f"/proc/{cluster.pid(1)}/environ").read_bytes().split(b"\0"))


def test_a_replicated_topic_gets_leaders_and_a_full_isr(cluster):
    cluster.wait_in_sync([TOPIC], timeout_s=120)
    leaders = cluster.leaders(TOPIC)
    assert sorted(leaders) == [0, 1, 2] and set(leaders.values()) <= {1, 2, 3}
    for via in (1, 2, 3):
        assert cluster.leaders(TOPIC, via=via) == leaders
    assert all(len(p.replicas) == 3 and sorted(p.isr) == [1, 2, 3] for p in cluster.partitions(TOPIC))


def test_the_data_disk_fills_to_the_last_byte_and_frees(cluster):
    written = cluster.fill_disk(2)
    try:
        assert written > 50 * 2**20
        assert cluster.disk_free_bytes(2) == 0
        assert cluster.disk_free_bytes(1) > 50 * 2**20
    finally:
        cluster.free_disk(2)
    assert cluster.disk_free_bytes(2) > 50 * 2**20
    cluster.free_disk(2)  # nothing to free: no error


def test_the_clock_offset_is_written_for_the_faketime_broker_only(cluster):
    cluster.set_clock_offset(3, -90.4)
    assert cluster.faketime_path(3).read_text() == "-90\n"
    cluster.set_clock_offset(3, 0)
    assert cluster.faketime_path(3).read_text() == "+0\n"
    with pytest.raises(ValueError, match="does not run under faketime"):
        cluster.set_clock_offset(1, 60)


def test_a_start_that_fails_half_way_leaves_no_process_mount_or_namespace(tmp_path):
    reason = ChaosCluster.unavailable()
    if reason is not None:
        pytest.skip(f"a chaos cluster cannot run here: {reason}")
    made = ChaosCluster(tmp_path, brokers=1, data_size_mb=16, broker_settings={"replica_lag_time_max_ms": 1})
    namespaces = [host.namespace for host in made.network.hosts.values()]
    with pytest.raises(RuntimeError, match="broker 1 is not running"):
        made.__enter__()  # the broker refuses its settings and exits: start_all fails after ZooKeeper
    assert made.ensemble is not None
    assert made.ensemble.alive() == [] and made.alive() == []
    assert all(made.ensemble.pid(i) is None or process_state(made.ensemble.pid(i)) is None for i in (1, 2, 3))
    assert str(made.data_dir(1)) not in Path("/proc/mounts").read_text()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(namespace in listed for namespace in namespaces)


def test_the_faketime_broker_sleeps_and_reads_a_moved_wall_clock_in_its_environment(cluster):
    """libfaketime fails Python's time.sleep once the monotonic clock is not faked: the
    environment the broker runs with must sleep as usual while its wall clock is moved."""
    probe = ("import time\n"
             "m = time.monotonic()\n"
             "time.sleep(0.2)\n"
             "print(time.time(), time.monotonic() - m)\n")
    cluster.set_clock_offset(3, 600)
    try:
        result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                env=cluster.broker_env(3), cwd=cluster.data_dir(3).parent, timeout=60)
        assert result.returncode == 0, result.stderr
        wall, slept = map(float, result.stdout.split())
        assert 595 < wall - time.time() < 605 and 0.19 < slept < 5
    finally:
        cluster.set_clock_offset(3, 0)
    assert "LD_PRELOAD" not in cluster.broker_env(1) or cluster.broker_env(1)["LD_PRELOAD"] == \
        os.environ.get("LD_PRELOAD")
