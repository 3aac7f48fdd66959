"""Fetches over a worker's TCP data port: one partition, one connection, one fetch ahead.

The broker serves a partition's fetches on the TCP data port of the worker that owns it
(``PartitionInfo.fetch_port``) and sends the record batches with ``sendfile`` straight from its
segment files.  A :class:`PartitionFetcher` keeps one TCP connection to that port for one
partition, with at most one request in flight on it: a FetchRequest, or a ListOffsetsRequest
(the data ports serve both, docs/PROTOCOL.md), so a partition's offsets are looked up where the
partition is stored, whichever broker the client was bootstrapped at.

Why a connection per partition: a data port answers each connection's requests in the order they
arrived, so a long poll parked on a caught-up partition would hold back the answers for every
other partition sharing its connection.

**Pipelining.**  The moment a response is whole, the fetcher sends the next FetchRequest (from the
offset after the response's last batch), and only then checks and decodes the response.  While
the application works through those records, the broker is already writing the next response
into this socket's kernel buffer.  The consumer reads a fetcher again only once the application
has taken its records, so a partition holds at most one decoded response and one on the wire.

**Version.**  Fetches go in FetchRequest version 0 (:data:`FETCH_VERSION`), the lowest that
carries what a consumer uses, and their answers are decoded in it: the fields later versions
add (``replica_id``, ``current_leader_epoch``, ``last_fetched_epoch``, ``durable_offset``; the
answer's diverging epoch and leader epoch) are a follower's, which a consumer never sends
(``replica_id`` -1 is version 0's meaning), so a client newer than a broker still reads from it.
Kafka's clients likewise send no field they do not use.

**Wire** (docs/PROTOCOL.md, "Two transports"), in each direction::

    head_length     u32
    payload_length  u32
    head            header + body; a FetchResponse's body is high_watermark i64,
                    log_start_offset i64, payload_length u32
    payload         whole record batches, the first one holding the offset asked for

**Receiving.**  ``recv_into`` a buffer kept for the connection's life, grown (never shrunk) for a
response larger than it: the broker always sends a first batch whole, even past ``max_bytes``.
With one response in flight the stream holds nothing beyond it, so no bytes carry over.

**Checking.**  ``scan_batches`` walks the payload (framing, CRC32C, consecutive offsets) and
gives the end of the valid prefix and the offset to fetch next; ``decode_records`` (compiled)
then builds the records of that prefix from the offset asked for on, tagged with topic and
partition, without checking the CRCs again.  A corrupt batch ends the response: the records before
it are returned, then a :class:`~hpbroker.errors.CorruptRecordError` naming topic, partition,
offset and byte position, and no next fetch is sent.  A batch whose CRC holds but whose records
do not decode ends it the same way; the next fetch, already sent past it, is dropped with the
connection.

**Columns.**  A fetcher made with ``columns=`` (names checked by
:func:`hpbroker.client.columns.check_columns`) decodes with the compiled columnar decoder instead
and returns the records as one :class:`~hpbroker.client.columns.RecordColumns` (no object per
record); errors end a response the same way.

**Raw batches.**  A fetcher made with ``raw=True`` skips the decoding: each response's checked
batches (the valid prefix, CRCs checked, the first batch possibly starting before the offset asked
for) come back as ``CompletedFetch.payload``, a view of the receive buffer that holds until the
next :meth:`PartitionFetcher.receive`, for readers that decode batches their own way (the Spark
data source's columnar decoder, ``hpbroker.spark``).

**Fetch tokens.**  A broker with ``security = "curve"`` serves its data ports only to
connections that authenticate first (docs/PROTOCOL.md, ``AuthenticateRequest``).  A fetcher made
with ``token=`` (``hpbroker.client.fetch_tokens``) sends an AuthenticateRequest right after each
connect and reads its answer before its first request.  A refused token (error 27: expired,
revoked key, another cluster's) is dropped and a fresh one asked for once, on a new connection
(the broker closes a refused one); refused again, the connect raises
:class:`~hpbroker.errors.AuthenticationError`, which is final.  A data port whose worker has not
yet received the broker's security state (it just started or was respawned) answers error 15
instead: the connect raises :class:`~hpbroker.errors.PartitionNotAvailableError`, retriable, as
does a connection the data port closes or drops before answering (ConnectionError, an OSError);
the fetcher is left disconnected with nothing in flight, and its owner backs off and sends the
request again (the consumer's ``retry_backoff_ms``), which connects anew.

A connection is made again, between requests, once two thirds of its token's lifetime have
passed, so it never outlives its token; a request answered with error 27 all the same (the
clocks disagree) raises AuthenticationError from :meth:`PartitionFetcher.receive` with the
connection dropped, and the next request connects with a fresh token.

Threads: a fetcher belongs to the thread of its consumer, and its calls block that thread only
while connecting: the TCP connect (up to ``connect_timeout_ms``) and, to a secured broker, the
AuthenticateRequest's round trip (up to ``request_timeout_ms``), before which ``token`` may itself
make a blocking FetchTokenRequest on the front-end (when no token is cached or it is due for
renewal).  So after a rebalance or a broker restart, N partitions that connect anew cost N such
round trips, one after the other; requests on a connected fetcher never block.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from hpbroker import protocol
from hpbroker.client.columns import RecordColumns, new_builder
from hpbroker.errors import (
    AuthenticationError,
    CorruptRecordError,
    DamagedRangeError,
    HPBrokerError,
    InvalidConfigError,
    InvalidRequestError,
    OffsetOutOfRangeError,
    PartitionNotAvailableError,
    error_for_code,
)
from hpbroker.records import Record, decode_records, read_header, scan_batches

__all__ = ["FETCH_VERSION", "CompletedFetch", "FetchConfig", "ListedOffset", "PartitionFetcher"]

# The TCP framing's prefix: head_length u32, payload_length u32.
_TCP_PREFIX = struct.Struct("<II")
# Room in the receive buffer beyond max_bytes for the prefix and the head.
_HEAD_ROOM_BYTES = 64 << 10
# The FetchRequest version a consumer sends (module docstring, "Version"): every broker serves it.
FETCH_VERSION = 0


@dataclass(frozen=True, slots=True)
class FetchConfig:
    """How a fetcher asks for records.  Validated on construction."""

    #: bytes of record batches one fetch asks for (a first batch larger than this still comes
    #: whole).  Default 1 MiB.
    max_partition_fetch_bytes: int = 1 << 20
    #: ms the broker may hold a fetch while less than ``fetch_min_bytes`` is new (long poll).
    #: Default 500.
    fetch_max_wait_ms: int = 500
    #: bytes of new records that make the broker answer a long poll at once.  Default 1.
    fetch_min_bytes: int = 1
    #: ms a TCP connect to a data port may take.  Default 5000.
    connect_timeout_ms: int = 5000
    #: ms past ``fetch_max_wait_ms`` a fetch may go unanswered before its connection is dropped
    #: and the fetch sent again.  Default 30000.
    request_timeout_ms: int = 30_000
    #: SO_RCVBUF of data connections, 0 for the kernel's autotuning.  Default 0.
    receive_buffer_bytes: int = 0

    def __post_init__(self) -> None:
        for name, low, high in (("max_partition_fetch_bytes", 1, protocol.MAX_MESSAGE_BYTES - 4096),
                                ("fetch_max_wait_ms", 0, 2**32 - 1), ("fetch_min_bytes", 0, 2**32 - 1),
                                ("connect_timeout_ms", 1, 2**31 - 1), ("request_timeout_ms", 1, 2**31 - 1),
                                ("receive_buffer_bytes", 0, 2**31 - 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise InvalidConfigError(f"{name} must be an integer in [{low}, {high}], got {value!r}")


@dataclass(slots=True)
class CompletedFetch:
    """One answered fetch: ``records`` from ``fetch_offset`` on (possibly none), then ``error``
    when the response ended early (a corrupt batch) or was an error response.  A columnar
    fetcher's ``records`` are one RecordColumns; a raw fetcher's stay empty and ``payload`` holds
    the checked batches instead."""

    fetch_offset: int
    records: list[Record] | RecordColumns
    next_offset: int  # where the next fetch starts: after the last valid batch
    high_watermark: int
    log_start_offset: int
    error: HPBrokerError | None = None
    payload: memoryview | bytes = b""


@dataclass(frozen=True, slots=True)
class ListedOffset:
    """One answered ListOffsetsRequest: the ``offset`` for ``timestamp`` (-1 when no record is
    that recent), or the broker's ``error``."""

    timestamp: int
    offset: int
    error: HPBrokerError | None = None


class PartitionFetcher:
    """Fetches one partition over one TCP connection to the data port ``host:port``."""

    def __init__(self, topic: str, partition: int, host: str, port: int, config: FetchConfig,
                 client_id: str = "hpbroker-python", *, raw: bool = False,
                 columns: tuple[str, ...] | None = None,
                 token: Callable[[bool], str | None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``token(fresh)``: the fetch token to authenticate each connection with (module
        docstring, "Fetch tokens"; ``fresh``: the last one was refused); None, or a token of
        None: the data port needs none.  ``clock``: monotonic seconds, when a connection is due
        to be made again with a newer token (``time.monotonic``; tests pass their own)."""
        self.topic = topic
        self.partition = partition
        self.host = host
        self.port = port
        self._config = config
        self._client_id = client_id
        self._raw = raw  # hand out the checked batches undecoded (module docstring, "Raw batches")
        self._builder = None if columns is None else new_builder(columns)  # module docstring, "Columns"
        self._sock: socket.socket | None = None
        self._buffer = bytearray(_HEAD_ROOM_BYTES)  # grown for a whole fetch by the first one
        self._view = memoryview(self._buffer)
        self._filled = 0  # bytes of the response in flight received so far
        self._total = -1  # its size with the prefix, once the prefix is in
        self._fetch_offset = -1  # the offset the fetch in flight asked for; -1 when none
        self._listing: int | None = None  # the timestamp the ListOffsetsRequest in flight asked for
        self._sent_at = 0.0
        self._limit_s = 0.0  # how long the request in flight may go unanswered
        self._correlation_ids = itertools.count(1)
        self._token = token
        self._clock = clock
        self._renew_at = float("inf")  # when to connect again with a newer token (on self._clock)

    def __repr__(self) -> str:
        return f"PartitionFetcher({self.topic}-{self.partition} via {self.host}:{self.port})"

    @property
    def in_flight(self) -> bool:
        return self._fetch_offset >= 0 or self._listing is not None

    def waiting_for(self) -> str:
        """The request in flight, in words (for error messages)."""
        where = f"{self.topic}-{self.partition}"
        if self._listing is not None:
            return f"a ListOffsets of {where} for timestamp {self._listing}"
        return f"a fetch of {where} from offset {self._fetch_offset}"

    @property
    def fetch_offset(self) -> int:
        """The offset the fetch in flight asked for, -1 when none is."""
        return self._fetch_offset

    def fileno(self) -> int:
        """The data connection's descriptor (for a poller): readable when the response arrives."""
        assert self._sock is not None, "no connection"
        return self._sock.fileno()

    def overdue(self, now: float) -> bool:
        """Whether the request in flight has gone unanswered for longer than
        ``request_timeout_ms`` (plus, for a fetch, the ``fetch_max_wait_ms`` the broker may hold it)."""
        return self.in_flight and now - self._sent_at > self._limit_s

    def deadline(self) -> float:
        """When the request in flight becomes :meth:`overdue` (monotonic seconds)."""
        return self._sent_at + self._limit_s

    def fetch(self, offset: int) -> None:
        """Send a FetchRequest from ``offset``, connecting first if needed.  Raises OSError when
        the data port cannot be reached or the connection breaks (nothing is then in flight)."""
        config = self._config
        request = protocol.FetchRequest(self.topic, self.partition, offset, config.max_partition_fetch_bytes,
                                        config.fetch_max_wait_ms, config.fetch_min_bytes)
        if len(self._buffer) < config.max_partition_fetch_bytes + _HEAD_ROOM_BYTES:
            self._grow(config.max_partition_fetch_bytes)
        self._send(request, (config.fetch_max_wait_ms + config.request_timeout_ms) / 1000, FETCH_VERSION)
        self._fetch_offset = offset

    def list_offsets(self, timestamp: int) -> None:
        """Send a ListOffsetsRequest for ``timestamp`` (ms, or ``protocol.EARLIEST_TIMESTAMP`` /
        ``LATEST_TIMESTAMP``), connecting first if needed; :meth:`receive` gives the
        :class:`ListedOffset`.  Raises OSError like :meth:`fetch`."""
        request = protocol.ListOffsetsRequest(self.topic, self.partition, timestamp)
        self._send(request, self._config.request_timeout_ms / 1000)
        self._listing = timestamp

    def _send(self, request: protocol.Message, limit_s: float, version: int | None = None) -> None:
        """Send ``request`` in ``version`` (None: the newest its type has); its answer is
        decoded in the same version."""
        if self.in_flight:
            raise RuntimeError(f"{self!r}: {self.waiting_for()} is already in flight")
        frames = protocol.frame_tcp(protocol.encode_request(request, next(self._correlation_ids) & 0xFFFFFFFF,
                                                            self._client_id, version))
        try:
            if self._sock is not None and self._clock() >= self._renew_at:
                self.disconnect()  # nothing in flight: connect again with a newer token
            if self._sock is None:
                self._connect()
            assert self._sock is not None
            self._sock.sendall(b"".join(frames))
        except OSError:
            self.disconnect()
            raise
        self._sent_at = time.monotonic()
        self._limit_s = limit_s
        self._filled = 0
        self._total = -1

    def _connect(self) -> None:
        for fresh in (False, True):
            timeout_s = self._config.connect_timeout_ms / 1000
            sock = socket.create_connection((self.host, self.port), timeout=timeout_s)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self._config.receive_buffer_bytes:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._config.receive_buffer_bytes)
                if self._token is not None and not self._authenticate(sock, fresh):
                    sock.close()
                    continue  # refused: once more with a fresh token
            except BaseException:
                sock.close()
                raise
            # Blocking mode: sends (a request is a few dozen bytes) go out whole; receives pass
            # MSG_DONTWAIT, so each one takes what has arrived and never waits.
            sock.settimeout(None)
            self._sock = sock
            return

    def _authenticate(self, sock: socket.socket, fresh: bool) -> bool:
        """Present a token on the new connection ``sock`` and read the answer (module docstring,
        "Fetch tokens"): True when accepted or none is needed, False when refused and
        ``fresh`` is not yet tried; AuthenticationError when a fresh one is refused too."""
        assert self._token is not None
        token = self._token(fresh)
        if token is None:
            self._renew_at = float("inf")
            return True
        request = protocol.encode_request(protocol.AuthenticateRequest(token),
                                          next(self._correlation_ids) & 0xFFFFFFFF, self._client_id)
        sock.settimeout(self._config.request_timeout_ms / 1000)
        sock.sendall(b"".join(protocol.frame_tcp(request)))
        head_length, payload_length = _TCP_PREFIX.unpack(_recv_exactly(sock, _TCP_PREFIX.size))
        if head_length == 0 or head_length + payload_length > protocol.DATA_PORT_MAX_REQUEST_BYTES:
            raise InvalidRequestError(f"{self.host}:{self.port} answered an AuthenticateRequest with a "
                                      f"message of {head_length} + {payload_length} bytes")
        frames = [_recv_exactly(sock, head_length)]
        if payload_length:
            frames.append(_recv_exactly(sock, payload_length))
        header, response = protocol.decode_response(protocol.ApiKey.AUTHENTICATE, frames)
        if header.error_code == 0:
            assert isinstance(response, protocol.AuthenticateResponse)
            left_s = max(0.0, response.expires_at_ms / 1000 - time.time()) if response.expires_at_ms >= 0 \
                else float("inf")
            self._renew_at = self._clock() + left_s * 2 / 3
            return True
        if header.error_code == AuthenticationError.code and not fresh:
            return False
        if header.error_code == PartitionNotAvailableError.code:  # its worker just started: retriable
            raise PartitionNotAvailableError(f"data port {self.host}:{self.port} serving {self.topic}-"
                                             f"{self.partition} is not ready: {header.error_message}")
        raise error_for_code(header.error_code, f"data port {self.host}:{self.port} refused the fetch token "
                                                f"for {self.topic}-{self.partition}: {header.error_message}")

    def receive(self) -> CompletedFetch | ListedOffset | None:
        """Take what has arrived of the response in flight: None until it is whole.  For a fetch,
        then send the next fetch (unless the response ended in an error) and return the decoded
        response; for a ListOffsetsRequest, return its :class:`ListedOffset`.

        Raises ConnectionError when the broker closed the connection, OSError when it broke, and
        InvalidRequestError when the stream makes no sense; the fetcher is then disconnected with
        nothing in flight, and the same request may be sent again."""
        if not self.in_flight:
            return None
        timestamp = self._listing
        try:
            if not self._read():
                return None
            header, response = self._decode_head(protocol.ApiKey.FETCH if timestamp is None
                                                 else protocol.ApiKey.LIST_OFFSETS,
                                                 FETCH_VERSION if timestamp is None else None)
        except (OSError, HPBrokerError):
            self.disconnect()
            raise
        if timestamp is not None:
            assert isinstance(response, protocol.ListOffsetsResponse)
            self._listing = None
            return self._listed(timestamp, header, response)
        assert isinstance(response, protocol.FetchResponse)
        fetch_offset = self._fetch_offset
        self._fetch_offset = -1
        if header.error_code == AuthenticationError.code:  # the token ran out here: connect again
            self.disconnect()
            raise AuthenticationError(f"fetch of {self.topic}-{self.partition} from offset {fetch_offset} at "
                                      f"{self.host}:{self.port}: {header.error_message}")
        if header.error_code:
            error = self._broker_error(header, response, fetch_offset)
            return CompletedFetch(fetch_offset, [], fetch_offset, response.high_watermark,
                                  response.log_start_offset, error)
        return self._complete(fetch_offset, response)

    def _listed(self, timestamp: int, header: protocol.ResponseHeader,
                response: protocol.ListOffsetsResponse) -> ListedOffset:
        if header.error_code:
            where = f"ListOffsets of {self.topic}-{self.partition} for timestamp {timestamp}"
            return ListedOffset(timestamp, -1, error_for_code(
                header.error_code, f"{where} at {self.host}:{self.port}: {header.error_message}"))
        return ListedOffset(timestamp, response.offset)

    def _read(self) -> bool:
        """recv_into the buffer until the response is whole (True) or nothing more has arrived."""
        while True:
            if self._total < 0 and self._filled >= _TCP_PREFIX.size:
                head_length, payload_length = _TCP_PREFIX.unpack_from(self._buffer, 0)
                if head_length == 0 or head_length + payload_length > protocol.MAX_MESSAGE_BYTES:
                    raise InvalidRequestError(
                        f"{self.host}:{self.port} sent a message of {head_length} + {payload_length} bytes "
                        f"for {self.topic}-{self.partition}: the head must be non-empty and the whole at "
                        f"most {protocol.MAX_MESSAGE_BYTES} bytes")
                self._total = _TCP_PREFIX.size + head_length + payload_length
                if self._total > len(self._buffer):
                    self._grow(self._total)
            if self._filled == self._total:
                return True
            # One response in flight: the stream holds nothing past it, so reading up to the end
            # of the buffer before its size is known cannot take bytes of another.
            end = self._total if self._total >= 0 else len(self._buffer)
            try:
                received = self._sock.recv_into(self._view[self._filled:end], 0, socket.MSG_DONTWAIT)  # type: ignore[union-attr]
            except BlockingIOError:
                return False
            if received == 0:
                raise ConnectionError(f"{self.host}:{self.port} closed the connection with "
                                      f"{self.waiting_for()} unanswered ({self._filled} bytes of its "
                                      f"response received)")
            self._filled += received

    def _grow(self, size: int) -> None:
        """A larger buffer for a response of ``size`` bytes (views of the old one may live on)."""
        bigger = bytearray(size + _HEAD_ROOM_BYTES)
        bigger[: self._filled] = self._view[: self._filled]
        self._buffer = bigger
        self._view = memoryview(bigger)

    def _decode_head(self, api_key: int,
                     version: int | None) -> tuple[protocol.ResponseHeader, protocol.Message]:
        head_length = _TCP_PREFIX.unpack_from(self._buffer, 0)[0]
        head_end = _TCP_PREFIX.size + head_length
        frames = [self._view[_TCP_PREFIX.size:head_end]]
        if self._total > head_end:
            frames.append(self._view[head_end:self._total])
        return protocol.decode_response(api_key, frames, version)

    def _complete(self, fetch_offset: int, response: protocol.FetchResponse) -> CompletedFetch:
        """Check the payload, send the next fetch, then decode (see the module docstring)."""
        payload = response.payload
        valid_bytes, next_offset, error = self._check(payload, fetch_offset)
        if error is None:
            # Pipelining: the broker works on the next one while this one is decoded.  If the
            # connection broke meanwhile, the fetcher is left disconnected with nothing in flight
            # and these records are still returned: the next fetch reconnects.
            with contextlib.suppress(OSError):
                self.fetch(next_offset)
        if self._raw:
            return CompletedFetch(fetch_offset, [], next_offset, response.high_watermark,
                                  response.log_start_offset, error, payload[:valid_bytes])
        if self._builder is not None:
            columns, next_offset, error = self._decode_columns(payload[:valid_bytes], fetch_offset,
                                                               next_offset, error)
            return CompletedFetch(fetch_offset, columns, next_offset, response.high_watermark,
                                  response.log_start_offset, error)
        try:
            records = decode_records(payload[:valid_bytes], verify_crc=False, topic=self.topic,
                                     partition=self.partition, min_offset=fetch_offset) if valid_bytes else []
        except (CorruptRecordError, ValueError):
            self.disconnect()  # the next fetch, sent past the batch that does not decode, is dropped
            records, next_offset, error = self._decode_until_corrupt(payload[:valid_bytes], fetch_offset)
        return CompletedFetch(fetch_offset, records, next_offset, response.high_watermark,
                              response.log_start_offset, error)

    def _decode_until_corrupt(self, payload: memoryview,
                              fetch_offset: int) -> tuple[list[Record], int, CorruptRecordError]:
        """A payload that passed its CRCs but does not decode: the records of the batches before
        the one that fails, the offset where it starts, and the error naming it."""
        scan = scan_batches(payload)
        records: list[Record] = []
        for position, size, base_offset in zip(scan.positions, scan.sizes, scan.base_offsets, strict=True):
            try:
                records += decode_records(payload[position:position + size], verify_crc=False,
                                          topic=self.topic, partition=self.partition, min_offset=fetch_offset)
            except (CorruptRecordError, ValueError) as e:
                offset = max(base_offset, fetch_offset)
                return records, offset, self._corrupt(offset, position, str(e))
        offset = max(scan.next_offset, fetch_offset)  # (each batch decodes alone: not seen happen)
        return records, offset, self._corrupt(offset, scan.valid_bytes, "the records do not decode")

    def _decode_columns(self, payload: memoryview, fetch_offset: int, next_offset: int,
                        error: CorruptRecordError | None
                        ) -> tuple[RecordColumns, int, CorruptRecordError | None]:
        """The checked prefix's records from ``fetch_offset`` on as columns, the offset to fetch
        next and the error that ends them (the check's, or a batch that does not decode)."""
        builder = self._builder
        assert builder is not None
        try:
            end = builder.add(payload, 0, fetch_offset, verify_crc=False)
        except CorruptRecordError:
            self.disconnect()  # the next fetch, sent past the batch that does not decode, is dropped
            builder.take()  # the batches before it are decoded again, one by one
            return self._columns_until_corrupt(payload, fetch_offset)
        if end < len(payload):  # the decoder's bound (lz4 inflating a whole response past 1 GiB)
            self.disconnect()  # the fetch sent from the end of the response is dropped
            next_offset, error = builder.next_offset, None
        return RecordColumns(self.topic, self.partition, builder.take()), next_offset, error

    def _columns_until_corrupt(self, payload: memoryview,
                               fetch_offset: int) -> tuple[RecordColumns, int, CorruptRecordError]:
        """:meth:`_decode_until_corrupt` for columns."""
        builder = self._builder
        assert builder is not None
        scan = scan_batches(payload)
        offset, position = max(scan.next_offset, fetch_offset), scan.valid_bytes
        why = "the records do not decode"
        for start, size, base_offset in zip(scan.positions, scan.sizes, scan.base_offsets, strict=True):
            try:  # (never stopped by the decoder's bound: the first pass reached the bad batch)
                builder.add(payload[start:start + size], 0, fetch_offset, verify_crc=False)
            except CorruptRecordError as e:
                offset, position, why = max(base_offset, fetch_offset), start, str(e)
                break
        columns = RecordColumns(self.topic, self.partition, builder.take())
        return columns, offset, self._corrupt(offset, position, why)

    def _check(self, payload: memoryview, fetch_offset: int) -> tuple[int, int, CorruptRecordError | None]:
        """The payload's valid prefix in bytes, the offset after it, and the error that ends it."""
        if not len(payload):
            return 0, fetch_offset, None
        try:
            first = read_header(payload)
        except CorruptRecordError as e:
            return 0, fetch_offset, self._corrupt(fetch_offset, 0, str(e))
        if not first.base_offset <= fetch_offset <= first.last_offset:
            return 0, fetch_offset, self._corrupt(
                fetch_offset, 0, f"its first batch holds offsets {first.base_offset}..{first.last_offset}, "
                                 f"not the offset asked for")
        scan = scan_batches(payload, expected_offset=first.base_offset)
        next_offset = scan.next_offset if scan.batch_count else fetch_offset
        if scan.error is None:
            return scan.valid_bytes, next_offset, None
        return scan.valid_bytes, next_offset, self._corrupt(next_offset, scan.valid_bytes, scan.error)

    def _corrupt(self, offset: int, position: int, why: str) -> CorruptRecordError:
        error = CorruptRecordError(
            f"corrupt record batch in {self.topic}-{self.partition} at offset {offset} (byte {position} of a "
            f"fetch response from {self.host}:{self.port}): {why}")
        error.topic, error.partition, error.offset = self.topic, self.partition, offset  # type: ignore[attr-defined]
        return error

    def _broker_error(self, header: protocol.ResponseHeader, response: protocol.FetchResponse,
                      fetch_offset: int) -> HPBrokerError:
        where = f"fetch of {self.topic}-{self.partition} from offset {fetch_offset}"
        if header.error_code == OffsetOutOfRangeError.code:
            return OffsetOutOfRangeError(
                f"{where}: offset out of range; the log holds offsets {response.log_start_offset} up to "
                f"{response.high_watermark} (exclusive) ({header.error_message})",
                response.log_start_offset, response.high_watermark)
        if header.error_code == DamagedRangeError.code:
            payload = response.payload
            next_offset = (protocol.DAMAGED_RANGE_PAYLOAD.unpack_from(payload)[0]
                           if len(payload) == protocol.DAMAGED_RANGE_PAYLOAD.size else -1)
            error = DamagedRangeError(f"{where}: {header.error_message}", fetch_offset, next_offset)
        else:
            error = error_for_code(header.error_code, f"{where}: {header.error_message}")
        if isinstance(error, CorruptRecordError):
            error.topic, error.partition, error.offset = self.topic, self.partition, fetch_offset  # type: ignore[attr-defined]
        return error

    def disconnect(self) -> None:
        """Close the connection; a fetch in flight is forgotten (its response never read)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._fetch_offset = -1
        self._listing = None
        self._filled = 0
        self._total = -1

    close = disconnect


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    """``size`` bytes from the blocking ``sock``; ConnectionError when it closes first."""
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError(f"the data port closed the connection {size - len(data)} bytes before "
                                  f"the end of its answer to an AuthenticateRequest")
        data += chunk
    return bytes(data)
