"""The producer's settings (:class:`ProducerConfig`), what it reports for an acknowledged
record (:class:`RecordMetadata`).

Pure values, no I/O: ``hpbroker.client.producer`` re-exports both classes (import them from
there or from ``hpbroker.client``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpbroker import protocol
from hpbroker.audit.events import AUDIT_TOPIC, DEFAULT_WINDOW_MS
from hpbroker.client.idempotence import MAX_UNSETTLED_REQUESTS
from hpbroker.client.partitioner import STICKY, Partitioner, partitioner_kind
from hpbroker.records import codec_for_name
from hpbroker.security.client import ClientSecurity

__all__ = ["ACKS_ALL", "ProducerConfig", "RecordMetadata", "parse_acks"]

#: acks=all on the wire: the leader answers once every in-sync replica has the records flushed.
ACKS_ALL = -1


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where an acknowledged record is: ``offset`` is -1 with ``acks=0`` (nobody answers)."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # ms since the epoch, as stored in the record
    #: True when the broker already had this record (an idempotent retry whose first attempt was
    #: stored): ``offset`` is where that first copy is, and nothing was appended again.
    deduplicated: bool = False


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """A producer's settings, validated on construction (ValueError names the field)."""

    #: 1: a record is acknowledged once the partition's leader has flushed it (per the topic's
    #: flush policy); -1 or "all" (kept as -1): once every in-sync replica has it flushed, each
    #: under its own flush policy (a replicated topic, docs/REPLICATION.md; on an unreplicated
    #: partition the same as 1); 0: requests are sent and never answered (no offsets, no retries
    #: after a send).  Default 1.
    acks: int | str = 1
    #: how long a batch that is not full may wait for more records before it is sent.  Default 5.
    linger_ms: float = 5
    #: the largest batch, header included, before compression; a record that cannot fit alone in
    #: one is refused by send().  Default 1 MiB (the broker's default max_message_bytes).
    batch_bytes: int = 1 << 20
    #: "lz4" or None: the codec of each batch's records section (a batch that lz4 would not
    #: shrink is sent uncompressed).  Default None.
    compression: str | None = None
    #: "sticky", "round_robin", or a callable (topic, key, partition_count) -> partition: see
    #: hpbroker.client.partitioner.  Keyed records always go to crc32c(key) mod partitions unless
    #: a callable decides.  Default "sticky".
    partitioner: str | Partitioner = STICKY
    #: the producer's name: in every batch header and as the requests' client_id (at most 255
    #: bytes of UTF-8).  Default "<host>-<pid>-<n>".
    name: str | None = None
    #: encoded records held (open, queued, in flight) before send() blocks.  Default 32 MiB.
    buffer_bytes: int = 32 << 20
    #: the largest ProduceRequest payload: a partition's due batches travel together up to this
    #: size.  Default 8 MiB.
    max_request_bytes: int = 8 << 20
    #: how long send() may block, learning a new topic's partitions or waiting for buffer room,
    #: before it raises.  Default 60000.
    max_block_ms: int = 60_000
    #: from a batch's first record to its acknowledgement, retries included; then its records
    #: fail with the last error.  Default 120000.
    delivery_timeout_ms: int = 120_000
    #: how long to wait for the response to one request.  Its timeout_ms on the wire is a tenth
    #: shorter (at most 1 s), so the broker's error 12 arrives while the client listens.
    #: Default 30000.
    request_timeout_ms: int = 30_000
    #: the first wait before a retry; it doubles on each retry of a request.  Default 100.
    retry_backoff_ms: int = 100
    #: the longest wait between retries.  Default 1000.
    retry_backoff_max_ms: int = 1000
    #: the topic monitoring events go to (hpbroker.audit.events: records acknowledged per topic
    #: and window, published every ``audit_window_ms`` and on close; the topic is created with
    #: one partition if missing), or None for no monitoring events.  Default "_audit".
    audit_topic: str | None = AUDIT_TOPIC
    #: the window of the monitoring counts, ms of record timestamps.  Default 10000.
    audit_window_ms: int = DEFAULT_WINDOW_MS
    #: the idempotent producer (docs/CLIENT.md): batches carry a producer id, epoch and sequence
    #: numbers, a retry resends the same bytes and the broker stores them once.  None: on unless
    #: acks=0 (nobody answers, so nothing is retried); True with acks=0 is a ValueError.  With
    #: acks="all" it is on by default, as in Kafka.
    #: Default None.
    enable_idempotence: bool | None = None
    #: requests of one partition in flight at once, 1 to 5, with idempotence (order and a
    #: single copy kept across retries; at most 5 because the partition leader remembers each
    #: producer's newest 5 runs of batches, and a request lies inside one); without it always 1.
    #: Each request carries every batch due, up to ``max_request_bytes``.  Default 5.
    max_in_flight_requests_per_partition: int = 5
    #: the producer's CurveZMQ identity for a broker with ``security = "curve"``
    #: (hpbroker.security.client.ClientSecurity).  None: from $HPBROKER_CLIENT_KEY_FILE and
    #: $HPBROKER_CLIENT_SERVER_KEY_FILE, else the client config file ($HPBROKER_CLIENT_CONFIG), else no
    #: security (``resolve_client_security``); the Producer keeps what it resolved here.
    #: Default None.
    security: ClientSecurity | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "acks", parse_acks(self.acks))
        if self.enable_idempotence is not None and not isinstance(self.enable_idempotence, bool):
            raise ValueError(f"enable_idempotence must be True, False or None, "
                             f"got {self.enable_idempotence!r}")
        if self.enable_idempotence and self.acks == 0:
            raise ValueError("enable_idempotence=True needs acks=1 or acks='all': with acks=0 nothing is "
                             "answered, so nothing is retried or deduplicated (leave enable_idempotence None "
                             "or False)")
        if (isinstance(self.max_in_flight_requests_per_partition, bool)
                or not isinstance(self.max_in_flight_requests_per_partition, int)
                or not 1 <= self.max_in_flight_requests_per_partition <= MAX_UNSETTLED_REQUESTS):
            raise ValueError(f"max_in_flight_requests_per_partition must be an int in [1, "
                             f"{MAX_UNSETTLED_REQUESTS}], got {self.max_in_flight_requests_per_partition!r}")
        if self.security is not None and not isinstance(self.security, ClientSecurity):
            raise ValueError(f"security must be a ClientSecurity or None, got {type(self.security).__name__}")
        codec_for_name(self.compression)
        partitioner_kind(self.partitioner)
        if self.name is not None and len(self.name.encode("utf-8")) > 255:
            raise ValueError(f"name is {len(self.name.encode('utf-8'))} bytes of UTF-8; at most 255 fit")
        _check_range("linger_ms", self.linger_ms, 0, 3_600_000)
        _check_range("batch_bytes", self.batch_bytes, 1024, protocol.MAX_MESSAGE_BYTES - 4096)
        _check_range("buffer_bytes", self.buffer_bytes, self.batch_bytes, 2**62)
        _check_range("max_request_bytes", self.max_request_bytes, self.batch_bytes,
                     protocol.MAX_MESSAGE_BYTES - 4096)
        if self.audit_topic is not None and (not isinstance(self.audit_topic, str) or not self.audit_topic):
            raise ValueError(f"audit_topic must be a topic name or None, got {self.audit_topic!r}")
        _check_range("audit_window_ms", self.audit_window_ms, 100, 86_400_000)
        if not isinstance(self.audit_window_ms, int):
            raise ValueError(f"audit_window_ms must be an int, got {self.audit_window_ms!r}")
        for field in ("max_block_ms", "delivery_timeout_ms", "request_timeout_ms", "retry_backoff_ms",
                      "retry_backoff_max_ms"):
            _check_range(field, getattr(self, field), 0 if "backoff" in field else 1, 2**32 - 1)

    @property
    def idempotent(self) -> bool:
        """Whether the producer is idempotent: ``enable_idempotence``, or when None, acks 1 or all."""
        return self.acks != 0 if self.enable_idempotence is None else self.enable_idempotence

    @property
    def max_in_flight(self) -> int:
        """Requests of one partition in flight at once: 1 unless idempotent."""
        return self.max_in_flight_requests_per_partition if self.idempotent else 1


def parse_acks(acks: object) -> int:
    """``acks`` as the wire carries it: 0, 1, or -1 for ``-1`` / ``"all"`` (any case; the strings
    "0", "1" and "-1" too, as a command line gives them).  ValueError for anything else."""
    if isinstance(acks, str):
        text = acks.strip().lower()
        if text == "all":
            return ACKS_ALL
        if text in ("0", "1", "-1"):
            return int(text)
    elif isinstance(acks, int) and not isinstance(acks, bool) and acks in (0, 1, ACKS_ALL):
        return acks
    raise ValueError(f"acks must be 0, 1, -1 or 'all', got {acks!r}")


def _check_range(field: str, value: Any, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ValueError(f"{field} must be a number in [{low}, {high}], got {value!r}")
