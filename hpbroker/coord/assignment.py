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

:func:`check_replica_assignment` is the one rule for what a replica assignment may be, used by
the topic node's reader (``hpbroker.coord.registry``) and by the broker's topic store
(``hpbroker.broker.topics``).  This module imports no kazoo (only ``paths`` and the errors), so
the broker's kazoo-free side may import it.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from hpbroker.coord.paths import check_broker_id
from hpbroker.errors import HPBrokerError, InvalidPartitionsError, InvalidReplicationFactorError

__all__ = ["assign_replicas", "check_replica_assignment"]


def check_replica_assignment(partitions: int, replicas: Mapping[int, Any]) -> dict[int, tuple[int, ...]]:
    """``replicas`` as a replicated topic holds it: ``{partition: (broker id, ...)}`` for exactly
    the partitions ``0 .. partitions-1``, each a non-empty list of distinct broker ids (the
    preferred leader first).  Partitions may have different numbers of replicas (a reassignment
    moving some).  An empty mapping is an unreplicated topic's and comes back empty.

    Raises InvalidPartitionsError naming what is wrong (the partition, the value found)."""
    if not isinstance(replicas, Mapping):
        raise InvalidPartitionsError(f"a replica assignment maps partitions to broker ids, "
                                     f"got {replicas!r:.200}")
    if not replicas:
        return {}
    if sorted(replicas) != list(range(partitions)):
        raise InvalidPartitionsError(f"a replica assignment must list partitions 0..{partitions - 1}, "
                                     f"got {sorted(replicas)!r:.200}")
    checked = {}
    for partition in range(partitions):
        brokers = replicas[partition]
        if not isinstance(brokers, (list, tuple)) or not brokers:
            raise InvalidPartitionsError(f"the replicas of partition {partition} must be a non-empty list "
                                         f"of broker ids, got {brokers!r:.200}")
        try:
            ids = tuple(check_broker_id(b) for b in brokers)
        except HPBrokerError as e:
            raise InvalidPartitionsError(f"the replicas of partition {partition}: {e.message}") from None
        if len(set(ids)) != len(ids):
            raise InvalidPartitionsError(f"the replicas of partition {partition} name a broker twice: "
                                         f"{list(ids)}")
        checked[partition] = ids
    return checked


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
