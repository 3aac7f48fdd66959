"""One ProduceRequest of one partition, from the batches it carries until they are settled, and
how its records' outcomes are told (:func:`report`).

Built by the producer's I/O thread (``hpbroker.client.producer``) from the batches it drained,
finished into ``payload`` once; a retry resends that payload as it is.  The idempotent
bookkeeping (``hpbroker.client.idempotence``) reads and sets its ``state``, ``retries``,
``due_s``, ``deadline_s`` and ``generation``.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpbroker.client._accumulator import Batch, PartitionQueue
    from hpbroker.client.links import BrokerLink
    from hpbroker.client.producer_config import RecordMetadata
    from hpbroker.errors import HPBrokerError

__all__ = ["GiveUp", "PartitionRequest", "broker_timeout_ms", "report"]

logger = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class PartitionRequest:
    """One ProduceRequest of one partition: its batches, finished into ``payload``, until settled."""

    queue: PartitionQueue
    batches: list[Batch]
    payload: bytes
    record_count: int
    deadline_s: float  # delivery_timeout_ms after the oldest batch was opened
    attempts: int = 0
    retries: int = 0
    correlation_id: int = -1
    sent_s: float = 0.0
    due_s: float = 0.0  # when to retry
    uncertain: bool = False  # a previous attempt may have been appended: look before resending
    error: BaseException | None = None
    link: BrokerLink | None = None  # the connection it is in flight on
    # Idempotent requests only (hpbroker.client.idempotence):
    generation: int = 0  # of the producer identity its batches carry
    state: int = 0  # QUEUED, IN_FLIGHT or ACKED
    base_offset: int = -1  # once ACKED
    deduplicated: bool = False  # once ACKED: the broker had stored it already

    def __str__(self) -> str:
        return f"{self.queue.topic}-{self.queue.partition}"

    @property
    def sequences(self) -> str:
        """Its batches' sequence range, for messages."""
        last = self.batches[-1]
        return f"sequences {self.batches[0].base_sequence}..{last.base_sequence + last.record_count - 1}"


class GiveUp(Exception):  # noqa: N818 - control flow inside the I/O thread, never leaves it
    """Settle the request with ``error`` now (its partition is gone)."""

    def __init__(self, error: HPBrokerError) -> None:
        self.error = error


def broker_timeout_ms(request_timeout_ms: float) -> int:
    """The timeout_ms a ProduceRequest carries: a tenth (at most 1 s) below request_timeout_ms,
    so that the broker's error 12 reaches a client still waiting for it."""
    return max(1, int(request_timeout_ms - min(1000.0, request_timeout_ms / 10)))


def report(waiter: Any, metadata: RecordMetadata | None, error: BaseException | None) -> None:
    """Tell one future or callback.  Whatever it raises, SystemExit and KeyboardInterrupt too,
    is logged: the I/O thread must live on to report every other record."""
    if type(waiter) is Future:
        try:
            if error is None:
                waiter.set_result(metadata)
            else:
                waiter.set_exception(error)
        except InvalidStateError:  # cancelled by its owner: nobody is listening
            pass
        except BaseException:  # a done-callback of the future raised past concurrent.futures
            logger.exception("a done-callback of a producer future raised")
        return
    try:
        waiter(metadata, error)
    except BaseException:
        logger.exception("a producer callback raised")
