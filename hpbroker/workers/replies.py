"""Responses a worker sends, built once and handed to whichever transport the request came on.

A :class:`Reply` is a response ready to go: its head (header + body, as
``hpbroker.protocol.encode_response`` lays it out) and its payload, either bytes in memory or a
*file slice* (record batches in a segment file).  The ZeroMQ path reads a slice into a frame; the
TCP data port sends it straight from the file with ``sendfile``.  Either way the head is the same
bytes, so its ``payload_length`` (the last field of every body, see docs/PROTOCOL.md) is the
slice's length.

A *responder* is the callable a request's reply goes to (``responder(reply)``): bound to a client
identity on the backend socket, or to a response slot of a TCP connection.  It is called exactly
once per request that gets an answer, always from the worker's event loop thread, and never
raises.  A transport that cannot hand out a reply as it is says so in the reply before it
returns, so that the worker's measurements count what the client gets: the ZeroMQ path, when it
cannot read the slice, answers with an error instead and sets ``error_code`` to it and
``file_slice`` to None; the data port, when the connection is closed already, sets
``file_slice`` to None.

**Versions.**  A reply is encoded in the version its request was asked in (``version``, the
request header's ``api_version``; 0 by default): a client that sends version 0 gets version 0
bytes.  An error reply to a version the broker does not serve is encoded in the nearest version
it serves (``protocol.response_version``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from hpbroker import protocol
from hpbroker.errors import DamagedRangeError, HPBrokerError, OffsetOutOfRangeError
from hpbroker.io import FileSlice

__all__ = [
    "Reply",
    "Responder",
    "error_reply",
    "fetch_error_reply",
    "fetch_reply",
    "list_offsets_reply",
    "produce_reply",
    "with_payload_length",
]

_PAYLOAD_LENGTH = struct.Struct("<I")  # the u32 that ends every message body


@dataclass(slots=True)
class Reply:
    """One response: ``head`` (header + body), then ``payload`` or the bytes of ``file_slice``.

    ``api_key``, ``correlation_id`` and ``api_version`` (the version ``head`` is encoded in)
    travel along so a transport that fails to read the slice can still answer with an error in
    the same version; ``error_code`` (the header's, 0 for none) so the worker can count errors
    without parsing the head."""

    api_key: int
    correlation_id: int
    head: bytes
    payload: bytes | memoryview = b""
    file_slice: FileSlice | None = None
    error_code: int = 0
    api_version: int = 0


Responder = Callable[[Reply], None]


@dataclass(slots=True)
class _BareResponse(protocol.Message):
    """A response of a request type the broker does not know: the header alone (and
    ``payload_length`` 0), since there is no body schema to fill with -1."""

    payload: bytes | memoryview = b""
    SCHEMA: ClassVar = ()


def with_payload_length(head: bytes, payload_length: int) -> bytes:
    """``head`` with its ``payload_length`` (its last four bytes) replaced."""
    return head[: -_PAYLOAD_LENGTH.size] + _PAYLOAD_LENGTH.pack(payload_length)


def _reply(api_key: int, correlation_id: int, message: protocol.Message, error: HPBrokerError | None = None,
           version: int = 0) -> Reply:
    code, text = (0, "") if error is None else (error.code, error.message)
    frames = protocol.encode_response(message, correlation_id, code, text, version=version)
    return Reply(api_key, correlation_id, frames[0], frames[1] if len(frames) > 1 else b"", error_code=code,
                 api_version=version)


def error_reply(api_key: int, correlation_id: int, error: HPBrokerError, *, version: int = 0,
                **body: Any) -> Reply:
    """The error response to a request of ``api_key`` asked in ``version``: the body's numbers
    are -1 except those given in ``body`` (e.g. the offsets of an OffsetOutOfRangeError).  A
    version not served (the request was refused for it) is answered in the nearest served."""
    response_type = protocol.RESPONSE_TYPES.get(api_key, _BareResponse)
    if len(error.message.encode("utf-8")) > 0xFFFF:  # a string field holds at most 65535 bytes
        error = type(error)(error.message.encode("utf-8")[:0xFF00].decode("utf-8", "ignore"))
    return _reply(api_key, correlation_id, response_type(**body), error,
                  protocol.response_version(api_key, version))


def produce_reply(correlation_id: int, base_offset: int, log_start_offset: int, *, version: int = 0,
                  duplicate: bool = False) -> Reply:
    """A produce acknowledged, in the request's ``version``.  ``duplicate``: every batch of the
    request was already stored and ``base_offset`` is the stored copy's (nothing appended);
    version 1 says so with ``duplicate`` 1, version 0 has no such field and answers it like an
    append."""
    response = protocol.ProduceResponse(base_offset=base_offset, log_start_offset=log_start_offset,
                                        duplicate=int(duplicate))
    return _reply(protocol.ApiKey.PRODUCE, correlation_id, response, version=version)


def fetch_reply(correlation_id: int, high_watermark: int, log_start_offset: int,
                file_slice: FileSlice | None, *, version: int = 0,
                leader_epoch: int = protocol.NO_LEADER_EPOCH, diverging_epoch: int = protocol.NO_LEADER_EPOCH,
                diverging_end_offset: int = -1) -> Reply:
    """A fetch response whose payload is ``file_slice`` (possibly empty, or None: no records),
    not yet read, in the request's ``version``.  ``leader_epoch``, ``diverging_epoch`` and
    ``diverging_end_offset`` are version 1 fields (a replicated partition's; -1 otherwise)."""
    response = protocol.FetchResponse(high_watermark=high_watermark, log_start_offset=log_start_offset,
                                      leader_epoch=leader_epoch, diverging_epoch=diverging_epoch,
                                      diverging_end_offset=diverging_end_offset)
    head = protocol.encode_response(response, correlation_id, version=version)[0]
    if file_slice is not None and file_slice.length:
        return Reply(protocol.ApiKey.FETCH, correlation_id, with_payload_length(head, file_slice.length),
                     file_slice=file_slice, api_version=version)
    return Reply(protocol.ApiKey.FETCH, correlation_id, head, api_version=version)


def fetch_error_reply(correlation_id: int, error: HPBrokerError, high_watermark: int = -1,
                      log_start_offset: int = -1, *, version: int = 0) -> Reply:
    """A fetch error; an OffsetOutOfRangeError carries the partition's offsets so the consumer can
    reset without asking again, a DamagedRangeError the offset after the damaged range as its
    8-byte payload (docs/PROTOCOL.md, FetchResponse)."""
    if isinstance(error, OffsetOutOfRangeError) and log_start_offset < 0:
        log_start_offset = error.log_start_offset
    payload = b""
    if isinstance(error, DamagedRangeError):
        payload = protocol.DAMAGED_RANGE_PAYLOAD.pack(error.next_offset)
    return error_reply(protocol.ApiKey.FETCH, correlation_id, error, version=version,
                       high_watermark=high_watermark, log_start_offset=log_start_offset, payload=payload)


def list_offsets_reply(correlation_id: int, offset: int) -> Reply:
    return _reply(protocol.ApiKey.LIST_OFFSETS, correlation_id, protocol.ListOffsetsResponse(offset=offset))
