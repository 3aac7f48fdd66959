"""Every error hpbroker raises or sends over the wire.

One base class, :class:`HPBrokerError`, carries a wire ``code`` (an unsigned 16-bit number that the
protocol transmits) and a ``retriable`` flag telling a client whether the same request may succeed
if sent again.  :data:`ERRORS_BY_CODE` is the single table mapping codes back to classes, so a
client can rebuild the exception a broker reported.

Messages always carry the numbers involved (offset, position, file, expected versus actual), so a
log line is enough to locate the problem.

Code table (never renumber; append only):

====  ===============================  =========  =====================================================
code  class                            retriable  meaning
====  ===============================  =========  =====================================================
1     UnknownServerError               no         an unexpected failure inside the broker
2     CorruptRecordError               yes        a batch failed its CRC or its framing is broken
3     InvalidRecordError               no         a batch is well framed but its contents are inconsistent
4     RecordTooLargeError              no         a batch exceeds ``max_message_bytes``
5     OffsetOutOfRangeError            no         the offset is outside ``[log_start_offset, log_end_offset]``
6     UnknownTopicOrPartitionError     yes        no such topic or partition on this broker
7     StorageError                     yes        a disk operation failed; disk full: writes resume when freed
8     InvalidConfigError               no         a configuration value is out of range or malformed
9     UnsupportedVersionError          no         the request's API key or version is not served here
10    InvalidRequestError              no         a request is malformed: truncated, bad lengths, bad values
11    TopicAlreadyExistsError          no         create was asked for a topic that exists
12    RequestTimedOutError             yes        the broker could not finish the request in time
13    InvalidTopicError                no         a topic name is empty, too long or has bad characters
14    InvalidPartitionsError           no         a partition count is out of range
15    PartitionNotAvailableError       yes        its worker is starting, restarting or crash-looping
16    BrokerNotAvailableError          yes        client side: the broker cannot be reached (never sent)
17    CoordinationError                yes        ZooKeeper cannot be reached, or a registration there failed
18    DamagedRangeError                no         the offset is in a damaged range; says where reading resumes
19    InvalidTimestampError            no         a record's timestamp is too far ahead of the broker's clock
20    OutOfOrderSequenceError          no         a producer's sequence does not follow its last stored batch
21    ProducerFencedError              no         a producer's epoch is older than the partition has stored
22    UnknownProducerIdError           no         the producer id was never issued (see InitProducerId)
23    NotLeaderOrFollowerError         yes        this broker does not lead the partition; names the leader
24    NotEnoughReplicasError           yes        acks=-1 refused: the ISR is smaller than min_insync_replicas
25    FencedLeaderEpochError           yes        a replica fetch's leader epoch is older than the leader's
26    InvalidReplicationFactorError    no         a replication factor below 1 or above the live brokers
27    AuthenticationError              no         the key, or a data port's fetch token, is not accepted
28    AuthorizationError               no         the ACLs do not allow the principal this operation
====  ===============================  =========  =====================================================
"""

from __future__ import annotations

__all__ = [
    "ERRORS_BY_CODE",
    "AuthenticationError",
    "AuthorizationError",
    "BrokerNotAvailableError",
    "CoordinationError",
    "CorruptRecordError",
    "DamagedRangeError",
    "FencedLeaderEpochError",
    "HPBrokerError",
    "InvalidConfigError",
    "InvalidPartitionsError",
    "InvalidRecordError",
    "InvalidReplicationFactorError",
    "InvalidRequestError",
    "InvalidTimestampError",
    "InvalidTopicError",
    "NotEnoughReplicasError",
    "NotLeaderOrFollowerError",
    "OffsetOutOfRangeError",
    "OutOfOrderSequenceError",
    "PartitionNotAvailableError",
    "ProducerFencedError",
    "RecordTooLargeError",
    "RequestTimedOutError",
    "StorageError",
    "TopicAlreadyExistsError",
    "UnknownProducerIdError",
    "UnknownServerError",
    "UnknownTopicOrPartitionError",
    "UnsupportedVersionError",
    "error_for_code",
]


class HPBrokerError(Exception):
    """Base of every hpbroker error: a wire ``code`` and a ``retriable`` flag."""

    code: int = 1
    retriable: bool = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.__class__.__name__)
        self.message = message or self.__class__.__name__


class UnknownServerError(HPBrokerError):
    code = 1


class CorruptRecordError(HPBrokerError):
    """A record batch failed its CRC, or its lengths, magic or varints do not parse."""

    code = 2
    retriable = True


class InvalidRecordError(HPBrokerError):
    """A batch is well framed and its CRC matches, but its header disagrees with its records."""

    code = 3


class RecordTooLargeError(HPBrokerError):
    """A batch is larger than the log accepts (``max_message_bytes``)."""

    code = 4


class OffsetOutOfRangeError(HPBrokerError):
    """A read asked for an offset outside ``[log_start_offset, log_end_offset]``.

    The valid range travels with the error so a consumer can reset without another request.
    """

    code = 5

    def __init__(self, message: str = "", log_start_offset: int = -1, log_end_offset: int = -1) -> None:
        super().__init__(message)
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class UnknownTopicOrPartitionError(HPBrokerError):
    code = 6
    retriable = True


class StorageError(HPBrokerError):
    """A disk operation failed (the wrapped ``OSError`` is the ``__cause__``).  Retriable: a
    partition whose writes failed (a full disk says "no space left on device") refuses produce
    and takes writes again by itself once space is freed, or once its data on disk has been
    re-read after another write error (``hpbroker.io.log``)."""

    code = 7
    retriable = True


class InvalidConfigError(HPBrokerError, ValueError):
    """A configuration field is out of range or malformed; the message names the field."""

    code = 8


class UnsupportedVersionError(HPBrokerError):
    """The API key or version is not served; the message names the supported range."""

    code = 9


class InvalidRequestError(HPBrokerError):
    """A request does not parse: truncated, lengths that disagree, or values out of range."""

    code = 10


class TopicAlreadyExistsError(HPBrokerError):
    code = 11


class RequestTimedOutError(HPBrokerError):
    code = 12
    retriable = True


class InvalidTopicError(HPBrokerError):
    code = 13


class InvalidPartitionsError(HPBrokerError):
    code = 14


class PartitionNotAvailableError(HPBrokerError):
    """The partition exists but the worker owning it is not serving (booting, recovering, or held
    back after crash-looping: the message says when it is retried)."""

    code = 15
    retriable = True


class BrokerNotAvailableError(HPBrokerError):
    """Raised by clients, never sent by a broker: no connection to the broker (refused, lost, or
    no answer within the client's timeout)."""

    code = 16
    retriable = True


class CoordinationError(HPBrokerError):
    """ZooKeeper cannot be reached within the connect timeout, its session was lost in the middle
    of an operation, or a registration there conflicts with another live process (a broker id
    already registered by a broker at another address).  Raised by ``hpbroker.coord``; sent to an
    InitProducerId request when no producer id can be allocated now (the broker's next block of
    ids is not yet stored, in ZooKeeper or its data directory), and by a secured broker with
    ZooKeeper to every request but a super user's until it has read the ACLs ("ACLs not loaded
    yet")."""

    code = 17
    retriable = True


class DamagedRangeError(CorruptRecordError):
    """A read reached offsets the broker knows to be unreadable: stored bytes that failed their
    checks when the log was opened or read (a damaged range), or a segment missing from the
    middle of the log (a gap).  Acknowledged records may have been there; they cannot be served.

    ``first_offset`` is where the damaged range starts (-1 when unknown; a client, told only where
    the range ends, gives the offset it fetched, which lies in the range), ``next_offset`` the first
    offset after it, where reading can go on: a consumer may choose to skip to it.  It is a
    CorruptRecordError, so code that stops on corrupt data stops on it too, but it is not
    retriable: the same read gets the same answer until the range is deleted by retention.
    """

    code = 18
    retriable = False

    def __init__(self, message: str = "", first_offset: int = -1, next_offset: int = -1) -> None:
        super().__init__(message)
        self.first_offset = first_offset
        self.next_offset = next_offset


class InvalidTimestampError(HPBrokerError):
    """A batch holds a record timestamp further ahead of the broker's clock than the topic's
    ``message_timestamp_after_max_ms`` allows; nothing of the request is appended."""

    code = 19


class OutOfOrderSequenceError(HPBrokerError):
    """An idempotent batch's ``base_sequence`` is not the one after the producer's last stored
    batch on the partition (a gap, a partial overlap, a sequence older than the runs of batches
    remembered, a new epoch not starting at 0, or a request mixing stored and new batches).
    Nothing of the request is appended; the producer must take a new identity."""

    code = 20


class ProducerFencedError(HPBrokerError):
    """An idempotent batch's ``producer_epoch`` is older than the newest epoch the partition has
    stored for its producer id: a newer incarnation of the producer took over.  Nothing of the
    request is appended."""

    code = 21


class UnknownProducerIdError(HPBrokerError):
    """An idempotent batch names a producer id the broker (or cluster) never issued.  Nothing of
    the request is appended; get an id with InitProducerId."""

    code = 22


class NotLeaderOrFollowerError(HPBrokerError):
    """The partition is not led by this broker: a produce, a consumer's fetch or list offsets
    sent to a follower (or to a broker that has no replica of it), or a replica fetch sent to a
    broker that is not the leader.  The message names the leader when the broker knows it
    ("... the leader is broker 2 at 127.0.0.1:9192 (leader epoch 4)"); a client refreshes its
    metadata and sends the request again to the leader named there (Kafka's redirect)."""

    code = 23
    retriable = True


class NotEnoughReplicasError(HPBrokerError):
    """An acks=-1 produce refused before anything was appended: the partition's in-sync replicas
    are fewer than its ``min_insync_replicas`` (the message gives both and the ISR, e.g.
    ``orders-0: 1 in-sync replicas [2], min_insync_replicas is 2``).  Retriable: the ISR grows
    again once followers catch up; acks=1 is still served meanwhile."""

    code = 24
    retriable = True


class FencedLeaderEpochError(HPBrokerError):
    """A replica fetch's ``current_leader_epoch`` is older than the leader's: the follower acts on
    stale partition state and must refresh it (from ZooKeeper) before fetching again."""

    code = 25
    retriable = True


class InvalidReplicationFactorError(HPBrokerError):
    """A topic's replication factor is below 1, above the number of live brokers (the message
    names them), or above 1 on a broker without ZooKeeper; nothing was created."""

    code = 26


class AuthenticationError(HPBrokerError):
    """The connection is not authenticated.  Sent by a data port to a connection whose fetch
    token is missing, malformed, forged, expired, or whose principal's key is no longer on the
    allowlist (the connection is then closed); raised on the client when the broker refuses the
    client's CurveZMQ key (not on its allowlist, or the wrong server key), which libzmq reports
    as a failed handshake rather than as a response.  Get a new token (or fix the key) first:
    the same request fails again as it is."""

    code = 27


class AuthorizationError(HPBrokerError):
    """The ACLs do not allow the principal the operation on the resource; the message names the
    three (``principal 'alice' may not produce to topic 'orders'``).  Nothing was appended,
    created, deleted or changed."""

    code = 28


ERRORS_BY_CODE: dict[int, type[HPBrokerError]] = {
    cls.code: cls
    for cls in (
        UnknownServerError,
        CorruptRecordError,
        InvalidRecordError,
        RecordTooLargeError,
        OffsetOutOfRangeError,
        UnknownTopicOrPartitionError,
        StorageError,
        InvalidConfigError,
        UnsupportedVersionError,
        InvalidRequestError,
        TopicAlreadyExistsError,
        RequestTimedOutError,
        InvalidTopicError,
        InvalidPartitionsError,
        PartitionNotAvailableError,
        BrokerNotAvailableError,
        CoordinationError,
        DamagedRangeError,
        InvalidTimestampError,
        OutOfOrderSequenceError,
        ProducerFencedError,
        UnknownProducerIdError,
        NotLeaderOrFollowerError,
        NotEnoughReplicasError,
        FencedLeaderEpochError,
        InvalidReplicationFactorError,
        AuthenticationError,
        AuthorizationError,
    )
}


def error_for_code(code: int, message: str = "") -> HPBrokerError:
    """Rebuild the exception a peer reported; unknown codes become :class:`UnknownServerError`."""
    cls = ERRORS_BY_CODE.get(code, UnknownServerError)
    return cls(message or f"error code {code}")
