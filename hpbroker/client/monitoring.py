"""The producer's monitoring events: counts of acknowledged records per topic and window.

:class:`MonitoringCounts` belongs to the producer's I/O thread (``hpbroker.client.producer``),
which alone calls it:

- when a request is acknowledged (with ``acks=0``: sent), :meth:`~MonitoringCounts.add` takes
  each batch's ``window_counts`` (the compiled accumulator counts a batch's records per window
  while it finishes the batch, so nothing here is per record);
- every ``window_ms`` and when the producer closes, :meth:`~MonitoringCounts.take` hands out one
  :class:`~hpbroker.audit.events.MonitoringEvent` per (topic, window) counted since the last
  take, each with the next number of this producer instance, and the I/O thread sends each as a
  record of the audit topic;
- an event whose record fails goes back with :meth:`~MonitoringCounts.give_back` and is handed
  out again, unchanged (same number), by the next take: if its failed attempt was stored after
  all, the audit counts the two copies once (docs/AUDIT.md).

So every acknowledged record is announced once, in some event of its window, as long as the
producer lives to publish it.  Records of the audit topic itself are not counted.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import time
from typing import Any

from hpbroker import protocol
from hpbroker.audit.events import MonitoringEvent, encode_event, window_start
from hpbroker.client._accumulator import partition_for_key
from hpbroker.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError, error_for_code

__all__ = ["AUDIT_TOPIC_PARTITIONS", "MonitoringCounts", "MonitoringPublisher"]

logger = logging.getLogger(__name__)

#: partitions of the audit topic when a producer has to create it
AUDIT_TOPIC_PARTITIONS = 1
# The I/O thread waits this long at most for one answer about the audit topic (it sends nothing
# meanwhile), and after a failure tries again no sooner than the backoff, doubling up to a minute.
_LOOKUP_TIMEOUT_S = 1.0
_BACKOFF_MAX_S = 60.0
_WARN_EVERY_S = 60.0


class MonitoringCounts:
    """Records acknowledged per ``(topic, window_start_ms)`` and not yet announced, and events
    to announce again.  ``instance`` is drawn at random; events are numbered from 0."""

    def __init__(self, producer: str, audit_topic: str, window_ms: int) -> None:
        self.producer = producer
        self.audit_topic = audit_topic
        self.window_ms = window_ms
        self.instance = int.from_bytes(os.urandom(8), "little") >> 1  # < 2**63
        self._next_sequence = 0
        self._counts: collections.Counter[tuple[str, int]] = collections.Counter()
        self._again: list[MonitoringEvent] = []

    def __bool__(self) -> bool:
        return bool(self._counts or self._again)

    def add(self, topic: str, batches: list) -> None:
        """Count the records of ``batches`` (finished by an accumulator that counts windows of
        ``window_ms``), now acknowledged."""
        if topic == self.audit_topic:
            return
        counts = self._counts
        for batch in batches:
            window_counts = batch.window_counts
            if window_counts is None:  # never finished: nothing of it was sent
                continue
            for start, count in window_counts:
                counts[topic, start] += count

    def add_records(self, topic: str, timestamp_ms: int, count: int) -> None:
        """Count ``count`` records of ``topic`` at ``timestamp_ms`` (for tests and replays)."""
        if topic != self.audit_topic and count:
            self._counts[topic, window_start(timestamp_ms, self.window_ms)] += count

    def take(self) -> list[MonitoringEvent]:
        """The events to publish now: those given back (unchanged), then one per (topic, window)
        counted since the last take, oldest window first, each with the next sequence number."""
        again, self._again = self._again, []
        counts, self._counts = self._counts, collections.Counter()
        events = again
        for (topic, start), count in sorted(counts.items(), key=lambda item: (item[0][1], item[0][0])):
            if count > 0:
                events.append(MonitoringEvent(self.producer, topic, start, self.window_ms, count,
                                              self.instance, self._next_sequence))
                self._next_sequence += 1
        return events

    def give_back(self, event: MonitoringEvent) -> None:
        """``event`` was not published (or may not have been): the next take hands it out again."""
        self._again.append(event)


class MonitoringPublisher:
    """Sends the events of a :class:`MonitoringCounts` as records of its audit topic, through the
    producer's own accumulator (``send_internal``: no waiting for buffer room, also while the
    producer closes).  I/O thread only.

    The audit topic is looked up on the bootstrap broker, and created there with
    :data:`AUDIT_TOPIC_PARTITIONS` partition if it does not exist; its events then go to each
    partition's leader like other records.  Each answer is awaited at most
    :data:`_LOOKUP_TIMEOUT_S` (the I/O thread does nothing else meanwhile), and after a failure
    (broker away, creation refused) the lookup waits a backoff that doubles up to a minute; the
    counts are kept, and a warning is logged at most once a minute.  An event goes to partition
    ``crc32c(topic) mod partitions``, so a topic's events stay in order.
    """

    def __init__(self, counts: MonitoringCounts) -> None:
        self.counts = counts
        self._partitions = 0
        self._retry_at_s = 0.0
        self._backoff_s = 0.0
        self._warned_s = -_WARN_EVERY_S

    def publish(self, producer: Any, metadata: Any, connection: Any, *, last: bool = False) -> int:
        """Queue every pending event; returns how many (0 also while the lookup backs off, unless
        this is the ``last`` publication, the producer's close, which tries at once)."""
        if not self.counts or (time.monotonic() < self._retry_at_s and not last):
            return 0
        events = self.counts.take()
        queued = 0
        try:
            partitions = self._audit_partitions(producer, metadata, connection)
            topic = self.counts.audit_topic
            for event in events:
                key, value = encode_event(event)
                producer.send_internal(topic, partition_for_key(key, partitions), value, key,
                                       functools.partial(self._published, event))
                queued += 1
        except Exception as e:  # the I/O thread must live on: keep what was not queued
            for event in events[queued:]:
                self.counts.give_back(event)
            self._failed(e)
            return queued
        self._backoff_s = 0.0
        return queued

    def _failed(self, error: BaseException) -> None:
        now = time.monotonic()
        self._backoff_s = min(_BACKOFF_MAX_S, max(1.0, self._backoff_s * 2))
        self._retry_at_s = now + self._backoff_s
        if now - self._warned_s >= _WARN_EVERY_S:
            self._warned_s = now
            logger.warning("[producer %s] cannot publish monitoring events to %r (kept; next try in "
                           "%.0f s): %s", self.counts.producer, self.counts.audit_topic, self._backoff_s,
                           error)

    def _published(self, event: MonitoringEvent, _metadata: Any, error: BaseException | None) -> None:
        if error is not None:
            logger.warning("[producer %s] monitoring event %d for %s window %d failed (published again "
                           "later): %s", self.counts.producer, event.sequence, event.topic,
                           event.window_start_ms, error)
            self.counts.give_back(event)

    def _audit_partitions(self, producer: Any, metadata: Any, connection: Any) -> int:
        if self._partitions:
            return self._partitions
        topic = self.counts.audit_topic
        partitions = self._lookup(metadata, connection, topic)
        if not partitions:
            try:
                request = protocol.CreateTopicRequest(topic, AUDIT_TOPIC_PARTITIONS, [])
                # Version 0: the broker's default replication factor, and any broker takes it.
                connection.wait_for(connection.send(request, version=0), _LOOKUP_TIMEOUT_S).raise_for_error()
                logger.info("[producer %s] created the audit topic %r", self.counts.producer, topic)
            except TopicAlreadyExistsError:  # another producer was first
                pass
            partitions = self._lookup(metadata, connection, topic)
            if not partitions:
                raise UnknownTopicOrPartitionError(f"the audit topic {topic!r} is missing after its creation")
        producer.set_partition_count(topic, partitions)
        self._partitions = partitions
        return partitions

    @staticmethod
    def _lookup(metadata: Any, connection: Any, topic: str) -> int:
        """The audit topic's partition count per the bootstrap broker; 0 if it does not exist."""
        response = metadata.request([topic], timeout_s=_LOOKUP_TIMEOUT_S)
        metadata.update(response)
        for described in response.topics:
            if described.name == topic and described.error_code and described.error_code != 6:
                raise error_for_code(described.error_code, f"metadata of the audit topic {topic!r}")
        partitions = metadata.cached(topic)
        return len(partitions) if partitions else 0
