"""The wire protocol, sans I/O: every request and response as bytes in, objects out, and back.

No sockets here.  The broker and every client share this module; ``docs/PROTOCOL.md`` is the
same specification in prose, precise enough to write a client in another language.

A *message* is a header, a body, and a *payload* (raw record batches, possibly empty).  The body
of every message ends with ``payload_length`` (u32).  Two framings carry messages:

- **ZeroMQ** (DEALER client to the broker's ROUTER): frame 0 is header + body; frame 1, present
  exactly when ``payload_length > 0``, is the payload.  Keeping record batches in their own frame
  lets both sides hand them on without copying.
- **TCP** (the fetch data port): ``head_length`` u32 and ``payload_length`` u32, then the head
  (header + body) and the payload, back to back.

Integers are little-endian.  ``string`` is a u16 byte length and UTF-8 bytes; ``array<T>`` is a
u32 count and that many ``T``.  Schemas are declared once, in :data:`REQUEST_TYPES` and
:data:`RESPONSE_TYPES`, and drive both the codec and the protocol document.

**Versions.**  Each message class serves ``MIN_VERSION`` .. ``VERSION`` (its ``api_version`` on
the wire).  A schema entry is ``(name, type)``, or ``(name, type, since)`` for a field that exists
from version ``since`` on: version *v* of a message is the entries whose ``since`` is at most *v*,
in order.  A field absent from the version decoded takes its dataclass default.  Nested types
(``PartitionMetadata`` …) have no version of their own: their ``since`` entries count in the
version of the message that carries them.  A request and its response share a version: the
broker answers in the version it was asked in (:func:`response_version` for a request whose
version it does not serve).

Decoding never trusts a length: every count and size is checked against the bytes present and
against :data:`MAX_MESSAGE_BYTES`, and any mismatch raises
:class:`~hpbroker.errors.InvalidRequestError` (or UnsupportedVersionError for an unknown API key
or version), which the broker turns into an error response.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from hpbroker.errors import InvalidRequestError, UnsupportedVersionError

__all__ = [
    "ACKS_ALL",
    "CONSUMER_REPLICA_ID",
    "EARLIEST_TIMESTAMP",
    "MAX_PRODUCER_EPOCH",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "LATEST_TIMESTAMP",
    "MAX_MESSAGE_BYTES",
    "NESTED_TYPES",
    "NO_LEADER_EPOCH",
    "REQUEST_TYPES",
    "RESPONSE_TYPES",
    "AlterTopicConfigRequest",
    "AuthenticateRequest",
    "AuthenticateResponse",
    "FetchTokenRequest",
    "FetchTokenResponse",
    "GroupCredentialsRequest",
    "GroupCredentialsResponse",
    "AlterTopicConfigResponse",
    "ApiKey",
    "BrokerInfo",
    "CreateTopicRequest",
    "CreateTopicResponse",
    "DeleteTopicRequest",
    "DeleteTopicResponse",
    "FetchRequest",
    "FetchResponse",
    "InitProducerIdRequest",
    "InitProducerIdResponse",
    "ListOffsetsRequest",
    "ListOffsetsResponse",
    "Message",
    "MetadataRequest",
    "MetadataResponse",
    "PartitionMetadata",
    "ProduceRequest",
    "ProduceResponse",
    "RequestHeader",
    "ResponseHeader",
    "TcpFrameDecoder",
    "TopicConfigEntry",
    "TopicMetadata",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "frame_tcp",
    "response_version",
    "schema_of",
]

# The largest message either framing accepts (header, body and payload): a 64 MiB produce is
# already far beyond a sane batch, and a bound keeps a hostile length from costing memory.
MAX_MESSAGE_BYTES = 64 << 20
# The data ports serve only requests without a payload (fetch, list offsets): a message to one
# is refused beyond this, whatever the broker's max_request_bytes (a head with the longest
# client id and topic name is about 64 KiB).
DATA_PORT_MAX_REQUEST_BYTES = 256 << 10
# ListOffsets timestamps with a special meaning.
LATEST_TIMESTAMP = -1  # the high watermark: the offset the next flushed record will get
EARLIEST_TIMESTAMP = -2  # the log start offset
# InitProducerId: "no producer id" and "no epoch" (ask for a new id), the newest epoch an id may reach.
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
MAX_PRODUCER_EPOCH = 2**31 - 1
# ProduceRequest.acks: answer once every in-sync replica has the records flushed.
ACKS_ALL = -1
# FetchRequest.replica_id of a consumer (a follower sends its broker id, >= 0).
CONSUMER_REPLICA_ID = -1
# A leader epoch field with nothing to say: no check asked for, no epoch known, no divergence.
NO_LEADER_EPOCH = -1
# The payload of a FetchResponse with error 18 (DamagedRangeError): the offset after the damaged range.
DAMAGED_RANGE_PAYLOAD = struct.Struct("<q")


class ApiKey:
    """Request types (u16 on the wire).  Never renumber; append only."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    CREATE_TOPIC = 4
    DELETE_TOPIC = 5
    ALTER_TOPIC_CONFIG = 6
    INIT_PRODUCER_ID = 7
    FETCH_TOKEN = 8
    AUTHENTICATE = 9
    GROUP_CREDENTIALS = 10


# --- field types -----------------------------------------------------------------------------


class _Scalar:
    def __init__(self, name: str, fmt: str) -> None:
        self.name = name
        self.struct = struct.Struct("<" + fmt)

    def encode(self, value: Any, out: bytearray, version: int | None = None) -> None:
        try:
            out += self.struct.pack(value)
        except struct.error as e:
            raise InvalidRequestError(f"value {value!r} does not fit {self.name}: {e}") from None

    def decode(self, reader: _Reader, version: int | None = None) -> Any:
        return reader.unpack(self.struct, self.name)[0]

    def min_size(self, version: int | None = None) -> int:
        return self.struct.size


class _String:
    name = "string"

    def encode(self, value: str, out: bytearray, version: int | None = None) -> None:
        data = value.encode("utf-8")
        if len(data) > 0xFFFF:
            raise InvalidRequestError(f"string of {len(data)} bytes exceeds 65535")
        out += _U16.pack(len(data))
        out += data

    def decode(self, reader: _Reader, version: int | None = None) -> str:
        (length,) = reader.unpack(_U16, "string length")
        raw = reader.take(length, "string")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            where = reader.position - length
            raise InvalidRequestError(f"string at byte {where} is not UTF-8: {e}") from None

    def min_size(self, version: int | None = None) -> int:
        return 2


class _Array:
    def __init__(self, element: Any) -> None:
        self.element = element
        self.name = f"array<{element.name}>"

    def encode(self, value: Sequence[Any], out: bytearray, version: int | None = None) -> None:
        out += _U32.pack(len(value))
        for item in value:
            self.element.encode(item, out, version)

    def decode(self, reader: _Reader, version: int | None = None) -> list[Any]:
        (count,) = reader.unpack(_U32, "array count")
        needed = count * self.element.min_size(version)
        if needed > reader.remaining:
            raise InvalidRequestError(
                f"array of {count} {self.element.name} at byte {reader.position - 4} needs at least "
                f"{needed} bytes, {reader.remaining} remain"
            )
        return [self.element.decode(reader, version) for _ in range(count)]

    def min_size(self, version: int | None = None) -> int:
        return 4


class _StructType:
    """A nested record type: decodes to an instance of a dataclass with a ``SCHEMA``.

    It is versioned with the message that carries it: ``version`` (the message's) selects the
    nested entries whose ``since`` is at most it, and a field absent from that version decodes
    to its dataclass default (None: every field)."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.name = cls.__name__

    def encode(self, value: Any, out: bytearray, version: int | None = None) -> None:
        _encode_fields(value, out, version)

    def decode(self, reader: _Reader, version: int | None = None) -> Any:
        return _decode_fields(self.cls, reader, version)

    def min_size(self, version: int | None = None) -> int:
        return sum(kind.min_size(version) for _, kind in schema_of(self.cls, version))


_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
I8 = _Scalar("i8", "b")
U8 = _Scalar("u8", "B")
I16 = _Scalar("i16", "h")
U16 = _Scalar("u16", "H")
U32 = _Scalar("u32", "I")
I32 = _Scalar("i32", "i")
I64 = _Scalar("i64", "q")
STRING = _String()


class _Reader:
    """A cursor over a buffer; every read is bounds-checked."""

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = memoryview(data)
        self.position = 0

    @property
    def remaining(self) -> int:
        return len(self.data) - self.position

    def unpack(self, fmt: struct.Struct, what: str) -> tuple[Any, ...]:
        if fmt.size > self.remaining:
            raise InvalidRequestError(
                f"truncated message: {what} at byte {self.position} needs {fmt.size} bytes, "
                f"{self.remaining} remain"
            )
        values = fmt.unpack_from(self.data, self.position)
        self.position += fmt.size
        return values

    def take(self, length: int, what: str) -> bytes:
        if length > self.remaining:
            raise InvalidRequestError(
                f"truncated message: {what} at byte {self.position} needs {length} bytes, "
                f"{self.remaining} remain"
            )
        chunk = self.data[self.position : self.position + length].tobytes()
        self.position += length
        return chunk


def schema_of(cls: type, version: int | None = None) -> tuple[tuple[str, Any], ...]:
    """``(name, type)`` of each field of ``cls`` in ``version`` (None: every field, the newest),
    in wire order: the schema entries whose ``since`` (third element, 0 when absent) is at most
    ``version``."""
    return tuple((entry[0], entry[1]) for entry in cls.SCHEMA
                 if version is None or (entry[2] if len(entry) > 2 else 0) <= version)


def _encode_fields(obj: Any, out: bytearray, version: int | None = None) -> None:
    for name, kind in schema_of(type(obj), version):
        kind.encode(getattr(obj, name), out, version)


def _decode_values(cls: type, reader: _Reader, version: int | None = None) -> dict[str, Any]:
    return {name: kind.decode(reader, version) for name, kind in schema_of(cls, version)}


def _decode_fields(cls: type, reader: _Reader, version: int | None = None) -> Any:
    return cls(**_decode_values(cls, reader, version))


# --- headers -----------------------------------------------------------------------------------


@dataclass(slots=True)
class RequestHeader:
    """Starts every request: ``api_key`` u16, ``api_version`` u16, ``correlation_id`` u32 (echoed
    in the response; a client picks them, unique among its requests in flight), ``client_id``."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str = ""
    SCHEMA: ClassVar = (("api_key", U16), ("api_version", U16), ("correlation_id", U32),
                        ("client_id", STRING))


@dataclass(slots=True)
class ResponseHeader:
    """Starts every response: the request's ``correlation_id``, then ``error_code`` (0 = none,
    else a code of hpbroker.errors) and ``error_message`` (empty when none).  The body follows
    complete even on error, with -1 in the numbers it could not fill."""

    correlation_id: int
    error_code: int = 0
    error_message: str = ""
    SCHEMA: ClassVar = (("correlation_id", U32), ("error_code", U16), ("error_message", STRING))


# --- messages ----------------------------------------------------------------------------------


class Message:
    """Base of every request and response body; ``payload`` is raw record batches (or b"").

    ``MIN_VERSION`` .. ``VERSION``: the versions served (a request and its response type keep the
    same range); ``SCHEMA`` entries are ``(name, type)`` or ``(name, type, since)`` (module
    docstring).  A field with a ``since`` has a default, which a decoded older version keeps."""

    API_KEY: ClassVar[int]
    MIN_VERSION: ClassVar[int] = 0
    VERSION: ClassVar[int] = 0
    SCHEMA: ClassVar[tuple[tuple[Any, ...], ...]] = ()
    payload: bytes | memoryview


@dataclass(slots=True)
class ProduceRequest(Message):
    """Append the record batches in ``payload`` to one partition.  ``acks``: 1 = respond once the
    leader has the records flushed (durable per the topic's flush policy), -1 (:data:`ACKS_ALL`)
    = respond once every in-sync replica has them flushed, each under its own flush policy
    (NotEnoughReplicasError at once when the ISR is smaller than ``min_insync_replicas``), 0 =
    send no response at all.  Version 1 has the same body as 0; it asks for a version 1 response
    (``duplicate``)."""

    topic: str
    partition: int
    acks: int = 1
    timeout_ms: int = 30_000
    payload: bytes | memoryview = b""
    API_KEY: ClassVar = ApiKey.PRODUCE
    VERSION: ClassVar = 1
    SCHEMA: ClassVar = (("topic", STRING), ("partition", U32), ("acks", I8), ("timeout_ms", U32))


@dataclass(slots=True)
class ProduceResponse(Message):
    """``base_offset`` of the first record appended (-1 on error); ``log_start_offset``.
    ``duplicate`` (version 1 on): 1 when every batch of the request was already stored, nothing
    was appended and ``base_offset`` is the stored copy's."""

    base_offset: int = -1
    log_start_offset: int = -1
    duplicate: int = 0
    payload: bytes | memoryview = b""
    API_KEY: ClassVar = ApiKey.PRODUCE
    VERSION: ClassVar = 1
    SCHEMA: ClassVar = (("base_offset", I64), ("log_start_offset", I64), ("duplicate", U8, 1))


@dataclass(slots=True)
class FetchRequest(Message):
    """Read from ``offset``: whole batches, at most ``max_bytes`` (but always the first batch, so a
    consumer progresses).  With nothing new, wait up to ``max_wait_ms`` for at least
    ``min_bytes`` of new flushed data (long polling).

    Version 1 adds what a follower sends when it fetches from its leader (a *replica fetch*):
    ``replica_id`` (-1, :data:`CONSUMER_REPLICA_ID`, for a consumer; a follower's broker id,
    >= 0), ``current_leader_epoch`` (the leader epoch the follower believes current; the leader
    answers FencedLeaderEpochError when it is older than its own, NotLeaderOrFollowerError when
    it does not lead; -1 = no check) and ``last_fetched_epoch`` (the leader epoch of the last
    batch in the follower's log, which the leader checks for divergence; -1 = none).

    Version 2 adds ``durable_offset``: a replica fetch's flushed end, when the follower fetches
    from ``offset`` (its log end) while its last records are still being flushed; the leader
    counts only ``durable_offset`` toward the high watermark.  -1 (and every older version):
    ``offset`` is the flushed end.  Never above ``offset``."""

    topic: str
    partition: int
    offset: int
    max_bytes: int = 1 << 20
    max_wait_ms: int = 500
    min_bytes: int = 1
    replica_id: int = CONSUMER_REPLICA_ID
    current_leader_epoch: int = NO_LEADER_EPOCH
    last_fetched_epoch: int = NO_LEADER_EPOCH
    durable_offset: int = -1
    payload: bytes | memoryview = b""
    API_KEY: ClassVar = ApiKey.FETCH
    VERSION: ClassVar = 2
    SCHEMA: ClassVar = (("topic", STRING), ("partition", U32), ("offset", I64), ("max_bytes", U32),
                        ("max_wait_ms", U32), ("min_bytes", U32), ("replica_id", I32, 1),
                        ("current_leader_epoch", I32, 1), ("last_fetched_epoch", I32, 1),
                        ("durable_offset", I64, 2))


@dataclass(slots=True)
class FetchResponse(Message):
    """``payload``: whole record batches, the first one holding the requested offset (it may start
    before it: skip records below the offset asked for).  ``high_watermark``: the offset below
    which a consumer may read (the end of the flushed records; for a replicated partition the
    replicated high watermark, the smallest flushed end in the ISR); ``log_start_offset``: the
    first offset still stored.  A replica fetch's payload may reach past ``high_watermark``, up to
    the leader's flushed end.

    Version 1 adds ``diverging_epoch`` and ``diverging_end_offset`` (set, with an empty payload,
    when a replica fetch's ``last_fetched_epoch`` ends earlier at the leader than the follower's
    ``offset`` or is unknown there: the follower truncates its log to at most
    ``diverging_end_offset`` and fetches again; -1 = no divergence) and ``leader_epoch`` (the
    leader's current epoch; -1 = unreplicated or unknown).  Version 2: the same body as 1."""

    high_watermark: int = -1
    log_start_offset: int = -1
    diverging_epoch: int = NO_LEADER_EPOCH
    diverging_end_offset: int = -1
    leader_epoch: int = NO_LEADER_EPOCH
    payload: bytes | memoryview = b""
    API_KEY: ClassVar = ApiKey.FETCH
    VERSION: ClassVar = 2
    SCHEMA: ClassVar = (("high_watermark", I64), ("log_start_offset", I64), ("diverging_epoch", I32, 1),
                        ("diverging_end_offset", I64, 1), ("leader_epoch", I32, 1))


@dataclass(slots=True)
class ListOffsetsRequest(Message):
    """The earliest offset whose record timestamp is >= ``timestamp`` (ms), or the log end
    (``LATEST_TIMESTAMP``, -1) or start (``EARLIEST_TIMESTAMP``, -2)."""

    topic: str
    partition: int
    timestamp: int = LATEST_TIMESTAMP
    payload: bytes | memoryview = b""
    API_KEY: ClassVar = ApiKey.LIST_OFFSETS
    SCHEMA: ClassVar = (("topic", STRING), ("partition", U32), ("timestamp", I64))


@dataclass(slots=True)
class ListOffsetsResponse(Message):
    """``offset``: -1 when no record is that recent."""

    offset: int = -1
    payload: bytes | memoryview = b""
    API_KEY: ClassVar = ApiKey.LIST_OFFSETS
    SCHEMA: ClassVar = (("offset", I64),)


@dataclass(slots=True)
class TopicConfigEntry:
    key: str
    value: str
    SCHEMA: ClassVar = (("key", STRING), ("value", STRING))


@dataclass(slots=True)
class BrokerInfo:
    broker_id: int
    host: str
    port: int  # the ZeroMQ front-end
    fetch_port: int  # the first TCP data port (each worker serves its partitions on one of them)
    SCHEMA: ClassVar = (("broker_id", U32), ("host", STRING), ("port", U16), ("fetch_port", U16))


@dataclass(slots=True)
class PartitionMetadata:
    """One partition of a MetadataResponse.  Version 1 adds ``leader_epoch``, ``replicas`` (broker
    ids, the preferred leader first) and ``isr`` (the in-sync replicas); for an unreplicated
    partition they are -1, [] and [], and a client takes ``[leader]`` for both lists."""

    partition: int
    error_code: int = 0
    leader: int = -1  # broker_id, -1 if none
    fetch_port: int = 0  # the TCP data port serving this partition on the leader, 0 if none
    log_start_offset: int = -1
    high_watermark: int = -1
    leader_epoch: int = NO_LEADER_EPOCH
    replicas: list[int] = field(default_factory=list)
    isr: list[int] = field(default_factory=list)
    SCHEMA: ClassVar = (("partition", U32), ("error_code", U16), ("leader", I64), ("fetch_port", U16),
                        ("log_start_offset", I64), ("high_watermark", I64), ("leader_epoch", I32, 1),
                        ("replicas", _Array(I32), 1), ("isr", _Array(I32), 1))


@dataclass(slots=True)
class TopicMetadata:
    name: str
    error_code: int = 0
    partitions: list[PartitionMetadata] = field(default_factory=list)
    configs: list[TopicConfigEntry] = field(default_factory=list)
    SCHEMA: ClassVar = (("name", STRING), ("error_code", U16),
                        ("partitions", _Array(_StructType(PartitionMetadata))),
                        ("configs", _Array(_StructType(TopicConfigEntry))))


@dataclass(slots=True)
class MetadataRequest(Message):
    """``topics``: the names to describe; empty means every topic.  Version 1 has the same body
    as 0; it asks for a version 1 response (each partition's leader epoch, replicas and ISR)."""

    topics: list[str] = field(default_factory=list)
    payload: bytes | memoryview = b""
    API_KEY: ClassVar = ApiKey.METADATA
    VERSION: ClassVar = 1
    SCHEMA: ClassVar = (("topics", _Array(STRING)),)


@dataclass(slots=True)
class MetadataResponse(Message):
    """The brokers, and each topic asked for (an unknown one with its error code set); in version
    1 its partitions carry their version 1 fields (:class:`PartitionMetadata`)."""

    brokers: list[BrokerInfo] = field(default_factory=list)
    topics: list[TopicMetadata] = field(default_factory=list)
    payload: bytes | memoryview = b""
    API_KEY: ClassVar = ApiKey.METADATA
    VERSION: ClassVar = 1
    SCHEMA: ClassVar = (("brokers", _Array(_StructType(BrokerInfo))),
                        ("topics", _Array(_StructType(TopicMetadata))))


@dataclass(slots=True)
class CreateTopicRequest(Message):
    """Create ``name`` with ``partitions`` partitions and per-topic settings (log config field
    names, values as strings, e.g. ``("retention_ms", "86400000")``).  Version 1 adds
    ``replication_factor``: the replicas of each partition, -1 for the broker's
    ``default_replication_factor`` (InvalidReplicationFactorError below 1, above the live
    brokers, or above 1 without ZooKeeper)."""

    name: str
    partitions: int
    configs: list[TopicConfigEntry] = field(default_factory=list)
    replication_factor: int = -1
    payload: bytes | memoryview = b""
    API_KEY: ClassVar = ApiKey.CREATE_TOPIC
    VERSION: ClassVar = 1
    SCHEMA: ClassVar = (("name", STRING), ("partitions", U32),
                        ("configs", _Array(_StructType(TopicConfigEntry))), ("replication_factor", I16, 1))


@dataclass(slots=True)
class CreateTopicResponse(Message):
    """No body; the outcome is the header's error code.  Version 1 is version 0."""

    payload: bytes | memoryview = b""
    API_KEY: ClassVar = ApiKey.CREATE_TOPIC
    VERSION: ClassVar = 1


@dataclass(slots=True)
class DeleteTopicRequest(Message):
    name: str
    payload: bytes | memoryview = b""
    API_KEY: ClassVar = ApiKey.DELETE_TOPIC
    SCHEMA: ClassVar = (("name", STRING),)


@dataclass(slots=True)
class DeleteTopicResponse(Message):
    payload: bytes | memoryview = b""
    API_KEY: ClassVar = ApiKey.DELETE_TOPIC


@dataclass(slots=True)
class AlterTopicConfigRequest(Message):
    """Change settings of topic ``name``: each entry sets one log setting (as in
    CreateTopicRequest); an entry with an empty ``value`` removes the topic's own value, so the
    broker's default applies again.  Settings not named keep their values."""

    name: str
    configs: list[TopicConfigEntry] = field(default_factory=list)
    payload: bytes | memoryview = b""
    API_KEY: ClassVar = ApiKey.ALTER_TOPIC_CONFIG
    SCHEMA: ClassVar = (("name", STRING), ("configs", _Array(_StructType(TopicConfigEntry))))


@dataclass(slots=True)
class AlterTopicConfigResponse(Message):
    payload: bytes | memoryview = b""
    API_KEY: ClassVar = ApiKey.ALTER_TOPIC_CONFIG


@dataclass(slots=True)
class InitProducerIdRequest(Message):
    """Get an idempotent producer's identity, answered by the broker's arbiter.

    - ``(-1, -1)``: a new producer id, epoch 0;
    - an id this broker (or cluster) has issued, with ``producer_epoch`` >= 0: the same id with
      the epoch one higher, which fences the older epoch;
    - an id never issued, or ``producer_epoch`` at :data:`MAX_PRODUCER_EPOCH`: a new id, epoch 0;
    - anything else (a negative id other than -1, -1 with an epoch, an id with epoch -1):
      InvalidRequestError."""

    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    payload: bytes | memoryview = b""
    API_KEY: ClassVar = ApiKey.INIT_PRODUCER_ID
    SCHEMA: ClassVar = (("producer_id", I64), ("producer_epoch", I32))


@dataclass(slots=True)
class InitProducerIdResponse(Message):
    """The identity the producer's batches carry; -1 each on error (CoordinationError, retriable,
    when no id can be allocated now)."""

    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    payload: bytes | memoryview = b""
    API_KEY: ClassVar = ApiKey.INIT_PRODUCER_ID
    SCHEMA: ClassVar = (("producer_id", I64), ("producer_epoch", I32))


@dataclass(slots=True)
class FetchTokenRequest(Message):
    """Ask the front-end for a fetch token: what a data-port connection presents first
    (:class:`AuthenticateRequest`) on a broker with ``security = "curve"``.  The token names the
    principal the front-end authenticated (the client's key name) and an expiry; any broker of
    the cluster accepts it.  It grants nothing by itself: each fetch is still checked against the
    ACLs.  A broker without security answers error 10."""

    payload: bytes | memoryview = b""
    API_KEY: ClassVar = ApiKey.FETCH_TOKEN
    SCHEMA: ClassVar = ()


@dataclass(slots=True)
class FetchTokenResponse(Message):
    """``token``: opaque printable ASCII (docs/SECURITY.md gives its layout); ``principal``: the
    name it is bound to; ``expires_at_ms``: when data ports stop accepting it (get the next one
    before then).  Empty and -1 on error."""

    token: str = ""
    principal: str = ""
    expires_at_ms: int = -1
    payload: bytes | memoryview = b""
    API_KEY: ClassVar = ApiKey.FETCH_TOKEN
    SCHEMA: ClassVar = (("token", STRING), ("principal", STRING), ("expires_at_ms", I64))


@dataclass(slots=True)
class AuthenticateRequest(Message):
    """Data ports only, and there the first request of every connection to a broker with
    ``security = "curve"`` and ``data_port_auth = "token"``: the token a front-end issued
    (:class:`FetchTokenResponse`).  Refused (error 27), the connection is closed after the
    answer; any other request before a successful one gets error 27 and the connection closes.
    A broker without data-port tokens answers it with error 0 and an empty principal."""

    token: str
    payload: bytes | memoryview = b""
    API_KEY: ClassVar = ApiKey.AUTHENTICATE
    SCHEMA: ClassVar = (("token", STRING),)


@dataclass(slots=True)
class AuthenticateResponse(Message):
    """The principal the connection now acts as and when its token expires (a connection outlives
    its token: requests after ``expires_at_ms`` get error 27 and the connection closes)."""

    principal: str = ""
    expires_at_ms: int = -1
    payload: bytes | memoryview = b""
    API_KEY: ClassVar = ApiKey.AUTHENTICATE
    SCHEMA: ClassVar = (("principal", STRING), ("expires_at_ms", I64))


@dataclass(slots=True)
class GroupCredentialsRequest(Message):
    """Ask for the ZooKeeper credentials of consumer group ``group`` (a group member writes its
    registration, partition ownership and offsets under ``/consumers/<group>`` itself).  Needs
    ``consume`` on the group; a broker without security, or without ZooKeeper, answers error 10."""

    group: str
    payload: bytes | memoryview = b""
    API_KEY: ClassVar = ApiKey.GROUP_CREDENTIALS
    SCHEMA: ClassVar = (("group", STRING),)


@dataclass(slots=True)
class GroupCredentialsResponse(Message):
    """``zookeeper_user`` and ``zookeeper_password``: the digest credentials to add to the
    member's ZooKeeper session (``addauth digest user:password``); ``acl_ids``: the digest ids
    (``user:base64(sha1(user:password))``) for the ACL of every znode the member creates under
    the group's node: all rights to the first (the cluster's), all but admin to the others (the
    group's), the world getting read only (docs/SECURITY.md).  Empty on error."""

    zookeeper_user: str = ""
    zookeeper_password: str = ""
    acl_ids: list[str] = field(default_factory=list)
    payload: bytes | memoryview = b""
    API_KEY: ClassVar = ApiKey.GROUP_CREDENTIALS
    SCHEMA: ClassVar = (("zookeeper_user", STRING), ("zookeeper_password", STRING),
                        ("acl_ids", _Array(STRING)))


REQUEST_TYPES: dict[int, type[Message]] = {
    cls.API_KEY: cls
    for cls in (ProduceRequest, FetchRequest, ListOffsetsRequest, MetadataRequest, CreateTopicRequest,
                DeleteTopicRequest, AlterTopicConfigRequest, InitProducerIdRequest, FetchTokenRequest,
                AuthenticateRequest, GroupCredentialsRequest)
}
RESPONSE_TYPES: dict[int, type[Message]] = {
    cls.API_KEY: cls
    for cls in (ProduceResponse, FetchResponse, ListOffsetsResponse, MetadataResponse, CreateTopicResponse,
                DeleteTopicResponse, AlterTopicConfigResponse, InitProducerIdResponse, FetchTokenResponse,
                AuthenticateResponse, GroupCredentialsResponse)
}
# Every payload-less message still ends its body with payload_length 0.
assert all({f.name for f in fields(cls)} >= {"payload"} for cls in (*REQUEST_TYPES.values(),
                                                                       *RESPONSE_TYPES.values()))
# A request and its response serve the same versions; a field added in a version has a default.
assert all((REQUEST_TYPES[key].MIN_VERSION, REQUEST_TYPES[key].VERSION)
           == (RESPONSE_TYPES[key].MIN_VERSION, RESPONSE_TYPES[key].VERSION) for key in REQUEST_TYPES)
NESTED_TYPES: tuple[type, ...] = (BrokerInfo, TopicMetadata, PartitionMetadata, TopicConfigEntry)
assert all(len(entry) == 2 or any(f.name == entry[0] and (f.default is not dataclasses.MISSING
                                                           or f.default_factory is not dataclasses.MISSING)
                                   for f in fields(cls))
           for cls in (*REQUEST_TYPES.values(), *RESPONSE_TYPES.values(), *NESTED_TYPES)
           for entry in cls.SCHEMA)


def _newest_since(kind: Any) -> int:
    """The newest ``since`` among the fields of the nested types ``kind`` holds (0: none)."""
    if isinstance(kind, _Array):
        return _newest_since(kind.element)
    if isinstance(kind, _StructType):
        return max((max(entry[2] if len(entry) > 2 else 0, _newest_since(entry[1]))
                    for entry in kind.cls.SCHEMA), default=0)
    return 0


# A nested field is versioned with its message, so the message must have that version.
assert all(_newest_since(entry[1]) <= cls.VERSION
           for cls in (*REQUEST_TYPES.values(), *RESPONSE_TYPES.values()) for entry in cls.SCHEMA)


# --- encoding and decoding ----------------------------------------------------------------------


def _check_version(message_type: type[Message], version: int | None) -> int:
    """``version`` (None: the newest) if ``message_type`` has it, else UnsupportedVersionError."""
    if version is None:
        return message_type.VERSION
    if not message_type.MIN_VERSION <= version <= message_type.VERSION:
        raise UnsupportedVersionError(
            f"{message_type.__name__} version {version} is not served; "
            f"versions {message_type.MIN_VERSION}..{message_type.VERSION} are")
    return version


def _encode(header: Any, message: Message, version: int) -> list[bytes | memoryview]:
    out = bytearray()
    _encode_fields(header, out)
    _encode_fields(message, out, version)
    payload = message.payload
    payload_length = memoryview(payload).nbytes
    out += _U32.pack(payload_length)
    if len(out) + payload_length > MAX_MESSAGE_BYTES:
        raise InvalidRequestError(f"message of {len(out) + payload_length} bytes exceeds {MAX_MESSAGE_BYTES}")
    return [bytes(out), payload] if payload_length else [bytes(out)]


def encode_request(message: Message, correlation_id: int, client_id: str = "",
                   version: int | None = None) -> list[bytes | memoryview]:
    """ZeroMQ frames of a request in ``version`` (None: ``message.VERSION``, the newest): header +
    body, then the payload frame if any."""
    version = _check_version(type(message), version)
    header = RequestHeader(message.API_KEY, version, correlation_id, client_id)
    return _encode(header, message, version)


def encode_response(message: Message, correlation_id: int, error_code: int = 0,
                    error_message: str = "", version: int | None = None) -> list[bytes | memoryview]:
    """ZeroMQ frames of a response in ``version`` (None: the newest; the broker passes the
    request's): header + body, then the payload frame if any."""
    version = _check_version(type(message), version)
    return _encode(ResponseHeader(correlation_id, error_code, error_message), message, version)


def response_version(api_key: int, api_version: int) -> int:
    """The version to answer a request of ``api_key`` asked in ``api_version`` with: that one
    when served, else the nearest served (an UnsupportedVersionError answer to a version too new
    or too old carries a body the broker can encode; the client reads the header's error)."""
    message_type = RESPONSE_TYPES.get(api_key)
    if message_type is None:
        return 0
    return min(max(api_version, message_type.MIN_VERSION), message_type.VERSION)


def _split(frames: Sequence[bytes | memoryview]) -> tuple[_Reader, memoryview]:
    if not frames:
        raise InvalidRequestError("a message has 1 or 2 frames, got 0")
    return _Reader(frames[0]), _payload(frames)


def _payload(frames: Sequence[bytes | memoryview]) -> memoryview:
    """The payload frame of a message (empty when it has none), once its frame count and size
    are checked; the head's reader is made first, so a request's header can be read before."""
    if len(frames) > 2:
        raise InvalidRequestError(f"a message has 1 or 2 frames, got {len(frames)}")
    total = sum(memoryview(f).nbytes for f in frames)
    if total > MAX_MESSAGE_BYTES:
        raise InvalidRequestError(f"message of {total} bytes exceeds {MAX_MESSAGE_BYTES}")
    return memoryview(frames[1]).cast("B") if len(frames) == 2 else memoryview(b"")


def _finish(reader: _Reader, message_type: type[Message], payload: memoryview, version: int) -> Message:
    values = _decode_values(message_type, reader, version)
    (payload_length,) = reader.unpack(_U32, "payload_length")
    if reader.remaining:
        raise InvalidRequestError(
            f"{reader.remaining} unexpected bytes after the body of {message_type.__name__}"
        )
    if payload_length != payload.nbytes:
        raise InvalidRequestError(
            f"payload_length says {payload_length} bytes, the payload frame has {payload.nbytes}"
        )
    return message_type(**values, payload=payload)


def decode_request(frames: Sequence[bytes | memoryview]) -> tuple[RequestHeader, Message]:
    """Parse a request from its frames, its body in the header's ``api_version`` (any of the
    type's ``MIN_VERSION`` .. ``VERSION``).  When the header parses but the rest does not, the
    InvalidRequestError or UnsupportedVersionError raised carries it as ``.header``, so the broker
    can still answer with the correlation id; without a header there is nobody to answer.  So a
    message of more than two frames, or over MAX_MESSAGE_BYTES, whose header parses is answered."""
    if not frames:
        raise InvalidRequestError("a message has 1 or 2 frames, got 0")
    reader = _Reader(frames[0])
    header = _decode_fields(RequestHeader, reader)
    try:
        payload = _payload(frames)
        message_type = REQUEST_TYPES.get(header.api_key)
        if message_type is None:
            raise UnsupportedVersionError(
                f"unknown api_key {header.api_key}; this broker serves {sorted(REQUEST_TYPES)}"
            )
        version = _check_version(message_type, header.api_version)
        return header, _finish(reader, message_type, payload, version)
    except (InvalidRequestError, UnsupportedVersionError) as e:
        e.header = header  # type: ignore[attr-defined]
        raise


def decode_response(api_key: int, frames: Sequence[bytes | memoryview],
                    version: int | None = None) -> tuple[ResponseHeader, Message]:
    """Parse the response to a request of ``api_key`` sent in ``version`` (None: the newest; the
    client knows what it asked)."""
    message_type = RESPONSE_TYPES.get(api_key)
    if message_type is None:
        raise UnsupportedVersionError(f"unknown api_key {api_key}")
    version = _check_version(message_type, version)
    reader, payload = _split(frames)
    header = _decode_fields(ResponseHeader, reader)
    return header, _finish(reader, message_type, payload, version)


# --- TCP framing --------------------------------------------------------------------------------

_TCP_PREFIX = struct.Struct("<II")  # head_length, payload_length


def frame_tcp(frames: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
    """The TCP form of a message given as ZeroMQ frames: ``head_length`` u32, ``payload_length``
    u32, then the head (header + body) and the payload.  A sender may write the prefix and head
    and then ``sendfile`` the payload straight from a segment file."""
    head = frames[0]
    payload_length = memoryview(frames[1]).nbytes if len(frames) > 1 else 0
    return [_TCP_PREFIX.pack(memoryview(head).nbytes, payload_length), *frames]


class TcpFrameDecoder:
    """Splits a TCP byte stream into messages; feed it what ``recv`` returned.

    Each complete message comes out as ZeroMQ-style frames (``[head]`` or ``[head, payload]``),
    so :func:`decode_request` and :func:`decode_response` parse both transports alike.  A message
    over ``max_message_bytes`` raises InvalidRequestError: the stream cannot be trusted after it,
    so the caller closes the connection.
    """

    def __init__(self, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self._buffer = bytearray()
        self._max = max_message_bytes

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes | memoryview) -> list[list[bytes]]:
        self._buffer += data
        messages = []
        while len(self._buffer) >= _TCP_PREFIX.size:
            head_length, payload_length = _TCP_PREFIX.unpack_from(self._buffer, 0)
            total = head_length + payload_length
            if total > self._max or head_length == 0:
                raise InvalidRequestError(
                    f"message of {head_length} + {payload_length} bytes: the head must be non-empty and "
                    f"the whole at most {self._max} bytes"
                )
            if len(self._buffer) < _TCP_PREFIX.size + total:
                break
            start = _TCP_PREFIX.size
            head = bytes(self._buffer[start : start + head_length])
            payload = bytes(self._buffer[start + head_length : start + total])
            del self._buffer[: start + total]
            messages.append([head, payload] if payload_length else [head])
        return messages


# --- the document's field tables ------------------------------------------------------------------


def schema_table(cls: type) -> str:
    """The markdown table of ``cls``'s fields as docs/PROTOCOL.md shows it (a test keeps the two
    equal): a field added in a later version has ``v<since>+`` in its third column, where the
    document's meaning starts.  Messages end with ``payload_length``."""
    rows = ["| field | type | meaning |", "|---|---|---|"]
    for entry in cls.SCHEMA:
        since = f" v{entry[2]}+ " if len(entry) > 2 else " "
        rows.append(f"| `{entry[0]}` | `{entry[1].name}` |{since}|")
    if isinstance(cls, type) and issubclass(cls, Message):
        rows.append("| `payload_length` | `u32` | |")
    return "\n".join(rows)


def _main() -> None:  # pragma: no cover - a documentation helper
    nested = (RequestHeader, ResponseHeader, *NESTED_TYPES)
    for cls in (*nested, *REQUEST_TYPES.values(), *RESPONSE_TYPES.values()):
        versions = f"versions {cls.MIN_VERSION}..{cls.VERSION}\n\n" if issubclass(cls, Message) else ""
        print(f"### {cls.__name__}\n\n{versions}{schema_table(cls)}\n")


if __name__ == "__main__":  # pragma: no cover
    _main()
