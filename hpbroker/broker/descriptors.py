"""File descriptors: how many partitions a worker can hold open, and the limit that bounds it.

What an open partition holds (``hpbroker.io.log``, ``hpbroker.io.segment``): the exclusive lock
on its directory's ``.lock`` file, a ``.log``, an ``.index`` and a ``.timeindex`` descriptor for
its active segment, and only the ``.log`` of every closed segment (their index entries live in
memory, ``Segment.release_index_files``).  A partition therefore costs ``3 + segments``
descriptors, at least :data:`DESCRIPTORS_PER_PARTITION` (4: one segment, the state of a new or
empty partition).  Every
worker process holds its slot's partitions (``hpbroker.workers.ownership``) under the broker's
``RLIMIT_NOFILE``, which it inherits from the arbiter.

A worker also needs descriptors that are not partitions: its TCP data connections (up to
``max_connections``), its ZeroMQ context and backend socket, the data listener, pipes, and files
it opens for a moment (heartbeat, stats, checkpoints).  :class:`DescriptorBudget` keeps
``max_connections + FIXED_RESERVE`` of the limit for them, but never more than half the limit,
and gives the rest to partitions.  Topic creation is refused when a slot's partitions would not
fit (:meth:`DescriptorBudget.check`, error 14), and a worker that finds more partitions than fit
at boot serves those that do and answers the rest with error 15 (``hpbroker.workers.opening``).

:func:`raise_nofile_limit` lifts the soft limit to the hard one at broker start, as Kafka's and
most servers' packaging do; the hard limit is the operator's to raise (``LimitNOFILE=`` in the
systemd unit, ``ulimit -n`` in a shell).
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

from hpbroker.errors import InvalidPartitionsError

__all__ = [
    "DESCRIPTORS_PER_PARTITION",
    "DESCRIPTORS_PER_CLOSED_SEGMENT",
    "DESCRIPTORS_PER_SEGMENT",
    "FIXED_RESERVE",
    "HOW_TO_RAISE",
    "DescriptorBudget",
    "partition_descriptors",
    "raise_nofile_limit",
]

logger = logging.getLogger(__name__)

DESCRIPTORS_PER_SEGMENT = 3  # the active segment's .log, .index and .timeindex
DESCRIPTORS_PER_CLOSED_SEGMENT = 1  # its .log (sendfile); its indexes live in memory
DESCRIPTORS_PER_PARTITION = 1 + DESCRIPTORS_PER_SEGMENT  # the directory lock and one segment
FIXED_RESERVE = 64  # ZeroMQ context and sockets, listener, pipes, stdio, files opened for a moment
_NR_OPEN_PATH = "/proc/sys/fs/nr_open"  # the kernel's ceiling for RLIMIT_NOFILE
HOW_TO_RAISE = ("raise it with LimitNOFILE= in the systemd unit (deploy/hpbroker.service), or "
                "`ulimit -n` before `hpbroker serve`, and restart the broker")


def partition_descriptors(segments: int) -> int:
    """Descriptors an open partition of ``segments`` segments holds."""
    return DESCRIPTORS_PER_PARTITION + DESCRIPTORS_PER_CLOSED_SEGMENT * max(segments - 1, 0)


@dataclass(frozen=True, slots=True)
class DescriptorBudget:
    """How one worker's ``limit`` descriptors (its soft ``RLIMIT_NOFILE``) are shared out."""

    limit: int
    max_connections: int

    @classmethod
    def current(cls, max_connections: int) -> DescriptorBudget:
        """The budget under this process's soft limit (RLIM_INFINITY counts as 2**31 - 1)."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return cls(soft if soft != resource.RLIM_INFINITY else 2**31 - 1, max_connections)

    @property
    def reserve(self) -> int:
        """Descriptors kept for connections and everything else that is not a partition."""
        return min(self.max_connections + FIXED_RESERVE, self.limit // 2)

    @property
    def for_partitions(self) -> int:
        """Descriptors a worker's partitions may hold together."""
        return self.limit - self.reserve

    @property
    def partitions_per_worker(self) -> int:
        """Partitions of one segment each that fit in one worker."""
        return self.for_partitions // DESCRIPTORS_PER_PARTITION

    def describe(self) -> str:
        return (f"the file-descriptor limit (RLIMIT_NOFILE) is {self.limit} per worker, of which "
                f"{self.reserve} are kept for connections and sockets, so a worker holds at most "
                f"{self.partitions_per_worker} partitions ({DESCRIPTORS_PER_PARTITION} descriptors each: "
                f"the directory lock and the active segment's .log, .index and .timeindex; one more per "
                f"closed segment)")

    def check(self, topic: str, partitions: int, slot: int, slot_partitions: int, workers: int) -> None:
        """Refuse (InvalidPartitionsError, nothing is changed) a topic of ``partitions`` after
        which worker ``slot``, the most loaded, would hold ``slot_partitions`` partitions."""
        if slot_partitions <= self.partitions_per_worker:
            return
        needed = slot_partitions * DESCRIPTORS_PER_PARTITION + self.reserve
        raise InvalidPartitionsError(
            f"topic {topic!r} with {partitions} partitions does not fit in this broker's file "
            f"descriptors: worker slot {slot} (of {workers}) would hold {slot_partitions} partitions, "
            f"which needs at least {needed} descriptors, but {self.describe()}; create fewer partitions "
            f"(at most {self.partitions_per_worker} per worker over all topics), or {HOW_TO_RAISE}")


def raise_nofile_limit() -> tuple[int, int]:
    """Lift the soft RLIMIT_NOFILE to the hard limit (an unlimited hard limit: to the kernel's
    ``fs.nr_open``), where allowed; returns ``(soft before, soft now)`` and logs the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            with open(_NR_OPEN_PATH) as f:
                target = int(f.read())
        except (OSError, ValueError):
            target = soft
    raised = soft
    if soft != resource.RLIM_INFINITY and target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            raised = target
        except (OSError, ValueError) as e:
            logger.warning("cannot raise the file-descriptor limit from %d to %d: %s", soft, target, e)
    hard_text = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    if raised != soft:
        logger.info("file-descriptor limit (RLIMIT_NOFILE): %d, raised from %d (hard limit %s)",
                    raised, soft, hard_text)
    else:
        logger.info("file-descriptor limit (RLIMIT_NOFILE): %d (hard limit %s)", raised, hard_text)
    return soft, raised
