"""Planning a read: which offsets of which partitions, cut into splits.

A read covers, for every partition of its topics, the offsets ``[start, end)``.  Where each
range starts and ends is asked of the broker once, when the read is planned
(:func:`plan_read`): ``earliest`` is the log start offset, ``latest`` the high watermark (the
offset the next flushed record will get), a timestamp the first offset whose record timestamp is
at least that (ListOffsets over the data ports, ``Consumer.offsets_for_times``; the high
watermark when no record is that recent), and an explicit offset is taken as it is (one past the
high watermark is taken as the high watermark; one below the log start is left for the reader,
whose ``fail_on_data_loss`` decides).  The ends are a **snapshot**: records appended
after planning lie past them and are not read, however long the read takes.

A range longer than ``max_records_per_split`` offsets is cut into even :class:`OffsetRange`
splits, each read by one Spark task, so a large partition is read by several executors at once.

No Spark here (the data source, ``hpbroker.spark.datasource``, wraps it); the client only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpbroker.client.consumer import Consumer, TopicPartition
from hpbroker.security.client import ClientSecurity

__all__ = ["EARLIEST", "LATEST", "OffsetRange", "OffsetSpec", "offsets_json", "parse_offsets",
           "plan_read", "resolve_ranges", "split_range"]

#: In an explicit offsets document, the log start offset and the high watermark (as in Kafka's).
EARLIEST = -2
LATEST = -1


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one partition: one split of a read (picklable, so Spark ships
    it to the executor that reads it)."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def count(self) -> int:
        """Offsets in the range (records, unless some offsets hold none)."""
        return max(0, self.end - self.start)

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition} [{self.start}, {self.end})"


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where ranges start or end: ``"earliest"``, ``"latest"``, ``timestamp_ms`` (every partition),
    or ``offsets`` per topic and partition (:data:`EARLIEST`/:data:`LATEST` allowed; partitions
    not named take ``default``)."""

    kind: str  # "earliest", "latest", "timestamp" or "offsets"
    timestamp_ms: int = -1
    offsets: Mapping[str, Mapping[int, int]] | None = None
    default: str = "earliest"

    def __post_init__(self) -> None:
        if self.kind not in ("earliest", "latest", "timestamp", "offsets"):
            raise ValueError(f"offset spec kind {self.kind!r}: expected earliest, latest, timestamp or "
                             "offsets")


def parse_offsets(text: str | None, default: str, what: str) -> OffsetSpec:
    """``earliest``, ``latest`` or a JSON document ``{"topic": {"0": 23, "1": -2}}`` (-2:
    earliest, -1: latest; partitions not named: ``default``).  ValueError names ``what``."""
    if text is None or not str(text).strip():
        return OffsetSpec(default)
    text = str(text).strip()
    if text in ("earliest", "latest"):
        return OffsetSpec(text)
    try:
        document = json.loads(text)
        offsets = {str(topic): {int(p): int(o) for p, o in partitions.items()}
                   for topic, partitions in document.items()}
    except (ValueError, TypeError, AttributeError):
        raise ValueError(f"{what} {text!r}: expected earliest, latest or JSON like "
                         '{"topic": {"0": 42, "1": -2}}') from None
    for topic, partitions in offsets.items():
        for partition, offset in partitions.items():
            if partition < 0 or offset < EARLIEST:
                raise ValueError(f"{what}: {topic}-{partition} offset {offset}: partitions are >= 0, offsets "
                                 f">= 0 or -2 (earliest) or -1 (latest)")
    return OffsetSpec("offsets", offsets=offsets, default=default)


def offsets_json(ranges: Sequence[OffsetRange], *, end: bool) -> str:
    """The ``startingOffsets`` (or, with ``end``, ``endingOffsets``) document that pins a read
    to ``ranges`` (as :func:`resolve_ranges` gives them: one per partition)."""
    document: dict[str, dict[str, int]] = {}
    for r in ranges:
        document.setdefault(r.topic, {})[str(r.partition)] = r.end if end else r.start
    return json.dumps(document)


def split_range(whole: OffsetRange, max_records: int) -> list[OffsetRange]:
    """``whole`` cut into as few ranges of at most ``max_records`` offsets as it takes, of even
    sizes; an empty range gives none."""
    if max_records < 1:
        raise ValueError(f"max_records per split must be >= 1, got {max_records}")
    count = whole.count
    if count == 0:
        return []
    pieces = math.ceil(count / max_records)
    bounds = [whole.start + count * i // pieces for i in range(pieces + 1)]
    return [OffsetRange(whole.topic, whole.partition, low, high)
            for low, high in zip(bounds, bounds[1:], strict=False)]


def plan_read(bootstrap: str, topics: Sequence[str], starting: OffsetSpec, ending: OffsetSpec,
              max_records_per_split: int, *, timeout_ms: int = 30_000,
              security: ClientSecurity | None = None) -> list[OffsetRange]:
    """The splits of a read of ``topics`` from ``starting`` to ``ending``, asked of the broker
    now (the snapshot).  Raises UnknownTopicOrPartitionError for a missing topic."""
    return [split for whole in resolve_ranges(bootstrap, topics, starting, ending, timeout_ms=timeout_ms,
                                              security=security)
            for split in split_range(whole, max_records_per_split)]


def resolve_ranges(bootstrap: str, topics: Sequence[str], starting: OffsetSpec, ending: OffsetSpec, *,
                   timeout_ms: int = 30_000, security: ClientSecurity | None = None) -> list[OffsetRange]:
    """The whole range of every partition of ``topics``, empty ones included (``end`` never below
    ``start``), asked of the broker now (``security``: the CurveZMQ identity; None: the
    environment's, if any)."""
    with Consumer(bootstrap, client_id="hpbroker-spark-planner", request_timeout_ms=timeout_ms,
                  reconnect_timeout_ms=timeout_ms, security=security) as consumer:
        tps = [TopicPartition(topic, p) for topic in dict.fromkeys(topics)
               for p in sorted(consumer.partitions_for_topic(topic))]
        if not tps:
            return []
        log_starts = consumer.beginning_offsets(tps)
        log_ends = consumer.end_offsets(tps)
        starts = _resolve(consumer, starting, tps, log_starts, log_ends)
        ends = _resolve(consumer, ending, tps, log_starts, log_ends)
    return [OffsetRange(tp.topic, tp.partition, starts[tp], max(starts[tp], ends[tp])) for tp in tps]


def _resolve(consumer: Consumer, spec: OffsetSpec, tps: list[TopicPartition], log_starts: dict,
             log_ends: dict) -> dict[TopicPartition, int]:
    """Each partition's offset for ``spec``, inside ``[log start, log end]``."""
    if spec.kind == "earliest":
        return {tp: log_starts[tp] for tp in tps}
    if spec.kind == "latest":
        return {tp: log_ends[tp] for tp in tps}
    if spec.kind == "timestamp":
        found = consumer.offsets_for_times(dict.fromkeys(tps, spec.timestamp_ms))
        return {tp: log_ends[tp] if found.get(tp) is None else found[tp] for tp in tps}
    assert spec.offsets is not None
    resolved = {}
    for tp in tps:
        offset = spec.offsets.get(tp.topic, {}).get(tp.partition)
        if offset is None:
            offset = EARLIEST if spec.default == "earliest" else LATEST
        if offset == EARLIEST:
            offset = log_starts[tp]
        elif offset == LATEST:
            offset = log_ends[tp]
        resolved[tp] = min(offset, log_ends[tp])  # below the log start: the reader's failOnDataLoss decides
    return resolved
