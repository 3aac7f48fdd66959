"""A replicated hpbroker cluster on this machine for the chaos suite: brokers and ZooKeeper
servers each in a network namespace of its own.

Layout of ``ChaosCluster(directory, brokers=N)``::

    Network (chaos.netns): bridge in the root namespace, hosts zk1..zk3 and b1..bN
    Ensemble (chaos.zookeeper): ZooKeeper servers on zk1..zk3, files under <directory>/zookeeper/
    broker <id> (1..N) on host b<id>, front-end <address>:9092, data ports 9093..:
        <directory>/b<id>/data          a tmpfs of its own (data_size_mb), the broker's data dir
        <directory>/b<id>/data/chaos-filler   only while the disk-full fault holds
        <directory>/b<id>/broker.toml   its settings, rewritten at every start
        <directory>/b<id>/broker-<n>.log  the output of its n-th start (n = 1, 2, ...)
        <directory>/b<id>/faketime      the wall-clock offset of the faketime broker ("+0", "-120")

Every broker has an address of its own, so all use the same ports.  Clients in the root
namespace (the runner's producers and consumers) reach every broker through the bridge.

``faketime_broker``: that broker runs under libfaketime (Debian's ``faketime``) reading its
offset from its ``faketime`` file at every call (``FAKETIME_NO_CACHE=1``); only the wall clock
moves, as an NTP step moves it (``FAKETIME_DONT_FAKE_MONOTONIC=1``): :meth:`ChaosCluster.set_clock_offset`.
libfaketime 0.9.10 (Debian 12) answers EINVAL to the absolute monotonic ``clock_nanosleep`` that
Python's ``time.sleep`` makes once the monotonic clock is not faked (poll, select, epoll, locks
and condition waits are unaffected), so that broker also gets ``<directory>/b<id>/site`` on its
PYTHONPATH, whose ``sitecustomize`` makes ``time.sleep`` wait in ``select`` until its monotonic
deadline: the broker then meets the clock jump, not a failure of the tool that makes it
(:mod:`chaos.faketime`).

Processes are signalled only by their own pid (a broker's arbiter, the pid ``ip netns exec``
execs into, and its workers, the arbiter's children).  :meth:`ChaosCluster.close` kills every
broker, then the ensemble, unmounts the tmpfs mounts and removes the network; it is safe after a
start that failed half-way, and so is a failing constructor, which undoes what it made.

Threads: one thread drives a cluster.  Brokers started from the main thread are asked to receive
SIGTERM should it die (``PR_SET_PDEATHSIG``), so a crashed runner leaves no broker behind.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from chaos import faketime, netns
from chaos.zookeeper import Ensemble
from hpbroker.client.admin import Admin
from hpbroker.client.metadata import PartitionInfo
from hpbroker.coord.server import die_with_parent, find_java, zookeeper_classpath
from hpbroker.errors import CoordinationError, HPBrokerError

__all__ = ["PORT", "ChaosCluster", "faketime_available"]

logger = logging.getLogger(__name__)

PORT = 9092  # every broker's front-end; its data ports follow (fetch port PORT + 1)
FILLER_NAME = "chaos-filler"  # not a <topic>-<N> name: the broker's scan of its data dir skips it
_FILL_CHUNK = 1 << 20


def faketime_available() -> str | None:
    """The path of libfaketime (``libfaketime.so.1``, Debian's ``faketime`` package), or None
    when it is not installed."""
    return faketime.library()


def _tmpfs_refusal() -> str | None:
    """Why a tmpfs cannot be mounted here, or None (a throw-away mount is made to find out)."""
    with tempfile.TemporaryDirectory(prefix="hpb-tmpfs-probe-") as probe:
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", probe],
                                capture_output=True, text=True, timeout=30)
        if result.returncode != 0:
            return f"`mount -t tmpfs` refused: {result.stderr.strip()}"
        subprocess.run(["umount", probe], capture_output=True, timeout=30)
    return None


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc), sorted."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return sorted(found)


def process_state(pid: int) -> str | None:
    """The state letter of ``pid`` in /proc (``R``, ``S``, ``T`` stopped, ``Z`` zombie), None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _gone(pid: int) -> bool:
    return process_state(pid) in (None, "Z", "X")


@dataclass
class _Broker:
    broker_id: int
    host: netns.Host
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    starts: int = 0
    paused: list[int] = field(default_factory=list)  # pids stopped by pause()

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"


class ChaosCluster:
    """Network, ensemble and brokers ``b1..bN`` (module docstring).  As a context manager it starts
    everything (:meth:`start_all`) and closes it all at the end."""

    def __init__(self, directory: Path, *, brokers: int = 3, workers: int = 2, session_timeout_ms: int = 6000,
                 data_size_mb: int = 256, faketime_broker: int | None = None,
                 broker_settings: dict | None = None) -> None:
        if brokers < 1:
            raise ValueError(f"a cluster needs at least one broker, got brokers={brokers}")
        if faketime_broker is not None and not 1 <= faketime_broker <= brokers:
            raise ValueError(f"faketime_broker {faketime_broker} is not a broker id (1..{brokers})")
        self.directory = Path(directory).absolute()
        self.workers = workers
        self.session_timeout_ms = session_timeout_ms
        self.data_size_mb = data_size_mb
        self.faketime_broker = faketime_broker
        self.broker_settings = {"zookeeper_session_timeout_ms": session_timeout_ms,
                                "replica_lag_time_max_ms": 10_000, **(broker_settings or {})}
        self._faketime_library = None
        if faketime_broker is not None:
            self._faketime_library = faketime_available()
            if self._faketime_library is None:
                raise RuntimeError("faketime_broker needs libfaketime (on Debian: apt-get install faketime)")
        self._mounts: list[Path] = []
        self._brokers: dict[int, _Broker] = {}
        self.network = netns.Network()
        self.ensemble: Ensemble | None = None
        try:
            self.ensemble = Ensemble(self.network, self.directory / "zookeeper")
            for broker_id in range(1, brokers + 1):
                broker = _Broker(broker_id, self.network.add_host(f"b{broker_id}"),
                                 self.directory / f"b{broker_id}")
                broker.data_dir.mkdir(parents=True, exist_ok=True)
                self._mount(broker.data_dir)
                self._brokers[broker_id] = broker
            if faketime_broker is not None:
                self.set_clock_offset(faketime_broker, 0)
        except BaseException:
            self.close()
            raise

    # --- what this machine offers --------------------------------------------------------------

    @staticmethod
    def unavailable() -> str | None:
        """Why this machine cannot run a cluster (not root, no ``ip``, namespaces or tmpfs
        refused, no ``nft`` for the network split, no java or ZooKeeper), or None when it can."""
        reason = netns.unavailable() or netns.nftables_unavailable()
        if reason is not None:
            return reason
        try:
            find_java()
            zookeeper_classpath()
        except CoordinationError as exc:
            return str(exc)
        return _tmpfs_refusal()

    faketime_available = staticmethod(faketime_available)

    # --- the whole cluster ---------------------------------------------------------------------

    def __enter__(self) -> ChaosCluster:
        try:
            self.start_all()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def broker_ids(self) -> list[int]:
        return sorted(self._brokers)

    def start_all(self, timeout_s: float = 120.0) -> None:
        """Start the ensemble (waiting for its quorum), then every broker not running, and wait
        until every broker serves."""
        assert self.ensemble is not None
        started = time.monotonic()
        self.ensemble.start(timeout_s)
        for broker_id in self._brokers:
            if broker_id not in self.alive():
                self.start(broker_id)
        for broker_id in self._brokers:
            self.wait_serving(broker_id, timeout_s)
        logger.info("[chaos] cluster of %d brokers serving in %.1f s (ZooKeeper %s)", len(self._brokers),
                    time.monotonic() - started, self.ensemble.connect_string)

    def close(self) -> None:
        """Kill every broker and ZooKeeper server (SIGKILL, by pid), unmount the data tmpfs
        mounts, remove the network.  Errors are collected and raised once all was tried."""
        errors = []
        for broker_id in list(self._brokers):
            try:
                self.kill(broker_id)
            except Exception as exc:  # noqa: BLE001 - go on cleaning up, report at the end
                errors.append(f"killing broker {broker_id}: {exc!r}")
        if self.ensemble is not None:
            try:
                self.ensemble.close()
            except Exception as exc:  # noqa: BLE001
                errors.append(f"stopping ZooKeeper: {exc!r}")
        while self._mounts:
            mount = self._mounts.pop()
            result = subprocess.run(["umount", str(mount)], capture_output=True, text=True, timeout=60)
            if result.returncode != 0:
                result = subprocess.run(["umount", "-l", str(mount)], capture_output=True, text=True,
                                        timeout=60)
                if result.returncode != 0:
                    errors.append(f"umount {mount}: {result.stderr.strip()}")
        try:
            self.network.close()
        except Exception as exc:  # noqa: BLE001
            errors.append(str(exc))
        if errors:
            raise RuntimeError("closing the chaos cluster: " + "; ".join(errors))

    # --- one broker ----------------------------------------------------------------------------

    def host(self, broker_id: int) -> netns.Host:
        return self._brokers[broker_id].host

    def address(self, broker_id: int) -> str:
        """``"ADDR:9092"``: the broker's front-end."""
        return f"{self._brokers[broker_id].host.address}:{PORT}"

    def bootstrap(self) -> str:
        """Every broker's front-end, comma-separated, by broker id."""
        return ",".join(self.address(b) for b in sorted(self._brokers))

    def data_dir(self, broker_id: int) -> Path:
        return self._brokers[broker_id].data_dir

    def log_path(self, broker_id: int) -> Path | None:
        """The log of the broker's latest start (None before its first)."""
        return self._brokers[broker_id].log_path

    def log(self, broker_id: int) -> str:
        path = self._brokers[broker_id].log_path
        return "" if path is None else path.read_text(errors="replace")

    def pid(self, broker_id: int) -> int | None:
        """The arbiter's pid (latest start), None if never started."""
        process = self._brokers[broker_id].process
        return None if process is None else process.pid

    def start(self, broker_id: int) -> None:
        """Start the broker in its namespace (RuntimeError if it runs); returns at once, see
        :meth:`wait_serving`."""
        broker = self._brokers[broker_id]
        if broker.process is not None and broker.process.poll() is None:
            raise RuntimeError(f"broker {broker_id} is already running (pid {broker.process.pid})")
        config = broker.directory / "broker.toml"
        assert self.ensemble is not None
        settings = {"broker_id": broker_id, "zookeeper": self.ensemble.connect_string, **self.broker_settings}
        config.write_text("[broker]\n" + "".join(f"{key} = {_toml(value)}\n"
                                                  for key, value in settings.items()))
        argv = broker.host.argv(sys.executable, "-m", "hpbroker.cli", "serve",
                                "--host", broker.host.address, "--port", str(PORT),
                                "--fetch-port", str(PORT + 1), "--workers", str(self.workers),
                                "--data-dir", str(broker.data_dir), "--config", str(config))
        env = self.broker_env(broker_id)
        broker.starts += 1
        broker.log_path = broker.directory / f"broker-{broker.starts}.log"
        broker.paused = []
        preexec = die_with_parent if threading.current_thread() is threading.main_thread() else None
        with open(broker.log_path, "wb") as log_file:
            broker.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_file,
                                              stderr=subprocess.STDOUT, env=env, cwd=broker.directory,
                                              start_new_session=True, preexec_fn=preexec)
        logger.info("[chaos] broker %d started (pid %d) on %s, log %s", broker_id, broker.process.pid,
                    self.address(broker_id), broker.log_path)

    def broker_env(self, broker_id: int) -> dict[str, str]:
        """The environment the broker runs with: ours, plus libfaketime's settings and the
        sitecustomize directory for the faketime broker (module docstring)."""
        env = dict(os.environ)
        if broker_id == self.faketime_broker:
            env = faketime.environment(self._brokers[broker_id].directory / "site",
                                       self.faketime_path(broker_id), base=env)
        return env

    def serving(self, broker_id: int) -> bool:
        """Whether the broker's latest start logged every worker serving and each slot's latest
        worker serves and lives (so also after a worker was killed and forked again)."""
        broker = self._brokers[broker_id]
        if broker.process is None or broker.process.poll() is not None:
            return False
        text = self.log(broker_id)
        if f"all {self.workers} workers serving" not in text:
            return False
        latest = {int(m[1]): int(m[2]) for m in re.finditer(r"forked worker slot=(\d+) pid=(\d+)", text)}
        ready = {(int(m[1]), int(m[2])) for m in re.finditer(r"worker slot=(\d+) pid=(\d+) serving", text)}
        return len(latest) == self.workers and all(
            (slot, pid) in ready and not _gone(pid) for slot, pid in latest.items())

    def wait_serving(self, broker_id: int, timeout_s: float = 60.0) -> None:
        """Until :meth:`serving`; RuntimeError with the log's tail if the broker exits or does not
        serve within ``timeout_s``."""
        broker = self._brokers[broker_id]
        deadline = time.monotonic() + timeout_s
        while not self.serving(broker_id):
            exited = broker.process is None or broker.process.poll() is not None
            if exited or time.monotonic() > deadline:
                what = "is not running" if exited else f"does not serve after {timeout_s:g} s"
                tail = "\n".join(self.log(broker_id).splitlines()[-40:])
                raise RuntimeError(f"broker {broker_id} {what}; {broker.log_path} ends:\n{tail}")
            time.sleep(0.2)

    def worker_pids(self, broker_id: int) -> list[int]:
        """The live children of the broker's arbiter (its workers), sorted."""
        pid = self.pid(broker_id)
        return [] if pid is None or _gone(pid) else _children(pid)

    def slot_pids(self, broker_id: int) -> list[int]:
        """The live worker of each slot, from the latest start's log (``forked worker slot=S
        pid=P``): workers only, whatever other children the arbiter has; sorted."""
        pid = self.pid(broker_id)
        if pid is None or _gone(pid):
            return []
        latest = {int(m[1]): int(m[2]) for m in re.finditer(r"forked worker slot=(\d+) pid=(\d+)",
                                                              self.log(broker_id))}
        children = set(_children(pid))
        return sorted(p for p in latest.values() if p in children)

    def alive(self) -> list[int]:
        """The brokers whose arbiter runs (paused ones included), sorted."""
        return sorted(b for b, broker in self._brokers.items()
                      if broker.process is not None and broker.process.poll() is None)

    def kill(self, broker_id: int, signum: int = signal.SIGKILL, timeout_s: float = 60.0) -> None:
        """Send ``signum`` to the arbiter and its workers (SIGKILL: a machine gone) and wait until
        all have exited (SIGKILL after ``timeout_s``).  Nothing when the broker is not running."""
        broker = self._brokers[broker_id]
        process = broker.process
        if process is None or process.poll() is not None:
            return
        pids = [process.pid, *self.worker_pids(broker_id)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        if signum != signal.SIGKILL and broker.paused:
            for pid in pids:  # a stopped process acts on SIGTERM only once continued
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        broker.paused = []
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("[chaos] broker %d (pid %d) still running %g s after signal %d: SIGKILL",
                           broker_id, process.pid, timeout_s, signum)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            process.wait(timeout=30)
        deadline = time.monotonic() + 30
        while not all(_gone(pid) for pid in pids[1:]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers of broker {broker_id} still running: "
                                   f"{[pid for pid in pids[1:] if not _gone(pid)]}")
            time.sleep(0.05)
        logger.info("[chaos] broker %d (pid %d, workers %s) ended by signal %d: exit status %s", broker_id,
                    process.pid, pids[1:], signum, process.returncode)

    def restart(self, broker_id: int, timeout_s: float = 60.0) -> None:
        """Kill the broker if it runs, start it again on its data, wait until it serves."""
        self.kill(broker_id)
        self.start(broker_id)
        self.wait_serving(broker_id, timeout_s)

    def pause(self, broker_id: int) -> None:
        """SIGSTOP the arbiter, then its workers (the arbiter first, so it sees none stop)."""
        pid = self.pid(broker_id)
        if pid is None or broker_id not in self.alive():
            raise RuntimeError(f"broker {broker_id} is not running")
        pids = [pid, *self.worker_pids(broker_id)]
        for target in pids:
            os.kill(target, signal.SIGSTOP)
        self._brokers[broker_id].paused = pids
        logger.info("[chaos] broker %d paused (pids %s)", broker_id, pids)

    def resume(self, broker_id: int) -> None:
        """SIGCONT what :meth:`pause` stopped, the workers first."""
        broker = self._brokers[broker_id]
        for target in reversed(broker.paused):
            with contextlib.suppress(ProcessLookupError):
                os.kill(target, signal.SIGCONT)
        logger.info("[chaos] broker %d resumed (pids %s)", broker_id, broker.paused)
        broker.paused = []

    def paused_pids(self, broker_id: int) -> list[int]:
        """The pids :meth:`pause` stopped for this broker (empty when it is not paused)."""
        return list(self._brokers[broker_id].paused)

    def paused(self) -> list[int]:
        """The brokers stopped by :meth:`pause` and not resumed, sorted."""
        return sorted(b for b, broker in self._brokers.items() if broker.paused)

    # --- clock and disk ------------------------------------------------------------------------

    def faketime_path(self, broker_id: int) -> Path:
        return self._brokers[broker_id].directory / "faketime"

    def set_clock_offset(self, broker_id: int, seconds: float) -> None:
        """Move the faketime broker's wall clock to ``seconds`` (rounded) from the host's; 0 puts it
        back.  ValueError for any other broker."""
        if broker_id != self.faketime_broker:
            raise ValueError(f"broker {broker_id} does not run under faketime (faketime_broker="
                             f"{self.faketime_broker})")
        faketime.set_offset(self.faketime_path(broker_id), seconds)  # the old offset or the new one
        logger.info("[chaos] broker %d wall clock offset %+d s", broker_id, round(seconds))

    def fill_disk(self, broker_id: int) -> int:
        """Fill the broker's data tmpfs with a filler file until no byte is left; its size."""
        path = self.data_dir(broker_id) / FILLER_NAME
        written = 0
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for chunk in (_FILL_CHUNK, 4096, 1):  # then whatever a smaller write still finds room for
                block = bytes(chunk)
                try:
                    while True:
                        written += os.write(descriptor, block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
        finally:
            os.close(descriptor)
        logger.info("[chaos] broker %d data disk filled (%d bytes of filler)", broker_id, written)
        return written

    def free_disk(self, broker_id: int) -> None:
        """Remove the filler file (nothing when there is none)."""
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir(broker_id) / FILLER_NAME).unlink()
        logger.info("[chaos] broker %d data disk freed", broker_id)

    def disk_free_bytes(self, broker_id: int) -> int:
        stat = os.statvfs(self.data_dir(broker_id))
        return stat.f_bavail * stat.f_frsize

    # --- topics --------------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int, replication_factor: int = 3,
                     min_insync_replicas: int = 2) -> None:
        """Create ``name`` through the first broker that answers (hpbroker's Admin)."""
        last: Exception | None = None
        for broker_id in self._answering_order():
            try:
                with Admin(self.address(broker_id), request_timeout_ms=60_000,
                           connect_timeout_ms=5_000) as admin:
                    admin.create_topic(name, partitions, {"min_insync_replicas": min_insync_replicas},
                                       replication_factor=replication_factor)
                return
            except HPBrokerError as exc:
                if not exc.retriable:
                    raise
                last = exc
        raise RuntimeError(f"no broker created topic {name!r}: {last!r}")

    def partitions(self, topic: str, *, via: int | None = None) -> list[PartitionInfo]:
        """``topic``'s partitions as broker ``via`` (else the first live, unpaused broker that
        answers) describes them; RuntimeError when none answers."""
        last: Exception | None = None
        for broker_id in ([via] if via is not None else self._answering_order()):
            try:
                with Admin(self.address(broker_id), request_timeout_ms=5_000,
                           connect_timeout_ms=2_000) as admin:
                    return sorted(admin.describe_topic(topic).partitions, key=lambda p: p.partition)
            except HPBrokerError as exc:
                last = exc
        raise RuntimeError(f"no broker described topic {topic!r}: {last!r}")

    def leaders(self, topic: str, *, via: int | None = None) -> dict[int, int]:
        """partition -> leader's broker id (-1 while it has none), see :meth:`partitions`."""
        return {p.partition: (p.leader if p.error_code == 0 else -1) for p in self.partitions(topic, via=via)}

    def in_sync(self, topic: str, *, via: int | None = None) -> bool:
        """Whether every partition of ``topic`` has a leader and all its replicas in the ISR, as
        broker ``via`` sees it, else as every running, unpaused broker sees it (one that does not
        answer counts as not in sync: a broker cut off still shows the state it last knew)."""
        for broker_id in [via] if via is not None else self._answering_order():
            try:
                found = self.partitions(topic, via=broker_id)
            except RuntimeError:
                return False
            if not found or not all(p.error_code == 0 and p.leader >= 0 and p.replicas
                                    and set(p.isr) == set(p.replicas) for p in found):
                return False
        return True

    def wait_in_sync(self, topics: list[str], timeout_s: float = 120.0, *, via: int | None = None) -> float:
        """Until every partition of ``topics`` has a leader and a full ISR; the seconds it took
        (RuntimeError, with what was seen, after ``timeout_s``)."""
        started = time.monotonic()
        while not all(self.in_sync(topic, via=via) for topic in topics):
            if time.monotonic() - started > timeout_s:
                seen = {}
                for topic in topics:
                    try:
                        seen[topic] = [(p.partition, p.leader, p.isr)
                                       for p in self.partitions(topic, via=via)]
                    except RuntimeError as exc:
                        seen[topic] = str(exc)
                raise RuntimeError(f"partitions not led with a full ISR after {timeout_s:g} s: {seen}")
            time.sleep(0.5)
        return time.monotonic() - started

    # --- internals -----------------------------------------------------------------------------

    def _answering_order(self) -> list[int]:
        paused = set(self.paused())
        return [b for b in self.alive() if b not in paused]

    def _mount(self, path: Path) -> None:
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.data_size_mb}m", "tmpfs",
                                 str(path)], capture_output=True, text=True, timeout=30)
        if result.returncode != 0:
            raise RuntimeError(f"mount -t tmpfs on {path} refused: {result.stderr.strip()}")
        self._mounts.append(path)


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
