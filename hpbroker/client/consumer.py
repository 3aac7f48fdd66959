"""The pulling consumer: assign partitions, then poll or iterate their records, seeking anywhere.

A :class:`Consumer` reads the partitions it is assigned (no consumer groups: the application
says which partitions, and where to start).  For every partition it keeps a **position**, the
offset of the next record the application gets, and a :class:`~hpbroker.client.fetcher.
PartitionFetcher` with its own TCP connection to the data port serving the partition.

How records flow, per partition::

    broker --sendfile--> socket --recv_into--> buffer --CRC, decode (compiled)--> list of records
                                                   \\--> next FetchRequest sent before decoding
    list of records --poll() or iteration--> application; position = last offset + 1

- **Long polling.**  Fetches carry ``fetch_max_wait_ms`` and ``fetch_min_bytes``: a caught-up
  partition's fetch waits in the broker until new records are flushed, and the consumer sleeps in
  ``poll(2)`` on its sockets meanwhile.  Nothing spins.
- **Pipelining.**  A partition has one decoded response waiting for the application at most, and
  one fetch on the wire: the next fetch leaves as soon as a response is whole.
- **Fast iteration.**  ``iter(consumer)`` is an ``itertools.chain`` over the decoded lists, so
  handing out a record is C code; the record objects are ``hpbroker._core.Record``, built in
  Cython.  ``position()`` stays exact mid-list (the list iterator knows how many are left).
  A list stays with its partition until the iteration reaches it, and only then does the
  partition's position move past it; so whenever the application breaks off, ``poll()``,
  ``seek()``, ``assign()`` and ``position()`` see the lists not reached.
- **Offsets outside the log.**  ``auto_offset_reset`` decides: ``"earliest"`` (the log start),
  ``"latest"`` (the high watermark) or ``"error"`` (raise OffsetOutOfRangeError with the log's
  bounds).  It also decides where a partition starts when it was never sought.
- **Errors.**  A fetch error is raised by the next ``poll()`` (or the iteration) that has no
  records to return, once; the following call tries again.  A corrupt batch is raised as
  CorruptRecordError after the records before it, with topic, partition and offset.  Offsets the
  broker knows to be unreadable (a *damaged range*: stored bytes that failed their checks, or a
  missing segment) are raised as DamagedRangeError, which says where reading can go on; with
  ``skip_damaged_ranges`` the consumer goes on there by itself, logging what it skipped and
  counting it in :attr:`Consumer.damaged_records_skipped`.
- **Faults.**  A lost connection (or a data port not reachable, or an answer overdue) is dropped;
  the metadata is asked again where the partition is served (in a cluster another broker may
  lead it now) and the fetch sent again from the position, so a broker restart or a failover
  costs at most a re-fetch, never a record.  Failures back off from
  ``retry_backoff_ms`` up to ``retry_backoff_max_ms``; a partition that has failed for
  ``reconnect_timeout_ms`` raises BrokerNotAvailableError (or the broker's last error), with the
  attempts and seconds.

**The encrypted fetch path.**  With ``fetch_via="frontend"`` a partition's fetches and
ListOffsets go through its leader's ZeroMQ front-end instead
(:class:`~hpbroker.client.frontend_fetcher.FrontendFetcher`): CurveZMQ-encrypted when the broker
has security on, checked against the ACLs there, no fetch token; no ``sendfile`` either, which
is what it costs (docs/SECURITY.md).  The partitions of one broker share one connection; the
fetch loop waits on its ZeroMQ socket beside the data connections.

Metadata (which data port serves a partition) goes over the bootstrap broker's ZeroMQ front-end
(:class:`~hpbroker.client.connection.BrokerConnection`): the first of the bootstrap addresses,
then, when the broker asked does not answer, the next that does
(:class:`~hpbroker.client.metadata.ClusterMetadata`).  ListOffsets go to the partition's data
port, where the partition is stored: a partition without a position sends one on its fetcher's
connection, in the fetch loop, before its first fetch; ``offsets_for_times`` and the like open a
connection per partition for the call.

**Nothing waits for an answer but the fetch loop.**  Metadata requests
(:class:`~hpbroker.client.metadata.MetadataRefreshes`), ListOffsets and fetches are all sent
without waiting, and answered in the loop, which sleeps in ``poll(2)`` until an answer, a retry
or timeout, the caller's deadline, or a wake-up.  So ``poll(timeout_ms)`` returns near its
timeout whatever the broker does, and ``wakeup()`` or ``close()`` end it at once.  The calls that
need an answer to return (``position()`` of a partition without one, ``seek_to_beginning()``,
``seek_to_end()``, ``offsets_for_times()``, ``beginning_offsets()``, ``end_offsets()``) run the
same loop for their partitions until answered, or until a partition has failed for
``reconnect_timeout_ms``; ``close()`` from another thread ends them (RuntimeError), and a
``wakeup()`` meanwhile is kept for the next poll or iteration.

**Consumer groups.**  ``Consumer(bootstrap, group=..., topics=[...], zookeeper=...)`` makes the
consumer a member of a group that shares the topics' partitions (``hpbroker.client.group``, which
is imported only then): the group decides the assignment, and the consumer commits offsets.

Threads: a consumer belongs to the thread that polls or iterates it.  :meth:`Consumer.wakeup` and
:meth:`Consumer.close` may be called from any thread: both make a blocked poll or iteration
return at once.  :func:`~hpbroker.client.streams.create_message_streams` gives each stream its
own consumer, so each stream may be iterated in its own thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import operator
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, NamedTuple

import zmq

from hpbroker import protocol
from hpbroker.client.columns import RecordColumns, check_columns
from hpbroker.client.connection import parse_bootstrap
from hpbroker.client.fetch_tokens import FetchTokens
from hpbroker.client.fetcher import CompletedFetch, FetchConfig, ListedOffset, PartitionFetcher
from hpbroker.client.frontend_fetcher import FETCH_VIAS, FrontendConnections, FrontendFetcher
from hpbroker.client.metadata import ClusterMetadata, MetadataRefreshes
from hpbroker.errors import (
    BrokerNotAvailableError,
    CorruptRecordError,
    DamagedRangeError,
    HPBrokerError,
    InvalidConfigError,
    OffsetOutOfRangeError,
    PartitionNotAvailableError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from hpbroker.records import Record
from hpbroker.security.client import ClientSecurity, resolve_client_security

if TYPE_CHECKING:
    from hpbroker.client.group import GroupMember

__all__ = ["AUTO_OFFSET_RESETS", "Consumer", "ConsumerConfig", "ConsumerRecord", "TopicPartition"]

logger = logging.getLogger(__name__)

AUTO_OFFSET_RESETS = ("earliest", "latest", "error")

#: What a consumer hands out: ``topic``, ``partition``, ``offset``, ``timestamp`` (ms), ``key``,
#: ``value``, ``headers`` (tuple of (str, bytes | None)), ``producer`` (the name of the producer
#: that built its batch) and ``sequence`` (that producer's number for it, or -1).
ConsumerRecord = Record


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """A consumer's settings, validated on construction; :meth:`from_settings` takes them flat,
    the fetch settings (:class:`FetchConfig`) included."""

    #: names the consumer in the broker's logs.
    client_id: str = "hpbroker-consumer"
    #: where a partition starts when never sought, or when its position falls outside the log:
    #: ``"earliest"``, ``"latest"`` or ``"error"``.  Default ``"latest"``.
    auto_offset_reset: str = "latest"
    #: ms a metadata or ListOffsets request may take.  Default 30000.
    request_timeout_ms: int = 30_000
    #: ms before the first retry after a failure; doubles per attempt.  Default 100.
    retry_backoff_ms: int = 100
    #: ms, the longest wait between retries.  Default 1000.
    retry_backoff_max_ms: int = 1_000
    #: ms a partition may keep failing (broker unreachable, partition unavailable) before the
    #: consumer raises the error.  Default 30000.
    reconnect_timeout_ms: int = 30_000
    #: ms iteration waits for a record before it ends (StopIteration); None: forever.
    consumer_timeout_ms: int | None = None
    #: None: ``poll()`` and iteration hand out record objects.  Column names
    #: (``hpbroker.client.columns.COLUMNS``, e.g. ``("timestamp", "value")``): ``poll()`` hands
    #: out one :class:`~hpbroker.client.columns.RecordColumns` per partition instead, decoded
    #: without an object per record (``offset`` is always filled); iteration is refused.
    columns: tuple[str, ...] | None = None
    #: what a fetch that reaches a *damaged range* does (stored records the broker found
    #: unreadable, DamagedRangeError, docs/PROTOCOL.md): False (default) raises the error and
    #: stays there, so nothing is lost silently; True logs a WARNING naming the offsets and goes
    #: on after the range, losing those records.
    skip_damaged_ranges: bool = False
    #: how fetches ask for records.
    fetch: FetchConfig = field(default_factory=FetchConfig)
    #: the consumer's CurveZMQ identity for a broker with ``security = "curve"``
    #: (hpbroker.security.client.ClientSecurity).  None: from $HPBROKER_CLIENT_KEY_FILE and
    #: $HPBROKER_CLIENT_SERVER_KEY_FILE, else the client config file ($HPBROKER_CLIENT_CONFIG), else no
    #: security (``resolve_client_security``); the Consumer keeps what it resolved here.
    security: ClientSecurity | None = None
    #: where fetches and ListOffsets go: ``"data_port"`` (default), the TCP data ports, where the
    #: broker sends records with ``sendfile`` (in the clear, also with security on); or
    #: ``"frontend"``, through the partition leader's ZeroMQ front-end, CurveZMQ-encrypted when the
    #: broker has security on, at a measured cost (``hpbroker.client.frontend_fetcher``,
    #: docs/SECURITY.md).  With ``data_port_auth = "loopback"``, consumers on other hosts need it.
    fetch_via: str = "data_port"

    def __post_init__(self) -> None:
        if self.fetch_via not in FETCH_VIAS:
            raise InvalidConfigError(f"fetch_via must be one of {FETCH_VIAS}, got {self.fetch_via!r}")
        if self.auto_offset_reset not in AUTO_OFFSET_RESETS:
            raise InvalidConfigError(f"auto_offset_reset must be one of {AUTO_OFFSET_RESETS}, "
                                     f"got {self.auto_offset_reset!r}")
        for name in ("request_timeout_ms", "retry_backoff_ms", "retry_backoff_max_ms",
                     "reconnect_timeout_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value < 2**31:
                raise InvalidConfigError(f"{name} must be an integer in [1, {2**31 - 1}], got {value!r}")
        if not isinstance(self.skip_damaged_ranges, bool):
            raise InvalidConfigError(f"skip_damaged_ranges must be True or False, "
                                     f"got {self.skip_damaged_ranges!r}")
        if self.consumer_timeout_ms is not None and not (isinstance(self.consumer_timeout_ms, int)
                                                         and self.consumer_timeout_ms >= 0):
            raise InvalidConfigError(f"consumer_timeout_ms must be None or an integer >= 0, "
                                     f"got {self.consumer_timeout_ms!r}")
        if self.security is not None and not isinstance(self.security, ClientSecurity):
            raise InvalidConfigError(f"security must be a ClientSecurity or None, "
                                     f"got {type(self.security).__name__}")
        if self.columns is not None:
            try:
                object.__setattr__(self, "columns", check_columns(self.columns))
            except (TypeError, ValueError) as e:
                raise InvalidConfigError(f"columns: {e}") from None

    def backoff_ms(self, attempts: int) -> int:
        """The wait before the next try after ``attempts`` failed ones (exponential, capped)."""
        return min(self.retry_backoff_max_ms, self.retry_backoff_ms << min(max(attempts - 1, 0), 20))

    @classmethod
    def from_settings(cls, **settings: object) -> ConsumerConfig:
        """Build from flat keyword settings; an unknown name raises InvalidConfigError naming it."""
        own = {f.name for f in dataclasses.fields(cls)} - {"fetch"}
        fetch_names = {f.name for f in dataclasses.fields(FetchConfig)}
        unknown = set(settings) - own - fetch_names
        if unknown:
            raise InvalidConfigError(f"unknown consumer settings {sorted(unknown)}; known: "
                                     f"{sorted(own | fetch_names)}")
        fetch = FetchConfig(**{k: v for k, v in settings.items() if k in fetch_names})  # type: ignore[arg-type]
        return cls(**{k: v for k, v in settings.items() if k in own}, fetch=fetch)  # type: ignore[arg-type]


class _PartitionState:
    """One assigned partition: position, fetcher, what waits for the application, failures.
    (Also one partition of an offset lookup: ``reset_to`` says what to list, ``position`` gets it.)"""

    __slots__ = ("attempts", "error", "failing_since", "fetcher", "high_watermark", "log_start_offset",
                 "position", "ready", "refresh_metadata", "reset_to", "retry_at", "tp")

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.position: int | None = None  # the next offset the application gets; None: not yet reset
        self.reset_to: int | None = None  # with no position: the timestamp to list; None: the policy's
        self.log_start_offset: int | None = None  # with no position and policy "error": listed so far
        self.fetcher: PartitionFetcher | None = None
        self.ready: list[Record] | RecordColumns | None = None  # decoded, not yet handed out
        self.error: HPBrokerError | None = None  # to raise once ``ready`` has been handed out
        self.high_watermark = -1  # as of the last fetch response
        self.failing_since: float | None = None  # start of the current run of failures
        self.attempts = 0
        self.retry_at = 0.0
        self.refresh_metadata = False

    def forget_fetch(self) -> None:
        """Nothing decoded or pending survives (after a seek, or leaving the assignment)."""
        self.ready = None
        self.error = None
        self.failing_since = None
        self.attempts = 0
        self.retry_at = 0.0


class Consumer:
    """Pulls records of the partitions it is assigned from the broker at ``bootstrap``.

    ``settings`` are :class:`ConsumerConfig` fields and :class:`FetchConfig` fields by name,
    e.g. ``Consumer("localhost:9092", auto_offset_reset="earliest", fetch_max_wait_ms=100)``.

    With ``group=`` (and ``topics=``, ``zookeeper=``, and the other
    :class:`~hpbroker.client.group.GroupConfig` settings) the consumer joins a consumer group,
    which assigns its partitions; :meth:`assign` is then refused.  ``on_assign=``,
    ``on_revoke=`` and ``on_lost=`` (each ``callable(partitions)``, a set of TopicPartitions)
    are its rebalance listener, called inside :meth:`poll` and the iteration
    (``hpbroker.client.group``, "Rebalance listener").
    """

    def __init__(self, bootstrap: str | Sequence[str], **settings: object) -> None:
        group_config = None
        listeners = sorted({"on_assign", "on_revoke", "on_lost"} & set(settings))
        if listeners and "group" not in settings:
            raise InvalidConfigError(f"{', '.join(listeners)}: rebalance listeners need a consumer group "
                                     "(group=, topics=, zookeeper=); an assigned consumer has no rebalances")
        if "group" in settings:  # only then is ZooKeeper's client loaded
            from hpbroker.client.group import GroupConfig

            group_config = GroupConfig.take(settings)
        self.config = ConsumerConfig.from_settings(**settings)
        self.config = dataclasses.replace(self.config, security=resolve_client_security(self.config.security))
        self._group: GroupMember | None = None
        self._bootstrap = parse_bootstrap(bootstrap)
        connect_timeout_s = min(5.0, self.config.reconnect_timeout_ms / 1000)
        self._metadata = ClusterMetadata.for_bootstrap(self._bootstrap, client_id=self.config.client_id,
                                                       connect_timeout_s=connect_timeout_s,
                                                       timeout_s=self.config.request_timeout_ms / 1000,
                                                       security=self.config.security)
        self._refreshes = MetadataRefreshes(self._metadata, timeout_s=self.config.request_timeout_ms / 1000)
        self._fetch_tokens: FetchTokens | None = None  # made by the first secured fetcher
        self._frontends: FrontendConnections | None = None  # fetch_via "frontend": made by the first fetcher
        self._states: dict[TopicPartition, _PartitionState] = {}
        #: records stepped over in damaged ranges (``skip_damaged_ranges``), since creation.
        self.damaged_records_skipped = 0
        self._iterator: Iterator[Record] | None = None
        self._iteration = 0  # which _record_lists generator is current
        self._iterated: tuple[_PartitionState, list[Record], Iterator[Record]] | None = None
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        # Held while polling; close() takes it to know nobody is.  Re-entrant: a rebalance
        # listener, called inside poll(), may commit().
        self._lock = threading.RLock()
        self._wake_pending = False  # a wakeup() taken in by an offset lookup, for the next wait
        self._closed = False
        if group_config is not None:
            from hpbroker.client.group import GroupMember

            try:
                self._group = GroupMember(self, group_config, self._metadata.connection)
            except BaseException:
                self.close()
                raise

    def __repr__(self) -> str:
        group = "" if self._group is None else f", group={self._group.config.group!r}"
        address = self._metadata.connection.address
        return f"Consumer({address}{group}, assignment={sorted(map(str, self._states))})"

    # --- assignment and positions -------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Read exactly these partitions from now on.  Partitions kept keep their positions; new
        ones start where ``auto_offset_reset`` says unless sought."""
        self._check_open()
        if self._group is not None:
            raise RuntimeError(f"assign() is refused in a consumer group (group {self._group.config.group!r} "
                               "assigns the partitions)")
        wanted = list(dict.fromkeys(_topic_partition(tp) for tp in partitions))
        for tp in [tp for tp in self._states if tp not in wanted]:
            state = self._states.pop(tp)
            self._drop_iterated(state)
            if state.fetcher is not None:
                state.fetcher.close()
        for tp in wanted:
            if tp not in self._states:
                self._states[tp] = _PartitionState(tp)

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer reads: assigned, or, in a group, owned."""
        return set(self._states)

    def partitions_for_topic(self, topic: str) -> set[int]:
        """The topic's partition numbers (asks the broker); UnknownTopicOrPartitionError if none."""
        self._check_open()
        return {info.partition for info in self._metadata.partitions(topic, refresh=True)}

    def position(self, tp: TopicPartition) -> int:
        """The offset of the next record the application gets from ``tp`` (after the records
        already handed out, also mid-iteration).  Resets a never-sought partition first."""
        state = self._state(tp)
        if state.position is None:
            with self._lock:
                self._settle([state])
        assert state.position is not None
        iterated = self._iterated
        if iterated is not None and iterated[0] is state:
            return state.position - operator.length_hint(iterated[2])
        return state.position

    def highwater(self, tp: TopicPartition) -> int | None:
        """The high watermark the last fetch response of ``tp`` carried, None before one came."""
        state = self._state(tp)
        return state.high_watermark if state.high_watermark >= 0 else None

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read ``tp`` from ``offset`` on.  Records fetched but not yet handed out are dropped; an
        offset outside the log is found at the next fetch (``auto_offset_reset`` decides)."""
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be an integer >= 0, got {offset!r}")
        state = self._state(tp)
        self._drop_iterated(state)
        state.forget_fetch()
        fetcher = state.fetcher
        if fetcher is not None and fetcher.in_flight and fetcher.fetch_offset != offset:
            fetcher.disconnect()  # its answer is for another offset; reconnecting beats waiting for it
        state.position, state.reset_to, state.log_start_offset = offset, None, None

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Seek to the log start offset of each of ``partitions`` (all assigned ones if none)."""
        self._seek_to(protocol.EARLIEST_TIMESTAMP, partitions)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Seek to the high watermark of each of ``partitions`` (all assigned ones if none): only
        records produced from now on are read."""
        self._seek_to(protocol.LATEST_TIMESTAMP, partitions)

    def _seek_to(self, timestamp: int, partitions: Sequence[TopicPartition]) -> None:
        tps = [_topic_partition(tp) for tp in partitions] or list(self._states)
        for tp in tps:
            self._state(tp)
        for tp, offset in self._list_offsets(dict.fromkeys(tps, timestamp)).items():
            self.seek(tp, offset)

    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, int | None]:
        """For each partition, the earliest offset whose record timestamp is at least the given
        one (ms), or None when no record is that recent (ListOffsetsRequest)."""
        self._check_open()
        for tp, timestamp in timestamps.items():
            if not isinstance(timestamp, int) or timestamp < 0:
                raise ValueError(f"timestamp of {tp} must be ms since the epoch (>= 0), got {timestamp!r}")
        offsets = self._list_offsets({_topic_partition(tp): ts for tp, ts in timestamps.items()})
        return {tp: (offset if offset >= 0 else None) for tp, offset in offsets.items()}

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The log start offset of each partition."""
        self._check_open()
        tps = map(_topic_partition, partitions)
        return self._list_offsets(dict.fromkeys(tps, protocol.EARLIEST_TIMESTAMP))

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The high watermark of each partition: the offset the next record will get."""
        self._check_open()
        tps = map(_topic_partition, partitions)
        return self._list_offsets(dict.fromkeys(tps, protocol.LATEST_TIMESTAMP))

    # --- consumer groups ----------------------------------------------------------------------

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Commit the group's offsets synchronously: ``offsets`` (the next offset to consume, per
        owned partition), by default the position of every owned partition.  CoordinationError
        when ZooKeeper cannot be reached or a partition is not (or no longer) owned."""
        group = self._need_group("commit()")
        with self._lock:
            group.commit(None if offsets is None else {_topic_partition(tp): o for tp, o in offsets.items()})

    def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset of ``tp`` (owned or not), read from ZooKeeper; None if the
        group never committed one."""
        return self._need_group("committed()").committed(_topic_partition(tp))

    def _need_group(self, what: str) -> GroupMember:
        self._check_open()
        if self._group is None:
            raise RuntimeError(f"{what} needs a consumer group: Consumer(..., group=..., topics=..., "
                               "zookeeper=...)")
        return self._group

    def _group_take(self, tp: TopicPartition, offset: int | None) -> None:
        """The group gave this consumer ``tp``: read it from ``offset`` (None: auto_offset_reset)."""
        state = self._states[tp] = _PartitionState(tp)
        state.position = offset

    def _group_drop(self, tp: TopicPartition) -> None:
        """The group took ``tp`` away: stop fetching it, discard what was fetched."""
        state = self._states.pop(tp, None)
        if state is not None:
            self._drop_iterated(state)
            if state.fetcher is not None:
                state.fetcher.close()

    def _group_positions(self, held: tuple[TopicPartition, int] | None = None) -> dict[TopicPartition, int]:
        """The position of every partition that has one, exact mid-iteration (``held``: one
        taken before the iterated list was cleared)."""
        positions = {tp: state.position for tp, state in self._states.items() if state.position is not None}
        iterated = self._iterated
        if iterated is not None and iterated[0].position is not None and \
                self._states.get(iterated[0].tp) is iterated[0]:
            positions[iterated[0].tp] = iterated[0].position - operator.length_hint(iterated[2])
        if held is not None and held[0] in positions:
            positions[held[0]] = min(positions[held[0]], held[1])
        return positions

    # --- reading ------------------------------------------------------------------------------

    def poll(self, timeout_ms: int = 0) -> dict[TopicPartition, list[Record] | RecordColumns]:
        """The records fetched so far, by partition, in offset order; waits up to ``timeout_ms``
        for some when none has arrived.  An empty dict when none came (or on :meth:`wakeup`).
        Raises a partition's pending error when there are no records to return.  A consumer
        made with ``columns=`` returns one RecordColumns per partition instead of a list."""
        self._check_open()
        out: dict[TopicPartition, list[Record] | RecordColumns] = {}
        if self._iterated is not None:  # records an interrupted iteration did not hand out
            state, _, rest = self._iterated
            left = list(rest)
            if left and self._group is not None and not self._group.may_hand_out():
                if self._states.get(state.tp) is state:  # still owned: fetched again later
                    self.seek(state.tp, left[0].offset)
                left = []
            if left:
                out[state.tp] = left
        if out:
            return out
        ready, _ = self._next_ready(time.monotonic() + max(0, timeout_ms) / 1000)
        for state in ready:
            records = self._take(state)
            if records is not None:
                out[state.tp] = records
        return out

    def __iter__(self) -> Iterator[Record]:
        """Every record of the assigned partitions, as they arrive; blocks while nothing is new
        (``consumer_timeout_ms`` bounds the wait), ends on :meth:`wakeup` or :meth:`close`.
        Breaking out of the loop and iterating again continues where it stopped."""
        self._check_open()
        if self.config.columns is not None:
            raise TypeError("this consumer was made with columns=: read it with poll(), which hands "
                            "out RecordColumns, not records")
        if self._iterator is None:
            self._iteration += 1
            self._iterator = itertools.chain.from_iterable(self._record_lists(self._iteration))
        return self._iterator

    def __next__(self) -> Record:
        return next(iter(self))

    def _record_lists(self, iteration: int) -> Iterator[Iterator[Record]]:
        timeout_ms = self.config.consumer_timeout_ms
        try:
            while not self._closed:
                deadline = float("inf") if timeout_ms is None else time.monotonic() + timeout_ms / 1000
                ready, woken = self._next_ready(deadline)
                # The last round's lists live on until this round's are decoded: freed before,
                # their memory goes back to the system and decoding faults it in again page by
                # page (measured: 60,000 page faults instead of 800 for 3 M records, 10 % slower).
                handed: list[list[Record]] = []
                for state in ready:
                    records = self._take(state)
                    if records is None:
                        continue  # dropped meanwhile: sought, assigned away, polled, rebalanced
                    handed.append(records)
                    records_iterator = iter(records)
                    self._iterated = (state, records, records_iterator)
                    group = self._group
                    yield records_iterator if group is None else group.leased(state.tp, records_iterator)
                if woken or (not ready and timeout_ms is not None):
                    return
        finally:
            if self._iteration == iteration:
                self._iterated = None
                self._iterator = None

    def _next_ready(self, deadline: float) -> tuple[list[_PartitionState], bool]:
        """Fetch until some partition has records (or an error) or ``deadline``.  Returns the
        partitions whose records may be handed out, and whether :meth:`wakeup` cut the wait
        short; each list stays with its partition until :meth:`_take` hands it out."""
        with self._lock:
            if self._closed:
                return [], True
            if self._group is not None and self._group.in_listener:
                raise RuntimeError("poll() and iteration are refused inside a rebalance listener")
            woken = self._run(deadline)
            if self._group is not None and not self._group.may_hand_out():
                return [], woken
            ready = [state for state in self._states.values() if state.ready]
            if not ready:
                for state in self._states.values():
                    if state.error is not None:
                        error, state.error = state.error, None
                        raise error
            return ready, woken

    def _take(self, state: _PartitionState) -> list[Record] | RecordColumns | None:
        """Hand out ``state``'s records, moving its position past them; None when they are gone
        (a seek, an assignment or a poll came first) or the partition is no longer assigned."""
        records = state.ready
        if not records or self._states.get(state.tp) is not state:
            return None
        state.ready = None
        if isinstance(records, RecordColumns):
            state.position = records.next_offset
        else:
            state.position = records[-1].offset + 1
        return records

    def _run(self, deadline: float) -> bool:
        """The fetch loop: start requests, sleep on the sockets, take responses.  True if woken."""
        while True:
            now = time.monotonic()
            if self._group is not None:
                self._group.service(now)
                self._group.raise_listener_error()  # the rebalance is over: what a listener raised
            states = self._states.values()
            self._start_requests(states, now)
            if self._has_output() and (self._group is None
                                       or (self._group.may_hand_out() and self._has_output())):
                return False  # (the group may have dropped partitions before allowing the rest)
            if self._wake_pending:  # a wakeup() that came while offsets were being looked up
                self._wake_pending = False
                return True
            due = self._next_timer(now, states)
            if self._group is not None:
                due = min(due, self._group.next_due(now))
            wait_s = max(0.0, min(deadline, due) - now)
            if self._wait(min(wait_s, 1.0), states) or self._closed:
                return True
            if time.monotonic() >= deadline:
                return False

    def _settle(self, states: list[_PartitionState]) -> None:
        """Run the fetch loop for ``states`` alone until each has a position (its ListOffsets
        answered) or an error, and raise the first error.  A partition gives up after failing
        for ``reconnect_timeout_ms``; :meth:`close` from another thread ends the wait at once
        (RuntimeError); a :meth:`wakeup` is kept for the next poll or iteration.  Lock held."""
        while pending := [state for state in states if state.position is None and state.error is None]:
            self._check_open()
            now = time.monotonic()
            self._start_requests(pending, now)
            wait_s = max(0.0, self._next_timer(now, pending) - now)
            if self._wait(min(wait_s, 1.0), pending):
                self._wake_pending = True
        for state in states:
            if state.error is not None:
                error, state.error = state.error, None
                raise error

    def _has_output(self) -> bool:
        return any(state.ready or state.error is not None for state in self._states.values())

    def _next_timer(self, now: float, states: Iterable[_PartitionState]) -> float:
        """The next moment something is due: a retry, or a request becoming overdue."""
        due = self._refreshes.next_due()
        for state in states:
            if state.retry_at > now:
                due = min(due, state.retry_at)
            if state.fetcher is not None and state.fetcher.in_flight:
                due = min(due, state.fetcher.deadline())
        return due

    def _wait(self, timeout_s: float, states: Iterable[_PartitionState]) -> bool:
        """Sleep until a response for one of ``states`` arrives (a fetch, a ListOffsets, or the
        metadata they wait for), take it; True if woken by :meth:`wakeup`."""
        waiting: dict[int, _PartitionState] = {}
        # fetch_via "frontend": the states waiting on each shared ZeroMQ socket, and those whose
        # answer another fetcher already read off it (the socket no longer shows it)
        on_sockets: dict[zmq.Socket, list[_PartitionState]] = {}
        answered: list[_PartitionState] = []
        for state in states:
            fetcher = state.fetcher
            if state.ready is None and fetcher is not None and fetcher.in_flight:
                if isinstance(fetcher, FrontendFetcher):
                    if fetcher.answered:
                        answered.append(state)
                    for pollable in fetcher.pollables():
                        on_sockets.setdefault(pollable, []).append(state)
                else:
                    waiting[fetcher.fileno()] = state
        timeout_ms = 0 if answered else int(timeout_s * 1000 + 0.999)
        refreshes = self._refreshes
        if refreshes.events() and self._take_refreshes(states, time.monotonic()):
            return False  # metadata came (or failed) meanwhile: the loop looks again at once
        events = refreshes.events()
        if events or on_sockets:  # ZeroMQ sockets to wait on too (zmq_poll takes both kinds)
            zmq_poller = zmq.Poller()
            if events:  # a metadata request on its way
                zmq_poller.register(refreshes.connection.socket, events)
            for pollable in on_sockets:
                zmq_poller.register(pollable, zmq.POLLIN)
            for fd in (self._wake_reader.fileno(), *waiting):
                zmq_poller.register(fd, zmq.POLLIN)
            ready = []
            for fd, _ in zmq_poller.poll(timeout_ms):
                if isinstance(fd, int):
                    ready.append(fd)
                else:
                    answered += on_sockets.get(fd, ())
        else:
            poller = select.poll()
            for fd in (self._wake_reader.fileno(), *waiting):
                poller.register(fd, select.POLLIN)
            ready = [fd for fd, _ in poller.poll(timeout_ms)]
        for state in dict.fromkeys(answered):  # each once, in order
            if state.fetcher is not None and state.fetcher.in_flight:
                self._receive(state)
        woken = False
        for fd in ready:
            state = waiting.get(fd)
            if state is not None:
                self._receive(state)
                continue
            try:
                while data := self._wake_reader.recv(4096):
                    woken = woken or b"w" in data  # b"n" (a nudge) only makes the loop look again
            except BlockingIOError:
                pass
        if events:
            self._take_refreshes(states, time.monotonic())
        return woken

    def _take_refreshes(self, states: Iterable[_PartitionState], now: float) -> bool:
        """Hand the metadata answers (or failures) that came to the ``states`` waiting for them;
        True if any came."""
        settled = self._refreshes.take(now)
        for state in states:
            if state.tp.topic in settled and state.fetcher is None and state.refresh_metadata:
                error = settled[state.tp.topic]
                if error is None:
                    state.refresh_metadata = False  # what the metadata says now is fresh
                elif isinstance(error, UnknownTopicOrPartitionError) or not error.retriable:
                    state.error = error
                else:
                    self._failed(state, type(error)(f"{state.tp}: no metadata: {error.message}"))
        return bool(settled)

    # --- fetching -----------------------------------------------------------------------------

    def _start_requests(self, states: Iterable[_PartitionState], now: float) -> None:
        """Send each partition's next request, unless it holds records or an error for the
        application, waits for a retry or has one in flight: a ListOffsets while it has no
        position, else a fetch."""
        for state in states:
            if state.ready or state.error is not None or now < state.retry_at:
                continue
            fetcher = state.fetcher
            if fetcher is not None and fetcher.in_flight:
                if fetcher.overdue(now):
                    waiting_for = fetcher.waiting_for()
                    self._connection_failed(state, RequestTimedOutError(
                        f"no answer from {fetcher.host}:{fetcher.port} to {waiting_for}"))
                continue
            try:
                if fetcher is None:
                    fetcher = state.fetcher = self._new_fetcher(state, now)
                    if fetcher is None:
                        continue  # its topic's metadata is on its way
                if state.position is None:
                    fetcher.list_offsets(self._lookup_timestamp(state))
                else:
                    fetcher.fetch(state.position)
            except OSError as e:
                where = f"{fetcher.host}:{fetcher.port}" if fetcher is not None else "?"
                self._connection_failed(state, BrokerNotAvailableError(
                    f"data port {where} serving {state.tp} is not reachable: {e}"))
            except HPBrokerError as e:
                if isinstance(e, UnknownTopicOrPartitionError) or not e.retriable:
                    state.error = e
                else:
                    self._failed(state, e)

    def _new_fetcher(self, state: _PartitionState, now: float) -> PartitionFetcher | None:
        """A fetcher for the data port the metadata names for the partition; None (and the
        metadata asked for, without waiting) when the topic is unknown here or must be fresh."""
        tp = state.tp
        partitions = None if state.refresh_metadata else self._metadata.cached(tp.topic)
        if partitions is None:
            state.refresh_metadata = True
            self._refreshes.want(tp.topic, now)
            return None
        state.refresh_metadata = True  # until a request succeeds: the next attempt asks again
        if tp.partition >= len(partitions):
            raise UnknownTopicOrPartitionError(f"topic {tp.topic!r} has {len(partitions)} partitions, "
                                               f"no partition {tp.partition}")
        info = partitions[tp.partition]
        if info.error_code or not info.fetch_port:
            raise error_for_code(info.error_code or PartitionNotAvailableError.code,
                                 f"{tp} is not being served (error {info.error_code}, data port "
                                 f"{info.fetch_port})")
        if self.config.fetch_via == "frontend":
            return self._new_frontend_fetcher(tp)
        return PartitionFetcher(tp.topic, tp.partition, info.host, info.fetch_port, self.config.fetch,
                                self.config.client_id, columns=self.config.columns, token=self._fetch_token())

    def _new_frontend_fetcher(self, tp: TopicPartition) -> FrontendFetcher:
        """A fetcher through the front-end of the partition's leader (``fetch_via="frontend"``),
        over the connection the fetchers of that broker share."""
        address = self._metadata.leader_address(tp.topic, tp.partition) or self._metadata.connection.address
        if self._frontends is None:
            self._frontends = FrontendConnections(
                client_id=self.config.client_id, security=self.config.security,
                connect_timeout_s=min(5.0, self.config.reconnect_timeout_ms / 1000))
        return FrontendFetcher(tp.topic, tp.partition, self._frontends, address, self.config.fetch,
                               self.config.client_id, columns=self.config.columns)

    def _fetch_token(self) -> Callable[[bool], str | None] | None:
        """What a secured consumer's fetchers authenticate their data connections with: a fetch
        token asked over the metadata connection (any broker's token serves the whole cluster,
        ``hpbroker.client.fetch_tokens``); None without security."""
        connection = self._metadata.connection
        if connection.security is None:
            return None
        if self._fetch_tokens is None:
            self._fetch_tokens = FetchTokens(connection.security, lambda _address: self._metadata.connection,
                                             timeout_s=self.config.request_timeout_ms / 1000)
        tokens = self._fetch_tokens
        return lambda fresh=False: tokens.token_for(self._metadata.connection.address, fresh=fresh)

    def _receive(self, state: _PartitionState) -> None:
        fetcher = state.fetcher
        assert fetcher is not None
        waiting_for = fetcher.waiting_for()
        try:
            completed = fetcher.receive()
        except (OSError, HPBrokerError) as e:
            self._connection_failed(state, BrokerNotAvailableError(
                f"lost the data connection to {fetcher.host}:{fetcher.port} waiting for {waiting_for}: {e}"))
            return
        if completed is None:
            return
        if isinstance(completed, ListedOffset):
            self._listed(state, completed)
            return
        if completed.fetch_offset != state.position:  # cannot happen: seek() drops stale fetches
            logger.warning("[%s] dropped a fetch response from offset %d at position %s", state.tp,
                           completed.fetch_offset, state.position)
            fetcher.disconnect()
            return
        state.failing_since = None
        state.attempts = 0
        state.refresh_metadata = False
        state.high_watermark = completed.high_watermark
        if completed.records:
            state.ready = completed.records
        if completed.error is not None:
            self._fetch_error(state, completed)

    def _listed(self, state: _PartitionState, listed: ListedOffset) -> None:
        """A ListOffsets answer: the partition's position (or, for the policy "error", the
        log's bounds: first its start, then its end, then the error)."""
        if listed.error is not None:
            self._partition_error(state, listed.error)
            return
        state.failing_since = None
        state.attempts = 0
        state.refresh_metadata = False
        if state.reset_to is not None or self.config.auto_offset_reset != "error":
            state.position, state.reset_to = listed.offset, None
        elif state.log_start_offset is None:
            state.log_start_offset = listed.offset  # the loop lists the end next
        else:
            start, end = state.log_start_offset, listed.offset
            state.log_start_offset = None
            state.error = OffsetOutOfRangeError(
                f"{state.tp} has no position and auto_offset_reset is 'error': seek() it first; the log "
                f"holds offsets {start} up to {end} (exclusive)", start, end)

    def _lookup_timestamp(self, state: _PartitionState) -> int:
        """What a partition without a position lists: a seek's timestamp, or the policy's."""
        if state.reset_to is not None:
            return state.reset_to
        policy = self.config.auto_offset_reset
        if policy == "latest" or (policy == "error" and state.log_start_offset is not None):
            return protocol.LATEST_TIMESTAMP
        return protocol.EARLIEST_TIMESTAMP

    def _fetch_error(self, state: _PartitionState, completed: CompletedFetch) -> None:
        error = completed.error
        assert error is not None
        if isinstance(error, OffsetOutOfRangeError):
            policy = self.config.auto_offset_reset
            if policy == "error":
                state.error = error
            else:
                offset = error.log_start_offset if policy == "earliest" else error.log_end_offset
                logger.info("[%s] offset %d is out of range; resetting to the %s offset %d", state.tp,
                            completed.fetch_offset, policy, offset)
                state.position = offset if offset >= 0 else None
        elif (isinstance(error, DamagedRangeError) and self.config.skip_damaged_ranges
              and error.next_offset > completed.fetch_offset):
            logger.warning("[%s] skipping offsets [%d, %d): they lie in a damaged range (%s)", state.tp,
                           completed.fetch_offset, error.next_offset, error.message)
            self.damaged_records_skipped += error.next_offset - completed.fetch_offset
            state.position = error.next_offset
        else:
            self._partition_error(state, error)

    def _partition_error(self, state: _PartitionState, error: HPBrokerError) -> None:
        """The broker's answer for the partition is an error: retry the retriable ones (but a
        corrupt batch) through fresh metadata, keep the others for the application."""
        if error.retriable and not isinstance(error, CorruptRecordError):
            if state.fetcher is not None:
                state.fetcher.close()
                state.fetcher = None  # the partition may be served elsewhere now: ask the metadata
            state.refresh_metadata = True
            self._failed(state, error)
        else:
            state.error = error

    def _connection_failed(self, state: _PartitionState, error: HPBrokerError) -> None:
        """The partition's data port is unreachable, its connection was lost or its answer is
        overdue: drop the connection and back off; the next attempt asks the metadata where the
        partition is served first (in a cluster its leader may be gone, and another one leads it)."""
        if state.fetcher is not None:
            state.fetcher.close()
            state.fetcher = None
        state.refresh_metadata = True
        self._failed(state, error)

    def _failed(self, state: _PartitionState, error: HPBrokerError) -> None:
        """A retriable failure: back off, or give up once failing for ``reconnect_timeout_ms``."""
        now = time.monotonic()
        if state.failing_since is None:
            state.failing_since, state.attempts = now, 0
        state.attempts += 1
        elapsed_s = now - state.failing_since
        if elapsed_s * 1000 >= self.config.reconnect_timeout_ms:
            state.error = type(error)(f"{error.message}; gave up on {state.tp} after {state.attempts} "
                                      f"attempts in {elapsed_s:.1f} s")
            state.failing_since, state.attempts, state.retry_at = None, 0, 0.0
            return
        backoff_ms = self.config.backoff_ms(state.attempts)
        state.retry_at = now + backoff_ms / 1000
        logger.debug("[%s] attempt %d failed (%s); retrying in %d ms", state.tp, state.attempts, error,
                     backoff_ms)

    # --- offsets over the data ports -----------------------------------------------------------

    def _list_offsets(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """ListOffsets for every partition, assigned or not, each over a connection of its own to
        its data port (closed afterwards), all in flight together; bounded like :meth:`_settle`."""
        states = []
        for tp, timestamp in timestamps.items():
            state = _PartitionState(tp)
            state.reset_to = timestamp
            states.append(state)
        try:
            with self._lock:
                self._settle(states)
        finally:
            for state in states:
                if state.fetcher is not None:
                    state.fetcher.close()
        return {state.tp: state.position for state in states if state.position is not None}

    # --- lifecycle ----------------------------------------------------------------------------

    def wakeup(self) -> None:
        """Make a blocked :meth:`poll` return and a blocked iteration end, now or at their next
        wait.  Safe from any thread."""
        with contextlib.suppress(OSError):  # a wake-up is already pending, or the consumer is closed
            self._wake_writer.send(b"w")

    def _nudge(self) -> None:
        """Make the fetch loop look at its group again without ending a poll or iteration (from
        kazoo's threads)."""
        with contextlib.suppress(OSError):
            self._wake_writer.send(b"n")

    def close(self) -> None:
        """Close every connection.  Safe from any thread: a blocked poll or iteration returns.
        Refused (RuntimeError) inside a rebalance listener, where a poll is running on this
        very thread: close after it returns."""
        if self._group is not None and self._group.in_listener:
            raise RuntimeError("close() is refused inside a rebalance listener, as poll() is: the poll "
                               "that called the listener is still running; close the consumer after "
                               "poll() returns (wakeup() makes it return)")
        if self._closed:
            return
        self._closed = True
        iterated = self._iterated
        held = None  # the exact position of the list being iterated, taken before it is cleared
        if iterated is not None:
            if iterated[0].position is not None:
                held = (iterated[0].tp, iterated[0].position - operator.length_hint(iterated[2]))
            iterated[1].clear()
        self.wakeup()
        with self._lock:
            if self._group is not None:
                self._group.close(self._group_positions(held))
            for state in self._states.values():
                if state.fetcher is not None:
                    state.fetcher.close()
                state.ready = None
            if self._frontends is not None:
                self._frontends.close()
            self._metadata.close()
            self._wake_reader.close()
            self._wake_writer.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    # --- helpers ------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the consumer is closed")

    def _state(self, tp: TopicPartition) -> _PartitionState:
        self._check_open()
        state = self._states.get(_topic_partition(tp))
        if state is None:
            raise ValueError(f"{tp} is not assigned to this consumer (assigned: "
                             f"{sorted(map(str, self._states))})")
        return state

    def _drop_iterated(self, state: _PartitionState) -> None:
        """Stop handing out the rest of ``state``'s list being iterated (a seek moved on)."""
        iterated = self._iterated
        if iterated is not None and iterated[0] is state:
            iterated[1].clear()
            self._iterated = None


def _topic_partition(tp: TopicPartition | tuple[str, int]) -> TopicPartition:
    topic, partition = tp
    if not isinstance(topic, str) or not isinstance(partition, int) or partition < 0:
        raise ValueError(f"expected TopicPartition(topic: str, partition: int >= 0), got {tp!r}")
    return tp if isinstance(tp, TopicPartition) else TopicPartition(topic, partition)
