"""The producer I/O thread's idempotent path: identity, pipelined sends, retries without a look.

:class:`IdempotentSending` is a mixin of the producer's ``_Sender`` (``hpbroker.client.producer``)
and runs on its I/O thread only.  It keeps one :class:`~hpbroker.client.idempotence.PartitionWindow`
per partition with unsettled requests and applies the rules of ``hpbroker.client.idempotence``:

- before the first drain, and again after a request failed for good, it asks the bootstrap
  broker for a producer identity (InitProducerId), retrying with backoff; batches wait in the
  accumulator meanwhile, and each fails (never sent) once it has waited ``delivery_timeout_ms``
  since it was opened;
- a partition's drained batches (every batch due, up to ``max_request_bytes``, as without
  idempotence) become one request, queued in the partition's window and sent as the window
  allows (up to ``max_in_flight`` requests unsettled at once, once a request of the identity
  was acknowledged on the partition; one at a time before); a window at its limit mutes the
  partition, so the batches due meanwhile wait and go together in its next request;
- a retry resends the same bytes (the broker answers a stored copy with ``duplicate``: the
  records are acknowledged at its offsets, ``RecordMetadata.deduplicated``); error 20 on a
  request behind an unsettled one is retried after it; errors 20 (on the first unsettled
  request), 21, 22 (retried while the identity is fresh: ``UNKNOWN_PRODUCER_ID_RETRY_S``) and
  every other error that is not retriable fail the request, as does the delivery timeout, and a
  failure of the current identity's request asks for a new identity.

What it uses of the sender: ``_producer``, ``_config``, ``connection``, ``identity``,
``_windows``, ``_acknowledged_generations``, ``_max_in_flight``, ``_control_timeout_s``,
``counts`` and the methods ``_new_request``, ``_send``, ``_settle``, ``_retry``,
``_retry_after``, ``_retry_backoff_ms``, ``_refresh_if_stale`` and ``_delivery_timeout_error``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from hpbroker import protocol
from hpbroker.client.idempotence import IN_FLIGHT, PIPELINE_AFTER_IDLE_S, QUEUED, PartitionWindow
from hpbroker.client.produce_request import GiveUp
from hpbroker.errors import HPBrokerError, OutOfOrderSequenceError, UnknownProducerIdError, error_for_code

__all__ = ["IdempotentSending"]

logger = logging.getLogger(__name__)


class IdempotentSending:
    """The idempotent half of the producer's I/O thread (module docstring)."""

    # --- the identity ------------------------------------------------------------------------------

    def _identity_ready(self, now: float) -> bool:
        """Whether batches may be drained: the producer has an identity that needs no replacing.
        Asks for one when it is due (a blocking call of at most the control timeout)."""
        identity = self.identity
        if not identity.wanted:
            return True
        if now < identity.next_attempt_s or not self._identity_needed():
            self._expire_without_identity(now)
            return False
        request = protocol.InitProducerIdRequest()
        try:
            response = self.connection.call(request, self._control_timeout_s)
        except HPBrokerError as e:
            identity.failed(now, e)
            logger.warning("[producer %s] no producer id from broker %s (%s); asking again in %.0f ms",
                           self._producer.name, self.connection.address, e,
                           (identity.next_attempt_s - now) * 1000)
            self._expire_without_identity(now)
            return False
        old = identity.producer_id, identity.producer_epoch
        self._producer.set_producer_identity(response.producer_id, response.producer_epoch)
        identity.obtained(response.producer_id, response.producer_epoch, time.monotonic())
        self.counts["producer_id_resets"] = identity.resets
        for queue in list(self._windows):  # partitions with requests of the old identity: no drain
            self._update_window(queue)
        if identity.resets:
            logger.warning("[producer %s] new producer id %d epoch %d (was %d epoch %d)", self._producer.name,
                           identity.producer_id, identity.producer_epoch, *old)
        else:
            logger.info("[producer %s] producer id %d epoch %d", self._producer.name, identity.producer_id,
                        identity.producer_epoch)
        return True

    def _identity_needed(self) -> bool:
        """Whether to ask for the wanted identity now: a new one at once, the first one only
        once there are records to send."""
        return self.identity.generation > 0 or (self._producer is not None
                                                and bool(self._producer.unfinished_batches))

    def _expire_without_identity(self, now: float) -> None:
        """No identity to drain with: fail the batches that have waited ``delivery_timeout_ms``
        since they were opened (never sent); younger ones wait on for the identity."""
        expired = self._producer.take_expired(now - self._config.delivery_timeout_ms / 1000)
        if not expired:
            return
        last = self.identity.last_error
        cls = type(last) if isinstance(last, HPBrokerError) else HPBrokerError
        for queue, batches in expired:
            request = self._new_request(queue, batches, b"", 0.0, 0)
            self._settle(request, cls(
                f"{request.record_count} records to {request} not sent: no producer id from broker "
                f"{self.connection.address} within delivery_timeout_ms {self._config.delivery_timeout_ms}; "
                f"last error: {last}"))

    # --- sending ---------------------------------------------------------------------------------

    def _queue_idempotent(self, queue: Any, batches: list, delivery_timeout_s: float) -> None:
        """A partition's drained batches into one request, queued behind its unsettled ones (the
        partition was not muted: its window had room for one more)."""
        window = self._windows.get(queue)
        if window is None:
            generation, idle_since = self._acknowledged_generations.pop(queue, (0, 0.0))
            if time.monotonic() - idle_since > PIPELINE_AFTER_IDLE_S:
                generation = 0  # the leader may have forgotten the producer: the first request alone
            window = self._windows[queue] = PartitionWindow(generation)
        window.add(self._new_request(queue, batches, self._producer.build_payload(batches),
                                     min(b.created_s for b in batches) + delivery_timeout_s,
                                     self.identity.generation))
        self._update_window(queue)

    def _send_queued(self, now: float) -> None:
        """Send what each window allows now; fail queued requests past their delivery timeout."""
        for queue, window in list(self._windows.items()):
            for request in window:
                if request.state == QUEUED and now >= request.deadline_s:
                    self._give_up(request, self._delivery_timeout_error(request, request.error))
            for request in window.sendable(now, self._max_in_flight):
                try:
                    self._refresh_if_stale(request)
                except HPBrokerError as e:
                    if not e.retriable:
                        self._give_up(request, e)
                    else:
                        self._retry(request, e, now, uncertain=False)
                    break
                except GiveUp as give_up:
                    self._give_up(request, give_up.error)
                    break
                self._send(request, now)
                if request.state != IN_FLIGHT:  # not handed to a connection: waits for its retry
                    break
            self._update_window(queue)

    def _update_window(self, queue: Any) -> None:
        """Mute the partition while its window takes no new batches; forget an empty window."""
        window = self._windows.get(queue)
        if window is None:
            queue.muted = False
        elif not window:
            del self._windows[queue]
            if window.acknowledged_generation:  # the leader knows this identity: pipeline at once
                self._acknowledged_generations[queue] = (window.acknowledged_generation, time.monotonic())
            queue.muted = False
        else:
            queue.muted = window.blocks_drain(self.identity.generation, self._max_in_flight)

    # --- outcomes --------------------------------------------------------------------------------

    def _idempotent_response(self, request: Any, response: Any, now: float) -> None:
        code = response.header.error_code
        window = self._windows[request.queue]
        if code == 0:
            request.base_offset = response.body.base_offset
            request.deduplicated = bool(response.body.duplicate)
            if request.deduplicated:
                logger.info("[producer %s] %s: %s were already stored (an earlier attempt): acknowledged at "
                            "offset %d, not appended again", self._producer.name, request, request.sequences,
                            request.base_offset)
            for done in window.acknowledged(request):
                self._settle(done, None, done.base_offset, done.deduplicated)
            self._update_window(request.queue)
            return
        error = error_for_code(code, response.header.error_message)
        if code == OutOfOrderSequenceError.code and not window.is_first(request):
            # An earlier request of the partition is unsettled (failed, or not answered yet): this
            # one's sequences did not follow what the broker had.  Resent after it, as it was.
            self._retry(request, error, now, uncertain=False)
            return
        if code == UnknownProducerIdError.code and self.identity.fresh(request.generation, now):
            # The leader may not know yet that the id was issued (another broker's new block):
            # nothing was appended; sent again as it was, until the identity is no longer fresh.
            self._retry(request, error, now, uncertain=False)
            return
        if not error.retriable:
            if request.uncertain:  # e.g. a crash cut that attempt during its flush, after its first batches
                error = error_for_code(code, f"{error.message}; an earlier attempt's outcome is unknown, "
                                             "so some of these records may have been stored")
            self._give_up(request, error)
            return
        self._retry_after(request, error, now)

    def _retry_idempotent(self, request: Any, error: HPBrokerError, now: float) -> None:
        """Queue ``request`` to be sent again, as it is, after a backoff (or fail it past its
        delivery timeout)."""
        if now >= request.deadline_s:
            self._give_up(request, self._delivery_timeout_error(request, error))
            return
        wait_ms = self._retry_backoff_ms(request)
        request.retries += 1
        request.due_s = min(now + wait_ms / 1000, request.deadline_s)
        self.counts["retries"] += 1
        self._windows[request.queue].to_retry(request)
        self._update_window(request.queue)
        logger.debug("[producer %s] %s: %s again in %d ms after %s", self._producer.name, request,
                     request.sequences, wait_ms, error)

    def _give_up(self, request: Any, error: BaseException) -> None:
        """``request`` fails for good: tell its records, then any acknowledged ones behind it,
        and ask for a new identity if it was the current one's."""
        queue = request.queue
        if request.state == IN_FLIGHT and request.link is not None:
            request.link.in_flight.pop(request.correlation_id, None)
            request.link.connection.forget(request.correlation_id)
        window = self._windows.get(queue)
        done = window.remove(request) if window is not None and request in window.requests else []
        self._settle(request, error)
        for acked in done:
            self._settle(acked, None, acked.base_offset, acked.deduplicated)
        if self.identity.broken(request.generation):
            logger.warning("[producer %s] %s: %s failed for good; a new producer id before more is sent",
                           self._producer.name, request, request.sequences)
        self._update_window(queue)
