"""The local stack: a ZooKeeper server and a broker registered in it, started and stopped together.

``run_stack(argv)`` (``hpbroker up``; also ``python -m hpbroker.stack``):

1. starts a managed ZooKeeper (``hpbroker.coord.server``) on 127.0.0.1, its configuration, data
   and log under ``<data-dir>/zookeeper``, on ``--zookeeper-port`` (0: a free port), and waits
   until a client connects; or, with ``--zookeeper host:port,...[/chroot]``, joins that ensemble
   instead and starts none;
2. starts the broker, ``hpbroker serve`` as a child process, its data in ``<data-dir>/broker``
   and ZooKeeper given to it in ``HPBROKER_ZOOKEEPER``; the broker's other settings come from
   the flags here, then the usual environment and ``--config`` file;
3. waits until the broker's registration appears in ZooKeeper and prints where everything
   listens;
4. runs until SIGINT (Ctrl-C) or SIGTERM, or until the broker exits; then stops the broker
   (SIGTERM, SIGKILL after its graceful timeout and a margin) and then ZooKeeper (SIGTERM, then
   SIGKILL), in that order, so the broker leaves the registry cleanly.

**A managed ZooKeeper that dies is started again; the broker keeps serving meanwhile.**  Producing
and fetching never wait on ZooKeeper (the broker's membership lives on its own thread,
``hpbroker.coord.member``), so the stack does not stop when its ZooKeeper exits: it logs the exit
and starts the server again, on the same port and with the same data directory, after
:data:`RESTART_FIRST_DELAY_S`, doubling the pause after each attempt that does not come to serve
(the process exits, or does not answer within :data:`RESTART_TIMEOUT_S`) up to
:data:`RESTART_MAX_DELAY_S`, for as long as the stack runs; the pause goes back to the first one
once the server has served for :data:`RESTART_STABLE_S`.  ZooKeeper reloads its data, sessions
included: the broker's session reconnects by itself (or, if it expired, the broker registers in a
new one), and the stack logs when it sees the broker's registration again.  The main loop never
waits for any of this: a restart is a state it checks each turn (:class:`_ZooKeeperKeeper`).

The children run in their own process groups, so a Ctrl-C in the terminal reaches the stack only
and the stack decides the order; each also gets SIGTERM should the stack die
(``PR_SET_PDEATHSIG``).  A second signal while stopping is passed on to the broker, which then
kills its workers at once.  The broker's log goes to this process's stderr; ZooKeeper's to
``<data-dir>/zookeeper/zookeeper.log``.  Neither child inherits ``$NOTIFY_SOCKET`` or
``$WATCHDOG_*``: under a service manager they are meant for the stack, not for a broker that
would take them for its own.

Exit status: 0 after a stop on request; 1 when a part could not start, or the broker died; 2 for
an invalid setting (before anything starts).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from kazoo.exceptions import KazooException
from kazoo.interfaces import IAsyncResult

from hpbroker import __version__
from hpbroker.broker.config import BrokerConfig
from hpbroker.broker.logging_setup import LOG_FORMATS, setup_logging
from hpbroker.coord.paths import parse_connect_string
from hpbroker.coord.registry import BrokerRegistration, BrokerRegistry
from hpbroker.coord.server import ZooKeeperServer, die_with_parent
from hpbroker.coord.session import Session, connect
from hpbroker.errors import HPBrokerError, InvalidConfigError
from hpbroker.workers.notify import withhold_service_manager

__all__ = ["EXIT_ERROR", "EXIT_INVALID", "EXIT_OK", "RESTART_FIRST_DELAY_S", "RESTART_MAX_DELAY_S",
           "RESTART_STABLE_S", "RESTART_TIMEOUT_S", "run_stack"]

logger = logging.getLogger(__name__)

EXIT_OK = 0  # stopped on request
EXIT_ERROR = 1  # a part could not start, or the broker died
EXIT_INVALID = 2  # an invalid setting
DEFAULT_ZOOKEEPER_PORT = 2181
_READY_TIMEOUT_S = 60.0  # for the broker to recover its partitions and register
_STOP_MARGIN_S = 5.0  # beyond the broker's own graceful timeout, before SIGKILL
_POLL_S = 0.1
RESTART_FIRST_DELAY_S = 1.0  # from a managed ZooKeeper's exit to the first attempt to start it again
RESTART_MAX_DELAY_S = 30.0  # longest pause between attempts
RESTART_TIMEOUT_S = 60.0  # for a started server to serve (it may have a long transaction log to load)
RESTART_STABLE_S = 60.0  # serving this long puts the pause back to the first one
_PROBE_EVERY_S = 0.5  # how often a starting server is asked whether it serves
_REGISTRATION_WARN_S = 30.0  # ZooKeeper back this long without the broker's registration: a warning


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpbroker up", description="run ZooKeeper and a broker together until Ctrl-C or SIGTERM")
    parser.add_argument("--data-dir", default="data", metavar="DIR",
                        help="holds zookeeper/ and broker/ (default ./data)")
    parser.add_argument("--zookeeper", metavar="HOSTS",
                        help="join this ensemble (host:port,...[/chroot]) instead of starting a ZooKeeper")
    parser.add_argument("--zookeeper-port", type=int, default=DEFAULT_ZOOKEEPER_PORT, metavar="N",
                        help=f"client port of the managed ZooKeeper; 0 for a free one (default "
                             f"{DEFAULT_ZOOKEEPER_PORT})")
    parser.add_argument("--config", metavar="FILE", help="the broker's TOML file ([broker] and [log])")
    parser.add_argument("--host", help="address the broker binds and advertises")
    parser.add_argument("--port", type=int, help="the broker's ZeroMQ front-end port")
    parser.add_argument("--fetch-port", type=int, help="the broker's first TCP data port")
    parser.add_argument("--workers", type=int, help="the broker's I/O worker processes")
    parser.add_argument("--broker-id", type=int, help="the broker's id")
    parser.add_argument("--metrics-port", type=int, help="the broker's port for Prometheus (GET /metrics)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="logging threshold of the stack and the broker (default INFO)")
    parser.add_argument("--log-format", default="text", choices=LOG_FORMATS,
                        help="log lines of the stack and the broker: text (default), or json objects")
    return parser


class _Signals:
    """SIGINT and SIGTERM recorded for the main loop (the handler does nothing else)."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self._saved: dict[int, object] = {}

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._saved[signum] = signal.signal(signum, self._record)

    def restore(self) -> None:
        for signum, handler in self._saved.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._saved.clear()

    def _record(self, signum: int, frame: object) -> None:
        self.received.append(signum)


def run_stack(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (without the program name), run the stack, return the exit status."""
    args = _parser().parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    withhold_service_manager()  # from the children started from here on
    data_dir = Path(args.data_dir).absolute()
    flags = {"host": args.host, "port": args.port, "fetch_port": args.fetch_port, "workers": args.workers,
             "broker_id": args.broker_id, "metrics_port": args.metrics_port,
             "data_dir": str(data_dir / "broker")}
    try:
        config = BrokerConfig.load(args.config, **flags)  # checked now, before anything starts
        if args.zookeeper is not None:
            parse_connect_string(args.zookeeper)
        if not 0 <= args.zookeeper_port <= 65535:
            raise InvalidConfigError(f"--zookeeper-port must be in [0, 65535], got {args.zookeeper_port}")
    except InvalidConfigError as e:
        print(f"hpbroker up: invalid configuration: {e.message}", file=sys.stderr)
        return EXIT_INVALID
    signals = _Signals()
    signals.install()
    try:
        return _Stack(args, config, flags, signals).run()
    finally:
        signals.restore()


class _Stack:
    """One run of the stack (module docstring): start, watch, stop."""

    def __init__(self, args: argparse.Namespace, config: BrokerConfig, flags: dict,
                 signals: _Signals) -> None:
        self.args = args
        self.config = config
        self.flags = flags
        self.signals = signals
        self.server: ZooKeeperServer | None = None
        self.keeper: _ZooKeeperKeeper | None = None
        self.broker: subprocess.Popen[bytes] | None = None
        self.session: Session | None = None  # the stack's own, to see the broker's registration
        self.connect_string = args.zookeeper or ""
        self._awaiting: _AwaitRegistration | None = None

    def run(self) -> int:
        status = EXIT_ERROR
        try:
            if not self.args.zookeeper:
                self.server = ZooKeeperServer(Path(self.args.data_dir).absolute() / "zookeeper",
                                              port=self.args.zookeeper_port)
                self.server.start()
                self.keeper = _ZooKeeperKeeper(self.server)
                self.connect_string = self.server.connect_string
            if self.signals.received:
                return EXIT_OK
            self.broker = self._spawn_broker()
            registration = self._wait_registered()
            if registration is None:  # stopped while starting, or the broker did not come up
                return EXIT_OK if self.signals.received and self.broker.poll() is None else EXIT_ERROR
            self._announce(registration)
            status = self._watch()
            return status
        except HPBrokerError as e:
            logger.error("[stack] %s", e.message)
            return EXIT_ERROR
        finally:
            self._close_session()
            broker_status = self._stop_broker()
            self._stop_server()
            logger.info("[stack] stopped (broker exit status %s)", broker_status)

    # --- starting -------------------------------------------------------------------------------

    def _spawn_broker(self) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "hpbroker.cli", "serve", "--log-level", self.args.log_level,
                "--log-format", self.args.log_format]
        for name, value in self.flags.items():
            if value is not None:
                argv += [f"--{name.replace('_', '-')}", str(value)]
        if self.args.config:
            argv += ["--config", self.args.config]
        env = {**os.environ, "HPBROKER_ZOOKEEPER": self.connect_string}
        broker = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                                  preexec_fn=die_with_parent)
        logger.info("[stack] started the broker, pid %d: %s", broker.pid, " ".join(argv[1:]))
        return broker

    def _wait_registered(self) -> BrokerRegistration | None:
        """The broker's registration once it appears; None if the broker exits or a signal
        comes first."""
        assert self.broker is not None
        deadline = time.monotonic() + _READY_TIMEOUT_S
        timeout_s = self.config.zookeeper_session_timeout_ms / 1000
        self.session = connect(self.connect_string, session_timeout_s=timeout_s, name="stack")
        registry = BrokerRegistry(self.session)
        while not self.signals.received:
            if self.keeper is not None:
                self.keeper.tick(time.monotonic())
            try:
                registration = registry.get(self.config.broker_id)
            except KazooException as e:  # connection trouble: the session reconnects
                logger.warning("[stack] reading the broker's registration: %r", e)
                registration = None
            if registration is not None:
                return registration
            if self.broker.poll() is not None:
                logger.error("[stack] the broker exited with status %d before registering",
                             self.broker.returncode)
                return None
            if time.monotonic() > deadline:
                logger.error("[stack] the broker did not register in ZooKeeper within %g s",
                             _READY_TIMEOUT_S)
                return None
            time.sleep(_POLL_S)
        return None

    def _announce(self, registration: BrokerRegistration) -> None:
        assert self.broker is not None
        ports = registration.data_ports
        data_ports = f"{ports[0]}..{ports[-1]}" if len(ports) > 1 else str(ports[0])
        if self.server is not None:
            zookeeper = (f"{self.server.connect_string} (pid {self.server.pid}; data and log in "
                         f"{self.server.directory})")
        else:
            zookeeper = f"{self.connect_string} (external)"
        metrics_host = self.config.metrics_host or registration.host
        metrics_url = (f"http://{metrics_host}:{self.config.metrics_port}/metrics"
                       if self.config.metrics_port else None)
        metrics = f"  metrics    {metrics_url} (Prometheus)\n" if metrics_url else ""
        print(f"hpbroker {__version__} stack up\n"
              f"  zookeeper  {zookeeper}\n"
              f"  broker {registration.broker_id}   tcp://{registration.host}:{registration.port} (ZeroMQ "
              f"front-end), data ports {data_ports} (TCP) (pid {self.broker.pid}; data in "
              f"{self.config.data_dir})\n"
              f"{metrics}"
              f"Ctrl-C or SIGTERM stops both.\n"
              f"{next_commands(f'{registration.host}:{registration.port}', metrics_url)}", flush=True)

    # --- running and stopping -------------------------------------------------------------------

    def _watch(self) -> int:
        """Until a signal (EXIT_OK) or the broker's exit (its own status, or EXIT_ERROR); a
        managed ZooKeeper that exits is started again (module docstring)."""
        assert self.broker is not None
        while not self.signals.received:
            if self.broker.poll() is not None:
                logger.error("[stack] the broker exited by itself with status %d", self.broker.returncode)
                return self.broker.returncode or EXIT_ERROR
            now = time.monotonic()
            if self.keeper is not None and self.keeper.tick(now) and self.session is not None:
                self._awaiting = _AwaitRegistration(self.session, BrokerRegistry(self.session),
                                                    self.config.broker_id, now)
            if self._awaiting is not None and self._awaiting.check(now):
                self._awaiting = None
            time.sleep(_POLL_S)
        logger.info("[stack] %s: stopping the broker, then ZooKeeper",
                    signal.Signals(self.signals.received[0]).name)
        return EXIT_OK

    def _close_session(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            session.close()

    def _stop_broker(self) -> int | None:
        broker, self.broker = self.broker, None
        if broker is None:
            return None
        if broker.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                broker.terminate()
            seen = len(self.signals.received)
            deadline = time.monotonic() + self.config.graceful_timeout_ms / 1000 + _STOP_MARGIN_S
            while broker.poll() is None and time.monotonic() < deadline:
                if len(self.signals.received) > seen:  # asked again: the broker kills its workers
                    seen = len(self.signals.received)
                    with contextlib.suppress(ProcessLookupError):
                        broker.terminate()
                time.sleep(0.02)
            if broker.poll() is None:
                logger.warning("[stack] the broker pid %d is still running: SIGKILL", broker.pid)
                broker.kill()
        return broker.wait()

    def _stop_server(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop()


def next_commands(bootstrap: str, metrics_url: str | None) -> str:
    """The end of the announcement: commands to try next against this stack, ready to paste
    (the programs as this Python installed them, the broker's real address)."""
    hpbroker, loadgen = _program("hpbroker", "hpbroker.cli"), _program("loadgen", "loadgen.cli")
    at = f"--bootstrap {bootstrap}"
    metrics = (f"  curl -s {metrics_url} | grep -E '^hpbroker_(produced|fetched)_records_total'"
               if metrics_url else "  (hpbroker up --metrics-port 9644 also serves Prometheus metrics)")
    return (f"Try, in another terminal:\n"
            f"  {hpbroker} topics create demo --partitions 4 {at}\n"
            f"  printf 'alice:hello\\nbob:world\\n' | {hpbroker} produce demo --key-separator : {at}\n"
            f"  {hpbroker} consume demo --from-beginning --max-records 2 {at}\n"
            f"  {loadgen} e2e --topic load --create-topic --partitions 4 --rate 10000 --duration 5 {at}\n"
            f"{metrics}")


def _program(name: str, module: str) -> str:
    """How to run the console script ``name`` of this installation: its bare name when the PATH
    finds this one, else its path (relative to the working directory when under it), else
    ``python -m module``."""
    script = Path(sys.executable).parent / name
    if not os.access(script, os.X_OK):
        return f"{sys.executable} -m {module}"
    found = shutil.which(name)
    if found is not None and Path(found).absolute() == script.absolute():
        return name
    try:
        return str(script.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(script)


class _ZooKeeperKeeper:
    """Starts the managed ZooKeeper again whenever it exits (module docstring).  Only the stack's
    main loop calls it, through :meth:`tick`, which waits at most one ``srvr`` probe, or up to 2 s
    to stop a launched process that did not serve in time.

    States: *serving* (``down_since`` is None and no attempt is under way), *down* (waiting
    until ``next_attempt_at``) and *starting* (``starting_until`` is set: a launched process
    that does not serve yet).  ``server.process`` is always the latest process, so stopping the
    stack stops whichever one runs."""

    def __init__(self, server: ZooKeeperServer) -> None:
        self.server = server
        self.delay_s = RESTART_FIRST_DELAY_S
        self.serving_since = time.monotonic()
        self.down_since: float | None = None
        self.next_attempt_at = 0.0
        self.starting_until: float | None = None
        self.next_probe_at = 0.0
        self.attempts = 0  # since the last exit
        self.restarts = 0  # times it came back

    def tick(self, now: float) -> bool:
        """Advance the state; True on the turn the server serves again after an exit."""
        process = self.server.process
        if self.down_since is None:
            if process is not None and process.poll() is None:
                if now - self.serving_since >= RESTART_STABLE_S:
                    self.delay_s = RESTART_FIRST_DELAY_S
                return False
            self.down_since, self.attempts = now, 0
            self.next_attempt_at = now + self.delay_s
            status = None if process is None else process.returncode
            logger.error("[stack] ZooKeeper pid %s on %s exited by itself (%s); the broker keeps serving "
                         "produce and fetch; starting ZooKeeper again in %g s, with the same data in %s",
                         None if process is None else process.pid, self.server.connect_string,
                         _describe_status(status), self.delay_s, self.server.directory)
            return False
        if self.starting_until is None:
            if now >= self.next_attempt_at:
                self._launch(now)
            return False
        assert process is not None
        if process.poll() is not None:
            self._failed(now, f"it exited ({_describe_status(process.returncode)})")
        elif now >= self.next_probe_at:
            self.next_probe_at = now + _PROBE_EVERY_S
            if self.server.serving():
                down_s = now - self.down_since
                self.down_since = self.starting_until = None
                self.serving_since = now
                self.restarts += 1
                logger.warning("[stack] ZooKeeper serves again on %s, pid %d, after %.1f s down "
                               "(attempt %d; restart %d of this stack)", self.server.connect_string,
                               process.pid, down_s, self.attempts, self.restarts)
                return True
            if now >= self.starting_until:
                self.server.stop(timeout_s=2.0)
                self._failed(now, f"it did not serve within {RESTART_TIMEOUT_S:g} s")
        return False

    def _launch(self, now: float) -> None:
        self.attempts += 1
        try:
            self.server.launch()
        except HPBrokerError as e:
            self._failed(now, e.message)
            return
        self.starting_until = now + RESTART_TIMEOUT_S
        self.next_probe_at = now + _PROBE_EVERY_S
        logger.info("[stack] starting ZooKeeper again on %s (attempt %d), pid %d", self.server.connect_string,
                    self.attempts, self.server.pid)

    def _failed(self, now: float, why: str) -> None:
        self.starting_until = None
        self.delay_s = min(self.delay_s * 2, RESTART_MAX_DELAY_S)
        self.next_attempt_at = now + self.delay_s
        logger.error("[stack] ZooKeeper attempt %d to start again failed: %s; next attempt in %g s; its log "
                     "(%s) ends:\n%s", self.attempts, why, self.delay_s, self.server.log_path,
                     self.server.log_tail(5))


class _AwaitRegistration:
    """After ZooKeeper came back: looks (without waiting) for the broker's registration, and logs
    once it is there again, or a warning while it is not."""

    def __init__(self, session: Session, registry: BrokerRegistry, broker_id: int, since: float) -> None:
        self.session = session
        self.path = registry.paths.broker(broker_id)
        self.broker_id = broker_id
        self.since = since
        self.pending: IAsyncResult | None = None
        self.next_look_at = since
        self.warned = False

    def check(self, now: float) -> bool:
        """True once the registration has been seen."""
        if self.pending is not None and self.pending.ready():
            if self.pending.successful() and self.pending.value is not None:
                logger.info("[stack] broker %d is registered in ZooKeeper again (%.1f s after ZooKeeper "
                            "came back)", self.broker_id, now - self.since)
                return True
            self.pending = None
        if self.pending is None and now >= self.next_look_at:
            self.next_look_at = now + _PROBE_EVERY_S
            self.pending = self.session.client.exists_async(self.path)
        if not self.warned and now - self.since >= _REGISTRATION_WARN_S:
            self.warned = True
            logger.warning("[stack] broker %d is not registered in ZooKeeper %g s after ZooKeeper came "
                           "back (%s)", self.broker_id, _REGISTRATION_WARN_S, self.path)
        return False


def _describe_status(status: int | None) -> str:
    if status is None:
        return "status unknown"
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_stack(sys.argv[1:]))
