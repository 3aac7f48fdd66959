"""One broker's membership in ZooKeeper: its registration and its topics' metadata, kept in step
with what the broker hands over, without ever making the broker wait for ZooKeeper.

The broker's arbiter (a single-threaded loop that must keep relaying requests) calls only
:meth:`BrokerMember.start` once, before its loop, and then :meth:`~BrokerMember.update` and
:meth:`~BrokerMember.close`, which return at once.  Everything else happens on the member's own
thread, the one writer of this broker's nodes:

- ``update(broker, topics)`` replaces the *wanted* state (an immutable snapshot: the broker's
  registration and the metadata of every topic it stores) and wakes the thread;
- the thread makes ZooKeeper match the latest wanted state: the broker's ephemeral node
  (``BrokerRegistry.register``), a topic node per topic (``TopicRegistry.publish``), and the
  removal of the topic nodes it published for topics no longer wanted;
- a write that fails (connection lost, session expired) leaves the state *dirty*; the thread
  tries again when kazoo reports a connection, and at least every :data:`RETRY_S`;
- after a session expiry the :class:`~hpbroker.coord.session.Session` re-creates the broker's
  ephemeral node with its latest data by itself (persistent topic nodes survive expiry).

:meth:`start` does the first round on the caller's thread so that a broker that cannot register
(no server within the connect timeout, its id held by another live broker) fails to start with a
:class:`~hpbroker.errors.CoordinationError`.  That first round also removes the topic nodes this
broker created for topics it no longer stores (deleted while ZooKeeper was unreachable).

Nothing here touches the caller's state from a kazoo thread: the snapshot is data, handed over
under a lock.  Create the member after ``fork`` in the process that uses it, and never use it in
a child forked later.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

from kazoo.client import KazooState
from kazoo.exceptions import KazooException

from hpbroker.coord.cluster import ClusterView
from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.registry import BrokerRegistration, BrokerRegistry, TopicRegistration, TopicRegistry
from hpbroker.coord.session import DEFAULT_SESSION_TIMEOUT_S, Session
from hpbroker.coord.zk_security import ZkCredentials
from hpbroker.errors import CoordinationError

__all__ = ["RETRY_S", "BrokerMember"]

logger = logging.getLogger(__name__)

RETRY_S = 1.0  # longest wait before trying a failed write again
_JOIN_TIMEOUT_S = 5.0  # how long close() waits for the member's thread


class BrokerMember:
    """Keeps this broker's nodes in ZooKeeper in step with the latest snapshot (module docstring)."""

    def __init__(self, connect_string: str, *, session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
                 connect_timeout_s: float | None = None, paths: ZkPaths | None = None,
                 credentials: ZkCredentials | None = None) -> None:
        """``credentials``: the cluster's ZooKeeper credentials (``zookeeper_credentials_file``):
        every node the broker creates, through this member's session, then carries the cluster
        ACL (``hpbroker.coord.zk_security``)."""
        self.session = Session(connect_string, session_timeout_s=session_timeout_s,
                               connect_timeout_s=connect_timeout_s, name="zookeeper", credentials=credentials)
        self.paths = paths or ZkPaths()
        self.brokers = BrokerRegistry(self.session, self.paths)
        self.topics = TopicRegistry(self.session, self.paths)
        self.cluster = ClusterView(self.brokers, self.topics)  # what every broker stores, for metadata
        self._wake = threading.Condition()
        self._wanted: tuple[BrokerRegistration, dict[str, TopicRegistration]] | None = None
        self._dirty = False
        self._retry_at = 0.0  # monotonic time before which a failed write is not retried
        self._closing = False
        self._failures = 0  # failed rounds in a row (the member's thread only)
        self._registered: BrokerRegistration | None = None  # last written registration
        self._published: dict[str, TopicRegistration] = {}  # topic nodes this member wrote
        self._thread: threading.Thread | None = None

    # --- the caller's side ----------------------------------------------------------------------

    def start(self, broker: BrokerRegistration, topics: Mapping[str, TopicRegistration]) -> None:
        """Connect, register, publish the topics, remove stale ones; then keep them in step.
        Raises CoordinationError (and leaves nothing running) when that first round fails."""
        self._wanted = (broker, dict(topics))
        try:
            self.session.start()
            self._sync(self._wanted, first=True)
        except (KazooException, CoordinationError) as e:
            self.session.close()
            if isinstance(e, CoordinationError):
                raise
            raise CoordinationError(f"cannot register broker {broker.broker_id} in ZooKeeper at "
                                    f"{self.session.connect_string}: {e!r}") from None
        logger.info("[zookeeper] registered broker %d at %s (%d topics)", broker.broker_id,
                    self.paths.broker(broker.broker_id), len(topics))
        self.cluster.start()
        self.session.client.add_listener(self._on_state)
        self._thread = threading.Thread(target=self._run, name="hpbroker-zookeeper", daemon=True)
        self._thread.start()

    def update(self, broker: BrokerRegistration, topics: Mapping[str, TopicRegistration]) -> None:
        """Hand over a new snapshot; never blocks on ZooKeeper."""
        with self._wake:
            self._wanted = (broker, dict(topics))
            self._dirty = True
            self._wake.notify()

    def close(self) -> None:
        """Stop the thread and close the session, which removes the broker's registration at
        once (topic nodes stay).  Idempotent."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self.cluster.close()
        self.session.close()  # also fails a write the thread is blocked in
        if self._thread is not None:
            self._thread.join(_JOIN_TIMEOUT_S)
            if self._thread.is_alive():
                logger.warning("[zookeeper] the member thread did not stop within %g s", _JOIN_TIMEOUT_S)

    # --- the member's thread --------------------------------------------------------------------

    def _on_state(self, state: str) -> None:
        """kazoo's listener (its connection thread): only wakes the member's thread."""
        if state == KazooState.CONNECTED:
            with self._wake:
                self._retry_at = 0.0
                self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._closing and not (self._dirty and time.monotonic() >= self._retry_at):
                    self._wake.wait(max(0.0, self._retry_at - time.monotonic()) if self._dirty else None)
                if self._closing:
                    return
                wanted, self._dirty = self._wanted, False
            assert wanted is not None
            try:
                self._sync(wanted)
                if self._failures:
                    logger.info("[zookeeper] broker %d's nodes are up to date again", wanted[0].broker_id)
                self._failures = 0
                continue
            except (KazooException, CoordinationError) as e:
                self._failures += 1  # the first failure is worth a warning, the next ones are not
                logger.log(logging.WARNING if self._failures == 1 else logging.DEBUG,
                           "[zookeeper] could not bring broker %d's nodes up to date (retrying every %g s "
                           "and on reconnection): %r", wanted[0].broker_id, RETRY_S, e)
            except Exception:
                logger.exception("[zookeeper] unexpected failure updating broker %d's nodes",
                                 wanted[0].broker_id)
            with self._wake:  # failed: again on the next connection, or after RETRY_S
                self._dirty = True
                self._retry_at = time.monotonic() + RETRY_S

    def _sync(self, wanted: tuple[BrokerRegistration, dict[str, TopicRegistration]], *,
              first: bool = False) -> None:
        """Make ZooKeeper hold ``wanted``: one writer (the member's thread, or start()).  A new
        topic's node is written before the registration names it, and a deleted one removed only
        after, so a reader going from a broker to its topics finds them.  The first round
        registers first instead, so that an id held by another broker fails before any write."""
        broker, topics = wanted
        if first:
            self._register(broker)
        for name, topic in sorted(topics.items()):
            if self._published.get(name) != topic:
                if self.topics.publish(topic):
                    logger.info("[zookeeper] published topic %s (%d partitions)", name, topic.partitions)
                self._published[name] = topic
        self._register(broker)
        gone = set(self._published) - set(topics)
        if first:  # and those deleted while this broker was away from ZooKeeper
            gone |= set(self.topics.names()) - set(topics)
        for name in sorted(gone):
            if first and (current := self.topics.get(name)) is not None and current.replicas:
                continue  # a replicated topic's node is the cluster's, never a broker's to remove
            if self.topics.remove(name, created_by=broker.broker_id):
                logger.info("[zookeeper] removed topic %s", name)
            self._published.pop(name, None)

    def _register(self, broker: BrokerRegistration) -> None:
        if broker != self._registered:
            self.brokers.register(broker)
            self._registered = broker
