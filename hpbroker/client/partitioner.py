"""Which partition a record goes to (docs/CLIENT.md, "Partitioning").

The rule is a contract with every other client: a keyed record goes to

    crc32c(key bytes) mod partition_count

where CRC32C is the Castagnoli CRC of docs/FORMAT.md (reflected polynomial ``0x82F63B78``, initial
value and final XOR ``0xFFFFFFFF``; ``123456789`` gives ``0xE3069283``), taken as an unsigned
32-bit number, for a ``partition_count`` of 1 to 2**31 - 1.  An empty key is a key (CRC 0,
partition 0); a ``None`` key is no key (:func:`partition_for_key` refuses it with TypeError).

Records without a key (and without an explicit ``partition=``) are spread by the producer's
``partitioner`` setting:

- ``"sticky"`` (the default): a topic's keyless records fill one partition's batch; when that
  batch is complete (full, or sent because its linger time passed or a flush asked for it), the
  next keyless record starts a batch on the next partition, ``(p + 1) mod partition_count``.  The
  first partition is chosen at random per producer and topic, so producers do not all start on 0.
  Fewer, fuller batches; spread evenly over time.
- ``"round_robin"``: each keyless record goes to the next partition in turn.
- a callable ``partitioner(topic, key, partition_count) -> int`` decides every record that has
  no explicit partition, keyed or not (it runs in Python, once per record: slower).

The producer's compiled send path (``hpbroker.client._accumulator``) implements the same rule;
:func:`partition_for_key` is that very code, for callers that want to know where a key goes.
"""

from __future__ import annotations

from collections.abc import Callable

from hpbroker.client._accumulator import PARTITIONER_ROUND_ROBIN, PARTITIONER_STICKY, partition_for_key

__all__ = ["ROUND_ROBIN", "STICKY", "Partitioner", "partition_for_key", "partitioner_kind"]

STICKY = "sticky"
ROUND_ROBIN = "round_robin"

#: A custom partitioner: ``(topic, key or None, partition_count) -> partition``.
Partitioner = Callable[[str, "bytes | None", int], int]

_KINDS = {STICKY: PARTITIONER_STICKY, ROUND_ROBIN: PARTITIONER_ROUND_ROBIN}


def partitioner_kind(partitioner: str | Partitioner) -> int | Partitioner:
    """What the accumulator takes: the number of a named partitioner, or the callable itself.
    ValueError names the choices for an unknown name."""
    if callable(partitioner):
        return partitioner
    kind = _KINDS.get(partitioner) if isinstance(partitioner, str) else None
    if kind is None:
        raise ValueError(f"unknown partitioner {partitioner!r}: choose {STICKY!r}, {ROUND_ROBIN!r} "
                         "or a callable (topic, key, partition_count) -> partition")
    return kind
