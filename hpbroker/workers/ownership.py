"""Which worker slot owns a partition: one stable rule, used by the arbiter to route requests and
by workers to know what to open.

``owner_slot(topic, partition, slots)`` spreads a topic's partitions round-robin over the slots,
starting at a slot chosen by a hash of the topic name (CRC32C of its UTF-8 bytes), so partition
``p`` of every topic lands on a different slot than ``p + 1`` and topics do not all start on
slot 0.  The rule depends only on its arguments: every process computes the same answer, and it
changes only when the number of slots does (a restart with a different ``workers`` setting moves
partitions between slots, which is safe because every slot opens its partitions from the shared
data directory).
"""

from __future__ import annotations

from hpbroker.records import crc32c

__all__ = ["owner_slot"]


def owner_slot(topic: str, partition: int, slots: int) -> int:
    """The slot in ``[0, slots)`` that owns ``partition`` of ``topic``."""
    if slots < 1:
        raise ValueError(f"slots must be at least 1, got {slots}")
    if partition < 0:
        raise ValueError(f"partition must be non-negative, got {partition}")
    return (crc32c(topic.encode("utf-8")) + partition) % slots
