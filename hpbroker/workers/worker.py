"""The I/O worker process: :func:`run_worker`, called by the arbiter in a forked child.

A worker owns the partitions of its slot (``hpbroker.workers.ownership``).  It opens (and so
recovers) their logs, connects a DEALER to the arbiter's backend ROUTER with the routing id
``backend.worker_identity(slot)``, says ``{"op": "ready"}`` and then runs one single-threaded event
loop until told to stop.  The loop polls four things with one ``zmq.Poller``:

- the DEALER: relayed requests (``hpbroker.workers.handlers``) and control messages (open
  partitions, apply a topic's new settings, delete a topic, the broker's security state for the
  data port, ``hpbroker.security.data_port``; each acknowledged with ``{"op": "ack", "id",
  "error"}``);
- a wake-up pipe, written by the flusher thread when a group commit is done and by the signal
  machinery (``signal.set_wakeup_fd``) when a signal arrives;
- the TCP data port (``hpbroker.workers.fetch_server``), through its epoll descriptor.  It
  serves from the first turn, before the arbiter's security state has arrived: a secured
  worker's data port answers every connection meanwhile with error 15 ("not ready", retriable)
  and closes it, never serving one it cannot check;
- the replica fetchers' connections to their leaders (``hpbroker.workers.replication``: one per
  partition this broker follows), registered anew each turn as they connect and reconnect;

and times out at the nearest deadline: a flush due (``PartitionLog.flush_deadline_ms``), a
produce or long-poll deadline, the next heartbeat, the next retention pass, a replication timer
(a follower's retry or reconnect, a leader's check of its followers' lag).  There is no busy
polling: with nothing to do the worker sleeps until a request, a flush or a deadline.  Every
deadline is on the monotonic clock (the flush deadline on the log's, ``hpbroker.io.log.monotonic_ms``),
so a step of the wall clock neither delays a group commit, and the acknowledgements waiting on
it, nor makes the loop spin.

Group commit (``hpbroker.workers.partitions``): appends happen on the loop; when a log's
``flush_due()`` says so the loop begins a flush job and the one flusher thread writes and
fdatasyncs it; when the thread wakes the loop, the loop applies the finished jobs in order and
answers the produce requests and long polls they made answerable.  A job without fdatasync
(``flush_fsync`` off) with none in flight before it is written on the loop itself, at once.  A
produce is acknowledged only after the flush that wrote its records, so an acknowledged record is
never lost.

Measurements (``hpbroker.workers.stats``): requests, errors, latencies, flush times and each
partition's counters are plain numbers on the loop; with ``metrics_port`` set, every heartbeat
also writes them to the slot's stats file, which the arbiter reads when it is scraped.

Signals (the handlers only set a flag; gunicorn's rule):

- SIGTERM, SIGINT: graceful stop.  Stop accepting on the data port, serve what the arbiter has
  already relayed, flush every log and answer the produce requests and long polls waiting on
  it, close every log cleanly (``clean-shutdown`` marker), finish sending what the data port
  owes its clients while time remains (80% of ``graceful_timeout_ms``), exit 0.  A SIGINT that
  was ignored when the worker started stays ignored (the arbiter arranges that, so a Ctrl-C
  reaches only the arbiter, which then stops its workers with SIGTERM).
- SIGQUIT, or the parent process gone (checked at every heartbeat): exit at once, nothing
  flushed (unacknowledged records may be lost; acknowledged ones are on disk).

Exit statuses (``hpbroker.workers.backend``): EXIT_OK after a stop; EXIT_BOOT_FAILED when the
backend could not be connected or the data port not served (a partition that cannot be opened
is answered with an error instead, ``hpbroker.workers.opening``), so the arbiter holds the
slot back with backoff instead of respawning it in a loop; 1 when the loop itself failed (a
bug: logged, logs closed).

Run standalone (for a manual test; the arbiter normally forks it)::

    python -m hpbroker.workers.worker --slot 0 --backend ipc:///tmp/hpb/backend.sock \\
        --run-dir /tmp/hpb --data-dir data orders:0 orders:1
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import zmq

from hpbroker import protocol
from hpbroker.broker.config import BrokerConfig
from hpbroker.broker.descriptors import DescriptorBudget
from hpbroker.broker.logging_setup import add_process_context, setup_logging
from hpbroker.errors import HPBrokerError, StorageError
from hpbroker.io.files import pread_full
from hpbroker.io.log import monotonic_ms
from hpbroker.io.producer_state import IssuedProducerIds
from hpbroker.security.data_port import DataPortGuard
from hpbroker.workers import backend, fetch_server, heartbeat
from hpbroker.workers.backend import EXIT_BOOT_FAILED, EXIT_OK, PartitionSpec
from hpbroker.workers.fetch_server import FetchServer
from hpbroker.workers.handlers import RequestHandler
from hpbroker.workers.opening import PartitionOpener
from hpbroker.workers.partitions import Flusher, PartitionSet
from hpbroker.workers.replication import Replication
from hpbroker.workers.replies import Reply, error_reply, with_payload_length
from hpbroker.workers.stats import WorkerStats, write_stats

__all__ = ["Worker", "main", "run_worker"]

logger = logging.getLogger(__name__)

# Relayed messages read per loop turn, so flushes and deadlines get their turn under load.
BACKEND_BATCH = 256
# Messages read from the backend on a graceful stop: what the arbiter relayed before it stopped.
STOP_DRAIN_MESSAGES = 100_000
# Share of graceful_timeout_ms the worker gives itself, so it is done before the arbiter's SIGKILL.
STOP_SHARE = 0.8
# Exit status when the event loop failed unexpectedly (neither EXIT_OK nor EXIT_BOOT_FAILED).
EXIT_LOOP_FAILED = 1

_GRACEFUL, _IMMEDIATE = "graceful", "immediate"
# Signals the arbiter may handle that mean nothing to a worker: the inherited handlers must go.
_IGNORED_SIGNALS = ("SIGHUP", "SIGUSR1", "SIGUSR2", "SIGTTIN", "SIGTTOU")
_DEFAULT_SIGNALS = ("SIGCHLD", "SIGWINCH")


def run_worker(slot: int, config: BrokerConfig, partitions: list[PartitionSpec], data_listener: socket.socket,
               backend_address: str, run_dir: str) -> int:
    """Run the worker of ``slot`` until it is stopped; returns its exit status.

    Call it in the forked child (it installs signal handlers and creates its ZeroMQ context), then
    ``os._exit`` with the status.  ``data_listener`` is the slot's bound, listening TCP socket
    (``config.fetch_port + slot``); ``backend_address`` the arbiter's backend ROUTER;
    ``run_dir`` where heartbeats go."""
    try:
        return Worker(slot, config, data_listener, backend_address, run_dir).run(partitions)
    except Exception:
        logger.exception("the worker failed")
        return EXIT_LOOP_FAILED


class Worker:
    """One worker process's state and event loop (see the module docstring)."""

    def __init__(self, slot: int, config: BrokerConfig, data_listener: socket.socket, backend_address: str,
                 run_dir: str) -> None:
        self._slot = slot
        self._config = config
        self._listener = data_listener
        self._backend_address = backend_address
        self._run_dir = run_dir
        self._stopping: str | None = None
        self._stop_started = 0.0
        self._ready = False
        self._parent_pid = os.getppid()
        self._wake_r = self._wake_w = -1
        self._context: zmq.Context | None = None
        self._backend: zmq.Socket | None = None
        self._heartbeat_interval_s = config.heartbeat_interval_ms / 1000
        self._next_heartbeat = self._next_maintenance = 0.0
        self._flusher = Flusher()
        self._stats = WorkerStats()
        self._stats_failing = False  # the last stats file write failed (logged once)
        self._heartbeat_failing = False  # the last heartbeat content write failed (logged once)
        # Data-port security (hpbroker.security.data_port): the state comes in the "security" control
        # message; until then a secured worker's data port answers every connection "not ready" (15).
        self._guard = DataPortGuard(config.fetch_token_lifetime_ms) if config.security == "curve" else None
        self._partitions = PartitionSet(config.data_dir, config.log, self._flusher, self._stats,
                                        producer_id_issued=IssuedProducerIds(config.data_dir))
        self._replication = Replication(config.broker_id, self._partitions, self._send_control,
                                        fetch_max_bytes=config.replica_fetch_max_bytes,
                                        fetch_wait_max_ms=config.replica_fetch_wait_max_ms,
                                        token=self._replica_token())
        self._handler = RequestHandler(self._partitions, self._stats, max_wait_ms=config.fetch_max_wait_ms,
                                       replication=self._replication)
        self._server: FetchServer | None = None

    # --- boot ----------------------------------------------------------------------------------

    def run(self, specs: Sequence[PartitionSpec]) -> int:
        add_process_context(f"worker={self._slot}")
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._flusher.start(self._wake_w)
        self._install_signal_handlers()
        self._write_heartbeat()
        if not self._boot(specs):
            self._flusher.shutdown(wait=False)
            return EXIT_BOOT_FAILED
        status = EXIT_OK
        try:
            self._loop()
        except Exception:
            logger.exception("the event loop failed; stopping")
            status, self._stopping = EXIT_LOOP_FAILED, _GRACEFUL
        if self._stopping == _IMMEDIATE:
            self._stop_at_once()
        else:
            self._stop_gracefully()
        return status

    def _boot(self, specs: Sequence[PartitionSpec]) -> bool:
        started = time.monotonic()
        # A partition that cannot be opened (descriptors, a disk error) answers with an error;
        # the worker serves the others (hpbroker.workers.opening).
        budget = DescriptorBudget.current(self._config.max_connections)
        PartitionOpener(self._partitions, budget).open_all(specs)
        try:
            self._context = zmq.Context()
            self._backend = self._context.socket(zmq.DEALER)
            self._backend.setsockopt(zmq.ROUTING_ID, backend.worker_identity(self._slot))
            self._backend.setsockopt(zmq.SNDHWM, 0)  # never drop or block on a response
            self._backend.setsockopt(zmq.LINGER, 0)  # set again on a graceful stop
            self._backend.connect(self._backend_address)
            self._server = FetchServer(self._listener, self._handler,
                                       max_connections=self._config.max_connections,
                                       max_request_bytes=min(self._config.max_request_bytes,
                                                             protocol.DATA_PORT_MAX_REQUEST_BYTES),
                                       max_idle_s=self._config.connections_max_idle_ms / 1000,
                                       guard=self._guard,
                                       tokens_required=self._config.data_port_auth == "token",
                                       first_request_deadline_s=fetch_server.FIRST_REQUEST_DEADLINE_S)
        except (zmq.ZMQError, OSError) as e:
            logger.error("cannot connect to the arbiter at %s or serve the data port: %s",
                         self._backend_address, e)
            self._partitions.close_all()
            if self._context is not None:
                self._context.destroy(linger=0)
            return False
        self._send_control("ready", slot=self._slot, pid=os.getpid())
        self._ready = True
        self._write_heartbeat()
        now = time.monotonic()
        self._next_heartbeat = now + self._heartbeat_interval_s
        self._next_maintenance = now + self._config.retention_check_interval_ms / 1000
        logger.info("ready: %d partitions open in %.3f s, data port %s, backend %s", len(self._partitions),
                    now - started, self._listener.getsockname(), self._backend_address)
        return True

    def _install_signal_handlers(self) -> None:
        for name in _IGNORED_SIGNALS:
            signal.signal(getattr(signal, name), signal.SIG_IGN)
        for name in _DEFAULT_SIGNALS:
            signal.signal(getattr(signal, name), signal.SIG_DFL)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGQUIT, self._on_signal)
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # the Unix rule: ignored stays ignored
            signal.signal(signal.SIGINT, self._on_signal)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        """Only sets a flag (the wake-up fd has already woken the loop)."""
        if signum == signal.SIGQUIT:
            self._stopping = _IMMEDIATE
        elif self._stopping is None:
            self._stopping = _GRACEFUL
            self._stop_started = time.monotonic()

    # --- the loop ------------------------------------------------------------------------------

    def _loop(self) -> None:
        assert self._backend is not None and self._server is not None
        poller = zmq.Poller()
        poller.register(self._backend, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        poller.register(self._server.fileno(), zmq.POLLIN)
        backend_socket, wake_r, server = self._backend, self._wake_r, self._server
        server_fd = server.fileno()
        partitions, replication = self._partitions, self._replication
        fetchers: dict[int, tuple[Any, int]] = {}  # fd -> (replica fetcher, events registered)
        while self._stopping is None:
            if fetchers or replication.active:
                fetchers = _register_fetchers(poller, fetchers, replication.fetchers())
            for target, _events in poller.poll(self._poll_timeout_ms()):
                if target is backend_socket:
                    self._read_backend(BACKEND_BATCH)
                elif target == wake_r:
                    _drain(wake_r)
                elif target == server_fd:
                    server.process_events()
                elif target in fetchers:
                    replication.process(fetchers[target][0])
            partitions.complete_done_flushes()
            partitions.flush_due()
            now = time.monotonic()
            replication.tick(now)
            partitions.deadlines.expire(now)
            partitions.resume_writes(now)
            server.close_idle(now)
            if now >= self._next_heartbeat:
                self._on_heartbeat(now)
            if now >= self._next_maintenance:
                self._next_maintenance = now + self._config.retention_check_interval_ms / 1000
                partitions.maintain()

    def _poll_timeout_ms(self) -> int:
        now = time.monotonic()
        wake_at = min(self._next_heartbeat, self._next_maintenance)
        for deadline in (self._partitions.deadlines.next_deadline(), self._partitions.next_resume_at(),
                         self._replication.next_deadline()):
            if deadline is not None:
                wake_at = min(wake_at, deadline)
        timeout_ms = (wake_at - now) * 1000
        flush_at_ms = self._partitions.next_flush_deadline_ms()
        if flush_at_ms is not None:
            timeout_ms = min(timeout_ms, flush_at_ms - monotonic_ms())  # the log's clock: never stepped
        return max(0, math.ceil(timeout_ms))

    def _on_heartbeat(self, now: float) -> None:
        self._next_heartbeat = now + self._heartbeat_interval_s
        if os.getppid() != self._parent_pid:
            logger.error("the arbiter (pid %d) is gone; exiting at once", self._parent_pid)
            self._stopping = _IMMEDIATE
            return
        self._write_heartbeat()

    def _write_heartbeat(self) -> None:
        """The heartbeat file and, when the broker serves metrics, the stats file next to it.
        Each failure is its own: one that cannot write its stats still heartbeats, and one that
        cannot write its heartbeat's content (a full disk) still touches its mtime, so the
        arbiter sees it alive (``hpbroker.workers.heartbeat``).  Each failure is logged once,
        then again only after it worked again."""
        try:
            error = heartbeat.write_heartbeat(self._run_dir, self._slot, ready=self._ready,
                                              partitions=self._partitions.heartbeat_entries())
        except OSError as e:
            logger.warning("cannot write or touch the heartbeat in %s: %s", self._run_dir, e)
        else:
            if error is not None and not self._heartbeat_failing:
                logger.warning("cannot write the heartbeat's content in %s (%s): touching its mtime "
                               "instead, so the worker stays alive; metadata shows its offsets as of "
                               "the last write meanwhile", self._run_dir, error)
            elif error is None and self._heartbeat_failing:
                logger.info("writing the heartbeat in %s works again", self._run_dir)
            self._heartbeat_failing = error is not None
        if not self._config.metrics_port:
            return
        try:
            connections = self._server.connection_count if self._server is not None else 0
            snapshot = self._stats.snapshot(self._slot, self._partitions, connections)
            write_stats(self._run_dir, self._slot, snapshot)
        except OSError as e:
            logger.log(logging.DEBUG if self._stats_failing else logging.WARNING,
                       "cannot write the stats file in %s (the metrics endpoint shows none of this "
                       "worker's figures meanwhile): %s", self._run_dir, e)
            self._stats_failing = True
        else:
            if self._stats_failing:
                logger.info("writing the stats file in %s works again", self._run_dir)
            self._stats_failing = False

    # --- the backend ---------------------------------------------------------------------------

    def _read_backend(self, limit: int) -> None:
        assert self._backend is not None
        for _ in range(limit):
            try:
                frames = self._backend.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                message = backend.decode(frames)
            except Exception as e:  # ValueError says what; anything else is a bug, still not fatal
                logger.warning("dropped a backend message: %s", e)
                continue
            if isinstance(message, backend.Relay):
                client = message.client
                self._handler.handle_relayed(message.frames, partial(self._send_reply, client), client)
            else:
                self._on_control(message)
            if self._flusher.has_done:  # keep the flusher busy and acks prompt under a stream
                self._partitions.complete_done_flushes()

    def _send_reply(self, client: bytes, reply: Reply) -> None:
        """The responder of a relayed request: the reply goes back to the arbiter for ``client``;
        a file slice is read into the payload frame here."""
        frames: list[Any] = [backend.RELAY, client, reply.head]
        if reply.file_slice is not None:
            file_slice = reply.file_slice
            try:
                data = pread_full(file_slice.fd, file_slice.length, file_slice.position)
            except OSError as e:
                error = StorageError(f"reading {file_slice.length} bytes at position {file_slice.position} "
                                     f"of {file_slice.path} failed: {e}")
                frames[2] = error_reply(reply.api_key, reply.correlation_id, error,
                                        version=reply.api_version).head
                reply.error_code, reply.file_slice = error.code, None  # what the client gets, for the stats
            else:
                if len(data) != file_slice.length:
                    frames[2] = with_payload_length(reply.head, len(data))
                if data:
                    frames.append(data)
        elif reply.payload:
            frames.append(reply.payload)
        self._send(frames)

    def _send(self, frames: list[Any]) -> None:
        assert self._backend is not None
        try:
            self._backend.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as e:  # zmq.Again cannot happen with SNDHWM 0, but never block the loop
            logger.warning("dropped a message to the arbiter: %s", e)

    def _send_control(self, op: str, **body: Any) -> None:
        self._send(backend.encode_control(op, **body))

    def _on_control(self, message: backend.Control) -> None:
        body = message.body
        try:
            if message.op == "open":
                errors = self._open_partitions(body.get("partitions"))
            elif message.op == "delete":
                topic = body.get("topic")
                if not isinstance(topic, str):
                    raise ValueError(f"delete needs a topic name, got {topic!r}")
                self._replication.forget_topic(topic)
                errors = self._partitions.delete_topic(topic)
            elif message.op == "configure":
                topic, config = body.get("topic"), body.get("config")
                if not isinstance(topic, str) or not isinstance(config, dict):
                    raise ValueError(f"configure needs a topic name and its settings, got {body!r}")
                errors = self._partitions.configure(topic, config)
            elif message.op == "remove":
                topic, partitions = body.get("topic"), body.get("partitions")
                if not isinstance(topic, str) or not isinstance(partitions, list) \
                        or not all(isinstance(p, int) for p in partitions):
                    raise ValueError(f"remove needs a topic name and partitions, got {body!r}")
                errors = []
                for number in partitions:
                    with contextlib.suppress(HPBrokerError):  # not open here: nothing to forget
                        self._replication.forget(self._partitions.get(topic, number))
                    errors += self._partitions.remove(topic, number)
            elif message.op == "replica_role":
                errors = self._replication.apply_role(body)
            elif message.op == "security":
                errors = self._update_security(body)
            else:
                raise ValueError(f"unknown control op {message.op!r}")
        except Exception as e:
            shown = body if message.op != "security" else "(security state not shown: it holds the token key)"
            logger.exception("control %s %r failed", message.op, shown)
            errors = [f"{type(e).__name__}: {e}"]
        self._send_control("ack", id=body.get("id"), error="; ".join(errors) if errors else None)
        self._next_heartbeat = 0.0  # tell the arbiter the new offsets soon

    def _replica_token(self) -> Callable[[], tuple[str, int] | None] | None:
        """What this broker's replica fetches authenticate with on their leaders' data ports: a
        token the worker mints for the broker's own principal (None: security is off).  With
        ``data_port_auth = "loopback"`` too: replica fetches always need one."""
        if self._guard is None:
            return None
        return self._guard.mint_own

    def _update_security(self, body: dict[str, Any]) -> list[str]:
        if self._guard is None:
            logger.warning("ignored a security state: this broker runs with security = %r",
                           self._config.security)
            return []
        self._guard.update({k: v for k, v in body.items() if k != "id"})
        return []

    def _open_partitions(self, specs: Any) -> list[str]:
        if not isinstance(specs, list):
            raise ValueError(f"open needs a list of partition specs, got {specs!r}")
        errors, parsed = [], []
        for obj in specs:
            try:
                parsed.append(PartitionSpec.from_json(obj))
            except ValueError as e:
                logger.error("cannot open partition %r: %s", obj, e)
                errors.append(f"{obj!r}: {e}")
        opener = PartitionOpener(self._partitions, DescriptorBudget.current(self._config.max_connections))
        return errors + opener.open_all(parsed)

    # --- stopping ------------------------------------------------------------------------------

    def _stop_gracefully(self) -> None:
        assert self._backend is not None and self._context is not None and self._server is not None
        started = self._stop_started or time.monotonic()
        deadline = started + STOP_SHARE * self._config.graceful_timeout_ms / 1000
        logger.info("stopping: flushing %d partitions", len(self._partitions))
        self._server.stop_accepting()
        self._read_backend(STOP_DRAIN_MESSAGES)  # what the arbiter relayed before it stopped relaying
        self._server.stop_reading()
        self._replication.close()
        self._partitions.complete_done_flushes()
        self._partitions.close_all()
        self._flusher.shutdown(wait=True)
        while self._server.has_output and time.monotonic() < deadline:
            self._server.process_events(max(0.0, min(0.1, deadline - time.monotonic())))
        self._server.close()
        linger_ms = max(100, int((deadline - time.monotonic()) * 1000))
        self._backend.close(linger=linger_ms)
        self._context.term()
        logger.info("stopped in %.3f s", time.monotonic() - started)

    def _stop_at_once(self) -> None:
        """Nothing flushed, nothing closed cleanly: the caller exits the process right away."""
        logger.warning("stopping at once, without flushing")
        self._flusher.shutdown(wait=False)
        if self._context is not None:
            self._context.destroy(linger=0)


def _register_fetchers(poller: zmq.Poller, registered: dict[int, tuple[Any, int]],
                       fetchers: list[Any]) -> dict[int, tuple[Any, int]]:
    """Bring the poll's registrations of the replica fetchers' sockets up to date (a fetcher's
    descriptor changes with each reconnect, and it wants POLLOUT only with output queued or a
    connect under way); returns the new ``fd -> (fetcher, events)``."""
    current: dict[int, tuple[Any, int]] = {}
    for fetcher in fetchers:
        fd = fetcher.fileno()
        if fd >= 0:
            current[fd] = (fetcher, zmq.POLLIN | (zmq.POLLOUT if fetcher.wants_write else 0))
    for fd in registered.keys() - current.keys():
        poller.unregister(fd)
    for fd, (_fetcher, events) in current.items():
        if registered.get(fd, (None, 0))[1] != events or fd not in registered:
            poller.register(fd, events)
    return current


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m hpbroker.workers.worker``: one worker without an arbiter (binds its own data
    port), for manual tests against a hand-made backend ROUTER."""
    parser = argparse.ArgumentParser(prog="python -m hpbroker.workers.worker", description=main.__doc__)
    parser.add_argument("--slot", type=int, default=0)
    parser.add_argument("--config", help="broker TOML file")
    parser.add_argument("--data-dir")
    parser.add_argument("--fetch-port", type=int, help="first data port; this worker binds fetch_port + slot")
    parser.add_argument("--backend", required=True, help="the arbiter's backend address, e.g. ipc:///tmp/b.sock")
    parser.add_argument("--run-dir", required=True, help="where the heartbeat file goes")
    parser.add_argument("partitions", nargs="*", metavar="TOPIC:PARTITION")
    args = parser.parse_args(argv)
    setup_logging("INFO")
    config = BrokerConfig.load(args.config, data_dir=args.data_dir, fetch_port=args.fetch_port)
    specs = []
    for text in args.partitions:
        topic, _, number = text.rpartition(":")
        if not topic or not number.isdigit():
            parser.error(f"{text!r} is not TOPIC:PARTITION")
        specs.append(PartitionSpec(topic, int(number)))
    listener = socket.create_server((config.host, config.fetch_port + args.slot), reuse_port=False)
    os._exit(run_worker(args.slot, config, specs, listener, args.backend, args.run_dir))


if __name__ == "__main__":
    main()
