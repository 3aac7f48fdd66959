"""The arbiter: the broker's master process.  It forks and watches one I/O worker per slot and
relays client requests to them.

``Arbiter(config).run()`` returns the broker's exit status: :data:`EXIT_OK` after a graceful stop,
:data:`EXIT_ERROR` when it could not start (a port taken, ZooKeeper unreachable).  No worker slot
makes it exit: a slot that keeps dying or cannot boot is retried with backoff ("Crash loops").

**Start.**  Create the data directory and lock it (``.lock``, ``flock``; the lock's descriptor is
inherited by the workers, so a second broker cannot start on the directory while any process of
this one lives), load the topic store, make the run directory (``config.run_dir``, or
``<data_dir>/.run``, cleared of what a crashed predecessor left; a fresh short one under /tmp,
removed at exit, if that path is too long for ipc://), and create every slot's TCP data listening socket
(``fetch_port + slot``, SO_REUSEADDR) *before* forking, so a respawned worker takes over the same
socket and clients never see the port closed.  Then fork one worker per slot, and only then
create the ZeroMQ context and bind the front-end ROUTER (``tcp://host:port``) and the backend
ROUTER (``ipc://<run_dir>/backend.sock``; ``ROUTER_HANDOVER`` so a respawned worker takes over
its slot's identity, ``ROUTER_MANDATORY`` so a send to an absent worker fails instead of vanishing).

**Fork and ZeroMQ.**  A ZeroMQ context must not be used across ``fork``.  The first workers are
forked before the arbiter's context exists.  Respawns fork while it exists: the child never
touches it (nor any arbiter socket); it resets the signal handlers, closes the other slots'
listeners and every other inherited socket and anonymous-inode descriptor (the ZeroMQ context's
TCP, ipc, eventfd and epoll descriptors: a worker outliving a killed arbiter must not keep its
front-end port bound), keeps the data directory's lock, asks the kernel for SIGTERM should the
arbiter die (``PR_SET_PDEATHSIG``), calls the worker entry point, which makes its own context,
and leaves with ``os._exit`` whatever happens, so it never returns into arbiter code and runs no
``atexit`` handler (pyzmq's included).

**The loop.**  Single-threaded.  Signal handlers only enqueue the signal; ``signal.set_wakeup_fd``
makes the ZeroMQ poller (which also watches the front-end and the backend) return, and the loop
dispatches each signal to ``handle_<name>``.  Each turn it also checks heartbeats and deadlines
(:meth:`_tick`).

**Liveness.**  A serving worker whose heartbeat file (``hpbroker.workers.heartbeat``) has not
changed for ``worker_timeout_ms``, or a booting one not ready within ``worker_boot_timeout_ms``,
gets SIGABRT, then SIGKILL after :data:`KILL_GRACE_S`.  Both are measured on the monotonic clock
(``hpbroker.workers.liveness``): the arbiter notes when it last saw the heartbeat change, and
never compares the file's mtime with the wall clock, so a wall-clock step (NTP, an operator
setting the date) neither aborts live workers nor hides a hung one.  Children are reaped with
``waitpid(WNOHANG)`` on SIGCHLD (and on every turn, in case a signal came before its handler).
A slot is forked again only after its old process has been reaped: a partition never has two
writers.

**Crash loops.**  A slot that dies more than ``slots.RESTART_LIMIT`` times in
``slots.RESTART_WINDOW_S``, whose worker exits with ``EXIT_BOOT_FAILED`` (it could not connect
its backend or serve its data port: retrying at once would only fork in a loop), or that cannot
be forked, is held back (``SlotState.BACKOFF``) and forked again after a backoff of 1 s doubling
up to 60 s with each
further death (``hpbroker.workers.slots``).  Only its partitions are unavailable meanwhile:
requests for them are answered with error 15 saying that the slot is crash-looping and when it
is retried, metadata gives them error 15, and every other slot keeps serving.  The log says so
(ERROR), the metrics too (``hpbroker_worker_crashloop``, ``hpbroker_worker_backoff_seconds``,
``hpbroker_worker_backoffs_total``, ``/healthz`` 503) and the systemd status.  A retried worker
that reports ready serves at once; the backoff is forgotten once it has served 60 s without
dying.  Even when every slot crash-loops the broker stays up: it answers metadata (every
partition with error 15), reports itself unavailable, and keeps retrying.  With ZooKeeper, the
replicated partitions of a crash-looping slot are reported offline in the broker's registration
(``offline_partitions``) so that the controller moves their leadership and ISR membership to the
other replicas, and reported back once the retried worker has served ``BACKOFF_RESET_S`` without
dying (its probation: a slot that dies again soon after each retry does not move leadership
back and forth); a partition left without a leader meanwhile is reported back as soon as the
worker serves (docs/COORDINATION.md).

**ZooKeeper.**  With ``config.zookeeper`` set, the arbiter joins ZooKeeper once its first
workers are forked and its sockets bound: a :class:`~hpbroker.coord.member.BrokerMember`
registers the broker (an ephemeral node: id, host, ports, the topics and partitions it stores)
and publishes every topic's metadata; a broker that cannot do so within the session timeout does
not start.  The member's kazoo threads are started with the arbiter's signals blocked, so signals
still reach only the loop's thread, and they never touch the loop's state: each turn the loop
hands the member a snapshot when the topic store has changed (``TopicStore.version``), and the
member writes it on its own thread, re-registering after a session expiry.  Children forked
later never touch the member.  Stopping closes the session right after the workers are asked to
stop, so the broker leaves the registry when it stops accepting connections, not once they have
flushed.

**Producer ids.**  Once ZooKeeper is joined (or at once, standalone) the arbiter starts a
:class:`~hpbroker.coord.producer_ids.ProducerIdAllocator`: it takes a fresh block of ids (from
the ``producer-id-block`` znode, or ``<data_dir>/producer-id-block``), rewrites
``<data_dir>/producer-ids-issued`` from it, and fetches later blocks on a thread of its own
(started with the arbiter's signals blocked), so the front-end answers InitProducerId without
ever waiting: error 17 when no id is at hand.  A first block that cannot be taken does not stop
the broker; the allocator keeps trying.  It stops with the broker, before ZooKeeper is left.

**Metrics.**  With ``config.metrics_port`` set, a :class:`~hpbroker.workers.exporter.MetricsEndpoint`
binds the HTTP port during start (before the first fork: a port in use stops the broker, and
every worker closes the inherited socket like the others) and serves ``GET /metrics`` from a
daemon thread started once the first workers are forked, with the arbiter's signals blocked.  The
loop only hands it data: the slot table after every change of a slot's state, the topics when the
store changes, and the front-end's connection events; with ZooKeeper it also reads the consumer
groups' committed offsets on a thread of its own.  A scrape never waits on the loop, nor the loop
on a scrape.

**Service manager.**  Under systemd (``$NOTIFY_SOCKET``, ``hpbroker.workers.notify``) the loop
sends ``READY=1`` once every worker serves for the first time (sockets bound, ZooKeeper joined,
every partition recovered), or, when some slot crash-loops meanwhile, once every slot either
serves or is held back (the status then says "degraded" or "unavailable": a start does not wait
forever for a slot that cannot boot); ``STATUS=`` lines while recovering, after a respawn, while
a slot crash-loops and when serving again, ``STOPPING=1`` when a stop begins, and ``WATCHDOG=1``
every half ``$WATCHDOG_USEC``; until ``READY=1`` is sent, ``EXTEND_TIMEOUT_USEC`` keeps a long
recovery within the unit's start timeout (a start that hangs before the loop runs still hits it).

**Stop.**  SIGTERM or SIGINT: stop accepting connections and reading requests (responses still
flow back to the clients), SIGTERM every worker, reap them until ``graceful_timeout_ms``, then
SIGKILL the rest; close the sockets and exit 0.  A second SIGTERM or SIGINT, or SIGQUIT, kills
the workers at once.  Log lines start with ``[arbiter]``.

**Security** (``security = "curve"``, ``hpbroker.security.broker``, docs/SECURITY.md).  The
server key and the allowlist directory are read during start, before the first fork: a bad one
stops the broker (exit status 1, the error naming the file).  The ZAP handler (a thread of the
arbiter's ZeroMQ context) starts, and the front-end ROUTER becomes a CURVE server in its domain,
before the ROUTER binds: no connection is ever admitted that the allowlist did not admit.  The
rest -- the handler's death being fatal, SIGHUP reading the allowlist again, the cluster's token
key and the ACLs from ZooKeeper, the security state sent to every worker -- is
``hpbroker.workers.security_state``.  With ``data_port_auth = "loopback"`` the data ports bind
127.0.0.1 only.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import glob
import logging
import os
import shutil
import signal
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

import zmq

from hpbroker.broker.config import BrokerConfig
from hpbroker.broker.topics import TopicStore
from hpbroker.errors import HPBrokerError, InvalidConfigError
from hpbroker.io.files import lock_directory, make_directory
from hpbroker.security.broker import BrokerSecurity
from hpbroker.workers import backend
from hpbroker.workers.exporter import MetricsEndpoint, SlotView
from hpbroker.workers.frontend import Frontend
from hpbroker.workers.heartbeat import heartbeat_path
from hpbroker.workers.liveness import HeartbeatWatch
from hpbroker.workers.notify import ServiceNotifier
from hpbroker.workers.ownership import owner_slot
from hpbroker.workers.replication import UNSAFE_ACK_BEFORE_REPLICATION_ENV, unsafe_ack_before_replication
from hpbroker.workers.security_state import SecurityState, data_port_host
from hpbroker.workers.slots import (
    BACKOFF_MAX_S,
    BACKOFF_RESET_S,
    RESTART_LIMIT,
    RESTART_WINDOW_S,
    Slot,
    SlotState,
)
from hpbroker.workers.stats import stats_path

if TYPE_CHECKING:  # kazoo is loaded only by a broker configured with ZooKeeper
    from hpbroker.coord.broker_replication import BrokerReplication
    from hpbroker.coord.member import BrokerMember
    from hpbroker.coord.producer_ids import ProducerIdAllocator
    from hpbroker.coord.registry import BrokerRegistration, TopicRegistration
    from hpbroker.coord.zk_security import ZkCredentials

__all__ = ["EXIT_ERROR", "EXIT_OK", "KILL_GRACE_S", "Arbiter", "WorkerMain"]

logger = logging.getLogger(__name__)

EXIT_OK = 0  # stopped on request
EXIT_ERROR = 1  # could not start, or gave up
# The worker entry point: (slot, config, partitions, data_listener, backend_address, run_dir) -> status.
WorkerMain = Callable[[int, BrokerConfig, list[backend.PartitionSpec], socket.socket, str, str], int]

KILL_GRACE_S = 2.0  # between SIGABRT and SIGKILL for a silent worker
_POLL_MS = 100  # the longest the loop sleeps without looking at heartbeats and deadlines
_BATCH = 256  # messages taken from one socket before looking at the other
_MAX_IPC_PATH = 100  # bytes; sun_path is 108 on Linux
CURVE_IO_THREADS = 2  # the ZeroMQ context's I/O threads with security = "curve"
RUN_DIR_NAME = ".run"  # the default run directory, inside the data directory
_PR_SET_PDEATHSIG = 1  # prctl option: signal this process when its parent dies
_SIGNALS = {signal.SIGTERM: "term", signal.SIGINT: "int", signal.SIGQUIT: "quit", signal.SIGHUP: "hup",
            signal.SIGCHLD: "chld"}


class Arbiter:
    """The broker's master process (module docstring).  ``worker_main`` defaults to
    ``hpbroker.workers.worker.run_worker``, imported when :meth:`run` starts."""

    def __init__(self, config: BrokerConfig, *, worker_main: WorkerMain | None = None) -> None:
        self.config = config
        self._worker_main = worker_main
        self._slots = [Slot(i) for i in range(config.workers)]
        self._signal_queue: collections.deque[int] = collections.deque()
        self._wakeup: tuple[int, int] | None = None
        self._saved_handlers: dict[int, object] = {}
        self._saved_wakeup_fd = -1
        self._listeners: list[socket.socket] = []
        self._lock_fd = -1
        self._run_dir = ""
        self._own_run_dir = False
        self._backend_address = ""
        self._frontend: Frontend | None = None
        self._store: TopicStore | None = None
        self._member: BrokerMember | None = None  # ZooKeeper membership, when configured
        self._replication: BrokerReplication | None = None  # replicated topics' ZooKeeper side
        # the cluster snapshot replicated topics were last taken from, and the store's version then
        self._adopted_cluster: tuple[object, int] = (None, -1)
        self._member_version = -1  # the store version last handed to the member
        self._member_offline: dict[str, tuple[int, ...]] = {}  # the offline partitions last handed to it
        self._producer_ids: ProducerIdAllocator | None = None  # hands out producer ids, once started
        self._metrics: MetricsEndpoint | None = None  # the HTTP metrics endpoint, when configured
        self._metrics_version = -1  # the store version last handed to it
        self._context: zmq.Context | None = None
        self._front: zmq.Socket | None = None
        self._back: zmq.Socket | None = None
        self._front_endpoint = ""
        self._stopping = False
        self._stop_deadline = float("inf")
        self._exit_status = EXIT_OK
        self._pid = os.getpid()
        self._prctl: Callable[..., int] | None = None
        self._last_check = 0.0
        self._all_serving_logged = False
        self._notifier = ServiceNotifier()  # systemd's sd_notify, when $NOTIFY_SOCKET is set
        self._ready_notified = False
        self._started = False  # sockets bound and ZooKeeper joined: READY=1 may go
        self._slots_by_identity = {backend.worker_identity(s.index): s for s in self._slots}
        self._heartbeats: HeartbeatWatch | None = None  # once the run directory is known
        self._security: BrokerSecurity | None = None  # made in _setup, before any fork
        self._zk_credentials: ZkCredentials | None = None  # the cluster's, from zookeeper_credentials_file
        self._security_state: SecurityState | None = None  # the security's wiring, made in _setup

    # --- life cycle -------------------------------------------------------------------------------

    def run(self) -> int:
        """Start, serve until stopped, and return the exit status."""
        try:
            try:
                self._setup()
            except (OSError, HPBrokerError, ImportError) as e:
                logger.error("[arbiter] cannot start: %s", e)
                return EXIT_ERROR
            if unsafe_ack_before_replication():
                logger.error("[arbiter] %s=1 in the environment: this broker's leaders answer acks=all "
                             "produce requests at their own flush, before the in-sync replicas have the "
                             "records: acknowledged records can be lost when a leader changes.  A "
                             "test-only switch; never set it in production",
                             UNSAFE_ACK_BEFORE_REPLICATION_ENV)
            self._notifier.status(f"recovering partitions: starting {len(self._slots)} workers")
            self._notifier.ping_if_due(time.monotonic())  # EXTEND_TIMEOUT_USEC before any READY=1
            for slot in self._slots:  # before the ZeroMQ context exists
                self._spawn(slot)
            try:
                self._open_sockets()
            except zmq.ZMQError as e:
                logger.error("[arbiter] cannot bind: %s", e)
                self._halt("cannot bind")
                self._wait_all(self._stop_deadline)
                return self._exit_status
            except HPBrokerError as e:
                logger.error("[arbiter] cannot secure the front-end: %s", e.message)
                self._halt("cannot secure the front-end")
                self._wait_all(self._stop_deadline)
                return self._exit_status
            self._start_metrics()
            if not self._join_zookeeper():
                self._wait_all(self._stop_deadline)
                return self._exit_status
            self._start_producer_ids()
            self._started = True
            self._notify_slots()  # every slot may have settled before the sockets were bound
            self._loop()
            return self._exit_status
        except BaseException:
            logger.exception("[arbiter] crashed; killing the workers")
            self._stopping = True
            self._kill_all(signal.SIGKILL)
            self._wait_all(float("inf"))
            return EXIT_ERROR
        finally:
            self._cleanup()

    def _setup(self) -> None:
        config = self.config
        make_directory(config.data_dir)
        self._lock_fd = lock_directory(config.data_dir)
        # The server key and the allowlist are read now: a bad one stops the start before any fork.
        self._security = BrokerSecurity(config)
        if config.zookeeper and config.zookeeper_credentials_file:
            from hpbroker.coord.zk_security import load_credentials

            self._zk_credentials = load_credentials(config.zookeeper_credentials_file)
        store = self._store = TopicStore(config.data_dir)
        run_dir = config.run_dir or os.path.join(os.path.abspath(config.data_dir), RUN_DIR_NAME)
        if config.run_dir or len(f"{run_dir}/backend.sock".encode()) <= _MAX_IPC_PATH:
            os.makedirs(run_dir, mode=0o700, exist_ok=True)
            self._run_dir = os.path.abspath(run_dir)
            _make_private(self._run_dir, change=not config.run_dir)
            _remove_stale_socket(self._run_dir)
        else:
            self._run_dir = tempfile.mkdtemp(prefix="hpb-")
            self._own_run_dir = True
        self._backend_address = f"ipc://{self._run_dir}/backend.sock"
        if len(self._backend_address.encode()) - len("ipc://") > _MAX_IPC_PATH:
            raise InvalidConfigError(f"run_dir {self._run_dir!r} is too long for an ipc:// socket path "
                                     f"(at most {_MAX_IPC_PATH - len('/backend.sock')} bytes)")
        for slot in self._slots:
            _remove_heartbeat(self._run_dir, slot.index)
        self._heartbeats = HeartbeatWatch(self._run_dir)
        data_host = data_port_host(config)  # 127.0.0.1 with data_port_auth = "loopback"
        for slot in self._slots:
            self._listeners.append(_data_listener(data_host, config.fetch_port + slot.index,
                                                  min(config.max_connections, socket.SOMAXCONN)))
        if self._worker_main is None:
            from hpbroker.workers.worker import run_worker

            self._worker_main = run_worker
        self._frontend = Frontend(config, store, self._slots, self._run_dir,
                                  admin_timeout_s=config.admin_timeout_ms / 1000,
                                  cluster=lambda: self._member.cluster.snapshot if self._member else None)
        self._frontend.security = self._security
        self._security_state = SecurityState(self._security, self._slots, self._frontend.send_control,
                                             self._wake_loop)
        if config.metrics_port:
            frontend = self._frontend
            self._metrics = MetricsEndpoint(config, self._run_dir, lambda: dict(frontend.error_counts))
        if sys.platform.startswith("linux"):
            with contextlib.suppress(OSError, AttributeError):
                self._prctl = ctypes.CDLL(None, use_errno=True).prctl
        self._install_signals()

    def _open_sockets(self) -> None:
        config = self.config
        # With CurveZMQ the front-end's handshakes and its encryption run on the context's I/O
        # threads: two, so one busy peer does not hold up every other (docs/SECURITY.md).
        self._context = zmq.Context(io_threads=CURVE_IO_THREADS if config.security == "curve" else 1)
        self._back = self._context.socket(zmq.ROUTER)
        self._back.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self._back.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._back.setsockopt(zmq.LINGER, 0)
        self._back.bind(self._backend_address)
        self._front = self._context.socket(zmq.ROUTER)
        assert self._frontend is not None
        peers = self._frontend.configure(self._front)  # limits and the connection monitor: before the bind
        self._front.setsockopt(zmq.LINGER, 1000)
        host = config.host
        if ":" in host:
            self._front.setsockopt(zmq.IPV6, 1)
            host = f"[{host}]"
        if self._metrics is not None:  # before the bind, so that it sees every connection
            self._metrics.watch_peers(peers)
        assert self._security is not None  # its ZAP handler runs before the bind: no unchecked client
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)  # its thread, like kazoo's, sees none of them
        try:
            self._security.secure_front(self._context, self._front)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
        self._front.bind(f"tcp://{host}:{config.port}")
        self._front_endpoint = self._front.getsockopt_string(zmq.LAST_ENDPOINT)
        assert self._frontend is not None
        self._frontend.attach(self._front, self._back)
        logger.info("[arbiter] broker %d listening on %s, data ports %d..%d, data in %s, run dir %s",
                    config.broker_id, self._front_endpoint, config.fetch_port,
                    config.fetch_port + config.workers - 1, os.path.abspath(config.data_dir), self._run_dir)

    def _join_zookeeper(self) -> bool:
        """Register in ZooKeeper when configured (module docstring); False (the broker halting)
        when that fails."""
        config = self.config
        if not config.zookeeper:
            return True
        from hpbroker.coord.member import BrokerMember

        timeout_s = config.zookeeper_session_timeout_ms / 1000
        member = BrokerMember(config.zookeeper, session_timeout_s=timeout_s, connect_timeout_s=timeout_s,
                              credentials=self._zk_credentials)
        assert self._store is not None
        self._member_version = self._store.version
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)  # inherited by every kazoo thread
        try:
            member.start(*self._cluster_snapshot())
            self._member = member  # left in _leave_zookeeper even when what follows fails
            assert self._security_state is not None
            self._security_state.join(member, self._zk_credentials)
            if self._metrics is not None:  # its thread, too, with the signals blocked
                self._metrics.watch_groups(member.session, config.metrics_lag_interval_ms / 1000,
                                           self._topic_names())
            self._start_replication(member)
        except HPBrokerError as e:
            logger.error("[arbiter] cannot join ZooKeeper: %s", e.message)
            self._halt("cannot join ZooKeeper")
            return False
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
        return True

    def _start_replication(self, member: BrokerMember) -> None:
        """Follow the replicated topics' partition states and run this broker's controller
        (``hpbroker.coord.broker_replication``); called with the loop's signals blocked."""
        from hpbroker.coord.broker_replication import BrokerReplication

        default = self.config.log.unclean_leader_election

        def unclean_leader_election(topic: str) -> bool:
            registration = member.cluster.snapshot.topics.get(topic)
            if registration is None:
                return default
            return bool(registration.config.get("unclean_leader_election", default))

        replication = BrokerReplication(member.session, member.paths, self.config.broker_id,
                                        wake=self._wake_loop, unclean_leader_election=unclean_leader_election,
                                        auto_leader_rebalance=self.config.auto_leader_rebalance)
        replication.start()
        self._replication = replication
        if self._metrics is not None:  # read on the scraping thread: Controller.state is thread-safe
            self._metrics.controller_state = replication.controller.state
        assert self._frontend is not None
        self._frontend.replication = replication

    def _wake_loop(self) -> None:
        """Make the loop's poll return (from another thread): a byte on the wake-up pipe."""
        if self._wakeup is not None:
            with contextlib.suppress(OSError):
                os.write(self._wakeup[1], b"\0")

    def _replication_turn(self) -> None:
        """Take the replicated topics' news: partition states, finished cluster-wide requests, topics
        new, changed or gone in the cluster; then hand the slots their roles."""
        frontend, replication, member = self._frontend, self._replication, self._member
        assert frontend is not None and self._store is not None
        if replication is not None and member is not None:
            from hpbroker.coord.broker_replication import Done, StateChanged, TopicGone

            for event in replication.take_events():
                if isinstance(event, StateChanged):
                    frontend.leadership.on_state(event.topic, event.partition, event.state)
                elif isinstance(event, Done):
                    frontend.cluster_request_done(event.request_id, event.error)
                elif isinstance(event, TopicGone):
                    frontend.drop_topic(event.topic)
            # Again whenever the store changed as well: a topic deleted and created again can be
            # taken only once the old one's deletion has ended (Frontend.adopt_topics).
            snapshot = member.cluster.snapshot
            adopted = (snapshot, self._store.version)
            if adopted[0] is not self._adopted_cluster[0] or adopted[1] != self._adopted_cluster[1]:
                self._adopted_cluster = adopted
                for name in frontend.adopt_topics(snapshot):
                    replication.confirm_gone(name)
            for topic in self._store.topics():
                if topic.replicated:
                    replication.watch_topic(topic.name, topic.partitions)
            frontend.check_new_topics()
        frontend.leadership.sync(time.monotonic())

    def _start_producer_ids(self) -> None:
        """Take the first block of producer ids and hand the allocator to the front-end (module
        docstring); its thread, like kazoo's, must see none of the loop's signals."""
        from hpbroker.coord.producer_ids import FileBlockStore, ProducerIdAllocator, ZkBlockStore

        config = self.config
        store: FileBlockStore | ZkBlockStore = FileBlockStore(config.data_dir)
        if self._member is not None:
            store = ZkBlockStore(self._member.session.client, self._member.paths.producer_id_block)
        allocator = ProducerIdAllocator(config.data_dir, config.broker_id, store)
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            allocator.start()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
        self._producer_ids = allocator
        assert self._frontend is not None
        self._frontend.producer_ids = allocator

    def _stop_producer_ids(self) -> None:
        if self._producer_ids is not None:
            self._producer_ids.close()
            self._producer_ids = None

    def _cluster_snapshot(self) -> tuple[BrokerRegistration, dict[str, TopicRegistration]]:
        """What ZooKeeper should say about this broker and its topics now."""
        from hpbroker.coord.registry import BrokerRegistration, TopicRegistration

        config = self.config
        assert self._store is not None
        topics = self._store.topics()
        stored = {t.name: tuple(p for p in range(t.partitions) if t.hosts(p, config.broker_id))
                  for t in topics}
        broker = BrokerRegistration(config.broker_id, config.host, config.port,
                                    tuple(range(config.fetch_port, config.fetch_port + config.workers)),
                                    {name: partitions for name, partitions in stored.items() if partitions},
                                    offline_partitions=self._offline_partitions())
        # A replicated topic's node is the cluster's (written when it is created or altered, through
        # hpbroker.coord.broker_replication), never published from a broker's store.
        return broker, {t.name: TopicRegistration(t.name, t.partitions, dict(t.config), config.broker_id)
                        for t in topics if not t.replicated}

    def _offline_partitions(self) -> dict[str, tuple[int, ...]]:
        """The replicated partitions stored here that the broker's registration reports offline,
        so that the controller moves their leadership and ISR membership to the other replicas
        (docs/COORDINATION.md): those of a crash-looping slot, and, while its retried worker
        serves on probation (until it has served ``BACKOFF_RESET_S`` without dying: the slot's
        backoff is kept that long), those another broker leads.  Reporting them back only after
        the probation keeps a slot that dies again soon after each retry from moving their
        leadership back and forth.  A partition without a leader (this broker was its last
        in-sync replica), or led here, is reported back as soon as the worker serves: keeping it
        offline would only keep it unavailable."""
        looping = {slot.index for slot in self._slots if slot.crash_looping}
        probation = {slot.index for slot in self._slots if slot.backoff_s and slot.serving}
        if not (looping or probation) or self._store is None or self._frontend is None:
            return {}
        broker_id, workers, leadership = self.config.broker_id, len(self._slots), self._frontend.leadership

        def offline(topic: str, partition: int) -> bool:
            slot = owner_slot(topic, partition, workers)
            if slot in looping:
                return True
            state = leadership.state(topic, partition)
            return slot in probation and state is not None and state.has_leader and state.leader != broker_id

        reported = {}
        for topic in self._store.topics():
            if topic.replicated:
                partitions = tuple(p for p in range(topic.partitions)
                                   if topic.hosts(p, broker_id) and offline(topic.name, p))
                if partitions:
                    reported[topic.name] = partitions
        return reported

    @staticmethod
    def _log_offline(before: dict[str, tuple[int, ...]], now: dict[str, tuple[int, ...]]) -> None:
        gone = {t: [p for p in ps if p not in before.get(t, ())] for t, ps in now.items()}
        back = {t: [p for p in ps if p not in now.get(t, ())] for t, ps in before.items()}
        gone = {t: ps for t, ps in gone.items() if ps}
        back = {t: ps for t, ps in back.items() if ps}
        if gone:
            logger.error("[arbiter] reporting replicas offline in ZooKeeper (their worker slot is "
                         "crash-looping): %s; the controller moves their leadership away", gone)
        if back:
            logger.warning("[arbiter] reporting replicas online again (their worker slot serves, and has "
                           "served %g s since its retry unless they have no leader): %s; they rejoin as "
                           "followers", BACKOFF_RESET_S, back)

    def _start_metrics(self) -> None:
        """Serve the metrics endpoint from its thread, which must see none of the loop's signals."""
        if self._metrics is None:
            return
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            self._metrics.start()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
        self._publish_slots()
        host, port = self._metrics.address
        logger.info("[arbiter] metrics on http://%s:%d/metrics", f"[{host}]" if ":" in host else host, port)

    def _publish_slots(self) -> None:
        """Hand the metrics endpoint the slot table as it is now (after every change of state)."""
        if self._metrics is not None:
            self._metrics.slots = tuple(SlotView(s.index, s.state.value, s.pid, max(0, s.forks - 1),
                                                 s.crash_looping, s.backoff_s, s.backoffs)
                                        for s in self._slots)

    def _topic_names(self) -> frozenset[str]:
        assert self._store is not None
        return frozenset(t.name for t in self._store.topics())

    def _leave_zookeeper(self) -> None:
        self._stop_producer_ids()  # its thread may be using the session
        if self._security_state is not None:
            self._security_state.leave()
        if self._replication is not None:  # resigns as controller while the session lives
            self._replication.close()
            self._replication = None
            if self._frontend is not None:
                self._frontend.replication = None
        if self._metrics is not None:
            self._metrics.controller_state = None
            self._metrics.stop_watching_groups()
        if self._member is not None:
            self._member.close()
            self._member = None
            logger.info("[arbiter] left ZooKeeper")

    def _cleanup(self) -> None:
        self._leave_zookeeper()
        if self._metrics is not None:
            self._metrics.close()
        if self._frontend is not None:  # before the ZeroMQ context: it holds a monitor socket
            self._frontend.close_peers()
        self._notifier.close()
        for sock in (self._front, self._back):
            if sock is not None:
                sock.close()
        # its ZAP handler's sockets, before the context ends; a handler that would not stop
        # keeps its sockets open, and term() would wait for them for ever
        stopped = self._security is None or self._security.close()
        if self._context is not None:
            if stopped:
                self._context.term()
            else:
                self._context.destroy(linger=0)
        self._front = self._back = self._context = None
        for listener in self._listeners:
            listener.close()
        self._listeners.clear()
        self._restore_signals()
        if self._run_dir:
            if self._own_run_dir:
                shutil.rmtree(self._run_dir, ignore_errors=True)
            else:
                for slot in self._slots:
                    _remove_heartbeat(self._run_dir, slot.index)
                _remove_stale_socket(self._run_dir)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    # --- signals ----------------------------------------------------------------------------------

    def _install_signals(self) -> None:
        read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wakeup = (read_fd, write_fd)
        self._saved_wakeup_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        for signum in _SIGNALS:
            self._saved_handlers[signum] = signal.signal(signum, self._enqueue_signal)

    def _enqueue_signal(self, signum: int, frame: object) -> None:
        self._signal_queue.append(signum)  # nothing else here: the loop does the work

    def _restore_signals(self) -> None:
        for signum, handler in self._saved_handlers.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._saved_handlers.clear()
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._saved_wakeup_fd)
            for fd in self._wakeup:
                os.close(fd)
            self._wakeup = None

    def _dispatch_signals(self) -> None:
        while self._signal_queue:
            getattr(self, "handle_" + _SIGNALS[self._signal_queue.popleft()])()

    def handle_chld(self) -> None:
        self._reap()

    def handle_term(self) -> None:
        if self._stopping:
            self.handle_quit()
        else:
            self._begin_stop("SIGTERM")

    def handle_int(self) -> None:
        if self._stopping:
            self.handle_quit()
        else:
            self._begin_stop("SIGINT")

    def handle_quit(self) -> None:
        self._begin_stop("SIGQUIT")
        logger.warning("[arbiter] stopping now: killing the workers")
        self._kill_all(signal.SIGKILL)

    def handle_hup(self) -> None:
        """Read the allowlist again (security on); nothing else is reloaded."""
        if self._security_state is not None:
            self._security_state.reload()

    # --- workers ----------------------------------------------------------------------------------

    def _spawn(self, slot: Slot) -> None:
        assert self._frontend is not None
        specs = self._frontend.admin.assign(slot.index)
        # Blocked across fork, so that a signal meant for the child cannot reach the arbiter's
        # handlers in it (and be lost) before it has reset them.
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            pid = os.fork()
        except OSError as e:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
            logger.error("[arbiter] cannot fork a worker for slot %d: %s", slot.index, e)
            self._hold_back(slot, time.monotonic(), f"cannot fork: {e.strerror or e}")
            return
        if pid == 0:
            self._become_worker(slot.index, specs)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
        slot.forked(pid, time.monotonic())
        self._publish_slots()
        logger.info("[arbiter] forked worker slot=%d pid=%d with %d partitions", slot.index, pid, len(specs))

    def _become_worker(self, index: int, specs: list[backend.PartitionSpec]) -> NoReturn:
        """The child side of ``fork``: never returns (module docstring, "Fork and ZeroMQ")."""
        status = EXIT_ERROR
        try:
            self._reset_in_child(index)
            assert self._worker_main is not None
            result = self._worker_main(index, self.config, specs, self._listeners[index],
                                       self._backend_address, self._run_dir)
            status = EXIT_OK if result is None else int(result)
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else EXIT_ERROR
        except BaseException:
            logger.exception("[worker slot=%d pid=%d] crashed", index, os.getpid())
            status = EXIT_ERROR
        finally:
            with contextlib.suppress(BaseException):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(status)

    def _reset_in_child(self, index: int) -> None:
        for signum in _SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        # Ctrl-C reaches the whole process group; the arbiter alone decides how workers stop.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.set_wakeup_fd(-1)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
        if self._wakeup is not None:
            for fd in self._wakeup:
                os.close(fd)
            self._wakeup = None
        for i, listener in enumerate(self._listeners):
            if i != index:
                listener.close()
        _close_inherited_sockets(keep={self._listeners[index].fileno()})
        if self._prctl is not None:
            self._prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != self._pid:  # the arbiter died before prctl took effect
            os._exit(EXIT_OK)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            slot = next((s for s in self._slots if s.pid == pid and s.alive), None)
            if slot is not None:
                self._on_exit(slot, os.waitstatus_to_exitcode(status))

    def _on_exit(self, slot: Slot, code: int) -> None:
        pid, asked = slot.pid, slot.state is SlotState.STOPPING
        how = f"exit status {code}" if code >= 0 else f"signal {signal.Signals(-code).name}"
        now = time.monotonic()
        deaths = slot.reaped(now, count_death=not self._stopping)
        self._publish_slots()
        _remove_heartbeat(self._run_dir, slot.index)
        assert self._frontend is not None and self._heartbeats is not None
        self._heartbeats.forget(slot.index)
        self._frontend.slot_down(slot.index, pid)
        self._all_serving_logged = False
        if self._stopping:
            logger.info("[arbiter] worker slot=%d pid=%d exited (%s)", slot.index, pid, how)
            return
        if code == backend.EXIT_BOOT_FAILED:
            logger.error("[arbiter] worker slot=%d pid=%d failed to boot (exit status %d); see the worker's "
                         "log above for why", slot.index, pid, code)
            self._hold_back(slot, now, f"failed to boot (exit status {code})")
            return
        log = logger.warning if asked else logger.error
        log("[arbiter] worker slot=%d pid=%d died (%s)", slot.index, pid, how)
        if deaths > RESTART_LIMIT:
            self._hold_back(slot, now, f"died {deaths} times within {RESTART_WINDOW_S:g} s, last by {how}")
            return
        if slot.backoff_s:  # still crash-looping: it died within BACKOFF_RESET_S of its retry
            self._hold_back(slot, now, f"died again after its retry, by {how}")
            return
        self._spawn(slot)
        if slot.alive:
            self._notifier.status(f"worker slot {slot.index} died ({how}); respawned as pid {slot.pid}, "
                                  f"recovering its partitions")

    def _hold_back(self, slot: Slot, now: float, reason: str) -> None:
        """The slot is crash-looping (module docstring): fork it again only after its backoff."""
        delay_s = slot.hold_back(now, reason)
        self._publish_slots()
        every = all(s.crash_looping for s in self._slots)
        logger.error("[arbiter] worker slot=%d is crash-looping (%s): its %d partitions are unavailable "
                     "(error 15) and it is retried in %g s (backoff doubling up to %g s)%s", slot.index,
                     reason, self._partitions_of(slot.index), delay_s, BACKOFF_MAX_S,
                     "" if every else "; the other slots keep serving")
        if every:
            logger.error("[arbiter] every worker slot is crash-looping: no partition is served; the broker "
                         "stays up, answers metadata and retries each slot with backoff")
        self._notify_slots()

    def _retry(self, slot: Slot) -> None:
        """Fork a held-back slot again, its backoff over."""
        logger.warning("[arbiter] worker slot=%d: retrying after a %g s backoff (crash-looping: %s)",
                       slot.index, slot.backoff_s, slot.crash_reason)
        self._spawn(slot)
        if slot.alive:
            self._notify_slots()

    def _partitions_of(self, index: int) -> int:
        """How many partitions the slot owns (those of topics being deleted too, until they are)."""
        assert self._frontend is not None
        return self._frontend.admin.partitions_per_slot()[index]

    def _on_ready(self, slot: Slot, body: dict) -> None:
        if slot.state is not SlotState.BOOTING or body.get("pid") != slot.pid \
                or body.get("slot") != slot.index:
            logger.log(logging.DEBUG if slot.state is SlotState.STOPPING else logging.WARNING,
                       "[arbiter] ignored a ready from slot %d (%s): its process is pid %d, %s",
                       slot.index, body, slot.pid, slot.state.value)
            return
        now = time.monotonic()
        slot.became_ready(now)
        assert self._heartbeats is not None
        self._heartbeats.start(slot.index, now)
        self._publish_slots()
        logger.info("[arbiter] worker slot=%d pid=%d serving (ready in %.2f s)", slot.index, slot.pid,
                    time.monotonic() - slot.forked_at)
        if slot.backoff_s:
            logger.warning("[arbiter] worker slot=%d serves again after crash-looping; it is no longer held "
                           "back once it has served %g s without dying", slot.index, BACKOFF_RESET_S)
        if self._security_state is not None:  # before its data port is told to serve anything
            self._security_state.slot_ready(slot)
        assert self._frontend is not None
        self._frontend.admin.slot_ready(slot.index)
        self._frontend.leadership.mark_dirty()  # its partitions' roles, after their open
        if all(s.serving for s in self._slots):
            if not self._all_serving_logged:
                self._all_serving_logged = True
                logger.info("[arbiter] all %d workers serving", len(self._slots))
                self._notify_slots()
        elif any(s.crash_looping for s in self._slots):
            self._notify_slots()

    def _notify_slots(self) -> None:
        """Tell the service manager how the slots are.  ``READY=1`` the first time every slot
        serves or is crash-looping once the front-end is bound and ZooKeeper joined (every
        partition that can be recovered is by then); afterwards a STATUS line."""
        assert self._store is not None
        serving = sum(1 for s in self._slots if s.serving)
        looping = [s for s in self._slots if s.crash_looping]
        if serving == len(self._slots):
            partitions = sum(t.partitions for t in self._store.topics())
            status = (f"serving {partitions} partitions on port {self.config.port} "
                      f"with {len(self._slots)} workers")
        elif len(looping) == 1:
            (slot,) = looping
            status = (f"worker slot {slot.index} is crash-looping ({slot.crash_reason}): its partitions are "
                      f"unavailable and it is retried with backoff (now {slot.backoff_s:g} s)")
        elif looping:
            status = (f"worker slots {', '.join(str(s.index) for s in looping)} are crash-looping: their "
                      "partitions are unavailable and they are retried with backoff")
        else:
            return  # only restarting or booting: the respawn's own STATUS line says so
        if looping:
            health = "degraded" if serving else "unavailable"
            status = f"{health}: {status}; {serving} of {len(self._slots)} workers serving"
        if self._ready_notified:
            self._notifier.status(status)
        elif self._started and all(s.serving or s.crash_looping for s in self._slots):
            self._ready_notified = True
            self._notifier.ready(status)
        else:
            self._notifier.status(status)

    def _signal_slot(self, slot: Slot, signum: int, reason: str, grace_s: float) -> None:
        """Ask a slot's process to go: it stops getting requests now, and gets SIGKILL if it is
        still there after ``grace_s``."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(slot.pid, signum)
        if signum == signal.SIGKILL:
            slot.kill_at = None
        else:
            deadline = time.monotonic() + grace_s
            slot.kill_at = deadline if slot.kill_at is None else min(slot.kill_at, deadline)
        slot.state = SlotState.STOPPING
        self._publish_slots()
        level = logging.INFO if self._stopping else logging.ERROR
        logger.log(level, "[arbiter] worker slot=%d pid=%d %s: %s", slot.index, slot.pid, reason,
                   signal.Signals(signum).name)

    def _kill_all(self, signum: int) -> None:
        for slot in self._slots:
            if slot.alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.pid, signum)

    def _wait_all(self, deadline: float) -> None:
        """Reap every worker, blocking; SIGKILL those still alive at ``deadline``."""
        while any(s.alive for s in self._slots):
            if time.monotonic() >= deadline:
                self._kill_all(signal.SIGKILL)
                deadline = float("inf")
            self._reap()
            time.sleep(0.01)

    # --- stopping ---------------------------------------------------------------------------------

    def _halt(self, reason: str) -> None:
        self._exit_status = EXIT_ERROR
        self._begin_stop(reason)

    def _begin_stop(self, reason: str) -> None:
        if self._stopping:
            return
        self._stopping = True
        if self._metrics is not None:
            self._metrics.stopping = True
        grace_s = self.config.graceful_timeout_ms / 1000
        self._stop_deadline = time.monotonic() + grace_s
        logger.info("[arbiter] stopping (%s): waiting up to %g s for the workers", reason, grace_s)
        self._notifier.stopping(f"stopping ({reason}): waiting up to {grace_s:g} s for the workers")
        if self._front is not None and self._front_endpoint:
            with contextlib.suppress(zmq.ZMQError):
                self._front.unbind(self._front_endpoint)
        for slot in self._slots:
            if slot.alive:
                self._signal_slot(slot, signal.SIGTERM, "asked to stop", grace_s)
        if self._frontend is not None:
            self._frontend.admin.abandon()
        self._leave_zookeeper()  # while the workers flush; quick unless ZooKeeper is unreachable

    # --- the loop ---------------------------------------------------------------------------------

    def _loop(self) -> None:
        assert self._wakeup is not None and self._front is not None and self._back is not None
        poller = zmq.Poller()
        poller.register(self._wakeup[0], zmq.POLLIN)
        poller.register(self._back, zmq.POLLIN)
        poller.register(self._front, zmq.POLLIN)
        assert self._frontend is not None and self._frontend.peers is not None
        peers, drain_peers = self._frontend.peers.socket, self._frontend.peers.drain
        poller.register(peers, zmq.POLLIN)  # connections counted and capped
        front_registered = True
        while True:
            events = dict(poller.poll(_POLL_MS))
            if self._back in events:  # first: what a worker said before dying still counts
                self._drain_backend()
            if peers in events:
                drain_peers()
            if self._wakeup[0] in events:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self._wakeup[0], 512):
                        pass
            self._dispatch_signals()
            if self._stopping and front_registered:
                poller.unregister(self._front)
                front_registered = False
            elif self._front in events:
                self._drain_frontend()
            self._tick()
            if self._stopping and not any(s.alive for s in self._slots):
                logger.info("[arbiter] stopped")
                return

    def _drain_frontend(self) -> None:
        assert self._front is not None and self._frontend is not None
        for _ in range(_BATCH):
            try:
                frames = self._front.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                self._frontend.on_request(frames)
            except Exception:  # one bad request must not take the broker down
                logger.exception("[arbiter] failed to handle a request")

    def _drain_backend(self) -> None:
        assert self._back is not None and self._frontend is not None
        for _ in range(_BATCH):
            try:
                frames = self._back.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            slot = self._slots_by_identity.get(frames[0].bytes)
            try:
                if slot is None:
                    raise ValueError(f"unknown worker identity {frames[0].bytes!r}")
                message = backend.decode(frames[1:])
                if isinstance(message, backend.Relay):
                    self._frontend.forward(slot.index, message)
                elif message.op == "ready":
                    self._on_ready(slot, message.body)
                elif message.op == "ack":
                    control_id = message.body.get("id")
                    if self._security_state is not None and self._security_state.owns(control_id):
                        self._security_state.acked(slot, control_id, message.body.get("error"))
                    elif self._frontend.leadership.owns(control_id):
                        self._frontend.leadership.acked(slot.index, control_id, message.body.get("error"),
                                                        time.monotonic())
                    else:
                        self._frontend.admin.acked(slot.index, control_id, message.body.get("error"))
                        self._frontend.leadership.mark_dirty()  # an open done: roles may follow
                elif message.op == "isr_change":
                    self._on_isr_change(slot, message.body)
                else:
                    raise ValueError(f"unexpected control {message.op!r}")
            except ValueError as e:
                logger.warning("[arbiter] dropped a backend message: %s", e)
            except Exception:
                logger.exception("[arbiter] failed to handle a backend message")

    def _on_isr_change(self, slot: Slot, body: dict) -> None:
        """A leader's ISR proposal: written to ZooKeeper on the replication thread, from where the
        new state comes back as a role."""
        topic, partition, epoch, isr = body.get("topic"), body.get("partition"), body.get("leader_epoch"), \
            body.get("isr")
        from_isr = body.get("from_isr")
        if not (isinstance(topic, str) and isinstance(partition, int) and isinstance(epoch, int)
                and isinstance(isr, list) and all(isinstance(b, int) for b in isr)
                and (from_isr is None
                     or isinstance(from_isr, list) and all(isinstance(b, int) for b in from_isr))):
            raise ValueError(f"isr_change needs topic, partition, leader_epoch and isr, got {body!r}")
        if self._replication is None:
            logger.warning("[arbiter] slot %d proposed ISR %s for %s-%d without ZooKeeper; ignored",
                           slot.index, isr, topic, partition)
            return
        stored = self._store.get(topic) if self._store is not None else None
        self._replication.propose_isr(topic, partition, epoch, tuple(isr),
                                      tuple(from_isr) if from_isr is not None else None,
                                      topic_id=stored.topic_id if stored is not None else "")

    def _tick(self) -> None:
        """Reap, check liveness and deadlines.  At most every few ms: it stats heartbeat files."""
        now = time.monotonic()
        if now - self._last_check < 0.02:
            return
        self._last_check = now
        self._notifier.ping_if_due(now)
        self._reap()
        if self._stopping:
            if now >= self._stop_deadline and any(s.alive for s in self._slots):
                logger.warning("[arbiter] workers still running after %d ms: SIGKILL",
                               self.config.graceful_timeout_ms)
                self._kill_all(signal.SIGKILL)
                self._stop_deadline = float("inf")
            return
        for slot in self._slots:
            if slot.state is SlotState.BACKOFF:
                if now >= slot.retry_at:
                    self._retry(slot)
            elif slot.settled(now):
                logger.info("[arbiter] worker slot=%d has served %g s since its retry: no longer "
                            "crash-looping", slot.index, BACKOFF_RESET_S)
                self._publish_slots()
            else:
                self._check_slot(slot, now)
        assert self._frontend is not None and self._store is not None
        if not self._security_turn():
            return
        self._frontend.admin.expire(now)
        self._replication_turn()
        if self._member is not None:
            offline = self._offline_partitions()
            if self._store.version != self._member_version or offline != self._member_offline:
                if offline != self._member_offline:
                    self._log_offline(self._member_offline, offline)
                    self._frontend.leadership.set_offline(offline)
                    if self._metrics is not None:
                        self._metrics.offline_replicas = sum(len(ps) for ps in offline.values())
                self._member_version, self._member_offline = self._store.version, offline
                self._member.update(*self._cluster_snapshot())
        if self._metrics is not None and self._store.version != self._metrics_version:
            self._metrics_version = self._store.version
            self._metrics.set_topics(self._topic_names())

    def _security_turn(self) -> bool:
        """The security's turn (``hpbroker.workers.security_state``); False when it halted the
        broker (the ZAP handler died)."""
        if self._security_state is not None and not self._security_state.turn():
            self._halt("the ZAP authenticator died")
            return False
        return True

    def _check_slot(self, slot: Slot, now: float) -> None:
        """SIGABRT a worker that is late to boot or silent; SIGKILL one that ignored its signal."""
        config = self.config
        if slot.state is SlotState.BOOTING and now - slot.forked_at > config.worker_boot_timeout_ms / 1000:
            self._signal_slot(slot, signal.SIGABRT, f"not ready within {config.worker_boot_timeout_ms} ms",
                              KILL_GRACE_S)
        elif slot.state is SlotState.SERVING:
            assert self._heartbeats is not None
            silent_s = self._heartbeats.silent_s(slot.index, now)
            if silent_s > config.worker_timeout_ms / 1000:
                self._signal_slot(slot, signal.SIGABRT, f"no heartbeat for {silent_s:.1f} s", KILL_GRACE_S)
        elif slot.state is SlotState.STOPPING and slot.kill_at is not None and now >= slot.kill_at:
            self._signal_slot(slot, signal.SIGKILL, "still running", 0)


def _data_listener(host: str, port: int, backlog: int) -> socket.socket:
    """A worker slot's TCP data listening socket, inheritable so that every process forked into
    the slot serves the very same socket."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                      flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as e:
        raise OSError(e.errno, f"cannot create the data listener {host}:{port}: {e.strerror or e}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
        sock.set_inheritable(True)
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"cannot listen on data port {host}:{port}: {e.strerror}") from None
    return sock


def _close_inherited_sockets(keep: set[int]) -> None:
    """In a forked worker: close every socket and anonymous-inode descriptor (eventfd, epoll)
    above stderr except ``keep``.  Regular files stay open (the data directory's lock)."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2 or fd in keep:
            continue
        try:
            is_socket = stat.S_ISSOCK(os.fstat(fd).st_mode)
            if is_socket or os.readlink(f"/proc/self/fd/{fd}").startswith("anon_inode:"):
                os.close(fd)
        except OSError:
            pass  # the listing's own descriptor, already gone


def _make_private(directory: str, *, change: bool) -> None:
    """Make the run directory 0700 (its backend socket carries the workers' security state, the
    token key included): the default one (``change``), which is the broker's alone; a
    ``run_dir`` the operator named is only warned about, as it may be shared (``/run``)."""
    try:
        mode = stat.S_IMODE(os.stat(directory).st_mode)
        if not mode & (stat.S_IRWXG | stat.S_IRWXO):
            return
        if change:
            os.chmod(directory, 0o700)
            logger.info("[arbiter] run_dir %s was mode %o: made 0700", directory, mode)
        else:
            logger.warning("[arbiter] run_dir %s is mode %o: others may reach its backend socket, which "
                           "carries the workers' security state; give the broker a directory of its own "
                           "with mode 0700", directory, mode)
    except OSError as e:
        logger.warning("[arbiter] run_dir %s cannot be made private (0700): %s", directory, e.strerror or e)


def _remove_stale_socket(run_dir: str) -> None:
    """The backend socket file (left behind by a broker killed with SIGKILL, or by ZeroMQ at
    exit) is ours to remove: the data directory's lock says no other broker uses this run
    directory."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(run_dir, "backend.sock"))


def _remove_heartbeat(run_dir: str, slot: int) -> None:
    """Forget a slot's heartbeat and stats, so a reaped process's age, offsets and counters are
    never taken for its successor's, and the temporary files of a process killed while writing
    them (``<file>.tmp``, or ``<file>.<pid>.tmp`` as older versions named them)."""
    for path in (heartbeat_path(run_dir, slot), stats_path(run_dir, slot)):
        for stale in (path, *glob.glob(f"{glob.escape(path)}*.tmp")):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
