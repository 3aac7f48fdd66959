"""What a worker does with each request, whichever transport it came on.

:class:`RequestHandler` serves the three requests the arbiter relays to a worker (produce, fetch,
list-offsets; fetch and list-offsets also arrive on the TCP data port) against the worker's
:class:`~hpbroker.workers.partitions.PartitionSet`, and answers through a *responder*
(``hpbroker.workers.replies``).  It knows nothing of sockets: the backend relay and the data port
decode the frames, pick the request types they serve, and deliver the replies.

Errors never escape: an :class:`~hpbroker.errors.HPBrokerError` becomes an error response with
its code and message, anything else an ``UnknownServerError`` response and a logged traceback.
An acks=0 produce gets no response at all, not even an error.

Replicated partitions (``hpbroker.workers.replication``): produce, consumer fetches and
list-offsets are served only where the partition is led (NotLeaderOrFollowerError naming the
leader elsewhere); a fetch with ``replica_id`` >= 0 is a follower's, served by the leader's
:meth:`~hpbroker.workers.replication.Replication.replica_fetch`.  Consumers read below the
replicated high watermark, and list-offsets LATEST answers it.

Every request is counted and its answer measured (``hpbroker.workers.stats``): its responder is
wrapped in a :class:`~hpbroker.workers.stats.TimedResponder` as it arrives.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Hashable, Sequence
from typing import Any

import zmq

from hpbroker import protocol
from hpbroker.errors import HPBrokerError, InvalidRequestError, StorageError, UnknownServerError
from hpbroker.protocol import ApiKey
from hpbroker.workers.partitions import FETCH_MAX_BYTES, FetchWaiter, PartitionSet
from hpbroker.workers.replication import Replication
from hpbroker.workers.replies import Responder, error_reply, list_offsets_reply
from hpbroker.workers.stats import TimedResponder, WorkerStats

__all__ = ["RELAYED_API_KEYS", "RequestHandler"]

logger = logging.getLogger(__name__)

# The requests the arbiter relays to the worker owning the partition.
RELAYED_API_KEYS = frozenset({ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.LIST_OFFSETS})


class RequestHandler:
    """Serves produce, fetch and list-offsets requests; single-threaded (the event loop)."""

    def __init__(self, partitions: PartitionSet, stats: WorkerStats, *, max_wait_ms: int = 30_000,
                 replication: Replication | None = None) -> None:
        """``max_wait_ms``: the longest a fetch may be parked (the broker's ``fetch_max_wait_ms``);
        a fetch asking for more waits this long.  ``replication``: the worker's roles (None: no
        partition is replicated, replica fetches are refused)."""
        self._partitions = partitions
        self._stats = stats
        self._max_wait_ms = max_wait_ms
        self._replication = replication
        self._broker_id = replication.broker_id if replication is not None else -1

    def handle_relayed(self, frames: Sequence[Any], responder: Responder, order_key: Hashable) -> None:
        """A request relayed by the arbiter, as its protocol frames.  One that does not parse is
        answered with its error when its header parsed, else dropped (nobody to answer)."""
        try:
            header, request = protocol.decode_request(frames)
        except HPBrokerError as e:
            header = getattr(e, "header", None)
            if header is None:
                logger.warning("dropped a relayed request whose header does not parse: %s", e)
            else:
                responder(error_reply(header.api_key, header.correlation_id, e, version=header.api_version))
            return
        except Exception:
            logger.exception("dropped a relayed request that could not be decoded")
            return
        self.dispatch(header, request, responder, order_key, RELAYED_API_KEYS)

    def dispatch(self, header: protocol.RequestHeader, request: protocol.Message, responder: Responder,
                 order_key: Hashable, served: Collection[int], transport: str = "zmq") -> None:
        """Serve a decoded request.  ``order_key`` names who must get its fetch responses in order
        (a client, a connection); ``served`` are the API keys this transport accepts;
        ``transport`` names it for the measurements (``"zmq"``: relayed, ``"tcp"``: data port)."""
        api_key = header.api_key
        responder = self._stats.timed(responder, api_key, transport)
        try:
            if api_key not in served:
                raise InvalidRequestError(f"{type(request).__name__} (api_key {api_key}) is not served here; "
                                          f"this port serves api keys {sorted(served)}")
            if api_key == ApiKey.PRODUCE:
                self._produce(header, request, responder)  # type: ignore[arg-type]
            elif api_key == ApiKey.FETCH:
                self._fetch(header, request, responder, order_key)  # type: ignore[arg-type]
            else:
                self._list_offsets(header, request, responder)  # type: ignore[arg-type]
        except HPBrokerError as e:
            if not _silent(request):
                responder(error_reply(api_key, header.correlation_id, e, version=header.api_version))
        except Exception as e:
            logger.exception("unexpected error serving %s %d from %r", type(request).__name__,
                             header.correlation_id, header.client_id)
            if not _silent(request):
                error = UnknownServerError(f"unexpected {type(e).__name__} in the broker: {e}")
                responder(error_reply(api_key, header.correlation_id, error, version=header.api_version))

    def _produce(self, header: protocol.RequestHeader, request: protocol.ProduceRequest,
                 responder: Responder) -> None:
        partition = self._partitions.get(request.topic, request.partition)
        if request.acks not in (0, 1, protocol.ACKS_ALL):
            raise InvalidRequestError(f"acks must be 0, 1 or -1 (all), got {request.acks}")
        partition.check_leader(self._broker_id)
        payload = memoryview(request.payload).toreadonly()
        deadline = time.monotonic() + request.timeout_ms / 1000
        partition.produce(payload, request.acks, header.correlation_id, responder, deadline,
                          request.timeout_ms, immutable=_received_frame(payload), version=header.api_version)

    def _fetch(self, header: protocol.RequestHeader, request: protocol.FetchRequest,
               responder: TimedResponder, order_key: Hashable) -> None:
        partition = self._partitions.get(request.topic, request.partition)
        replica = request.replica_id >= 0
        if not replica:
            partition.check_leader(self._broker_id)
        elif self._replication is None:
            raise InvalidRequestError(f"a replica fetch from broker {request.replica_id}, but this worker "
                                      f"does not replicate")
        responder.partition = partition
        max_bytes = min(max(request.max_bytes, 1), FETCH_MAX_BYTES)
        max_wait_ms = min(request.max_wait_ms, self._max_wait_ms)
        waiter = FetchWaiter(header.correlation_id, responder, order_key, request.offset, max_bytes,
                             request.min_bytes, expired=max_wait_ms == 0, version=header.api_version,
                             replica=replica)
        deadline = time.monotonic() + max_wait_ms / 1000
        if replica:
            assert self._replication is not None
            self._replication.replica_fetch(partition, request, waiter, deadline)
        else:
            partition.fetch(waiter, deadline)
        if not waiter.finished:
            responder.parked = True

    def _list_offsets(self, header: protocol.RequestHeader, request: protocol.ListOffsetsRequest,
                      responder: Responder) -> None:
        partition = self._partitions.get(request.topic, request.partition)
        partition.check_leader(self._broker_id)
        log = partition.log
        if log.offline:
            raise StorageError(f"[{log.name}] the partition is offline after a disk error")
        timestamp = request.timestamp
        if timestamp == protocol.LATEST_TIMESTAMP:
            offset = partition.high_watermark
        elif timestamp == protocol.EARLIEST_TIMESTAMP:
            offset = log.log_start_offset
        elif timestamp < 0:
            raise InvalidRequestError(f"timestamp {timestamp}: expected -1 (latest), -2 (earliest) or a "
                                      f"time in ms")
        else:
            found = log.offset_for_timestamp(timestamp)
            offset = -1 if found is None or found >= partition.high_watermark else found
        responder(list_offsets_reply(header.correlation_id, offset))


def _silent(request: protocol.Message) -> bool:
    """Whether the client asked for no response at all (an acks=0 produce)."""
    return isinstance(request, protocol.ProduceRequest) and request.acks == 0


def _received_frame(view: memoryview) -> bool:
    """Whether ``view`` shows a received ZeroMQ message (or bytes): memory nobody changes, which
    the log may therefore hold until the flush instead of copying it (a MiB copy into fresh
    pages costs more than validating the batch)."""
    owner = view.obj
    while isinstance(owner, memoryview):
        owner = owner.obj
    return isinstance(owner, bytes | zmq.Frame)
