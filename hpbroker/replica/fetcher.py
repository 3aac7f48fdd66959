"""A follower's fetch connection to one data port of its leader, on the worker's event loop.

One :class:`ReplicaFetcher` per leader data port (a leader serves each partition on the data port
of the worker that owns it, ``PartitionMetadata.fetch_port``).  It sends replica fetches
(FetchRequest version 1 with ``replica_id``, ``current_leader_epoch`` and
``last_fetched_epoch``) and hands each answer to its owner; what to do with the records
(append them as they are, truncate on a divergence, fetch again once flushed) is the owner's.

**Wire** (docs/PROTOCOL.md, "Two transports"): each message is ``head_length`` u32,
``payload_length`` u32, the head (header + body), the payload.  Requests are framed with
:func:`~hpbroker.protocol.frame_tcp`, the stream of responses split with
:class:`~hpbroker.protocol.TcpFrameDecoder` and parsed with
:func:`~hpbroker.protocol.decode_response`.  The data port answers a connection's requests in
the order they arrived, so responses are matched to the fetches in the order sent (and the
correlation id checked): a response out of order means the stream cannot be trusted.

**One fetch in flight per partition**; several partitions share the connection.  Beware: a
fetch the leader parks (long poll at its log end) holds back the answers to every fetch sent
after it on the same connection, so a partition that is caught up delays the others by up to its
``max_wait_ms``; an owner that needs partitions independent uses one fetcher per partition.

**Never blocks.**  The socket is non-blocking from its ``connect`` on.  A numeric host is used as
it is; a name is resolved (``getaddrinfo``) on a short-lived thread of its own, and the connect
waits for the answer (:data:`RESOLVE_POLL_S` between looks), so a slow or failing resolver holds
up this leader's fetches only, never the loop; a failed lookup counts as a failed connect.  The owner polls
:meth:`ReplicaFetcher.fileno` for :meth:`ReplicaFetcher.events` and calls
:meth:`ReplicaFetcher.process` when they fire, and at :meth:`ReplicaFetcher.next_deadline` (a
reconnect due, a fetch overdue).  ``process`` reads what has arrived (at most
:data:`READ_BYTES_PER_PROCESS` per call, so one busy leader cannot starve the loop; the poll is
level-triggered), sends what the socket takes, and calls back.

**Connection loss.**  When the connection breaks, cannot be made, stays silent past a fetch's
``max_wait_ms`` plus ``request_timeout_ms``, or sends something that does not parse, every fetch
sent or queued on it is *lost*: ``on_lost(topic, partition)`` is called for each (nothing of it
was delivered) and the owner sends it again (its fetch offset is still its flushed end).  The
next connect waits a backoff: 100 ms after the first failure, doubling to 2 s, back to none
once a response arrives.  A connection closed by the leader with nothing in flight (its idle
timeout) is no failure: the next fetch connects at once.

**Bounded buffers.**  Output: one request per partition in flight, each a few dozen bytes.
Input: the decoder holds at most one message being received, refused beyond
:data:`~hpbroker.protocol.MAX_MESSAGE_BYTES` (the connection is then dropped).

**Fetch tokens.**  Made with ``token`` (a broker whose data ports need one, docs/SECURITY.md), the
fetcher sends an AuthenticateRequest with a freshly minted token first on every new connection,
ahead of the fetches queued for it, and again before a fetch once two thirds of the token's
lifetime have passed, so a long-lived connection never outlives its token.  Responses come in
request order, so each AuthenticateResponse is read in its place among the fetch responses; a
refusal (error 27) counts as a connection failure: every fetch on it is lost, and the next
connect, after the backoff, presents a new token.  So does error 15, the leader's worker not
ready yet (it has not received its broker's security state): logged as such, and retried the
same way.  Followers authenticate with ``data_port_auth = "loopback"`` too: replica fetches
always need a token.

**Callbacks** run inside :meth:`~ReplicaFetcher.process`, after the fetcher's state is settled,
so they may call :meth:`~ReplicaFetcher.fetch` again: ``on_response(topic, partition, header,
response)`` for each answer (``header.error_code`` set for an error answer; ``response.payload``
the leader's record batches, bytes the owner may keep), responses first, then ``on_lost``.

Single owner: the worker's event loop.  ``now`` is ``time.monotonic()`` seconds.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpbroker import protocol
from hpbroker.errors import (
    AuthenticationError,
    HPBrokerError,
    InvalidRequestError,
    PartitionNotAvailableError,
)

__all__ = ["BACKOFF_INITIAL_S", "BACKOFF_MAX_S", "READ_BYTES_PER_PROCESS", "RESOLVE_POLL_S", "ReplicaFetcher"]

logger = logging.getLogger(__name__)

BACKOFF_INITIAL_S = 0.1  # wait before the first reconnect after a failure
BACKOFF_MAX_S = 2.0  # the backoff doubles up to this
READ_BYTES_PER_PROCESS = 4 << 20  # at most this much is read in one process() call
RESOLVE_POLL_S = 0.05  # while a host name is looked up, process() looks for the answer this often
_RECV_BYTES = 256 << 10
_CONNECTING = (errno.EINPROGRESS, errno.EALREADY, errno.EWOULDBLOCK)

ResponseCallback = Callable[[str, int, protocol.ResponseHeader, protocol.FetchResponse], None]
LostCallback = Callable[[str, int], None]


@dataclass(slots=True)
class _Fetch:
    """A fetch sent (or queued to be sent) on the connection, awaiting its response."""

    topic: str
    partition: int
    offset: int
    correlation_id: int
    limit_s: float  # how long it may go unanswered once sent: max_wait_ms + request_timeout_ms
    version: int  # the FetchRequest version sent, which its response comes in
    sent_at: float = -1.0  # when its request was queued on a live connection; -1 while waiting for one


@dataclass(slots=True)
class _Authenticate:
    """An AuthenticateRequest sent on the connection, awaiting its response."""

    correlation_id: int


class ReplicaFetcher:
    """Replica fetches from the leader data port ``host:port`` for follower broker ``broker_id``
    (module docstring).  Nothing is connected until the first :meth:`fetch`.

    ``on_response`` and ``on_lost``: the callbacks (module docstring; without ``on_lost`` a lost
    fetch is only logged, and the owner must notice it by :meth:`in_flight`).
    ``request_timeout_ms``: how long a connect, or a fetch beyond its ``max_wait_ms``, may go
    unanswered before the connection is given up.  ``broker_id`` -1 sends consumer fetches
    (records below the high watermark only), for tools and tests.  ``token``: mints ``(token,
    expires_at_ms)`` for this broker's principal (None: the leader's data ports need no token;
    the callable's None: no token yet, the connection goes without and the leader refuses it)."""

    def __init__(self, broker_id: int, host: str, port: int, *, on_response: ResponseCallback, now: float,
                 on_lost: LostCallback | None = None, request_timeout_ms: int = 30_000,
                 token: Callable[[], tuple[str, int] | None] | None = None) -> None:
        self.broker_id = broker_id
        self.host = host
        self.port = port
        self._on_response = on_response
        self._on_lost = on_lost
        self._request_timeout_s = request_timeout_ms / 1000
        self._client_id = f"hpbroker-replica-{broker_id}"
        self._correlation_ids = itertools.count(1)
        self._sock: socket.socket | None = None
        self._connecting = False  # a non-blocking connect under way
        self._connect_started = now
        self._poller: select.poll | None = None  # sees the connect complete
        self._decoder = protocol.TcpFrameDecoder(protocol.MAX_MESSAGE_BYTES)
        self._out = bytearray()  # requests not yet taken by the socket
        # correlation id -> request of a fetch made while there was no connection (sent on connect)
        self._pending: dict[int, list[bytes | memoryview]] = {}
        self._fetches: deque[_Fetch] = deque()  # in the order sent: the order of the answers
        # on the connection, the fetches and authentications awaiting answers, in the order sent
        self._answers: deque[_Fetch | _Authenticate] = deque()
        self._token = token
        self._renew_at = 0.0  # when the connection's token is due for renewal (monotonic)
        self._partitions: set[tuple[str, int]] = set()
        self._failures = 0  # connection failures since the last response (the backoff's exponent)
        self._retry_at = now  # no connect before this
        self._lost: list[_Fetch] = []  # to report in the next process()
        self._closed = False
        # getaddrinfo's first answer for a name, once its lookup thread has put it (or its error) in
        self._lookup: list[Any] = []
        self._looking_up = False

    def __repr__(self) -> str:
        return f"ReplicaFetcher(broker {self.broker_id} <- {self.host}:{self.port})"

    # --- what the owner polls ---------------------------------------------------------------------

    def fileno(self) -> int:
        """The connection's descriptor, -1 when there is none (waiting to connect: call
        :meth:`process` at :meth:`next_deadline`).  It changes with every reconnect."""
        return self._sock.fileno() if self._sock is not None else -1

    @property
    def wants_write(self) -> bool:
        """Whether the fetcher waits for the socket to become writable (connecting, or requests
        the socket has not taken yet)."""
        return self._sock is not None and (self._connecting or bool(self._out))

    def events(self) -> int:
        """``select.POLLIN``, plus ``select.POLLOUT`` when :attr:`wants_write` (0 without a
        connection).  A ``zmq.Poller`` spells POLLOUT differently (``zmq.POLLOUT``):
        translate, or use :attr:`wants_write`."""
        if self._sock is None:
            return 0
        return select.POLLIN | (select.POLLOUT if self.wants_write else 0)

    def next_deadline(self) -> float | None:
        """When :meth:`process` must run even if no event fires (``time.monotonic()`` seconds):
        a connect due, a connect or fetch overdue, lost fetches to report; None when nothing is
        timed."""
        if self._closed:
            return None
        if self._lost:
            return 0.0  # at once: lost fetches to report
        if self._sock is None:
            return self._retry_at if self._fetches else None
        if self._connecting:
            return self._connect_started + self._request_timeout_s
        sent = [fetch.sent_at + fetch.limit_s for fetch in self._fetches if fetch.sent_at >= 0]
        return min(sent) if sent else None

    @property
    def connected(self) -> bool:
        return self._sock is not None and not self._connecting

    def in_flight(self, topic: str, partition: int) -> bool:
        """Whether a fetch of ``topic``-``partition`` awaits its response."""
        return (topic, partition) in self._partitions

    @property
    def in_flight_count(self) -> int:
        return len(self._fetches)

    # --- fetching ---------------------------------------------------------------------------------

    def fetch(self, topic: str, partition: int, offset: int, *, leader_epoch: int, last_fetched_epoch: int,
              max_bytes: int, max_wait_ms: int, min_bytes: int = 1,
              durable_offset: int | None = None) -> None:
        """Send a replica fetch of ``topic``-``partition`` from ``offset`` (the follower's log
        end) in ``leader_epoch`` (the epoch the follower believes current), its log's last batch
        being of ``last_fetched_epoch`` (-1: none).  ``durable_offset``: the follower's flushed
        end when it is below ``offset`` (its last records are being flushed), sent in
        FetchRequest version 2; None (or ``offset``): ``offset`` is the flushed end, and the
        fetch goes in version 1, which every leader serves.  Queued and sent without waiting; connects
        first if needed (a non-blocking connect; during a backoff, :meth:`process` connects once
        it is over).  RuntimeError when that partition already has a
        fetch in flight, or the fetcher is closed; InvalidRequestError for a field out of range."""
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        key = (topic, partition)
        if key in self._partitions:
            raise RuntimeError(f"{self!r}: a fetch of {topic}-{partition} is already in flight")
        pipelined = durable_offset is not None and durable_offset != offset
        request = protocol.FetchRequest(topic, partition, offset, max_bytes, max_wait_ms, min_bytes,
                                        replica_id=self.broker_id, current_leader_epoch=leader_epoch,
                                        last_fetched_epoch=last_fetched_epoch,
                                        durable_offset=durable_offset if pipelined else -1)
        version = 2 if pipelined else 1
        correlation_id = next(self._correlation_ids) & 0xFFFFFFFF
        frames = protocol.frame_tcp(protocol.encode_request(request, correlation_id, self._client_id,
                                                            version=version))
        fetch = _Fetch(topic, partition, offset, correlation_id, max_wait_ms / 1000 + self._request_timeout_s,
                       version)
        self._fetches.append(fetch)
        self._partitions.add(key)
        if self._sock is not None:
            if self._token is not None and time.monotonic() >= self._renew_at:
                self._authenticate(time.monotonic())
            self._answers.append(fetch)
            self._queue(fetch, frames)
            if not self._connecting:
                self._send()
        else:
            self._pending[correlation_id] = frames
            now = time.monotonic()
            if now >= self._retry_at:
                self._connect(now)

    def _queue(self, fetch: _Fetch, frames: list[bytes | memoryview]) -> None:
        for frame in frames:
            self._out += frame
        fetch.sent_at = self._connect_started if self._connecting else time.monotonic()

    # --- the loop ---------------------------------------------------------------------------------

    def process(self, events: int, now: float) -> None:
        """Do what can be done now without blocking (module docstring): connect, send, read,
        time out, then call back.  ``events`` (what the poll reported) is a hint only: reads
        and writes are tried whatever it says."""
        if self._closed:
            return
        responses: list[tuple[_Fetch, protocol.ResponseHeader, protocol.FetchResponse]] = []
        if self._sock is None and self._fetches and now >= self._retry_at:
            self._connect(now)
        if self._sock is not None and self._connecting:
            self._finish_connect(now)
        if self._sock is not None and not self._connecting:
            self._send()
            if self._sock is not None:
                self._receive(responses, now)
            if self._sock is not None:
                self._check_overdue(now)
        self._call_back(responses)

    def _resolved(self, now: float) -> tuple[Any, ...] | None:
        """The host's address, or None while its lookup runs (then ``process`` looks again after
        :data:`RESOLVE_POLL_S`).  Raises OSError when the lookup failed."""
        try:
            return socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM,
                                      flags=socket.AI_NUMERICHOST)[0]
        except socket.gaierror:
            pass  # a name: looked up off the loop
        if self._lookup:
            found, self._lookup = self._lookup[0], []
            self._looking_up = False
            if isinstance(found, BaseException):
                raise found
            return found
        if not self._looking_up:
            self._looking_up = True
            host, port, answer = self.host, self.port, self._lookup

            def look_up() -> None:
                try:
                    answer.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0])
                except OSError as e:
                    answer.append(e)

            threading.Thread(target=look_up, name="hpbroker-resolve", daemon=True).start()
        self._retry_at = now + RESOLVE_POLL_S
        return None

    def _connect(self, now: float) -> None:
        self._connect_started = now
        self._decoder = protocol.TcpFrameDecoder(protocol.MAX_MESSAGE_BYTES)
        sock = None
        try:
            resolved = self._resolved(now)
            if resolved is None:
                return
            family, kind, proto, _name, address = resolved
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            code = sock.connect_ex(address)
        except OSError as e:
            if sock is not None:
                sock.close()
            self._failed(f"cannot connect: {e}", now)
            return
        if code not in (0, *_CONNECTING):
            sock.close()
            self._failed(f"cannot connect: {errno.errorcode.get(code, code)} ({code})", now)
            return
        self._sock = sock
        self._connecting = code != 0
        if self._connecting:
            self._poller = select.poll()
            self._poller.register(sock.fileno(), select.POLLOUT)
        self._authenticate(now)
        for fetch in self._fetches:
            self._answers.append(fetch)
            self._queue(fetch, self._pending.pop(fetch.correlation_id))
        if not self._connecting:
            self._connected()

    def _authenticate(self, now: float) -> None:
        """Queue an AuthenticateRequest with a new token (module docstring, "Fetch tokens")."""
        if self._token is None:
            return
        minted = self._token()
        if minted is None:
            logger.warning("%r: no fetch token to present yet (the broker's security state has not "
                           "arrived); the leader will refuse the connection", self)
            self._renew_at = now + BACKOFF_MAX_S  # asked again at the next connect, or after this
            return
        token, expires_at_ms = minted
        correlation_id = next(self._correlation_ids) & 0xFFFFFFFF
        for frame in protocol.frame_tcp(protocol.encode_request(protocol.AuthenticateRequest(token),
                                                                correlation_id, self._client_id)):
            self._out += frame
        self._answers.append(_Authenticate(correlation_id))
        left_s = max(0.0, expires_at_ms / 1000 - time.time())
        self._renew_at = now + left_s * 2 / 3

    def _finish_connect(self, now: float) -> None:
        assert self._sock is not None and self._poller is not None
        if not self._poller.poll(0):
            if now - self._connect_started > self._request_timeout_s:
                self._failed(f"connect not done after {self._request_timeout_s:.1f} s", now)
            return
        code = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            self._failed(f"cannot connect: {errno.errorcode.get(code, code)} ({code})", now)
            return
        self._connecting = False
        self._poller = None
        for fetch in self._fetches:
            fetch.sent_at = now
        self._connected()

    def _connected(self) -> None:
        logger.debug("%r: connected", self)

    def _send(self) -> None:
        if not self._out:
            return
        assert self._sock is not None
        try:
            sent = self._sock.send(self._out)
        except BlockingIOError:
            return
        except OSError as e:
            self._failed(f"send failed: {e}", time.monotonic())
            return
        del self._out[:sent]

    def _receive(self, responses: list, now: float) -> None:
        sock = self._sock
        assert sock is not None
        read = 0
        while read < READ_BYTES_PER_PROCESS:
            try:
                data = sock.recv(_RECV_BYTES)
            except BlockingIOError:
                return
            except OSError as e:
                self._failed(f"recv failed: {e}", now)
                return
            if not data:
                if self._fetches:
                    self._failed(f"closed by the leader with {len(self._fetches)} fetches unanswered", now)
                else:
                    logger.debug("%r: closed by the leader (idle)", self)
                    self._disconnect()
                return
            read += len(data)
            try:
                messages = self._decoder.feed(data)
                for frames in messages:
                    answered = self._decode(frames)
                    if answered is not None:
                        responses.append(answered)
            except AuthenticationError as e:
                self._failed(f"the leader refused this broker's fetch token: {e}", now)
                return
            except PartitionNotAvailableError as e:
                self._failed(f"the leader's data port is not ready yet, retrying: {e}", now)
                return
            except HPBrokerError as e:
                self._failed(f"unparsable response stream: {e}", now)
                return
            if responses:
                self._failures = 0

    def _decode(self, frames: list[bytes]
                ) -> tuple[_Fetch, protocol.ResponseHeader, protocol.FetchResponse] | None:
        """The fetch answered by the message ``frames``: the first one sent (data ports answer
        in order); None for an accepted AuthenticateResponse.  InvalidRequestError when the
        message is not the response expected, AuthenticationError when the leader refused the
        token, PartitionNotAvailableError when its worker is not ready yet."""
        if not self._answers:
            raise InvalidRequestError("a response arrived with no fetch in flight")
        expected = self._answers[0]
        if isinstance(expected, _Authenticate):
            header, _ = protocol.decode_response(protocol.ApiKey.AUTHENTICATE, frames)
            if header.correlation_id != expected.correlation_id:
                raise InvalidRequestError(f"response with correlation id {header.correlation_id} where the "
                                          f"authentication (correlation id {expected.correlation_id}) was "
                                          f"expected")
            self._answers.popleft()
            if header.error_code == PartitionNotAvailableError.code:  # not ready: no verdict on the token
                raise PartitionNotAvailableError(f"error {header.error_code}: {header.error_message}")
            if header.error_code:
                raise AuthenticationError(f"error {header.error_code}: {header.error_message}")
            return None
        fetch = self._fetches[0]
        assert fetch is expected
        header, response = protocol.decode_response(protocol.ApiKey.FETCH, frames,
                                                    version=protocol.response_version(protocol.ApiKey.FETCH,
                                                                                      fetch.version))
        if header.correlation_id != fetch.correlation_id:
            raise InvalidRequestError(
                f"response with correlation id {header.correlation_id} where the fetch of "
                f"{fetch.topic}-{fetch.partition} (correlation id {fetch.correlation_id}) was expected")
        assert isinstance(response, protocol.FetchResponse)
        self._answers.popleft()
        self._fetches.popleft()
        self._partitions.discard((fetch.topic, fetch.partition))
        return fetch, header, response

    def _check_overdue(self, now: float) -> None:
        for fetch in self._fetches:
            if fetch.sent_at >= 0 and now - fetch.sent_at > fetch.limit_s:
                self._failed(f"the fetch of {fetch.topic}-{fetch.partition} from offset {fetch.offset} is "
                             f"unanswered after {now - fetch.sent_at:.1f} s", now)
                return

    def _call_back(self, responses: list[tuple[_Fetch, protocol.ResponseHeader, protocol.FetchResponse]]
                   ) -> None:
        lost, self._lost = self._lost, []
        for fetch, header, response in responses:
            if self._closed:  # closed by a callback
                return
            self._on_response(fetch.topic, fetch.partition, header, response)
        for fetch in lost:
            if self._closed or self._on_lost is None:
                return
            self._on_lost(fetch.topic, fetch.partition)

    # --- failures ---------------------------------------------------------------------------------

    def _failed(self, why: str, now: float) -> None:
        """The connection (or its making) failed: every fetch on it is lost; back off."""
        self._failures += 1
        backoff_s = min(BACKOFF_INITIAL_S * 2 ** (self._failures - 1), BACKOFF_MAX_S)
        self._retry_at = now + backoff_s
        lost = list(self._fetches)
        logger.warning("%r: %s; %d fetches lost, reconnecting in %.0f ms", self, why, len(lost),
                       backoff_s * 1000)
        self._lost += lost
        self._fetches.clear()
        self._partitions.clear()
        self._pending.clear()
        self._disconnect()

    def _disconnect(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None
        self._connecting = False
        self._poller = None
        self._out.clear()
        self._answers.clear()

    def close(self) -> None:
        """Close the connection; fetches in flight are forgotten (no callback)."""
        self._closed = True
        self._disconnect()
        self._fetches.clear()
        self._partitions.clear()
        self._pending.clear()
        self._lost.clear()
