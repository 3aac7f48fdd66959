"""The batching producer: records in, per-partition batches out, acknowledgements back.

Two threads (the Kafka paper's asynchronous producer: latency traded for throughput):

- **application threads** call :meth:`Producer.send` (compiled: ``RecordAccumulator.send``), which
  appends the record to its partition's open batch and returns; no per-record Python work, no
  future unless asked for (:meth:`Producer.send_future`, or ``callback=``);
- **the I/O thread** (:class:`_Sender`) owns the ZeroMQ connections (one per partition leader,
  ``hpbroker.client.links``; metadata comes from the bootstrap broker, the first bootstrap
  address that answers) and the cluster metadata.
  It sleeps in one poll on the connections, a ZeroMQ monitor of each and a wake-up pipe, and each turn:
  reads the responses, drains the batches that are due (full, lingered ``linger_ms``, or flushed),
  finishes them into one ProduceRequest per partition and sends them, retries what failed.  The
  application wakes it through the pipe at most once per batch opened or closed, never per record.

**Idempotence** (``enable_idempotence``, on by default with ``acks`` 1 or all): the I/O thread takes a
producer id and epoch (InitProducerId) before it drains a batch; every batch carries them and
its partition's ``base_sequence``, assigned once at drain; a partition keeps up to
``max_in_flight_requests_per_partition`` requests in flight, and a retry resends the same bytes
(the leader answers a copy it stored with its offsets).  The rules are in
``hpbroker.client.idempotence``, the I/O thread's half in ``hpbroker.client.idempotent_sending``.

**Order** (without idempotence). A partition has at most one produce request in flight or
waiting for a retry (its queue is *muted* meanwhile), and a request carries every batch that
became due while its predecessor was out (up to ``max_request_bytes``), so a retry can never
overtake or be overtaken by later records. Requests to different partitions are in flight
together. With ``acks=0`` nothing is answered; a partition's requests follow each other on its
leader's connection, in order (while the leader stays where it is), and only a request that
could not be handed to a connection waits (muted) for a retry.

**Retries.**  A retriable error (docs/PROTOCOL.md's table; also a lost connection or no response
within ``request_timeout_ms``) sends the same bytes again after a backoff (``retry_backoff_ms``,
doubling up to ``retry_backoff_max_ms``), refreshing the topic's metadata first after errors 6,
15, 23 and 25, until ``delivery_timeout_ms`` after the oldest batch was opened; then, or at once
for an error that is not retriable, the request's records fail.  Error 23 (the broker is not the
partition's leader: it moved) sends the retry to the leader the refreshed metadata names, with
the same bytes (an idempotent producer's sequences too, so the new leader, which replicated the
old one's producer state, stores them once); error 24 (``acks="all"`` refused: too few in-sync
replicas) is retried with backoff like any other.  Without idempotence, when an
attempt's outcome is unknown (lost connection, timeout, error 7, 12, 15, 23 or 24: the broker
may have appended it, e.g. a leader that lost its leadership while waiting for its followers),
the I/O thread first looks for the request in the partition
(``hpbroker.client.appended_lookup``): found, the records are acknowledged where they are; not
found, they are sent again.

**Delivery reports.**  Every record is acknowledged or failed, never dropped: a future
(:meth:`send_future`) or callback (``send(..., callback=f)``, called on the I/O thread as
``f(metadata, None)`` or ``f(None, error)``) learns which; failures of records sent without either
are logged and raised by the next :meth:`flush` or :meth:`close`.

Threads: a producer may be shared by application threads; the connection, metadata and requests
belong to the I/O thread alone.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import zmq

from hpbroker import protocol
from hpbroker.errors import (
    AuthenticationError,
    BrokerNotAvailableError,
    FencedLeaderEpochError,
    HPBrokerError,
    NotLeaderOrFollowerError,
    PartitionNotAvailableError,
    RequestTimedOutError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from hpbroker.records import codec_for_name

try:
    from hpbroker.client._accumulator import Batch, PartitionQueue, RecordAccumulator
except ImportError as exc:  # pragma: no cover - exercised only on a broken install
    raise ImportError(
        "hpbroker's compiled producer core (hpbroker/client/_accumulator.pyx) is not built or does not "
        f"load: {exc}. Build it with `python setup.py build_ext --inplace` (or `pip install -e .`)."
    ) from exc

from hpbroker.client.appended_lookup import AppendedLookup
from hpbroker.client.backoff import backoff_ms
from hpbroker.client.connection import BrokerAddress, BrokerConnection, parse_bootstrap
from hpbroker.client.idempotence import ACKED, IN_FLIGHT, PartitionWindow, ProducerIdentity
from hpbroker.client.idempotent_sending import IdempotentSending
from hpbroker.client.links import BrokerLink, BrokerLinks
from hpbroker.client.metadata import ClusterMetadata
from hpbroker.client.monitoring import MonitoringCounts, MonitoringPublisher
from hpbroker.client.partitioner import partitioner_kind
from hpbroker.client.produce_request import GiveUp, PartitionRequest, broker_timeout_ms, report
from hpbroker.client.producer_config import ProducerConfig, RecordMetadata
from hpbroker.security.client import resolve_client_security

__all__ = ["Producer", "ProducerClosedError", "ProducerConfig", "RecordMetadata"]

logger = logging.getLogger(__name__)

# Errors whose request the broker refused before appending anything: resend without looking.
_REFUSED_BEFORE_APPEND = frozenset({2, 6})  # corrupt (checked before append), unknown topic/partition
# Errors after which the topic's metadata is refreshed before the retry: unknown topic or
# partition, partition not available, not the leader (the partition moved), fenced leader epoch.
_REFRESH_METADATA = frozenset({UnknownTopicOrPartitionError.code, PartitionNotAvailableError.code,
                               NotLeaderOrFollowerError.code, FencedLeaderEpochError.code})
_PRODUCE_VERSION_IDEMPOTENT = 1  # its response says duplicate; without idempotence: version 0, as before
_CONTROL_TIMEOUT_S = 5.0  # longest wait for one metadata, list-offsets or verifying fetch response
# Leaving a with block by an exception: the longest close() waits for records still unsent.
_CLOSE_ON_ERROR_TIMEOUT_S = 5.0
# acks=0: how long the closed connection goes on sending requests queued before close (in libzmq's
# background threads; the process waits for them, up to this, when it ends).
_ACKS_0_CLOSE_LINGER_MS = 5_000
_names = itertools.count(1)


class ProducerClosedError(RuntimeError):
    """The producer is closed: :meth:`Producer.send` refuses records, and records still unsent
    when :meth:`Producer.close` gave up fail with this error."""


class Producer(RecordAccumulator):
    """Sends records to an hpbroker broker in batches, from a background I/O thread.

    ``Producer(bootstrap, acks=1, linger_ms=5, batch_bytes=1 << 20, compression=None, ...)``: the
    keyword options are the fields of :class:`ProducerConfig` (or pass ``config=``); ``acks`` is
    0, 1, or ``"all"`` (also -1).  ``bootstrap`` is ``"host:port"`` (a broker's ZeroMQ front-end),
    or several, comma-separated or as a list: the first is asked for metadata, and when it does
    not answer the others are, in turn (``hpbroker.client.metadata``).

    ``send(topic, value, key=None, headers=None, timestamp=None, partition=None, callback=None)``
    appends one record and returns None; it costs about a tenth of a microsecond (compiled, see
    ``hpbroker.client._accumulator``).  ``value`` and ``key`` are bytes-like or None; ``headers``
    a sequence of ``(str, bytes-like or None)``; ``timestamp`` ms since the epoch (now if None);
    ``partition`` overrides the partitioner; ``callback(metadata, error)`` is called on the I/O
    thread once the record is acknowledged (``error`` None) or failed (``metadata`` None): keep
    it short.  It raises at once for bad input: TypeError (a value, key, topic, header value or
    timestamp of the wrong type; a float timestamp too), UnknownTopicOrPartitionError (a topic
    the broker does not have, a partition out of range), RecordTooLargeError (a record over
    ``batch_bytes``), ProducerClosedError (closed, or the I/O thread failed, also when that
    happened while it waited); and after ``max_block_ms`` BrokerNotAvailableError (no metadata
    for a new topic) or TimeoutError (no buffer room).

    ``send_many(topic, values, keys=None, partition=None, timestamp=None)`` appends many values
    in one call (one timestamp for all) and returns how many.  ``values`` is a sequence of
    bytes-like objects (or None), or one 2-D C-contiguous buffer of bytes, such as a numpy
    ``uint8`` array of shape ``(n, size)`` or a memoryview cast to it: row ``i`` is the value of
    record ``i``, encoded straight from the buffer with no Python object per record (the buffer
    is held, so cannot be resized, until the call returns).  Any other buffer is read as a
    sequence of values; a bytes-like object itself (one dimension of plain bytes) is refused
    (TypeError).
    """

    def __init__(self, bootstrap: str | Sequence[str], config: ProducerConfig | None = None,
                 **options: Any) -> None:
        config = ProducerConfig(**options) if config is None else dataclasses.replace(config, **options)
        config = dataclasses.replace(config, security=resolve_client_security(config.security))
        self.config = config
        self.name = config.name or f"{socket.gethostname()[:200]}-{os.getpid()}-{next(_names)}"
        self.bootstrap = parse_bootstrap(bootstrap)
        self.address = self.bootstrap[0]
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        super().__init__(self.name, codec_for_name(config.compression), config.batch_bytes, config.linger_ms,
                         config.buffer_bytes, partitioner_kind(config.partitioner), self._wake_write,
                         config.audit_window_ms if config.audit_topic else 0, config.idempotent)
        self._progress = threading.Condition()  # notified by the I/O thread when batches settle
        self._unreported: list[Any] | None = None  # [record count, first error] since the last flush
        self._close_lock = threading.Lock()
        self._closed_done = False
        self._sender = _Sender(self, self.bootstrap, config, self._wake_read)
        self._thread = threading.Thread(target=self._sender.run, name=f"hpbroker-producer[{self.name}]",
                                        daemon=True)
        self._thread.start()

    @property
    def producer_id(self) -> int:
        """The idempotent producer's id from the broker (-1 before it has one, or not idempotent).
        It changes when the producer takes a new identity (docs/CLIENT.md)."""
        return self._sender.identity.producer_id

    @property
    def producer_epoch(self) -> int:
        """The epoch that goes with :attr:`producer_id` (-1 likewise)."""
        return self._sender.identity.producer_epoch

    @property
    def metrics(self) -> dict[str, int]:
        """Counts since the producer started: ``records_acknowledged``, ``records_deduplicated``
        (acknowledged records the broker already had: an idempotent retry of a stored request),
        ``records_failed``, ``retries`` (requests sent again) and ``producer_id_resets`` (new
        identities taken after a request failed for good).  A snapshot, read from any thread."""
        return dict(self._sender.counts)

    def __repr__(self) -> str:
        return (f"Producer({self.name!r}, {self.address}, buffered_bytes={self.buffered_bytes}, "
                f"unfinished_batches={self.unfinished_batches}, closed={self.closed})")

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """:meth:`close`.  When an exception leaves the block, close waits at most
        ``_CLOSE_ON_ERROR_TIMEOUT_S`` (5 s) for the records still unsent (then they fail with
        ProducerClosedError), and what it raises is logged: the block's exception comes out
        soon, not after a ``delivery_timeout_ms`` spent on a broker that is gone."""
        if exc_type is None:
            self.close()
            return
        try:
            self.close(_CLOSE_ON_ERROR_TIMEOUT_S)
        except Exception as e:  # do not hide the exception that left the block
            logger.error("[producer %s] closing after an error in the with block: %s: %s", self.name,
                         type(e).__name__, e)

    # --- sending -------------------------------------------------------------------------------

    def send_future(self, topic: str, value: Any, key: Any = None, *, headers: Any = None,
                    timestamp: int | None = None, partition: int | None = None) -> Future[RecordMetadata]:
        """:meth:`send`, and a future of the record's :class:`RecordMetadata` (or its error)."""
        future: Future[RecordMetadata] = Future()
        self.send(topic, value, key, headers, timestamp, partition, future)
        return future

    def flush(self, timeout_s: float | None = None) -> None:
        """Send every record sent before this call at once (linger or not) and wait until each
        is acknowledged or failed.  Raises TimeoutError after ``timeout_s``, and the error of
        records that failed with no future or callback to report it (since the last flush);
        ProducerClosedError once the I/O thread has failed."""
        self._refuse_on_io_thread("flush()")
        target = self.mark_flush()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._progress:
            while self.unfinished_through(target):
                if not self._thread.is_alive():  # it settles everything on its way out: never here
                    raise ProducerClosedError(f"producer {self.name}: its I/O thread stopped with "
                                              f"{self.unfinished_batches} batches unsettled")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"producer {self.name}: flush did not finish within {timeout_s} s "
                                       f"({self.unfinished_batches} batches unacknowledged)")
                self._progress.wait(remaining)
        self._raise_unreported()
        self._raise_failed()

    def close(self, timeout_s: float | None = None) -> None:
        """Refuse new records, deliver the ones sent (waiting at most ``timeout_s``; records
        still unacknowledged then fail with ProducerClosedError), stop the I/O thread.  Raises
        like :meth:`flush`, also for records the I/O thread failed on its way out.  Closing
        twice does nothing."""
        self._refuse_on_io_thread("close()")
        with self._close_lock:
            if self._closed_done:
                return
            self._closed_done = True
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.close_for_sends()
        try:
            self.flush(timeout_s)
        finally:
            self._publish_last_events(deadline)
            self._sender.stop()
            self.wake()
            join_s = 10.0 if deadline is None else max(0.0, deadline - time.monotonic()) + 1.0
            self._thread.join(join_s + _CONTROL_TIMEOUT_S)
            if self._thread.is_alive():
                logger.warning("[producer %s] the I/O thread did not stop within %.1f s", self.name, join_s)
            else:
                self.set_wake_fd(-1)
                os.close(self._wake_read)
                os.close(self._wake_write)
        self._raise_unreported()

    def _publish_last_events(self, deadline: float | None) -> None:
        """Closing: publish the monitoring counts not yet announced (the last partial window)
        and wait, until ``deadline``, for their records to settle.  Failures are logged."""
        if self.config.audit_topic is None:
            return
        if not self._thread.is_alive():
            logger.warning("[producer %s] closing: the I/O thread has stopped; monitoring counts not yet "
                           "published are lost", self.name)
            return
        try:
            wait_s = _CONTROL_TIMEOUT_S * 2
            if deadline is not None:
                wait_s = min(wait_s, max(0.0, deadline - time.monotonic()))
            self._sender.call(lambda sender: sender.publish_monitoring(last=True), wait_s)
            target = self.mark_flush()
            with self._progress:
                while self.unfinished_through(target) and self._thread.is_alive():
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise TimeoutError("the producer's close timeout ran out")
                    self._progress.wait(remaining)
            if self._sender.call(lambda sender: sender.unpublished_monitoring(), _CONTROL_TIMEOUT_S):
                raise ProducerClosedError("some were not stored; the audit will flag their windows")
        except Exception as e:
            logger.warning("[producer %s] closing: the last monitoring events were not published: %s",
                           self.name, e)

    def _refuse_on_io_thread(self, what: str) -> None:
        if threading.current_thread() is self._thread:
            raise RuntimeError(f"producer {self.name}: {what} called from a callback, on the I/O thread "
                               "that it would wait for")

    # --- hooks of the compiled accumulator (application threads) ----------------------------------

    def _topic_partition_count(self, topic: str) -> int:
        """A topic's first record: ask the I/O thread for its partitions, for ``max_block_ms``."""
        deadline = time.monotonic() + self.config.max_block_ms / 1000
        failures = 0
        while True:
            try:
                count = self._sender.call(lambda sender: sender.partition_count(topic),
                                          max(0.0, deadline - time.monotonic()))
            except UnknownTopicOrPartitionError:
                raise UnknownTopicOrPartitionError(
                    f"topic {topic!r} does not exist on broker {self.address}") from None
            except (BrokerNotAvailableError, RequestTimedOutError, TimeoutError) as e:
                backoff_s = backoff_ms(self.config.retry_backoff_ms, self.config.retry_backoff_max_ms,
                                       failures) / 1000
                failures += 1
                if time.monotonic() + backoff_s >= deadline:
                    raise BrokerNotAvailableError(
                        f"bootstrap {','.join(map(str, self.bootstrap))}: no partitions for topic "
                        f"{topic!r} within max_block_ms "
                        f"{self.config.max_block_ms} ({e})") from e
                time.sleep(backoff_s)
                continue
            if self.closed:
                self._raise_closed()
            return count

    def _wait_for_room(self) -> None:
        """``buffered_bytes`` reached ``buffer_bytes``: wait (GIL released) for batches to settle.
        Meanwhile every open batch is due, linger or not (a flush of what is buffered): the
        buffer may be full of batches that are neither full nor lingered, with nothing in flight
        to free it.  The caller checks ``closed`` again after this returns (in ``_append``)."""
        self._refuse_on_io_thread("send() with a full buffer")
        deadline = time.monotonic() + self.config.max_block_ms / 1000
        with self._progress:
            while self.buffered_bytes >= self.buffer_bytes:
                if self.closed:
                    self._raise_closed()
                if not self._thread.is_alive():
                    raise ProducerClosedError(f"producer {self.name}: its I/O thread has stopped")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"producer {self.name}: send blocked {self.config.max_block_ms} ms "
                                       f"with {self.buffered_bytes} bytes buffered "
                                       f"(buffer_bytes {self.buffer_bytes})")
                self.mark_flush()  # batches opened by other threads meanwhile too
                self._progress.wait(min(remaining, 0.1))

    def _raise_closed(self) -> None:
        self._raise_failed()
        raise ProducerClosedError(f"producer {self.name} is closed")

    def _raise_failed(self) -> None:
        failure = self._sender.failure
        if failure is not None:
            raise ProducerClosedError(f"producer {self.name}: its I/O thread failed ({failure!r}); it takes "
                                      "no more records") from failure

    # --- reports from the I/O thread ------------------------------------------------------------

    def _record_failure(self, count: int, error: BaseException) -> None:
        with self._progress:
            if self._unreported is None:
                self._unreported = [count, error]
            else:
                self._unreported[0] += count

    def _raise_unreported(self) -> None:
        with self._progress:
            unreported, self._unreported = self._unreported, None
        if unreported is not None:
            count, error = unreported
            known = isinstance(error, HPBrokerError | ProducerClosedError)
            cls = type(error) if known else UnknownServerError
            raise cls(f"{count} records sent without a future or callback failed; the first: "
                      f"{error}") from error


class _Sender(AppendedLookup, IdempotentSending):
    """The I/O thread (module docstring).  Everything here runs on it, but :meth:`call`,
    :meth:`stop` and the constructor.  The idempotent path is in :class:`IdempotentSending`."""

    def __init__(self, producer: Producer, bootstrap: BrokerAddress | Sequence[BrokerAddress],
                 config: ProducerConfig, wake_fd: int) -> None:
        self._producer = producer
        self._bootstrap = [bootstrap] if isinstance(bootstrap, BrokerAddress) else list(bootstrap)
        self._address = self._bootstrap[0]
        self._config = config
        self._wake_fd = wake_fd
        self._acks = config.acks
        self._audit_topic = config.audit_topic
        self._idempotent = config.idempotent
        self._max_in_flight = config.max_in_flight
        # Idempotent: version 1 (its response says duplicate); else version 0, as before idempotence.
        self._produce_version = _PRODUCE_VERSION_IDEMPOTENT if config.idempotent else 0
        self.identity = ProducerIdentity(config.retry_backoff_ms, config.retry_backoff_max_ms)
        # Idempotent: each partition's unsettled requests, in sequence order (only partitions with some).
        self._windows: dict[PartitionQueue, PartitionWindow] = {}
        # Idempotent: partitions without a window -> the newest identity generation acknowledged there.
        self._acknowledged_generations: dict[PartitionQueue, tuple[int, float]] = {}  # and since when idle
        self.counts = {"records_acknowledged": 0, "records_deduplicated": 0, "records_failed": 0,
                       "retries": 0, "producer_id_resets": 0}
        self._request_timeout_s = config.request_timeout_ms / 1000
        self._broker_timeout_ms = broker_timeout_ms(config.request_timeout_ms)
        self._control_timeout_s = min(self._request_timeout_s, _CONTROL_TIMEOUT_S)
        self._tasks: collections.deque[tuple[Callable[[_Sender], Any], Future]] = collections.deque()
        self._waiting: list[PartitionRequest] = []  # to be retried at their due_s
        self._known_end: dict[tuple[str, int], int] = {}  # offset after our last acknowledged record
        self._stale_topics: set[str] = set()
        self._next_due_s = math.inf
        self._settled = False  # a batch settled this turn: notify the application threads
        self._stopping = False
        self._alive = True
        self.failure: BaseException | None = None  # what ended the thread, if not close()
        self._poller = zmq.Poller()
        self.links: BrokerLinks | None = None
        self.metadata: ClusterMetadata | None = None
        self._moved_after: BaseException | None = None  # the InitProducerId failure last moved after
        self._monitoring: MonitoringPublisher | None = None
        self._monitoring_due_s = math.inf
        if config.audit_topic is not None:
            self._monitoring = MonitoringPublisher(
                MonitoringCounts(producer.name, config.audit_topic, config.audit_window_ms))
            self._monitoring_due_s = time.monotonic() + config.audit_window_ms / 1000

    # --- called from application threads -------------------------------------------------------

    def call(self, task: Callable[[_Sender], Any], timeout_s: float) -> Any:
        """Run ``task(sender)`` on the I/O thread and return its result (or raise its error)."""
        if not self._alive:
            raise ProducerClosedError(f"producer {self._producer.name}: its I/O thread has stopped")
        if threading.current_thread() is self._producer._thread:  # from a callback: run it here
            return task(self)
        future: Future = Future()
        self._tasks.append((task, future))
        self._producer.wake()
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def stop(self) -> None:
        self._stopping = True

    # --- the loop ---------------------------------------------------------------------------------

    def run(self) -> None:
        producer = self._producer
        error: BaseException = ProducerClosedError(f"producer {producer.name} closed before the records "
                                                   "were acknowledged")
        try:
            self._open()
            poller = self._poller
            poller.register(self._wake_fd, zmq.POLLIN)
            while not self._stopping:
                events = dict(poller.poll(self._poll_timeout_ms()))
                if self._wake_fd in events:
                    # Drain first, then clear the flag: a wake-up written after the drain finds the
                    # flag clear and writes a byte the next poll sees; one in between finds it set
                    # and writes nothing, but the turn below looks at the accumulator after it.
                    # (The other order loses a byte written between the two: the flag stays set,
                    # no byte is left, and every later send() skips waking the thread.)
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self._wake_fd, 4096):
                            pass
                    producer.woken()
                self._turn()
        except BaseException as e:  # the thread must settle every record, whatever happened
            logger.exception("[producer %s] the I/O thread failed", producer.name)
            self.failure = e
            error = ProducerClosedError(f"producer {producer.name}: its I/O thread failed: {e!r}")
        finally:
            self._alive = False
            producer.close_for_sends()  # nobody would send what came in now: send() raises
            self._abort(error)
            self._close()

    def _turn(self) -> None:
        self._read_monitor()
        while self._tasks:
            task, future = self._tasks.popleft()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(task(self))
                except BaseException as e:
                    future.set_exception(e)
        self._read_responses()
        now = time.monotonic()
        self._check_timeouts(now)
        self._retry_due(now)
        if now >= self._monitoring_due_s:
            self._monitoring_due_s = now + self._config.audit_window_ms / 1000
            self.publish_monitoring()
        self._send_due(now)
        if self._settled:
            self._settled = False
            with self._producer._progress:
                self._producer._progress.notify_all()

    def _poll_timeout_ms(self) -> int:
        # Responses a synchronous call kept, monitor events a send read: the poll would not show them.
        if self._tasks or any(link.connection.arrived or link.connection.events_pending
                              for link in self.links):
            return 0
        due = min(self._next_due_s, self._monitoring_due_s)
        for request in self._waiting:
            due = min(due, request.due_s)
        for window in self._windows.values():
            due = min(due, window.next_due_s(self._max_in_flight))
        if self._idempotent and self.identity.wanted and self._identity_needed():
            due = min(due, self.identity.next_attempt_s)
        for request in self._in_flight():
            due = min(due, request.sent_s + self._request_timeout_s)
        if due == math.inf:
            return 1000
        return max(0, min(1000, math.ceil((due - time.monotonic()) * 1000)))

    def _open(self) -> None:
        self.links = BrokerLinks(self._address, self._producer.name, self._poller, self._config.security)
        self.metadata = ClusterMetadata(self.connection, timeout_s=self._control_timeout_s,
                                        bootstrap=self._bootstrap,
                                        connect=lambda address: self.links.rebootstrap(address).connection)

    @property
    def connection(self) -> BrokerConnection | None:
        """The bootstrap link's connection, the broker asked for metadata and producer ids: the
        first bootstrap address until it stops answering (then the one the metadata moved to)."""
        return None if self.links is None else self.links.bootstrap.connection

    def _identity_ready(self, now: float) -> bool:
        """:meth:`IdempotentSending._identity_ready`; when the bootstrap broker did not answer
        the InitProducerId, the metadata moves to the next broker that answers, asked next."""
        ready = super()._identity_ready(now)
        error = self.identity.last_error
        if not ready and isinstance(error, BrokerNotAvailableError | RequestTimedOutError) \
                and error is not self._moved_after:
            self._moved_after = error
            try:
                self.metadata.move_on(error)
            except HPBrokerError as e:
                logger.warning("[producer %s] no other broker answers either: %s", self._producer.name, e)
        return ready

    def _close(self) -> None:
        if self.links is not None:
            self.links.close(0 if self._acks else _ACKS_0_CLOSE_LINGER_MS)

    def _in_flight(self) -> list[PartitionRequest]:
        if self.links is None:  # the connections were never opened
            return []
        return [request for link in self.links for request in link.in_flight.values()]

    def _read_monitor(self) -> None:
        """Take the connections' events.  Read before every send too: a request is then in
        flight only on a connection newer than every disconnect seen, so a disconnect read
        later is never one from before the request (libzmq reports it at once, and reconnects
        no sooner than RECONNECT_IVL, 100 ms, after it)."""
        for link in self.links:
            for event in link.monitor_events():
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    link.connected = True
                elif event == zmq.EVENT_DISCONNECTED:
                    self._connection_lost(link)
                    link.connected = False

    def _connection_lost(self, link: BrokerLink) -> None:
        """Requests in flight will never be answered: they may or may not have been appended.
        Responses that came before the connection broke are taken first."""
        self._read_responses()
        now = time.monotonic()
        lost, link.in_flight = link.in_flight, {}
        for correlation_id, request in lost.items():
            link.connection.forget(correlation_id)
            self._leader_may_have_moved(request, link)
            self._retry(request, BrokerNotAvailableError(
                f"connection to broker {link.address} lost with request {correlation_id} in flight"),
                now, uncertain=True)

    # --- sending --------------------------------------------------------------------------------

    def _send_due(self, now: float) -> None:
        producer = self._producer
        if self._idempotent and not self._identity_ready(now):
            self._next_due_s = math.inf  # the poll wakes for the next InitProducerId attempt
            self._send_queued(now)  # requests of the previous identity go on meanwhile
            return
        ready, self._next_due_s = producer.drain(now, self._config.max_request_bytes)
        delivery_timeout_s = self._config.delivery_timeout_ms / 1000
        for queue, batches in ready:
            if self._idempotent:
                self._queue_idempotent(queue, batches, delivery_timeout_s)
                continue
            request = PartitionRequest(queue, batches, producer.build_payload(batches),
                               sum(b.record_count for b in batches),
                               min(b.created_s for b in batches) + delivery_timeout_s)
            if self._acks or queue.topic == self._audit_topic:
                queue.muted = True
            self._send(request, now)
        if self._idempotent:
            self._send_queued(now)

    def _send(self, request: PartitionRequest, now: float) -> None:
        queue = request.queue
        acks = 1 if queue.topic == self._audit_topic else self._acks  # events are acknowledged, always
        message = protocol.ProduceRequest(queue.topic, queue.partition, acks, self._broker_timeout_ms,
                                          request.payload)
        try:
            link = self.links.for_partition(self.metadata, queue.topic, queue.partition)
        except PartitionNotAvailableError as e:  # no live leader: ask again before the retry
            self._stale_topics.add(queue.topic)
            self._retry(request, e, now, uncertain=False)
            return
        try:
            self._read_monitor()
            if not link.connected and request.attempts:
                raise BrokerNotAvailableError(f"broker {link.address} is not connected")
            correlation_id = link.connection.send(message, expect_response=bool(acks),
                                                  version=self._produce_version)
        except BrokerNotAvailableError as e:
            self._leader_may_have_moved(request, link)
            self._retry(request, e, now, uncertain=False)
            return
        except AuthenticationError as e:  # the broker refused the key: the same key fails again
            if self._idempotent:
                self._give_up(request, e)
            else:
                self._settle(request, e)
            return
        request.attempts += 1
        if not acks:
            self._settle(request)
            return
        request.correlation_id = correlation_id
        request.sent_s = now
        request.link = link
        request.state = IN_FLIGHT
        link.in_flight[correlation_id] = request

    @staticmethod
    def _new_request(queue: PartitionQueue, batches: list[Batch], payload: bytes, deadline_s: float,
                     generation: int) -> PartitionRequest:
        return PartitionRequest(queue, batches, payload, sum(b.record_count for b in batches), deadline_s,
                        generation=generation)

    def _leader_may_have_moved(self, request: PartitionRequest, link: BrokerLink) -> None:
        """A leader did not answer: ask where the partition is before the retry (it may have
        moved, or changed address); the bootstrap broker too, in a cluster (the metadata then
        comes from another broker)."""
        if link is not self.links.bootstrap or self.metadata.in_cluster:
            self._stale_topics.add(request.queue.topic)

    def _read_responses(self) -> None:
        now = time.monotonic()
        for link in self.links:
            connection = link.connection
            while (response := connection.poll(0)) is not None:
                link.connected = True
                request = link.in_flight.pop(response.correlation_id, None)
                if request is not None:
                    self._response(request, response, now)

    def _response(self, request: PartitionRequest, response: Any, now: float) -> None:
        """Settle or retry ``request`` by its response."""
        if self._idempotent:
            self._idempotent_response(request, response, now)
            return
        code = response.header.error_code
        if code == 0:
            self._acknowledged(request, response.body.base_offset)
            return
        error = error_for_code(code, response.header.error_message)
        if not error.retriable:
            self._settle(request, error)
            return
        self._retry_after(request, error, now)

    def _retry_after(self, request: PartitionRequest, error: HPBrokerError, now: float) -> None:
        """Retry ``request`` after a retriable error the broker answered."""
        if error.code in _REFRESH_METADATA:
            self._stale_topics.add(request.queue.topic)
        self._retry(request, error, now, uncertain=error.code not in _REFUSED_BEFORE_APPEND)

    def _check_timeouts(self, now: float) -> None:
        expired = [r for r in self._in_flight() if r.sent_s + self._request_timeout_s <= now]
        for request in expired:
            link = request.link
            del link.in_flight[request.correlation_id]
            link.connection.forget(request.correlation_id)
            self._leader_may_have_moved(request, link)
            self._retry(request, RequestTimedOutError(
                f"no response to the produce request of {request} from {link.address} within "
                f"request_timeout_ms {self._config.request_timeout_ms}"), now, uncertain=True)

    # --- retries --------------------------------------------------------------------------------

    def _retry(self, request: PartitionRequest, error: HPBrokerError, now: float, *, uncertain: bool) -> None:
        request.error = error
        request.uncertain |= uncertain
        if self._idempotent:
            self._retry_idempotent(request, error, now)
            return
        request.queue.muted = True  # acks=0 too: nothing of the partition may overtake the retry
        if now >= request.deadline_s:
            self._settle(request, self._delivery_timeout_error(request, error))
            return
        wait_ms = self._retry_backoff_ms(request)
        request.retries += 1
        request.due_s = min(now + wait_ms / 1000, request.deadline_s)
        self._waiting.append(request)
        logger.debug("[producer %s] %s: retry in %d ms after %s", self._producer.name, request, wait_ms,
                     error)

    def _retry_backoff_ms(self, request: PartitionRequest) -> float:
        """The wait before ``request`` goes again (it failed ``retries + 1`` times)."""
        config = self._config
        return backoff_ms(config.retry_backoff_ms, config.retry_backoff_max_ms, request.retries)

    def _delivery_timeout_error(self, request: PartitionRequest,
                                error: BaseException | None) -> HPBrokerError:
        """The error of records that ran out of delivery_timeout_ms, of ``error``'s class."""
        cls = type(error) if isinstance(error, HPBrokerError) else RequestTimedOutError
        last = f"last error: {error.message}" if isinstance(error, HPBrokerError) else "never sent"
        stored = ("; an attempt's outcome is unknown, they may have been stored"
                  if self._idempotent and request.uncertain else "")
        return cls(f"{request.record_count} records to {request} not delivered within delivery_timeout_ms "
                   f"{self._config.delivery_timeout_ms} ({request.attempts} attempts); {last}{stored}")

    def _refresh_if_stale(self, request: PartitionRequest) -> None:
        """Refresh the topic's metadata if an error asked for it.  Raises HPBrokerError when the
        broker cannot say now, GiveUp when the partition is gone."""
        topic, partition = request.queue.topic, request.queue.partition
        if topic in self._stale_topics:
            try:
                count = len(self.metadata.partitions(topic, refresh=True))
            except UnknownTopicOrPartitionError:
                raise GiveUp(UnknownTopicOrPartitionError(
                    f"topic {topic!r} no longer exists on broker {self._address}")) from None
            self._stale_topics.discard(topic)
            self.links.prune(self.metadata.leader_addresses(), 0 if self._acks else _ACKS_0_CLOSE_LINGER_MS)
            if partition >= count:
                raise GiveUp(UnknownTopicOrPartitionError(
                    f"topic {topic!r} now has {count} partitions, no partition {partition}"))
            self._producer.set_partition_count(topic, count)

    # --- settling ---------------------------------------------------------------------------------

    def _settle(self, request: PartitionRequest, error: BaseException | None = None, base_offset: int = -1,
                deduplicated: bool = False) -> None:
        """Report every record of ``request`` (acknowledged at ``base_offset`` onwards, or failed
        with ``error``) and release its batches; the partition may send again (idempotent: as
        its window says, :meth:`_update_window`)."""
        queue = request.queue
        if not self._idempotent:
            queue.muted = False
        offset = base_offset
        unobserved = 0
        for batch in request.batches:
            waiters = batch.waiters
            if waiters:
                for index, timestamp, waiter in waiters:
                    if error is None:
                        metadata = RecordMetadata(queue.topic, queue.partition,
                                                  offset + index if offset >= 0 else -1, timestamp,
                                                  deduplicated)
                        report(waiter, metadata, None)
                    else:
                        report(waiter, None, error)
            if error is not None:
                unobserved += batch.record_count - batch.waiter_count
            elif offset >= 0:
                offset += batch.record_count
        counts = self.counts
        if error is not None:
            counts["records_failed"] += request.record_count
            logger.error("[producer %s] %d records to %s failed: %s", self._producer.name,
                         request.record_count, request, error)
            if unobserved:
                self._producer._record_failure(unobserved, error)
        else:
            counts["records_acknowledged"] += request.record_count
            if deduplicated:
                counts["records_deduplicated"] += request.record_count
            if self._monitoring is not None:
                self._monitoring.counts.add(queue.topic, request.batches)
        self._producer.finish(request.batches)
        self._settled = True

    def _abort(self, error: BaseException) -> None:
        """The thread is ending: fail everything not yet settled (but requests acknowledged
        while an earlier one was unsettled: told after it, in order)."""
        for request in [] if self._idempotent else [*self._in_flight(), *self._waiting]:
            self._settle(request, error)
        for window in self._windows.values():
            for request in window:
                if request.state == ACKED:
                    self._settle(request, None, request.base_offset, request.deduplicated)
                else:
                    self._settle(request, error)
        self._windows = {}
        for link in self.links or ():
            link.in_flight = {}
        self._waiting = []
        for queue, batches in self._producer.take_all():
            self._settle(self._new_request(queue, batches, b"", 0.0, 0), error)
        while self._tasks:
            _task, future = self._tasks.popleft()
            if future.set_running_or_notify_cancel():
                future.set_exception(error)
        with self._producer._progress:
            self._producer._progress.notify_all()

    # --- tasks ------------------------------------------------------------------------------------

    def partition_count(self, topic: str) -> int:
        count = len(self.metadata.partitions(topic, refresh=True))
        self.links.bootstrap.connected = True
        return count

    def publish_monitoring(self, *, last: bool = False) -> int:
        """Queue the monitoring events counted since the last publication (hpbroker.client.monitoring);
        ``last``: the close's, tried even while the audit topic's lookup backs off."""
        if self._monitoring is None:
            return 0
        return self._monitoring.publish(self._producer, self.metadata, self.connection, last=last)

    def unpublished_monitoring(self) -> bool:
        return self._monitoring is not None and bool(self._monitoring.counts)
