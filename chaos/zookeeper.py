"""A ZooKeeper ensemble of three (or ``size``) servers, each in a network namespace of its own.

Server ``i`` (1-based) runs ``java ... QuorumPeerMain <directory>/zk<i>/zoo.cfg`` inside host
``zk<i>`` of the :class:`~chaos.netns.Network` (``ip netns exec`` execs it, so the pid kept is the
JVM's), listens for clients on ``<address>:client_port`` and speaks to its peers on
``<address>:2888`` (quorum) and ``:3888`` (leader election).  Its files::

    <directory>/zk<i>/zoo.cfg      written at every start
    <directory>/zk<i>/data/myid    "i", as a quorum member must have
    <directory>/zk<i>/data/...     snapshots and transaction logs (kept across restarts)
    <directory>/zk<i>.log          the server's output, appended at every start

The ensemble serves while a majority runs (two of three): :meth:`Ensemble.kill` of one server is
a fault it survives.  Java and ZooKeeper come from :func:`hpbroker.coord.server.find_java` and
:func:`~hpbroker.coord.server.zookeeper_classpath` (a CoordinationError says what to install).

Processes are signalled by their own pid only; :meth:`Ensemble.close` kills every server this
ensemble started and is safe after a partial start.  Call it from the thread that started the
servers: they are asked to receive SIGTERM should that thread die (``PR_SET_PDEATHSIG``), so
only servers started from the main thread carry that request.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

from chaos.netns import Host, Network
from hpbroker.coord.server import MAIN_CLASS, die_with_parent, find_java, zookeeper_classpath
from hpbroker.errors import CoordinationError

__all__ = ["Ensemble"]

logger = logging.getLogger(__name__)
_PROBE_LOGGER = logging.getLogger(__name__ + ".probe")
_PROBE_LOGGER.setLevel(logging.ERROR)  # refused connections while servers boot are expected

QUORUM_PORT = 2888
ELECTION_PORT = 3888
_JVM_FLAGS = ("-Xms16m", "-Xmx192m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
              "-Djava.awt.headless=true")
_INIT_LIMIT_TICKS = 20  # a follower may take 20 ticks to connect and sync to a new leader
_SYNC_LIMIT_TICKS = 6   # ... and fall 6 ticks behind before the leader drops it


class Ensemble:
    """Servers ``zk1..zk<size>`` (module docstring).  Use as a context manager or call
    :meth:`close`."""

    def __init__(self, network: Network, directory: Path, size: int = 3, client_port: int = 2181,
                 tick_ms: int = 500) -> None:
        if size < 1:
            raise ValueError(f"an ensemble needs at least one server, got size={size}")
        self.network = network
        self.directory = Path(directory).absolute()
        self.size = size
        self.client_port = client_port
        self.tick_ms = tick_ms
        self.hosts: dict[int, Host] = {}
        self._processes: dict[int, subprocess.Popen[bytes]] = {}
        self._killed: set[int] = set()  # servers killed on purpose (their exit is no start failure)
        for i in range(1, size + 1):
            self.hosts[i] = network.hosts.get(f"zk{i}") or network.add_host(f"zk{i}")

    def __enter__(self) -> Ensemble:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def connect_string(self) -> str:
        """``"a1:2181,a2:2181,a3:2181"``: every server, for ZooKeeper clients."""
        return ",".join(f"{host.address}:{self.client_port}" for host in self.hosts.values())

    def server_dir(self, i: int) -> Path:
        return self.directory / f"zk{i}"

    def log_path(self, i: int) -> Path:
        return self.directory / f"zk{i}.log"

    def start(self, timeout_s: float = 60.0) -> Ensemble:
        """Start every server not running, then wait until the ensemble has a quorum (a client can
        create and delete a node); CoordinationError, with the servers' log tails, when it has none
        within ``timeout_s`` or a server exits meanwhile."""
        java, classpath = find_java(), zookeeper_classpath()
        for i in self.hosts:
            if i not in self.alive():
                self._spawn(i, java, classpath)
        self.wait_quorum(timeout_s)
        logger.info("[zookeeper] ensemble of %d serving on %s", self.size, self.connect_string)
        return self

    def wait_quorum(self, timeout_s: float = 60.0) -> None:
        """Until a client connected to any server can create and delete a node."""
        from kazoo.client import KazooClient
        from kazoo.exceptions import KazooException
        from kazoo.handlers.threading import KazooTimeoutError

        deadline = time.monotonic() + timeout_s
        path = f"/chaos-probe-{uuid.uuid4().hex[:8]}"
        while True:
            for i, process in self._processes.items():
                if process.poll() is not None and i not in self._killed:
                    raise CoordinationError(f"ZooKeeper server {i} exited with status {process.returncode} "
                                            f"while starting; its log ends:\n{self.log_tail(i)}")
            client = KazooClient(hosts=self.connect_string, timeout=5.0, logger=_PROBE_LOGGER,
                                 connection_retry={"max_tries": 1, "delay": 0.1})
            try:
                client.start(timeout=5.0)
                client.create(path, b"", ephemeral=True)
                client.delete(path)
                return
            except (KazooException, KazooTimeoutError, OSError) as exc:
                if time.monotonic() > deadline:
                    tails = "\n".join(f"--- zk{i}:\n{self.log_tail(i)}" for i in self.hosts)
                    raise CoordinationError(
                        f"the ZooKeeper ensemble on {self.connect_string} has no quorum "
                        f"after {timeout_s:g} s ({exc!r}); the logs end:\n{tails}") from exc
                time.sleep(0.5)
            finally:
                with contextlib.suppress(Exception):
                    client.stop()
                client.close()

    def kill(self, i: int) -> None:
        """SIGKILL server ``i`` and wait until it has exited (nothing when it is not running)."""
        process = self._processes.get(i)
        if process is None or process.poll() is not None:
            return
        self._killed.add(i)
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        logger.info("[zookeeper] server %d (pid %d) killed", i, process.pid)

    def restart(self, i: int, timeout_s: float = 60.0) -> None:
        """Start server ``i`` again (killed first if running), on its data, and wait until it
        serves as a member of the quorum (CoordinationError, with its log tail, if not within
        ``timeout_s``)."""
        self.kill(i)
        self._spawn(i, find_java(), zookeeper_classpath())
        deadline = time.monotonic() + timeout_s
        while self.mode(i) is None:
            process = self._processes[i]
            if process.poll() is not None or time.monotonic() > deadline:
                state = "exited" if process.poll() is not None else f"does not serve after {timeout_s:g} s"
                raise CoordinationError(f"ZooKeeper server {i} {state} after a restart; its log ends:\n"
                                        f"{self.log_tail(i)}")
            time.sleep(0.2)

    def mode(self, i: int, timeout_s: float = 1.0) -> str | None:
        """Server ``i``'s answer to ``srvr``: ``"leader"``, ``"follower"`` (or ``"standalone"``)
        while it serves, None while it runs without a quorum, is unreachable or is down."""
        reply = b""
        try:
            address = (self.hosts[i].address, self.client_port)
            with socket.create_connection(address, timeout=timeout_s) as probe:
                probe.sendall(b"srvr")
                while chunk := probe.recv(4096):
                    reply += chunk
        except OSError:
            return None
        for line in reply.decode(errors="replace").splitlines():
            if line.startswith("Mode: "):
                return line.split(":", 1)[1].strip()
        return None

    def alive(self) -> list[int]:
        """The servers whose process runs, sorted."""
        return sorted(i for i, process in self._processes.items() if process.poll() is None)

    def pid(self, i: int) -> int | None:
        """Server ``i``'s pid (its latest start), None if never started."""
        process = self._processes.get(i)
        return None if process is None else process.pid

    def log_tail(self, i: int, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path(i).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def close(self) -> None:
        """Kill every server this ensemble started (SIGKILL, by pid) and reap them."""
        for i in list(self._processes):
            self.kill(i)
        self._processes.clear()

    # --- internals ------------------------------------------------------------------------------

    def _write_config(self, i: int) -> Path:
        data = self.server_dir(i) / "data"
        data.mkdir(parents=True, exist_ok=True)
        (data / "myid").write_text(f"{i}\n")
        lines = [
            f"tickTime={self.tick_ms}",
            f"initLimit={_INIT_LIMIT_TICKS}",
            f"syncLimit={_SYNC_LIMIT_TICKS}",
            f"dataDir={data}",
            f"clientPort={self.client_port}",
            f"clientPortAddress={self.hosts[i].address}",
            "admin.enableServer=false",
            "4lw.commands.whitelist=*",
            "maxClientCnxns=0",
            f"minSessionTimeout={2 * self.tick_ms}",
            f"maxSessionTimeout={120 * self.tick_ms}",
            "autopurge.snapRetainCount=3",
            "autopurge.purgeInterval=1",
            *(f"server.{j}={host.address}:{QUORUM_PORT}:{ELECTION_PORT}" for j, host in self.hosts.items()),
        ]
        config = self.server_dir(i) / "zoo.cfg"
        config.write_text("# written by chaos.zookeeper; rewritten at every start\n"
                          + "\n".join(lines) + "\n")
        return config

    def _spawn(self, i: int, java: str, classpath: str) -> None:
        self._killed.discard(i)
        config = self._write_config(i)
        argv = self.hosts[i].argv(java, *_JVM_FLAGS, "-Dorg.slf4j.simpleLogger.showDateTime=true",
                                  "-Dzookeeper.jmx.log4j.disable=true", "-cp", classpath, MAIN_CLASS,
                                  str(config))
        preexec = die_with_parent if threading.current_thread() is threading.main_thread() else None
        with open(self.log_path(i), "ab") as log_file:
            log_file.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(argv)}\n".encode())
            log_file.flush()
            self._processes[i] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_file,
                                                  stderr=log_file, cwd=self.server_dir(i),
                                                  start_new_session=True, preexec_fn=preexec)
        logger.info("[zookeeper] server %d started (pid %d) on %s", i, self._processes[i].pid,
                    self.hosts[i].address)
