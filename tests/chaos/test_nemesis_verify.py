"""Each nemesis's verification, on real processes and files with a stand-in cluster: it accepts a
fault that took effect and refuses, with what it saw, one that did not (no cluster needed)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from types import SimpleNamespace

import pytest

from chaos.cluster import process_state
from chaos.nemesis import ClockJump, DiskFull, Fault, IsolateLeader, Kill, NemesisError, Pause, WorkerKill


@pytest.fixture
def sleeper():
    process = subprocess.Popen(["sleep", "60"])
    try:
        yield process
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)
            process.kill()
        process.wait()


def _wait_state(pid, states, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while process_state(pid) not in states:
        assert time.monotonic() < deadline, f"pid {pid} state {process_state(pid)}"
        time.sleep(0.01)


def test_pause_is_verified_only_once_every_pid_is_stopped(sleeper):
    fault = Fault("pause", "b1", time.time(), pids=[sleeper.pid])
    with pytest.raises(NemesisError, match="not every pid stopped 5 s after SIGSTOP"):
        Pause().verify(None, fault)
    assert fault.evidence.startswith("NOT VERIFIED")
    os.kill(sleeper.pid, signal.SIGSTOP)  # verified as soon as the process shows it, not only if at once
    assert "in state T" in Pause().verify(None, fault) and "in state T" in fault.evidence
    _wait_state(sleeper.pid, ("T", "t"))


@pytest.mark.parametrize("kind", [Kill, WorkerKill])
def test_a_kill_is_verified_only_once_its_pids_are_gone(sleeper, kind):
    fault = Fault(kind.name, "b1", time.time(), pids=[sleeper.pid])
    with pytest.raises(NemesisError, match="still running"):
        kind().verify(None, fault)
    sleeper.kill()
    sleeper.wait()
    assert "gone" in kind().verify(None, fault)


def test_a_kill_with_no_pid_recorded_is_not_verified():
    with pytest.raises(NemesisError, match="none recorded"):
        Kill().verify(None, Fault("kill", "b1", time.time()))


def test_a_disk_with_room_left_is_not_full():
    cluster = SimpleNamespace(disk_free_bytes=lambda broker_id: 1 << 20)
    with pytest.raises(NemesisError, match="1048576 bytes still free"):
        DiskFull().verify(cluster, Fault("disk-full", "b2", time.time()))
    cluster.disk_free_bytes = lambda broker_id: 0
    assert DiskFull().verify(cluster, Fault("disk-full", "b2", time.time())) == "0 bytes free"


def test_a_link_still_up_is_not_isolated():
    cluster = SimpleNamespace(network=SimpleNamespace(hosts={"b1": SimpleNamespace(veth="lo")}))
    with pytest.raises(NemesisError, match="not down"):
        IsolateLeader().verify(cluster, Fault("isolate-leader", "b1", time.time()))


def test_a_clock_whose_file_or_process_does_not_say_the_offset_is_not_verified(tmp_path, sleeper):
    path = tmp_path / "faketime"
    path.write_text("+0\n")
    cluster = SimpleNamespace(faketime_path=lambda broker_id: path, pid=lambda broker_id: sleeper.pid)
    fault = Fault("clock", "b1", time.time(), detail="wall clock of broker 1 +120 s")
    with pytest.raises(NemesisError, match="holds '\\+0', not '\\+120'"):
        ClockJump().verify(cluster, fault)
    path.write_text("+120\n")
    with pytest.raises(NemesisError, match="does not run under libfaketime"):
        ClockJump().verify(cluster, fault)  # `sleep` has no LD_PRELOAD


class _SlowMetadataCluster:
    """Answers the leader question slowly, as a loaded broker does; records when the kill came."""

    def __init__(self):
        self.answered_at = self.killed_at = None

    def alive(self):
        return [1, 2, 3]

    def paused(self):
        return []

    def leaders(self, topic):
        time.sleep(0.5)
        self.answered_at = time.time()
        return {0: 2}

    def pid(self, broker_id):
        return 100 + broker_id

    def worker_pids(self, broker_id):
        return []

    def kill(self, broker_id):
        self.killed_at = time.time()


def test_a_faults_start_is_its_injection_not_the_metadata_asked_to_pick_its_target():
    import random

    cluster = _SlowMetadataCluster()
    fault = Kill().inject(cluster, random.Random(1), ["t"], avoid={"b1"})
    assert fault.target == "b2" and fault.pids == [102]
    assert cluster.answered_at <= fault.start <= cluster.killed_at


def test_worker_kill_picks_among_the_logged_worker_slots_not_any_child_of_the_arbiter():
    """The arbiter's children that no ``forked worker`` line names are not workers."""
    from chaos.cluster import ChaosCluster

    worker, other = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])
    try:
        arbiter = SimpleNamespace(pid=lambda broker_id: os.getpid(),
                                  log=lambda broker_id: f"forked worker slot=0 pid=1\n"
                                                        f"forked worker slot=0 pid={worker.pid}\n")
        assert ChaosCluster.slot_pids(arbiter, 1) == [worker.pid]
    finally:
        for process in (worker, other):
            process.kill()
            process.wait()
