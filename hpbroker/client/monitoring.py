"""The producer's monitoring events: counts of acknowledged records per topic and window.

:class:`MonitoringCounts` belongs to the producer's I/O thread (``hpbroker.client.producer``),
which alone calls it:

- when a request is acknowledged (with ``acks=0``: sent), :meth:`~MonitoringCounts.add` takes
  each batch's ``window_counts`` (the compiled accumulator counts a batch's records per window
  while it finishes the batch, so nothing here is per record);
- every ``window_ms`` and when the producer closes, :meth:`~MonitoringCounts.take` hands out one
  :class:`~hpbroker.audit.events.MonitoringEvent` per (topic, window) counted since the last
  take, and the I/O thread sends each as a record of the audit topic;
- an event whose record fails goes back with :meth:`~MonitoringCounts.give_back`, to be announced
  again with the next take.

So every acknowledged record is announced exactly once, in some event of its window, as long as
the producer lives to publish it; the audit sums a window's events (docs/AUDIT.md).  Records of
the audit topic itself are not counted.
"""

from __future__ import annotations

import collections
import functools
import logging
import time
from typing import Any

from hpbroker import protocol
from hpbroker.audit.events import MonitoringEvent, encode_event, window_start
from hpbroker.client._accumulator import partition_for_key
from hpbroker.errors import HPBrokerError, TopicAlreadyExistsError, UnknownTopicOrPartitionError

__all__ = ["MonitoringCounts", "MonitoringPublisher"]

logger = logging.getLogger(__name__)

#: partitions of the audit topic when a producer has to create it
AUDIT_TOPIC_PARTITIONS = 1
_WARN_EVERY_S = 60.0


class MonitoringCounts:
    """Records acknowledged per ``(topic, window_start_ms)`` and not yet announced."""

    def __init__(self, producer: str, audit_topic: str, window_ms: int) -> None:
        self.producer = producer
        self.audit_topic = audit_topic
        self.window_ms = window_ms
        self._counts: collections.Counter[tuple[str, int]] = collections.Counter()

    def __bool__(self) -> bool:
        return bool(self._counts)

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
        """The events to publish now (oldest window first), forgetting their counts."""
        counts, self._counts = self._counts, collections.Counter()
        return [MonitoringEvent(self.producer, topic, start, self.window_ms, count)
                for (topic, start), count in sorted(counts.items(), key=lambda item: (item[0][1], item[0][0]))
                if count > 0]

    def give_back(self, event: MonitoringEvent) -> None:
        """``event`` was not published: announce its records with the next take."""
        self._counts[event.topic, event.window_start_ms] += event.record_count


class MonitoringPublisher:
    """Sends the events of a :class:`MonitoringCounts` as records of its audit topic, through the
    producer's own accumulator (``send_internal``: no waiting for buffer room, also while the
    producer closes).  I/O thread only.

    The audit topic is looked up on the broker the producer talks to, and created there with
    :data:`AUDIT_TOPIC_PARTITIONS` partition if it does not exist.  While that fails (broker
    away, creation refused) the counts are kept and a warning is logged at most once a minute.
    An event goes to partition ``crc32c(topic) mod partitions``, so a topic's events stay in order.
    """

    def __init__(self, counts: MonitoringCounts) -> None:
        self.counts = counts
        self._partitions = 0
        self._warned_s = -_WARN_EVERY_S

    def publish(self, producer: Any, metadata: Any, connection: Any, timeout_s: float) -> int:
        """Queue every pending event; returns how many."""
        events = self.counts.take()
        if not events:
            return 0
        try:
            partitions = self._audit_partitions(producer, metadata, connection, timeout_s)
        except HPBrokerError as e:
            for event in events:
                self.counts.give_back(event)
            now = time.monotonic()
            if now - self._warned_s >= _WARN_EVERY_S:
                self._warned_s = now
                logger.warning("[producer %s] cannot publish monitoring events to %r (kept for the next "
                               "try): %s", self.counts.producer, self.counts.audit_topic, e)
            return 0
        topic = self.counts.audit_topic
        for event in events:
            key, value = encode_event(event)
            producer.send_internal(topic, partition_for_key(key, partitions), value, key,
                                   functools.partial(self._published, event))
        return len(events)

    def _published(self, event: MonitoringEvent, _metadata: Any, error: BaseException | None) -> None:
        if error is not None:
            logger.warning("[producer %s] monitoring event for %s window %d failed (announced again "
                           "later): %s", self.counts.producer, event.topic, event.window_start_ms, error)
            self.counts.give_back(event)

    def _audit_partitions(self, producer: Any, metadata: Any, connection: Any, timeout_s: float) -> int:
        if self._partitions:
            return self._partitions
        topic = self.counts.audit_topic
        try:
            partitions = len(metadata.partitions(topic, refresh=True))
        except UnknownTopicOrPartitionError:
            try:
                connection.call(protocol.CreateTopicRequest(topic, AUDIT_TOPIC_PARTITIONS, []), timeout_s)
                logger.info("[producer %s] created the audit topic %r", self.counts.producer, topic)
            except TopicAlreadyExistsError:  # another producer was first
                pass
            partitions = len(metadata.partitions(topic, refresh=True))
        producer.set_partition_count(topic, partitions)
        self._partitions = partitions
        return partitions
