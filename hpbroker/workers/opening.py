"""Opening a worker's partitions so that none of them can keep the worker from serving the rest.

A worker opens the partitions of its slot at boot and whenever the arbiter sends ``open``.  Two
things can make a partition impossible to open, and neither may stop the worker:

- **Descriptors.**  Every open partition holds ``3 + segments`` file descriptors
  (``hpbroker.broker.descriptors``); the worker keeps a reserve of its ``RLIMIT_NOFILE`` for
  connections and its sockets.  A partition that would take the partitions' share beyond
  :attr:`DescriptorBudget.for_partitions` is not opened: it answers with
  PartitionNotAvailableError (error 15) naming the limit and how to raise it.  Without this a
  topic stored with more partitions than the limit allows ran the worker out of descriptors
  (EMFILE) for its heartbeats and sockets, and stopped the broker at every start.
- **Errors while opening**: a StorageError (error 7: EMFILE, the directory's lock held by
  another process, a disk error) or an InvalidConfigError is answered as it was raised, any
  other failure of recovery as a StorageError, each carrying the reason.

At boot the partitions are opened topic by topic, the topics with the fewest partitions in this
worker first, so that one topic too large for the limit cannot take the descriptors of the
others.  A partition that could not be opened is opened again by a later ``open`` of it.

Single-threaded: the worker's loop.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Sequence

from hpbroker.broker.descriptors import (
    DESCRIPTORS_PER_PARTITION,
    HOW_TO_RAISE,
    DescriptorBudget,
    partition_descriptors,
)
from hpbroker.errors import HPBrokerError, PartitionNotAvailableError, StorageError
from hpbroker.workers.backend import PartitionSpec
from hpbroker.workers.partitions import PartitionSet

__all__ = ["PartitionOpener"]

logger = logging.getLogger(__name__)

_ERRORS_LISTED = 5  # partitions named in what open_all returns; the rest are counted


class PartitionOpener:
    """Opens partitions into a :class:`PartitionSet` within a :class:`DescriptorBudget`."""

    def __init__(self, partitions: PartitionSet, budget: DescriptorBudget) -> None:
        self._partitions = partitions
        self._budget = budget
        self._held = 0  # descriptors the open partitions hold, as of their opening or refresh()

    def open_all(self, specs: Sequence[PartitionSpec]) -> list[str]:
        """Open every partition of ``specs``, smallest topics first; the errors, one a partition
        that could not be opened (it is marked unavailable)."""
        self._refresh()
        per_topic = collections.Counter(spec.topic for spec in specs)
        ordered = sorted(specs, key=lambda s: (per_topic[s.topic], s.topic, s.partition))
        errors = []
        refused: collections.Counter[str] = collections.Counter()
        for spec in ordered:
            error = self._open(spec)
            if error is None:
                continue
            errors.append(f"{spec.topic}-{spec.partition}: {error.message}")
            if isinstance(error, PartitionNotAvailableError):
                refused[spec.topic] += 1
        if len(errors) > _ERRORS_LISTED:
            errors[_ERRORS_LISTED:] = [f"and {len(errors) - _ERRORS_LISTED} more partitions"]
        if refused:
            logger.error("%d partitions not opened for lack of file descriptors (%s): %s; %s",
                         sum(refused.values()),
                         ", ".join(f"{topic}: {count}" for topic, count in sorted(refused.items())),
                         self._budget.describe(), HOW_TO_RAISE)
        return errors

    def _refresh(self) -> None:
        """Count again what the open partitions hold (segments come and go as logs roll and
        retention deletes)."""
        self._held = sum(partition_descriptors(p.log.segment_count) for p in self._partitions)

    def _open(self, spec: PartitionSpec) -> HPBrokerError | None:
        name = f"{spec.topic}-{spec.partition}"
        try:
            self._partitions.get(spec.topic, spec.partition)
            return None  # open already
        except HPBrokerError:
            pass
        error: HPBrokerError
        if self._held + DESCRIPTORS_PER_PARTITION > self._budget.for_partitions:
            error = PartitionNotAvailableError(
                f"partition {name} is not open on this broker: it would exceed the file descriptors "
                f"its worker may use for partitions ({self._held} held of {self._budget.for_partitions}); "
                f"{self._budget.describe()}; {HOW_TO_RAISE}")
        else:
            try:
                partition = self._partitions.open(spec)
            except HPBrokerError as e:  # StorageError (EMFILE, a lock held, a disk error), InvalidConfigError
                logger.error("cannot open partition %s: %s", name, e.message)
                error = type(e)(f"partition {name} could not be opened: {e.message}")
            except Exception as e:  # recovery failed: a bug or a file it cannot read; serve the rest
                logger.exception("cannot open partition %s", name)
                error = StorageError(f"partition {name} could not be opened: {type(e).__name__}: {e}")
            else:
                self._held += partition_descriptors(partition.log.segment_count)
                return None
        self._partitions.mark_unavailable(spec, error)
        return error
