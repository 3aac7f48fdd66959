"""A managed ZooKeeper server: one standalone ZooKeeper as a child process, for the local stack and
the tests.

``ZooKeeperServer(directory).start()`` writes ``<directory>/zoo.cfg``, keeps ZooKeeper's data in
``<directory>/data`` and its log in ``<directory>/zookeeper.log``, starts
``java ... org.apache.zookeeper.server.quorum.QuorumPeerMain zoo.cfg`` (standalone, since the
configuration names no other server) and returns once a ZooKeeper client has connected; the
server binds 127.0.0.1 only, on ``port`` or, with 0, on a free port.  :meth:`~ZooKeeperServer.stop`
sends SIGTERM, waits up to a deadline, then SIGKILL.

For a supervisor that must not block (the local stack, ``hpbroker.stack``): once started, a server
that died is started again by :meth:`~ZooKeeperServer.launch`, on the same port and with the same
data (ZooKeeper reloads its snapshot and transaction log, sessions included, so clients that
reconnect within their session timeout keep their sessions and ephemeral nodes), which returns at
once; :meth:`~ZooKeeperServer.serving` then probes it with ZooKeeper's ``srvr`` command.

Where ZooKeeper comes from: ``$ZOOKEEPER_HOME`` when set (an Apache release: ``lib/*.jar`` and
``conf/`` for its logging configuration), else Debian's ``zookeeper`` package
(``/usr/share/java/zookeeper.jar``, whose manifest names its dependencies, plus
``slf4j-simple.jar`` when present so that the server's log is written).  Java is
``$JAVA_HOME/bin/java`` or ``java`` on the PATH.  What is missing is a
:class:`~hpbroker.errors.CoordinationError` that says what to install.

Not a production deployment: one server, no replication, no authentication, loopback only.
The four-letter-word commands are on (``4lw.commands.whitelist=*``, for ``ruok``/``srvr`` and
kazoo's ``server_version``) and the admin HTTP server off.

The process is asked to receive SIGTERM should the thread that started it die
(``PR_SET_PDEATHSIG``), so a crashed parent does not leave a server behind: start it from a
thread that outlives it (the main thread).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from hpbroker.errors import CoordinationError

__all__ = ["DEBIAN_JAR_DIR", "MAIN_CLASS", "ZooKeeperServer", "die_with_parent", "find_java",
           "zookeeper_classpath"]

logger = logging.getLogger(__name__)
# The readiness probe's client: its refused and dropped connections while the server boots are
# expected, so only its errors are worth a line.
_PROBE_LOGGER = logging.getLogger(__name__ + ".probe")
_PROBE_LOGGER.setLevel(logging.ERROR)

MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
DEBIAN_JAR_DIR = Path("/usr/share/java")  # Debian's zookeeper package puts its jars here
_CONFIG_NAME = "zoo.cfg"
_LOG_NAME = "zookeeper.log"
_DATA_NAME = "data"
_TICK_MS = 500  # ZooKeeper's time unit: sessions may last 2 to 120 ticks (1 s to 60 s)
_JVM_FLAGS = ("-Xms16m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
              "-Djava.awt.headless=true")  # small and quick to start: a development server
_PR_SET_PDEATHSIG = 1


def find_java() -> str:
    """The java executable: ``$JAVA_HOME/bin/java``, else ``java`` on the PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK):
        return os.path.join(java_home, "bin", "java")
    found = shutil.which("java")
    if found is None:
        raise CoordinationError("cannot start ZooKeeper: no java on the PATH and no $JAVA_HOME "
                                "(on Debian: apt-get install default-jre-headless)")
    return found


def zookeeper_classpath() -> str:
    """The class path of ZooKeeper's server (module docstring: where it comes from)."""
    home = os.environ.get("ZOOKEEPER_HOME")
    if home:
        jars = sorted(Path(home).glob("lib/*.jar")) + sorted(Path(home).glob("*.jar"))
        if not any(jar.name.startswith("zookeeper-") for jar in jars):
            raise CoordinationError(f"cannot start ZooKeeper: $ZOOKEEPER_HOME={home} holds no "
                                    "zookeeper-*.jar in lib/ (expected an Apache ZooKeeper release)")
        return os.pathsep.join([str(Path(home) / "conf"), *map(str, jars)])
    jar = DEBIAN_JAR_DIR / "zookeeper.jar"
    if not jar.is_file():
        raise CoordinationError(f"cannot start ZooKeeper: {jar} is missing (on Debian: apt-get install "
                                "zookeeper; or set $ZOOKEEPER_HOME to an Apache ZooKeeper release)")
    parts = [jar]
    binding = DEBIAN_JAR_DIR / "slf4j-simple.jar"  # the log goes nowhere without an SLF4J binding
    if binding.is_file():
        parts.append(binding)
    return os.pathsep.join(map(str, parts))


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


try:
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
except (OSError, AttributeError):  # pragma: no cover
    _PRCTL = None


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


#: ``preexec_fn`` for ``subprocess.Popen``: the child gets SIGTERM when the thread that started
#: it dies (None where the kernel offers no such thing).
die_with_parent = _die_with_parent if _PRCTL is not None else None


class ZooKeeperServer:
    """One standalone ZooKeeper process (module docstring).  Use as a context manager, or call
    :meth:`start` and :meth:`stop`."""

    def __init__(self, directory: str | os.PathLike[str], *, port: int = 0, host: str = "127.0.0.1",
                 tick_ms: int = _TICK_MS, jvm_flags: tuple[str, ...] = _JVM_FLAGS) -> None:
        self.directory = Path(directory).absolute()
        self.host = host
        self.port = port
        self.tick_ms = tick_ms
        self.jvm_flags = jvm_flags
        self.process: subprocess.Popen[bytes] | None = None
        self._chosen_port = port == 0

    @property
    def connect_string(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.directory / _CONFIG_NAME

    @property
    def log_path(self) -> Path:
        return self.directory / _LOG_NAME

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 30.0) -> ZooKeeperServer:
        """Start the server and wait until a client connects (CoordinationError if it does not
        within ``timeout_s``, or if the process exits; its log is then in the message)."""
        if self.process is not None:
            raise CoordinationError(f"ZooKeeper at {self.connect_string} is already started")
        java, classpath = find_java(), zookeeper_classpath()
        (self.directory / _DATA_NAME).mkdir(parents=True, exist_ok=True)
        for attempt in range(3):  # a port chosen here may be taken before ZooKeeper binds it
            if self._chosen_port:
                self.port = _free_port(self.host)
            self._write_config()
            self._spawn(java, classpath)
            try:
                self._wait_ready(time.monotonic() + timeout_s)
                logger.info("[zookeeper] server pid %d serving on %s, data in %s", self.pid,
                            self.connect_string, self.directory / _DATA_NAME)
                return self
            except CoordinationError:
                exited = self.process is not None and self.process.poll() is not None
                self.stop()
                if not (exited and self._chosen_port and "Address already in use" in self._log_tail()) \
                        or attempt == 2:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def launch(self) -> None:
        """Start the process again, on the port it had, and return at once without waiting for
        it to serve (module docstring).  CoordinationError when it is still running, or when java
        or ZooKeeper is missing."""
        if self.process is not None and self.process.poll() is None:
            raise CoordinationError(f"ZooKeeper at {self.connect_string} is still running (pid {self.pid})")
        self.process = None
        java, classpath = find_java(), zookeeper_classpath()
        (self.directory / _DATA_NAME).mkdir(parents=True, exist_ok=True)
        self._write_config()
        self._spawn(java, classpath)

    def serving(self, timeout_s: float = 0.5) -> bool:
        """Whether the process runs and answers ``srvr`` as a server that serves requests (one
        probe, at most about ``timeout_s`` for the connection and as much for each read)."""
        if self.process is None or self.process.poll() is not None:
            return False
        reply = b""
        try:
            with socket.create_connection((self.host, self.port), timeout=timeout_s) as probe:
                probe.sendall(b"srvr")
                while chunk := probe.recv(4096):
                    reply += chunk
        except OSError:
            return False
        return b"Mode: " in reply  # a server still loading its data answers "not currently serving"

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the server's log (``(no log)`` when it cannot be read)."""
        return self._log_tail(lines)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout_s``; the exit status (None if never started)."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("[zookeeper] server pid %d still running %g s after SIGTERM: SIGKILL",
                               process.pid, timeout_s)
                process.kill()
                process.wait()
        logger.info("[zookeeper] server pid %d stopped (exit status %d)", process.pid, process.returncode)
        return process.returncode

    # --- internals ------------------------------------------------------------------------------

    def _write_config(self) -> None:
        lines = [
            f"tickTime={self.tick_ms}",
            f"dataDir={self.directory / _DATA_NAME}",
            f"clientPort={self.port}",
            f"clientPortAddress={self.host}",
            "admin.enableServer=false",
            "4lw.commands.whitelist=*",
            "maxClientCnxns=0",
            f"minSessionTimeout={2 * self.tick_ms}",
            f"maxSessionTimeout={120 * self.tick_ms}",
            "autopurge.snapRetainCount=3",
            "autopurge.purgeInterval=1",
        ]
        self.config_path.write_text("# written by hpbroker.coord.server; rewritten at every start\n"
                                    + "\n".join(lines) + "\n")

    def _spawn(self, java: str, classpath: str) -> None:
        argv = [java, *self.jvm_flags, "-Dorg.slf4j.simpleLogger.showDateTime=true",
                "-Dzookeeper.jmx.log4j.disable=true", "-cp", classpath, MAIN_CLASS, str(self.config_path)]
        with open(self.log_path, "ab") as log_file:
            log_file.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(argv)}\n".encode())
            log_file.flush()
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                                            cwd=self.directory, start_new_session=True,
                                            preexec_fn=die_with_parent)

    def _wait_ready(self, deadline: float) -> None:
        """Until the port accepts connections, then until a ZooKeeper session is established."""
        from kazoo.client import KazooClient  # only here: the rest of this module needs no kazoo

        assert self.process is not None
        while not self._port_open():
            self._check_alive(deadline)
            time.sleep(0.05)
        retry = {"max_tries": -1, "delay": 0.05, "backoff": 1.5, "max_delay": 0.5}
        # A short session timeout, because kazoo waits that long for an answer on each connection:
        # a server still starting may refuse the session and leave the socket open (ZooKeeper 3.8
        # fails to close it), and a 10 s wait there made one start in six take 10 s.
        client = KazooClient(hosts=self.connect_string, timeout=2.0, connection_retry=retry,
                             logger=_PROBE_LOGGER)
        try:
            ready = client.start_async()
            while not ready.wait(0.1):
                self._check_alive(deadline)
        finally:
            client.stop()
            client.close()

    def _port_open(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def _check_alive(self, deadline: float) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise CoordinationError(f"ZooKeeper exited with status {self.process.returncode} while "
                                    f"starting on {self.connect_string}; its log ({self.log_path}) ends:\n"
                                    f"{self._log_tail()}")
        if time.monotonic() > deadline:
            raise CoordinationError(f"ZooKeeper did not accept a session on {self.connect_string} in time; "
                                    f"its log ({self.log_path}) ends:\n{self._log_tail()}")

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
