"""Which brokers hold the replicas of each partition of a new replicated topic.

Kafka's scheme (``AdminUtils.assignReplicasToBrokers``, without racks), so operators find the
layout they know.  With the live broker ids sorted, ``n`` of them, and ``R`` replicas a partition:

- partition ``p``'s first replica, its *preferred leader*, is ``brokers[(start + p) % n]``:
  leadership goes round the brokers, each leading ``partitions / n`` partitions (one more for
  some when ``n`` does not divide ``partitions``);
- its ``j``-th follower (``j = 0 .. R-2``) is ``shift + j`` places further round the brokers,
  modulo ``n - 1`` and plus one so it is never the first replica: index
  ``(first + 1 + (shift + j) % (n - 1)) % n``.  ``shift`` starts at ``start`` and grows by one
  every ``n`` partitions, so the followers of a broker's partitions do not always land on the same
  next brokers, and each broker holds about ``partitions * R / n`` replicas (exactly that when
  ``n`` divides ``partitions``).

No broker appears twice in one partition's list.  ``start`` None picks the starting index and the
first shift at random (as Kafka does), so that topics created one after another do not all lead
on the lowest broker; a given ``start`` makes the result deterministic (tests, tools).

Pure computation: no ZooKeeper.  The controller calls it with the brokers alive when a topic is
created, and writes the result as the topic node's ``replicas`` (``hpbroker.coord.registry``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from hpbroker.coord.paths import check_broker_id
from hpbroker.errors import InvalidPartitionsError, InvalidReplicationFactorError

__all__ = ["assign_replicas"]


def assign_replicas(partitions: int, replication_factor: int, brokers: Sequence[int], *,
                    start: int | None = None) -> dict[int, tuple[int, ...]]:
    """``{partition: (preferred leader, follower, ...)}`` for partitions ``0 .. partitions-1``
    over ``brokers`` (any order; a broker listed twice counts once).

    Raises InvalidPartitionsError when ``partitions`` < 1, InvalidReplicationFactorError when
    ``replication_factor`` < 1 or more than the brokers given (the message lists them),
    InvalidConfigError for a broker id that is not one, ValueError for a negative ``start``."""
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise InvalidPartitionsError(f"a topic needs at least 1 partition, got {partitions!r}")
    live = sorted({check_broker_id(b) for b in brokers})
    if not isinstance(replication_factor, int) or isinstance(replication_factor, bool) \
            or replication_factor < 1:
        raise InvalidReplicationFactorError(f"replication factor must be an integer >= 1, "
                                            f"got {replication_factor!r}")
    if replication_factor > len(live):
        raise InvalidReplicationFactorError(
            f"replication factor {replication_factor} is larger than the {len(live)} live "
            f"broker{'' if len(live) == 1 else 's'} {live}")
    n = len(live)
    if start is None:
        first_index, shift = random.randrange(n), random.randrange(n)
    elif not isinstance(start, int) or isinstance(start, bool) or start < 0:
        raise ValueError(f"start must be an integer >= 0 or None, got {start!r}")
    else:
        first_index = shift = start
    assignment = {}
    for partition in range(partitions):
        if partition > 0 and partition % n == 0:
            shift += 1
        first = (first_index + partition) % n
        followers = ((first + 1 + (shift + j) % (n - 1)) % n for j in range(replication_factor - 1))
        assignment[partition] = (live[first], *(live[i] for i in followers))
    return assignment
