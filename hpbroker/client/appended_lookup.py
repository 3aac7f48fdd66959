"""Without idempotence: a retry that is due, and the look whether an attempt of unknown outcome
was appended.

A request whose answer never came (a lost connection, a timeout, errors 7, 12 or 15) may or may
not be in the partition.  Before it is resent, :meth:`AppendedLookup._look_if_uncertain` looks for
its first batch in the log, by producer name, ``base_sequence`` and CRC: fetching from the end
of the producer's previous acknowledged request to the partition (``_known_end``), or, with
none, from ``ListOffsets`` of the request's oldest record timestamp (FetchRequest version 0, as
a consumer's: ``hpbroker.client.fetcher.FETCH_VERSION``).  It sees flushed records
only: an append still waiting for its flush is not found, and resending it stores it twice (the
idempotent producer, ``hpbroker.client.idempotent_sending``, never looks: the broker
deduplicates).

:class:`AppendedLookup` is a mixin of the producer's ``_Sender`` (``hpbroker.client.producer``)
and runs on its I/O thread only.  What it uses of the sender: ``_producer`` (its ``name``),
``links``, ``metadata``, ``_waiting`` (requests to retry at their ``due_s``), ``_known_end``
(``(topic, partition)`` -> the offset after the producer's last acknowledged record there),
``_control_timeout_s`` and the methods ``_refresh_if_stale``, ``_send``, ``_settle`` and
``_retry``.
"""

from __future__ import annotations

import logging
from typing import Any

from hpbroker import protocol
from hpbroker.client.fetcher import FETCH_VERSION
from hpbroker.client.produce_request import GiveUp
from hpbroker.errors import HPBrokerError, OffsetOutOfRangeError, UnknownServerError
from hpbroker.records import read_header, scan_batches

__all__ = ["AppendedLookup"]

logger = logging.getLogger(__name__)

_VERIFY_FETCH_BYTES = 4 << 20  # max_bytes of each fetch while looking
_VERIFY_MAX_BYTES = 256 << 20  # give up looking for a request's batch after scanning this much


class AppendedLookup:
    """The look for a request's first batch in its partition (module docstring)."""

    def _retry_due(self, now: float) -> None:
        """Send the requests whose retry is due (``_waiting``), each after a look if its last
        attempt's outcome is unknown (acknowledged where it is found)."""
        if not self._waiting:
            return
        due = [r for r in self._waiting if r.due_s <= now]
        if not due:
            return
        self._waiting = [r for r in self._waiting if r.due_s > now]
        for request in due:
            try:
                self._refresh_if_stale(request)
                found = self._look_if_uncertain(request)
            except HPBrokerError as e:
                if e.retriable:
                    self._retry(request, e, now, uncertain=False)
                else:
                    self._settle(request, e)
                continue
            except GiveUp as give_up:
                self._settle(request, give_up.error)
                continue
            if found is not None:
                self._acknowledged(request, found)
            else:
                self._send(request, now)

    def _acknowledged(self, request: Any, base_offset: int) -> None:
        """``request`` is stored at ``base_offset``: tell it, and look after it next time."""
        queue = request.queue
        self._known_end[queue.topic, queue.partition] = base_offset + request.record_count
        self._settle(request, None, base_offset)

    def _look_if_uncertain(self, request: Any) -> int | None:
        """Before a retry: the base offset at which an earlier attempt of ``request`` was
        appended, or None (no attempt's outcome was unknown, or it is not in the log: send it
        again, and it is certain from now on).  Raises HPBrokerError when that cannot be known
        yet (the look failed)."""
        if not request.uncertain:
            return None
        base_offset = self._find_appended(request)
        logger.info("[producer %s] %s: the outcome of an earlier attempt was unknown; its records %s",
                    self._producer.name, request, "are not in the log: sending them again"
                    if base_offset is None else f"were appended at offset {base_offset}")
        if base_offset is None:
            request.uncertain = False
        return base_offset

    def _find_appended(self, request: Any) -> int | None:
        """The base offset at which ``request`` was appended, or None if it is not in the log.

        Its first batch is looked for from the end of this producer's previous acknowledged
        request to the partition (or, with none, from the first record at least as recent as
        the request's oldest timestamp), by producer name, ``base_sequence`` and CRC."""
        topic, partition = request.queue.topic, request.queue.partition
        first = request.batches[0]
        call = self.links.for_partition(self.metadata, topic, partition).connection.call
        timeout_s = self._control_timeout_s
        start = self._known_end.get((topic, partition))
        by_time = start is None
        if by_time:
            start = self._first_offset_since(request)
        scanned = 0
        while start is not None and scanned < _VERIFY_MAX_BYTES:
            try:
                fetched = call(protocol.FetchRequest(topic, partition, start, max_bytes=_VERIFY_FETCH_BYTES,
                                                     max_wait_ms=0), timeout_s, version=FETCH_VERSION)
            except OffsetOutOfRangeError:  # the log no longer has our last acknowledged offset
                start = None if by_time else self._first_offset_since(request)
                by_time = True
                continue
            payload = fetched.payload
            scan = scan_batches(payload)
            for position in scan.positions:
                header = read_header(payload, position)
                if (header.base_sequence == first.base_sequence and header.crc == first.crc
                        and header.producer == self._producer.name):
                    return header.base_offset
            if scan.batch_count == 0 or scan.next_offset >= fetched.high_watermark:
                return None
            start = scan.next_offset
            scanned += len(payload)
        if start is None:
            return None
        raise UnknownServerError(f"{request}: request {request.correlation_id} not found in {scanned} bytes "
                                 "after the producer's last acknowledged offset; giving up looking")

    def _first_offset_since(self, request: Any) -> int | None:
        """The first offset whose timestamp is at least the request's oldest one (None: no record
        is that recent, so the request is not there)."""
        oldest = min(b.min_timestamp for b in request.batches)
        queue = request.queue
        link = self.links.for_partition(self.metadata, queue.topic, queue.partition)
        found = link.connection.call(protocol.ListOffsetsRequest(queue.topic, queue.partition, oldest),
                                     self._control_timeout_s).offset
        return None if found < 0 else found
