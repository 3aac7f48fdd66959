"""Monitoring events: how many records a producer had acknowledged, per topic and time window.

Every producer counts the records the broker acknowledged (with ``acks=0``: the records it sent)
per topic and **window**, a window being ``[window_start_ms, window_start_ms + window_ms)`` of the
*record timestamps*, with ``window_start_ms = timestamp - timestamp mod window_ms``.  Every
``window_ms`` and when it closes, the producer publishes what it counted since its last
publication as records of the audit topic (``_audit`` unless configured otherwise): one event per
(topic, window) with a count above zero.  A window can be announced by several events (records
acknowledged after the window's first event): the audit **sums** every event of a (producer,
topic, window).  The events are records like any other, acknowledged and retried.  Each event is
numbered (``instance``, ``sequence``), and an event that failed is published again unchanged, so
one whose failed attempt was stored after all (an unknown outcome) is stored twice under the
same number: the audit counts each (producer, instance, sequence) once.

An event is one record of the audit topic:

- its batch's ``producer`` is the name of the producer that counted (docs/FORMAT.md), the same
  name that batch headers of the counted records carry;
- its ``key`` is the audited topic's name in UTF-8 (so a topic's events share a partition);
- its ``timestamp`` is when the event was published;
- its ``value``, little-endian like the rest of the format (:data:`VALUE_HEADER`)::

      position  size  field            type
      0         1     version          u8     1
      1         8     instance         u64    random, drawn once per producer instance (< 2**63)
      9         8     sequence         u64    the instance's event number: 0, 1, 2 ... (< 2**63)
      17        8     window_start_ms  i64    first timestamp of the window (ms since the epoch)
      25        4     window_ms        u32    length of the window, ms (>= 1)
      29        8     record_count     i64    records acknowledged in the window since the last event (>= 1)
      37        2     topic_length     u16    bytes of topic
      39        n     topic            UTF-8  the audited topic (the key again: the value stands alone)

The audit (``hpbroker audit``) counts the records of each topic per producer and window from the
data itself and reports every (topic, producer, window) where that count and the announced sum
differ.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "AUDIT_TOPIC",
    "DEFAULT_WINDOW_MS",
    "EVENT_VERSION",
    "VALUE_HEADER",
    "MonitoringEvent",
    "decode_event",
    "encode_event",
    "window_start",
]

#: the topic producers publish monitoring events to unless configured otherwise
AUDIT_TOPIC = "_audit"
#: the default window of the counts, ms
DEFAULT_WINDOW_MS = 10_000
#: the version byte of the value layout above
EVENT_VERSION = 1
#: version, instance, sequence, window_start_ms, window_ms, record_count, topic_length (39 bytes),
#: then the topic
VALUE_HEADER = struct.Struct("<BQQqIqH")
_MAX_NUMBER = (1 << 63) - 1  # instance and sequence fit a signed 64-bit column too
_MAX_TOPIC_BYTES = 0xFFFF


def window_start(timestamp_ms: int, window_ms: int) -> int:
    """The start of the window of ``window_ms`` that holds ``timestamp_ms`` (floor, also for
    timestamps before the epoch)."""
    return timestamp_ms - timestamp_ms % window_ms


@dataclass(frozen=True, slots=True)
class MonitoringEvent:
    """One event: ``producer`` acknowledged ``record_count`` more records of ``topic`` whose
    timestamps lie in ``[window_start_ms, window_start_ms + window_ms)``; it is event number
    ``sequence`` of the producer instance ``instance``."""

    producer: str
    topic: str
    window_start_ms: int
    window_ms: int
    record_count: int
    instance: int
    sequence: int

    def __post_init__(self) -> None:
        for name in ("instance", "sequence"):
            if not 0 <= getattr(self, name) <= _MAX_NUMBER:
                raise ValueError(f"{name} must be in [0, 2**63 - 1], got {getattr(self, name)}")
        if not 1 <= self.window_ms <= 0xFFFFFFFF:
            raise ValueError(f"window_ms must be in [1, {0xFFFFFFFF}], got {self.window_ms}")
        if self.window_start_ms % self.window_ms:
            raise ValueError(f"window_start_ms {self.window_start_ms} is not a multiple of window_ms "
                             f"{self.window_ms}")
        if self.record_count < 1:
            raise ValueError(f"record_count must be at least 1, got {self.record_count}")
        if len(self.topic.encode("utf-8")) > _MAX_TOPIC_BYTES:
            raise ValueError(f"topic name of {len(self.topic.encode('utf-8'))} bytes is too long")


def encode_event(event: MonitoringEvent) -> tuple[bytes, bytes]:
    """``(key, value)`` of the event's record; the producer name travels in the batch header."""
    topic = event.topic.encode("utf-8")
    value = VALUE_HEADER.pack(EVENT_VERSION, event.instance, event.sequence, event.window_start_ms,
                              event.window_ms, event.record_count, len(topic)) + topic
    return topic, value


def decode_event(producer: str, value: bytes | bytearray | memoryview) -> MonitoringEvent:
    """The event in an audit record's ``value`` (``producer`` from its batch).  Raises ValueError
    naming what is wrong for a value that is not a version-1 event."""
    view = memoryview(value)
    if len(view) < VALUE_HEADER.size:
        raise ValueError(f"a monitoring event is at least {VALUE_HEADER.size} bytes, got {len(view)}")
    version, instance, sequence, start, window_ms, count, topic_length = VALUE_HEADER.unpack_from(view)
    if version != EVENT_VERSION:
        raise ValueError(f"monitoring event version {version}; this reader knows version {EVENT_VERSION}")
    if len(view) != VALUE_HEADER.size + topic_length:
        raise ValueError(f"monitoring event of {len(view)} bytes; its topic_length {topic_length} makes "
                         f"{VALUE_HEADER.size + topic_length}")
    try:
        topic = bytes(view[VALUE_HEADER.size:]).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"monitoring event topic is not UTF-8: {e}") from None
    return MonitoringEvent(producer, topic, start, window_ms, count, instance, sequence)
