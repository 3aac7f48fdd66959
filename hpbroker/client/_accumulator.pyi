"""Type stub for the producer's compiled core (``hpbroker/client/_accumulator.pyx``).

``Producer`` subclasses :class:`RecordAccumulator`; ``send`` and ``send_many`` are its send path.
The methods after them are the I/O thread's (see the module docstring of the ``.pyx``).
"""

from collections.abc import Callable, Sequence
from typing import Any

Buffer = bytes | bytearray | memoryview
RowsBuffer = Any  # an object with the buffer protocol: 2-D, C-contiguous, 1-byte items (numpy uint8)
Headers = Sequence[tuple[str, Buffer | None]]
Ready = list[tuple["PartitionQueue", list["Batch"]]]

PARTITIONER_STICKY: int
PARTITIONER_ROUND_ROBIN: int
PARTITIONER_CALLABLE: int

def partition_for_key(key: Buffer, partition_count: int) -> int:
    """CRC32C of the key's bytes (unsigned 32-bit) modulo ``partition_count`` (1 to 2**31 - 1;
    ValueError otherwise).  TypeError for a None key: it is no key."""

class Batch:
    """One partition's batch; after :meth:`RecordAccumulator.build_payload`, what settling it needs."""

    length: int  # bytes of the batch uncompressed, header included
    record_count: int
    first_timestamp: int
    max_timestamp: int
    min_timestamp: int
    created_s: float  # time.monotonic() of its first record
    batch_id: int
    base_sequence: int  # -1 until drained
    producer_id: int  # the identity it carries, set when drained; -1 when not idempotent
    producer_epoch: int  # likewise
    crc: int  # set by build_payload
    queue: PartitionQueue  # the partition it belongs to
    waiters: list[tuple[int, int, Any]] | None  # (index in batch, timestamp, future or callback)
    waiter_count: int
    window_counts: list[tuple[int, int]] | None  # [(window_start_ms, records)], set by build_payload

class PartitionQueue:
    topic: str
    partition: int
    muted: bool  # a request of this partition is in flight or waiting for a retry
    next_sequence: int  # the base_sequence its next drained batch gets
    @property
    def empty(self) -> bool: ...

class TopicState:
    name: str
    partition_count: int

class RecordAccumulator:
    header_room: int  # 56, + 12 when idempotent (the identity block), + bytes of the producer name
    idempotent: bool
    producer_id: int  # what drained batches carry; -1 until set_producer_identity
    producer_epoch: int
    batch_bytes: int
    codec: int
    linger_s: float
    buffered_bytes: int
    buffer_bytes: int
    closed: bool
    window_ms: int  # > 0: build_payload counts each batch's records per window of timestamps

    def __init__(
        self,
        producer_name: str = "",
        codec: int = 0,
        batch_bytes: int = 1 << 20,
        linger_ms: float = 5,
        buffer_bytes: int = 32 << 20,
        partitioner: int | Callable[[str, bytes | None, int], int] = ...,
        wake_fd: int = -1,
        window_ms: int = 0,
        idempotent: bool = False,
    ) -> None: ...
    def send(
        self,
        topic: str,
        value: Buffer | None,
        key: Buffer | None = None,
        headers: Headers | None = None,
        timestamp: int | None = None,
        partition: int | None = None,
        callback: Any = None,
    ) -> None:
        """Append one record to its partition's open batch.  ``timestamp``: an int (or int-like),
        TypeError for a float.  ``callback``: a Future or a callable ``(metadata, error)``, told
        when the record is acknowledged or failed."""
    def send_many(
        self,
        topic: str,
        values: Sequence[Buffer | None] | RowsBuffer,
        keys: Sequence[Buffer | None] | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
    ) -> int:
        """Append every value, in order, with one timestamp; the number appended.  ``values``: a
        sequence of bytes-like objects (or None), or one 2-D C-contiguous buffer of 1-byte items
        (a numpy uint8 array of shape (n, size), a memoryview cast to it) whose row i is value i,
        encoded straight from the buffer.  Any other buffer is read as a sequence of values;
        TypeError for a bytes-like object itself (one dimension of plain bytes)."""
    def send_internal(self, topic: str, partition: int, value: Buffer, key: Buffer, callback: Any) -> None:
        """The I/O thread's own record (a monitoring event), also after ``closed``; now as timestamp."""
    def set_partition_count(self, topic: str, count: int) -> None: ...
    def partition_count(self, topic: str) -> int: ...
    # --- the producer's side
    def set_wake_fd(self, fd: int) -> None: ...
    def wake(self) -> None: ...
    def woken(self) -> None: ...
    def mark_flush(self) -> int: ...
    def unfinished_through(self, batch_id: int) -> bool: ...
    @property
    def unfinished_batches(self) -> int: ...
    def close_for_sends(self) -> None: ...
    def set_producer_identity(self, producer_id: int, producer_epoch: int) -> None:
        """What batches drained from now on carry; every partition's next sequence back to 0.
        Only while no batch of the old identity is left to drain or resend.  RuntimeError when
        not idempotent; ValueError for an id < 0 or an epoch outside [0, 2**31 - 1]."""
    def drain(self, now_s: float, max_request_bytes: int) -> tuple[Ready, float]:
        """RuntimeError when idempotent and no identity was set yet."""
    def take_expired(self, cutoff_s: float) -> Ready:
        """The queued batches opened at or before ``cutoff_s`` (``time.monotonic()``), muted
        partitions included, oldest first; they leave without a sequence or identity, to be
        failed and finished by the caller."""
    def take_all(self) -> Ready:
        """Every unfinished batch that no request holds (when the producer gives up)."""
    def build_payload(self, batches: list[Batch]) -> bytes: ...
    def finish(self, batches: list[Batch]) -> None: ...
    # --- hooks a subclass overrides
    def _topic_partition_count(self, topic: str) -> int: ...
    def _wait_for_room(self) -> None: ...
    def _raise_closed(self) -> None: ...
