"""The arbiter's request side: route client requests to workers, answer the rest itself.

A client message on the front-end ROUTER is ``[client_id, head, payload?]``.  The head is parsed
(``protocol.decode_request``: header and body; the payload is left to the worker) and then:

- **produce, fetch, list-offsets** for an existing partition are relayed to the worker slot that
  owns it (``ownership.owner_slot``) as ``[worker_id, b"R", client_id, head, payload?]``: the
  client's own frames, not re-encoded or copied.  The worker answers on the backend and
  :meth:`Frontend.forward` hands the answer to the client.  A slot that is not serving (booting,
  restarting), or whose process is not connected, answers error 15; an unknown topic or
  partition error 6.
- **metadata** is answered here from the topic store, the slot table and the workers' heartbeat
  files (offsets at most one heartbeat old);
- **init-producer-id** is answered here from the broker's
  :class:`~hpbroker.coord.producer_ids.ProducerIdAllocator` (:attr:`Frontend.producer_ids`, set
  by the arbiter once it has taken its first block of ids; error 17 until then or whenever no id
  is at hand);
- **create-topic**, **alter-topic-config** and **delete-topic** go to
  :class:`~hpbroker.workers.admin.TopicAdmin`, which answers once the owning workers have done
  their part;
- **fetch-token** and **group-credentials** are answered here from :attr:`Frontend.security`
  (error 10 on a broker without security; group credentials also need ZooKeeper).

**Security.**  With :attr:`Frontend.security` set to an enabled
:class:`~hpbroker.security.broker.BrokerSecurity` (``security = "curve"``), each request's
principal is the key the CURVE handshake authenticated (its frames' ``User-Id``,
``NAME#fingerprint``, read by ``BrokerSecurity.principal_of``: ACLs and messages use ``NAME``; a
key replaced under the same name counts as revoked), and every request is checked before
anything else is done with it (``hpbroker.workers.frontend_security`` says what each needs and
what a refusal is answered): a refused one gets its error (28 when no ACL allows it; an acks=0
produce gets no answer), nothing is relayed, created or changed, and the refusal is counted in
:attr:`Frontend.error_counts`.  Metadata lists only the topics the principal may describe; one
named and not describable gets error 28 in its ``TopicMetadata``.
Without security the only cost on a request is one attribute test.

Every response goes out in the version its request was asked in (``api_version``; the nearest
served for a version refused with error 9), whether answered here or relayed: a relayed
request's version travels in its own frames, and the ones a dead worker left unanswered are
remembered with theirs.  A request whose header parses but whose body does not (a message of
more than two frames included) gets an error response with its correlation id; one whose header
does not parse cannot be answered and is dropped (logged).  A produce with ``acks`` 0 never gets a
response, not even an error.  docs/PROTOCOL.md's "Malformed and oversized requests" lists every case.

The front-end ROUTER's own limits (message size, heartbeats, the connection cap) are set by
:meth:`Frontend.configure` before it binds: ``hpbroker.workers.peers``.

Every error response sent from here is counted in :attr:`Frontend.error_counts` (for the
metrics endpoint, which copies it),
every api key the broker does not know under :data:`UNKNOWN_API_KEY`: a client cannot make the
table, nor the metric's series, grow with the keys it invents.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import zmq

from hpbroker import protocol
from hpbroker.broker.config import BrokerConfig
from hpbroker.broker.topics import (
    Topic,
    TopicStore,
    alter_topic_config,
    check_partitions,
    check_topic_name,
    config_to_strings,
    parse_topic_config,
)
from hpbroker.errors import (
    AuthorizationError,
    CoordinationError,
    HPBrokerError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    PartitionNotAvailableError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
)
from hpbroker.protocol import ApiKey
from hpbroker.workers import backend
from hpbroker.workers.admin import TopicAdmin
from hpbroker.workers.frontend_security import FrontendSecurity, no_fetch_tokens, no_group_credentials
from hpbroker.workers.heartbeat import read_heartbeat
from hpbroker.workers.leadership import Leadership
from hpbroker.workers.ownership import owner_slot
from hpbroker.workers.peers import FrontendPeers, configure_front
from hpbroker.workers.slots import Slot

if TYPE_CHECKING:  # kazoo is loaded only by a broker configured with ZooKeeper
    from hpbroker.coord.broker_replication import BrokerReplication
    from hpbroker.coord.cluster import ClusterSnapshot
    from hpbroker.coord.producer_ids import ProducerIdAllocator
    from hpbroker.security.broker import BrokerSecurity

__all__ = ["UNKNOWN_API_KEY", "Frontend"]

logger = logging.getLogger(__name__)

_RELAYED = (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.LIST_OFFSETS)
_MAX_ERROR_MESSAGE = 1000  # characters of an error message sent to a client
UNKNOWN_API_KEY = -1  # Frontend.error_counts' key for every api key not in protocol.REQUEST_TYPES
# (client_id, api_key, correlation_id, api_version): how TopicAdmin's waiters are answered.
_Waiter = tuple[bytes, int, int, int]
# (topic, partition) -> (log_start_offset, high_watermark), from the workers' heartbeats
_Offsets = dict[tuple[str, int], tuple[int, int]]


class Frontend:
    """Routes and answers client requests (module docstring).  Single-threaded: used only by the
    arbiter's loop, which owns both sockets and the slot table.  :meth:`attach` gives it the
    sockets once they exist; before that no request can arrive and no slot serves."""

    def __init__(self, config: BrokerConfig, store: TopicStore, slots: Sequence[Slot], run_dir: str,
                 *, admin_timeout_s: float, clock=time.monotonic,
                 cluster: Callable[[], ClusterSnapshot | None] | None = None) -> None:
        """``cluster`` returns the latest picture of the brokers and topics registered in
        ZooKeeper (None when the broker runs standalone): metadata answers from it for topics
        this broker does not store."""
        self._config = config
        self._cluster = cluster
        self._store = store
        self._slots = slots
        self._run_dir = run_dir
        self._clock = clock
        self._front: zmq.Socket | None = None
        self._back: zmq.Socket | None = None
        self.peers: FrontendPeers | None = None
        self._identities = [backend.worker_identity(s.index) for s in slots]
        # Per slot: the relayed requests its process has not answered, (client, correlation id) ->
        # (api key, api version), so that they can be answered with error 15 if it dies.
        self._in_flight: list[dict[tuple[bytes, int], tuple[int, int]]] = [{} for _ in slots]
        # Hands out producer ids; None until the arbiter has started it.
        self.producer_ids: ProducerIdAllocator | None = None
        # (api key or UNKNOWN_API_KEY, error code) -> responses
        self.error_counts: dict[tuple[int, int], int] = {}
        self.admin = TopicAdmin(store, len(slots), send_control=self.send_control, reply=self._answer_waiter,
                                is_serving=lambda index: slots[index].serving, timeout_s=admin_timeout_s,
                                max_connections=config.max_connections, broker_id=config.broker_id,
                                released=lambda topic, partition: self.leadership.released(topic, partition))
        self._admin_timeout_s = admin_timeout_s
        # Replicated topics (docs/REPLICATION.md): their partition states and the roles they give
        # the slots; ``replication`` writes their nodes in ZooKeeper (set once ZooKeeper is joined).
        self.leadership = Leadership(config, len(slots), send_control=self.send_control,
                                     assigned=self.admin.assigned, topic=store.get,
                                     is_serving=lambda index: slots[index].serving,
                                     cluster=cluster if cluster is not None else lambda: None)
        self.replication: BrokerReplication | None = None
        # Cluster-wide creates, alters and deletes handed to ``replication``: request id ->
        # (waiter, kind, topic name, deadline); a create then waits for its partitions' leaders.
        self._cluster_requests: dict[int, tuple[_Waiter | None, str, str, float]] = {}
        self._awaiting_leaders: dict[str, tuple[_Waiter | None, float]] = {}
        self._request_ids = iter(range(1, 2**63))
        # name -> topic id of the last replicated topic of that name deleted here: a snapshot that
        # still shows it (it lags ZooKeeper) must not have it stored again.
        self._dropped_ids: dict[str, str] = {}
        # The checks of the enabled BrokerSecurity, or None: the one attribute the unsecured path tests.
        self._security: FrontendSecurity | None = None

    @property
    def security(self) -> BrokerSecurity | None:
        """The broker's security when enabled, else None (set by the arbiter before the
        front-end binds); setting None, or one not enabled, serves every request as a broker
        without security does."""
        return self._security.security if self._security is not None else None

    @security.setter
    def security(self, security: BrokerSecurity | None) -> None:
        self._security = None if security is None or not security.enabled else \
            FrontendSecurity(security, self._config, self._store, self._cluster, self._clock)

    def configure(self, front: zmq.Socket) -> FrontendPeers:
        """Set the front-end ROUTER's limits and start counting and capping its connections
        (``hpbroker.workers.peers``).  Call it before ``front`` binds; drain :attr:`peers` from the
        loop, and :meth:`close_peers` before the context ends."""
        configure_front(front, self._config)
        self.peers = FrontendPeers(front, port=self._config.port,
                                   max_connections=self._config.frontend_max_connections)
        return self.peers

    def close_peers(self) -> None:
        if self.peers is not None:
            self.peers.close()

    def attach(self, front: zmq.Socket, back: zmq.Socket) -> None:
        self._front, self._back = front, back

    # --- from clients -----------------------------------------------------------------------------

    def on_request(self, frames: list[zmq.Frame]) -> None:
        """Handle one front-end message ``[client_id, head, payload?]``."""
        client = frames[0].bytes
        message = frames[1:]
        try:
            header, request = protocol.decode_request(message)
        except (InvalidRequestError, UnsupportedVersionError) as e:
            header = getattr(e, "header", None)
            if header is None:
                logger.warning("[arbiter] dropped a request from client %s whose header does not parse: %s",
                               client.hex(), e.message)
                return
            self._respond(client, header.api_key, header.correlation_id, e, header.api_version)
            return
        size = sum(f.buffer.nbytes for f in message)
        if size > self._config.max_request_bytes:
            error = InvalidRequestError(f"request of {size} bytes exceeds max_request_bytes "
                                        f"{self._config.max_request_bytes}")
            self._respond_unless_silent(client, header, request, error)
            return
        principal = None
        if self._security is not None:
            principal = self._security.principal_of(frames[1])
            if self._refused(client, header, request, principal):
                return
        if header.api_key in _RELAYED:
            self._route(client, header, request, message)
        elif header.api_key == ApiKey.METADATA:
            self._respond(client, header.api_key, header.correlation_id,
                          self._metadata(request.topics, principal), header.api_version)
        elif header.api_key == ApiKey.INIT_PRODUCER_ID:
            self._respond(client, header.api_key, header.correlation_id, self._init_producer_id(request),
                          header.api_version)
        elif header.api_key == ApiKey.CREATE_TOPIC:
            self._create(client, header, request)
        elif header.api_key == ApiKey.DELETE_TOPIC:
            self._delete(client, header, request)
        elif header.api_key == ApiKey.ALTER_TOPIC_CONFIG:
            self._alter(client, header, request)
        elif header.api_key == ApiKey.FETCH_TOKEN:
            answer = self._security.fetch_token(principal) if self._security is not None \
                else no_fetch_tokens()
            self._respond(client, header.api_key, header.correlation_id, answer, header.api_version)
        elif header.api_key == ApiKey.GROUP_CREDENTIALS:
            answer = self._security.group_credentials(request) if self._security is not None \
                else no_group_credentials()
            self._respond(client, header.api_key, header.correlation_id, answer, header.api_version)
        elif header.api_key == ApiKey.AUTHENTICATE:
            self._respond(client, header.api_key, header.correlation_id, InvalidRequestError(
                "AuthenticateRequest is served on the data ports only; the front-end authenticates by "
                "the CurveZMQ handshake"), header.api_version)

    # --- security -----------------------------------------------------------------------------------

    def _refused(self, client: bytes, header: protocol.RequestHeader, request: Any,
                 principal: str | None) -> bool:
        """Check the request against the ACLs (module docstring); a refused one is answered here
        (True): nothing else is done with it.  While the ACLs are not read yet the answer is 17
        (retriable), not a refusal."""
        assert self._security is not None
        error = self._security.check(header, request, principal)
        if error is None:
            return False
        if header.api_key == ApiKey.PRODUCE and request.acks == 0:
            key = (header.api_key, error.code)
            self.error_counts[key] = self.error_counts.get(key, 0) + 1
        self._respond_unless_silent(client, header, request, error)
        return True

    def _route(self, client: bytes, header: protocol.RequestHeader, request: Any,
               message: list[zmq.Frame]) -> None:
        topic = self._store.get(request.topic)
        if (topic is None or topic.deleting) and self._auto_create(header, request, topic):
            error = PartitionNotAvailableError(f"topic {request.topic!r} is being created; retry")
            self._respond_unless_silent(client, header, request, error)
            return
        error = self._unroutable(topic, request)
        if error is not None:
            self._respond_unless_silent(client, header, request, error)
            return
        assert topic is not None
        if not topic.hosts(request.partition, self._config.broker_id):
            error = self.leadership.not_here(topic, request.partition)
            self._respond_unless_silent(client, header, request, error)
            return
        slot = owner_slot(topic.name, request.partition, len(self._slots))
        if not self._slots[slot].serving:
            error = PartitionNotAvailableError(
                f"partition {request.partition} of {topic.name!r}: its worker (slot {slot}) is "
                f"{self._slots[slot].condition(self._clock())}")
        else:
            error = self._send_backend(slot, backend.encode_relay(client, message))
        if error is not None:
            self._respond_unless_silent(client, header, request, error)
        elif not (header.api_key == ApiKey.PRODUCE and request.acks == 0):
            self._in_flight[slot][client, header.correlation_id] = (header.api_key, header.api_version)

    def _unroutable(self, topic: Topic | None, request: Any) -> HPBrokerError | None:
        if topic is None or topic.deleting:
            return UnknownTopicOrPartitionError(f"topic {request.topic!r} does not exist")
        if not request.partition < topic.partitions:
            return UnknownTopicOrPartitionError(
                f"partition {request.partition} of {topic.name!r} does not exist "
                f"(it has partitions 0..{topic.partitions - 1})")
        return None

    def _auto_create(self, header: protocol.RequestHeader, request: Any, topic: Topic | None) -> bool:
        """Create an unknown topic that a produce or fetch names, when the broker is set to."""
        if topic is not None or not self._config.auto_create_topics or header.api_key == ApiKey.LIST_OFFSETS \
                or request.partition >= self._config.default_partitions:
            return False
        try:
            self._check_not_replicated_in_cluster(request.topic)
            self.admin.create(None, request.topic, self._config.default_partitions, (), self._clock())
        except HPBrokerError as e:
            logger.info("[arbiter] cannot create topic %r automatically: %s", request.topic, e.message)
            return False
        return True

    def _create(self, client: bytes, header: protocol.RequestHeader,
                request: protocol.CreateTopicRequest) -> None:
        waiter = (client, header.api_key, header.correlation_id, header.api_version)
        try:
            replication_factor = self._replication_factor(request.replication_factor)
            if replication_factor is None:
                self._check_not_replicated_in_cluster(request.name)
                self.admin.create(waiter, request.name, request.partitions, request.configs, self._clock())
            else:
                self._create_replicated(waiter, request.name, request.partitions, request.configs,
                                        replication_factor)
        except HPBrokerError as e:
            logger.info("[arbiter] create topic %r refused: %s", request.name, e.message)
            self._answer_waiter(waiter, e)

    def _replication_factor(self, requested: int) -> int | None:
        """The replication factor of a new topic, None for an unreplicated one: a topic created
        without one (-1) on a broker whose ``default_replication_factor`` is 1 is stored whole on
        this broker, as before replication; with ZooKeeper, any other is replicated."""
        if requested == -1:
            requested = self._config.default_replication_factor
            if requested == 1:
                return None
        if requested < 1:
            raise InvalidReplicationFactorError(f"replication factor must be at least 1, got {requested}")
        if self.replication is None:
            if self._config.zookeeper:
                raise CoordinationError("the broker has not joined ZooKeeper yet; retry")
            if requested > 1:
                raise InvalidReplicationFactorError(
                    f"replication factor {requested} needs a cluster: this broker runs standalone (no "
                    "zookeeper setting), so it holds every partition's only replica")
            return None
        return requested

    def _check_not_replicated_in_cluster(self, name: str) -> None:
        """TopicAlreadyExistsError when the cluster has a replicated topic ``name``: an unreplicated
        topic never takes a replicated one's name (this broker may not store the replicated one
        yet, or only its deletion's end lies between them)."""
        cluster = self._cluster() if self._cluster is not None else None
        registration = cluster.topics.get(name) if cluster is not None else None
        if registration is not None and registration.replicas:
            raise TopicAlreadyExistsError(f"topic {name!r} already exists in the cluster, replicated "
                                          f"(replication factor {registration.replication_factor})")

    def _create_replicated(self, waiter: _Waiter | None, name: str, partitions: int, configs: Any,
                           replication_factor: int) -> None:
        """Validate here, then have ``replication`` write the topic's node (its assignment over
        the live brokers); every broker then stores its replicas (:meth:`adopt_topics`) and the
        controller elects the leaders, when the client is answered."""
        check_topic_name(name)
        check_partitions(partitions)
        config = parse_topic_config(configs)
        if self._store.get(name) is not None or name in self._awaiting_leaders:
            raise TopicAlreadyExistsError(f"topic {name!r} already exists")
        assert self.replication is not None
        request_id = next(self._request_ids)
        self._cluster_requests[request_id] = (waiter, "create", name, self._clock() + self._admin_timeout_s)
        self.replication.create_topic(request_id, name, partitions, replication_factor, config)

    def _alter(self, client: bytes, header: protocol.RequestHeader,
               request: protocol.AlterTopicConfigRequest) -> None:
        waiter = (client, header.api_key, header.correlation_id, header.api_version)
        try:
            topic = self._store.get(request.name)
            if topic is not None and topic.replicated and not topic.deleting and self.replication is not None:
                alter_topic_config(topic.config, request.configs)  # refused at once when invalid here
                request_id = next(self._request_ids)
                self._cluster_requests[request_id] = (waiter, "alter", request.name,
                                                      self._clock() + self._admin_timeout_s)
                changes = {entry.key: entry.value for entry in request.configs}
                self.replication.alter_topic(request_id, request.name, changes)
            else:
                self.admin.alter(waiter, request.name, request.configs, self._clock())
        except HPBrokerError as e:
            logger.info("[arbiter] alter topic %r refused: %s", request.name, e.message)
            self._answer_waiter(waiter, e)

    def _delete(self, client: bytes, header: protocol.RequestHeader,
                request: protocol.DeleteTopicRequest) -> None:
        waiter = (client, header.api_key, header.correlation_id, header.api_version)
        try:
            topic = self._store.get(request.name)
            if topic is not None and topic.replicated and not topic.deleting and self.replication is not None:
                request_id = next(self._request_ids)
                self._cluster_requests[request_id] = (waiter, "delete", request.name,
                                                      self._clock() + self._admin_timeout_s)
                self.replication.delete_topic(request_id, request.name)
            else:
                self.admin.delete(waiter, request.name, self._clock())
        except HPBrokerError as e:
            self._answer_waiter(waiter, e)

    # --- replicated topics ----------------------------------------------------------------------------

    def cluster_request_done(self, request_id: Any, error: HPBrokerError | None) -> None:
        """``replication`` finished (or refused) a create, alter or delete of a replicated topic."""
        entry = self._cluster_requests.pop(request_id, None)
        if entry is None:
            return
        waiter, kind, name, deadline = entry
        if error is not None:
            logger.info("[arbiter] %s of replicated topic %r refused: %s", kind, name, error.message)
            if waiter is not None:
                self._answer_waiter(waiter, error)
        elif kind == "create":
            self._awaiting_leaders[name] = (waiter, deadline)
            self.check_new_topics()
        elif kind == "delete":
            self.drop_topic(name, waiter)
        elif waiter is not None:
            self._answer_waiter(waiter, None)  # every broker applies it as its watch fires

    def check_new_topics(self) -> None:
        """Answer the creates whose topics every partition has a leader for now (or whose time ran
        out: the topic exists, its leaders come as the controller elects them)."""
        now = self._clock()
        for name, (waiter, deadline) in list(self._awaiting_leaders.items()):
            topic = self._store.get(name)
            if topic is not None and self.leadership.has_states(topic):
                del self._awaiting_leaders[name]
                if waiter is not None:
                    self._answer_waiter(waiter, None)
            elif now >= deadline:
                del self._awaiting_leaders[name]
                if waiter is not None:
                    self._answer_waiter(waiter, RequestTimedOutError(
                        f"topic {name!r} was created, but not every partition had a leader within "
                        f"{self._admin_timeout_s:g} s; it goes on"))
        for request_id, (waiter, kind, name, deadline) in list(self._cluster_requests.items()):
            if now >= deadline:
                del self._cluster_requests[request_id]
                if waiter is not None:
                    self._answer_waiter(waiter, RequestTimedOutError(
                        f"{kind} of topic {name!r} could not be written to ZooKeeper within "
                        f"{self._admin_timeout_s:g} s; it may still happen"))

    def adopt_topics(self, cluster: ClusterSnapshot) -> list[str]:
        """Bring the store in step with the replicated topics ZooKeeper holds: store new ones (this
        broker opens the replicas naming it), take changed settings.  Returns the names of
        replicated topics stored here that ``cluster`` no longer has (the caller confirms with
        ZooKeeper before dropping them: a snapshot may lag).

        A stored topic whose ``topic_id`` is not the one of the cluster's node of that name (when
        the node has one) is an older topic deleted and created again while this broker did not
        see it: its replicas here are deleted first, and the new topic is stored once that
        deletion has ended.  The caller therefore calls this again whenever the store changed
        (a deletion ended), not only when ``cluster`` did."""
        now = self._clock()
        for name, registration in sorted(cluster.topics.items()):
            if not registration.replicas:
                continue
            topic = self._store.get(name)
            try:
                if topic is not None and topic.replicated and not topic.deleting and registration.topic_id \
                        and topic.topic_id != registration.topic_id:
                    logger.warning("[arbiter] topic %s stored here (topic id %s) is not the cluster's "
                                   "topic of that name (topic id %s): it was deleted and created again; "
                                   "deleting the old replicas before taking the new topic", name,
                                   topic.topic_id or "none", registration.topic_id)
                    self.drop_topic(name)
                    topic = self._store.get(name)  # None when no worker had anything to delete
                if topic is None:
                    if registration.topic_id and self._dropped_ids.get(name) == registration.topic_id:
                        continue  # deleted here; the snapshot has not seen its node go yet
                    self.admin.create(None, name, registration.partitions, dict(registration.config), now,
                                      replicas={p: tuple(r) for p, r in registration.replicas.items()})
                    if registration.topic_id:
                        self._store.set_topic_id(name, registration.topic_id)
                    self.leadership.mark_dirty()
                elif not topic.replicated:
                    logger.error("[arbiter] topic %s is replicated in the cluster but stored here "
                                 "unreplicated: its replicas are not taken", name)
                elif not topic.deleting:
                    if dict(registration.config) != topic.config:
                        changes = {**{k: None for k in topic.config if k not in registration.config},
                                   **dict(registration.config)}
                        self.admin.alter(None, name, changes, now)
                    replicas = {p: tuple(r) for p, r in registration.replicas.items()}
                    if replicas != topic.replicas:
                        self.admin.move_replicas(name, replicas)
                        self.leadership.mark_dirty()
            except HPBrokerError as e:
                logger.error("[arbiter] cannot take replicated topic %s: %s", name, e.message)
        return [t.name for t in self._store.topics() if t.replicated and t.name not in cluster.topics]

    def drop_topic(self, name: str, waiter: _Waiter | None = None) -> None:
        """A replicated topic is gone from the cluster: delete its replicas here."""
        topic = self._store.get(name)
        self.leadership.forget_topic(name)
        if topic is None or not topic.replicated:
            if waiter is not None:
                self._answer_waiter(waiter, None)
            return
        if self.replication is not None:
            self.replication.unwatch_topic(name)
        if topic.topic_id:
            self._dropped_ids[name] = topic.topic_id
        try:
            self.admin.delete(waiter, name, self._clock())
        except HPBrokerError as e:
            if waiter is not None:
                self._answer_waiter(waiter, e)

    # --- producer ids ---------------------------------------------------------------------------------

    def _init_producer_id(self, request: protocol.InitProducerIdRequest,
                          ) -> protocol.InitProducerIdResponse | HPBrokerError:
        """A producer's identity (``ProducerIdAllocator.init_producer_id``), or the error that
        refused it; never waits: with no id at hand the allocator says so at once."""
        if self.producer_ids is None:
            return CoordinationError("no producer id available yet: the broker is starting; retry")
        try:
            producer_id, producer_epoch = self.producer_ids.init_producer_id(request.producer_id,
                                                                             request.producer_epoch)
        except HPBrokerError as e:
            logger.log(logging.DEBUG if e.retriable else logging.INFO, "[arbiter] init producer id (%d, %d) "
                       "refused: %s", request.producer_id, request.producer_epoch, e.message)
            return e
        return protocol.InitProducerIdResponse(producer_id, producer_epoch)

    # --- metadata -----------------------------------------------------------------------------------

    def _metadata(self, names: list[str], principal: str | None = None) -> protocol.MetadataResponse:
        """This broker's topics from its store; the others from the cluster's registries when
        ZooKeeper is configured (leader: the live broker storing the partition, -1 and error 15
        when none does; offsets -1: only the serving broker knows them).  With security, only
        the topics ``principal`` may describe: a named one it may not gets error 28."""
        offsets = self._heartbeat_offsets()
        cluster = self._cluster() if self._cluster is not None else None
        wanted = names or sorted({t.name for t in self._store.topics()} | set(_cluster_topics(cluster)))
        if self._security is not None and not names:
            wanted = [name for name in wanted if self._security.describable(principal, name)]
        topics = []
        for name in wanted:
            topic = self._store.get(name)
            if self._security is not None and names and not self._security.describable(principal, name):
                topics.append(protocol.TopicMetadata(name, AuthorizationError.code))
            elif topic is not None and not topic.deleting:
                topics.append(protocol.TopicMetadata(
                    name, 0, [self._partition_metadata(topic, p, offsets) for p in range(topic.partitions)],
                    [protocol.TopicConfigEntry(k, v) for k, v in config_to_strings(topic.config)]))
            elif (remote := _remote_topic(cluster, name, self._config.broker_id)) is not None:
                topics.append(remote)
            else:
                try:
                    check_topic_name(name)
                    code = UnknownTopicOrPartitionError.code
                except InvalidTopicError:
                    code = InvalidTopicError.code
                topics.append(protocol.TopicMetadata(name, code))
        brokers = [protocol.BrokerInfo(self._config.broker_id, self._config.host, self._config.port,
                                       self._config.fetch_port)]
        if cluster is not None:
            brokers += [protocol.BrokerInfo(b.broker_id, b.host, b.port, (*b.data_ports, 0)[0])
                        for b_id, b in sorted(cluster.brokers.items()) if b_id != self._config.broker_id]
        return protocol.MetadataResponse(brokers, topics)

    def _partition_metadata(self, topic: Topic, partition: int,
                            offsets: dict[tuple[str, int], tuple[int, int]]) -> protocol.PartitionMetadata:
        if topic.replicated:
            return self._replicated_partition_metadata(topic, partition, offsets)
        slot = owner_slot(topic.name, partition, len(self._slots))
        code = 0 if self._slots[slot].serving else PartitionNotAvailableError.code
        log_start_offset, high_watermark = offsets.get((topic.name, partition), (-1, -1))
        return protocol.PartitionMetadata(partition, code, self._config.broker_id,
                                          self._config.fetch_port + slot, log_start_offset, high_watermark)

    def _replicated_partition_metadata(self, topic: Topic, partition: int,
                                       offsets: _Offsets) -> protocol.PartitionMetadata:
        """A replicated partition as its state says: leader, leader epoch, replicas and ISR (error
        15 while it has no leader); offsets only where this broker leads it (its heartbeat)."""
        replicas = list(topic.replicas.get(partition, ()))
        state = self.leadership.state(topic.name, partition)
        where = self.leadership.leader_location(topic.name, partition)
        if state is None or where is None:
            return protocol.PartitionMetadata(partition, PartitionNotAvailableError.code, -1, 0,
                                              leader_epoch=state.leader_epoch if state else -1,
                                              replicas=replicas, isr=list(state.isr) if state else [])
        code = 0
        log_start_offset = high_watermark = -1
        if where.broker_id == self._config.broker_id:
            slot = owner_slot(topic.name, partition, len(self._slots))
            code = 0 if self._slots[slot].serving else PartitionNotAvailableError.code
            log_start_offset, high_watermark = offsets.get((topic.name, partition), (-1, -1))
        return protocol.PartitionMetadata(partition, code, where.broker_id, where.fetch_port,
                                          log_start_offset, high_watermark, leader_epoch=state.leader_epoch,
                                          replicas=replicas, isr=list(state.isr))

    def _heartbeat_offsets(self) -> dict[tuple[str, int], tuple[int, int]]:
        """(topic, partition) -> (log_start_offset, high_watermark) from the heartbeat files of the
        serving slots' current processes."""
        offsets: dict[tuple[str, int], tuple[int, int]] = {}
        for slot in self._slots:
            if not slot.serving:
                continue
            _, content = read_heartbeat(self._run_dir, slot.index)
            if content is None or content.get("pid") != slot.pid:
                continue
            for entry in content.get("partitions") or ():
                try:
                    key = (entry["topic"], entry["partition"])
                    offsets[key] = (int(entry["log_start_offset"]), int(entry["high_watermark"]))
                except (KeyError, TypeError, ValueError):
                    continue
        return offsets

    # --- to workers and back ----------------------------------------------------------------------

    def send_control(self, slot: int, op: str, body: dict[str, Any]) -> bool:
        """Hand a control to the slot's process; False (logged) if it cannot take it now."""
        error = self._send_backend(slot, backend.encode_control(op, **body))
        if error is not None:
            logger.warning("[arbiter] could not send %s to worker slot %d: %s", op, slot, error.message)
        return error is None

    def _send_backend(self, slot: int, frames: list[Any]) -> HPBrokerError | None:
        assert self._back is not None
        try:
            self._back.send_multipart([self._identities[slot], *frames], flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return PartitionNotAvailableError(f"worker slot {slot} is not keeping up; retry")
        except zmq.ZMQError as e:
            if e.errno != zmq.EHOSTUNREACH:
                raise
            return PartitionNotAvailableError(f"worker slot {slot} is not connected")
        return None

    def forward(self, slot: int, relay: backend.Relay) -> None:
        """A worker's response: hand its frames to the client, untouched.  A response to no
        request in flight (its request was already answered with error 15 when the worker was
        reaped) is dropped: the client must not get two answers."""
        assert self._front is not None
        correlation_id = int.from_bytes(memoryview(relay.frames[0])[:4], "little")
        if self._in_flight[slot].pop((relay.client, correlation_id), None) is None:
            logger.debug("[arbiter] dropped a response of slot %d to a request not in flight", slot)
            return
        self._front.send_multipart([relay.client, *relay.frames], copy=False)

    def slot_down(self, slot: int, pid: int) -> None:
        """The slot's process is gone (reaped): answer what it left unanswered with error 15,
        and let the topic admin forget its assignment."""
        in_flight, self._in_flight[slot] = self._in_flight[slot], {}
        error = PartitionNotAvailableError(
            f"worker slot {slot} (pid {pid}) stopped before answering; a produce may or may not have "
            "been appended")
        for (client, correlation_id), (api_key, api_version) in in_flight.items():
            self._respond(client, api_key, correlation_id, error, api_version)
        self.admin.slot_down(slot)
        self.leadership.slot_down(slot)

    # --- responses ----------------------------------------------------------------------------------

    def _answer_waiter(self, waiter: _Waiter | None, error: HPBrokerError | None) -> None:
        if waiter is None:  # a change the broker made by itself (a replicated topic's), nobody waits
            return
        client, api_key, correlation_id, api_version = waiter
        self._respond(client, api_key, correlation_id, error, api_version)

    def _respond_unless_silent(self, client: bytes, header: protocol.RequestHeader, request: Any,
                               error: HPBrokerError) -> None:
        if header.api_key == ApiKey.PRODUCE and request.acks == 0:
            logger.debug("[arbiter] no response to an acks=0 produce: %s", error.message)
            return
        self._respond(client, header.api_key, header.correlation_id, error, header.api_version)

    def _respond(self, client: bytes, api_key: int, correlation_id: int,
                 outcome: protocol.Message | HPBrokerError | None, api_version: int) -> None:
        """Send a response in the request's ``api_version`` (the nearest served if it is not):
        ``outcome`` is the response body, or an error (the body's numbers then -1), or None for
        a body-less success.  An unknown ``api_key`` gets a header and an empty body
        (``payload_length`` 0 only)."""
        assert self._front is not None
        response_type = protocol.RESPONSE_TYPES.get(api_key, protocol.CreateTopicResponse)
        code, text = 0, ""
        if isinstance(outcome, HPBrokerError):
            code, text = outcome.code, outcome.message[:_MAX_ERROR_MESSAGE]
            key = (api_key if api_key in protocol.REQUEST_TYPES else UNKNOWN_API_KEY, code)
            self.error_counts[key] = self.error_counts.get(key, 0) + 1
        body = outcome if isinstance(outcome, protocol.Message) else response_type()
        frames = protocol.encode_response(body, correlation_id, code, text,
                                          version=protocol.response_version(api_key, api_version))
        self._front.send_multipart([client, *frames], copy=False)


def _cluster_topics(cluster: ClusterSnapshot | None) -> set[str]:
    """Every topic the registries know: registered, or stored by a live broker."""
    if cluster is None:
        return set()
    names = set(cluster.topics)
    for broker in cluster.brokers.values():
        names.update(broker.topics)
    return names


def _remote_topic(cluster: ClusterSnapshot | None, name: str, own_id: int) -> protocol.TopicMetadata | None:
    """``name`` as the registries describe it, if some other broker has it."""
    if cluster is None:
        return None
    registered = cluster.topics.get(name)
    stored = {p for b_id, b in cluster.brokers.items() if b_id != own_id for p in b.topics.get(name, ())}
    if registered is None and not stored:
        return None
    count = registered.partitions if registered is not None else max(stored) + 1
    partitions = []
    for partition in range(count):
        where = cluster.location(name, partition, owner_slot)
        if where is None or where.broker_id == own_id:
            partitions.append(protocol.PartitionMetadata(partition, PartitionNotAvailableError.code))
        else:
            partitions.append(protocol.PartitionMetadata(partition, 0, where.broker_id, where.fetch_port))
    config = config_to_strings(registered.config) if registered is not None else []
    return protocol.TopicMetadata(name, 0, partitions, [protocol.TopicConfigEntry(k, v) for k, v in config])
