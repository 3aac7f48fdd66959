"""Type stub for the compiled record-batch core (``hpbroker/_core.pyx``).

The byte layout is specified in ``docs/FORMAT.md``; the constants below are the only source of its
numbers on the Python side.
"""

from array import array
from collections.abc import Iterator, Sequence

Buffer = bytes | bytearray | memoryview  # any object with the buffer protocol

MAGIC: int  # format version byte, 1
CODEC_NONE: int  # 0
CODEC_LZ4: int  # 1
CODEC_MASK: int  # attribute bits holding the codec
LOG_OVERHEAD: int  # 12: base_offset (8) + batch_length (4), the bytes before batch_length counts
HEADER_SIZE: int  # 56: the fixed header, before the producer name (or the identity block)
PRODUCER_IDENTITY_SIZE: int  # 12: producer_id i64 + producer_epoch i32, at 56 when attributes has bit 3
ATTR_IDEMPOTENT: int  # 0x08: attributes bit 3, the batch carries the producer identity block
NO_PRODUCER_ID: int  # -1: producer_id and producer_epoch of a batch without the block
CRC_START: int  # 20: the CRC covers bytes [CRC_START, end of batch)
MAX_PRODUCER_NAME_BYTES: int  # 255
BASE_OFFSET_POSITION: int  # 0
LEADER_EPOCH_POSITION: int  # 12

MAX_DECOMPRESSED_BYTES: int  # an lz4 records section may not inflate past this

def crc32c(data: Buffer, crc: int = 0) -> int:
    """CRC32C (Castagnoli) of ``data``, continuing from ``crc``; hardware-accelerated when the CPU can."""

def crc32c_hardware_accelerated() -> bool: ...
def _crc32c_table(data: Buffer, crc: int = 0) -> int: ...

class BatchHeader:
    """The fixed header of one batch, parsed (no CRC check)."""

    base_offset: int
    batch_length: int
    leader_epoch: int
    crc: int
    magic: int
    attributes: int
    compression: int
    last_offset_delta: int
    record_count: int
    first_timestamp: int
    max_timestamp: int
    base_sequence: int
    idempotent: bool  # attributes bit 3: the producer identity block follows the fixed header
    # NO_PRODUCER_ID (-1) without bit 3; None when read_header's buffer ends before the block does
    producer_id: int | None
    producer_epoch: int | None
    producer: str | None  # None when read_header's buffer ends before the name does
    producer_length: int  # bytes of the producer name as stored
    size: int  # LOG_OVERHEAD + batch_length: bytes the whole batch occupies
    last_offset: int  # base_offset + last_offset_delta
    next_offset: int  # last_offset + 1
    header_size: int  # where the producer name starts: HEADER_SIZE, + PRODUCER_IDENTITY_SIZE with bit 3
    records_position: int  # header_size + producer_length: where the records section starts

def read_header(buf: Buffer, position: int = 0) -> BatchHeader:
    """Parse the header of the batch starting at ``position``; raise CorruptRecordError on a bad magic,
    an impossible length, or a header cut off by the end of ``buf``.  The CRC is not checked.
    Only the 56-byte fixed header must be in ``buf``: ``producer_id`` and ``producer_epoch`` of an
    idempotent batch are None when its identity block (bytes 56-67) lies past the end, ``producer``
    when its name does."""

class ScanResult:
    """What :func:`scan_batches` found: the longest valid prefix of a buffer of batches."""

    valid_bytes: int  # length of the valid prefix, from the scan's start position
    batch_count: int
    record_count: int
    next_offset: int  # last_offset + 1 of the last valid batch, or the expected offset if none
    max_timestamp: int  # largest max_timestamp of the valid batches, -1 if none
    incomplete: bool  # stopped because the buffer ended inside a batch (more bytes may complete it)
    error: str | None  # why the scan stopped before the end, None if it reached the end cleanly
    error_code: int  # 0, or the HPBrokerError code matching ``error``: 2 corrupt (also when the
    # buffer ends inside a batch, with ``incomplete`` set), 3 invalid, 4 too large (checked from
    # the length field before the batch's bytes need to be present)
    # One entry per valid batch, in order; positions are absolute offsets into ``buf``.
    positions: array  # array('q')
    sizes: array  # array('q'): bytes of each batch
    base_offsets: array  # array('q'): as found in the bytes (0 in a batch a producer just built)
    last_offset_deltas: array  # array('q')
    max_timestamps: array  # array('q')
    producer_ids: array  # array('q'): NO_PRODUCER_ID (-1) for a batch without attributes bit 3
    producer_epochs: array  # array('q'): likewise
    base_sequences: array  # array('q'): as stored (-1 or any value without bit 3)
    idempotent_batches: int  # how many of the valid batches have attributes bit 3

def scan_batches(
    buf: Buffer,
    start: int = 0,
    *,
    expected_offset: int = -1,
    max_batch_bytes: int = 0x7FFFFFFF,
    deep: bool = False,
) -> ScanResult:
    """Walk the concatenated batches in ``buf[start:]`` and return the longest valid prefix.

    A batch is valid when its magic, lengths and CRC check out and its header is consistent
    (FORMAT.md "Validation"; an idempotent batch's identity and sequence range included);
    ``deep=True`` also decodes every
    record (decompressing lz4) and checks that record count, offset deltas and max timestamp agree
    with the header.  With ``expected_offset >= 0`` the first batch must have that base offset and
    each following batch must start right after its predecessor's last offset.  A batch longer than
    ``max_batch_bytes`` stops the scan with error_code 4.  Never raises for bad data.
    """

def validate_batches(buf: Buffer, *, max_batch_bytes: int = 0x7FFFFFFF) -> ScanResult:
    """Deep-validate that ``buf`` is one or more whole, valid batches, and nothing else.

    Raises CorruptRecordError (bad CRC, framing, or bytes left over), InvalidRecordError (header
    disagrees with records) or RecordTooLargeError (a batch over ``max_batch_bytes``).  Base offsets
    are not checked: producers send 0 and the log stamps the real one.
    """

def stamp_batch(buf: bytearray | memoryview, position: int, base_offset: int, leader_epoch: int = 0) -> None:
    """Write base_offset and leader_epoch into the writable batch at ``position``.  Both fields lie
    outside the CRC, so the batch stays valid.  Only the first 16 bytes of the batch need to be in
    ``buf`` (the log stamps a copy of just that prefix)."""

class Record:
    """One decoded record.  ``sequence`` is the batch's base_sequence plus the offset delta, or -1.
    ``topic`` and ``partition`` are where a consumer fetched it (None and -1 when not given)."""

    topic: str | None
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    producer: str
    sequence: int

def decode_records(
    buf: Buffer,
    *,
    verify_crc: bool = True,
    topic: str | None = None,
    partition: int = -1,
    min_offset: int = -(2**63),
) -> list[Record]:
    """Every record of every batch in ``buf`` (whole batches only), decompressing as needed.
    Raises CorruptRecordError on a bad CRC, truncated batch or bad framing.  Every record carries
    ``topic`` and ``partition``; records below ``min_offset`` are checked but left out (a fetch
    starts at the batch holding the offset asked for)."""

def iter_records(buf: Buffer, *, verify_crc: bool = True) -> Iterator[Record]:
    """Like :func:`decode_records`, batch by batch, for buffers too large to decode at once."""

def build_batch(
    values: Sequence[Buffer | None],
    *,
    keys: Sequence[Buffer | None] | None = None,
    timestamps: int | Sequence[int] | None = None,
    headers: Sequence[Sequence[tuple[str, Buffer | None]] | None] | None = None,
    producer: str = "",
    base_sequence: int = -1,
    compression: int = 0,
    base_offset: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
) -> bytes:
    """One batch holding ``values`` in order.  ``timestamps``: None for now (one clock read for the
    whole batch), an int for all records, or one int per record, in milliseconds since the epoch.
    ``producer_id >= 0`` (with ``producer_epoch`` in [0, 2**31 - 1] and ``base_sequence >= 0``)
    makes it idempotent: attributes bit 3 and the identity block.  ValueError for an identity or
    sequence range the format refuses."""

class BatchBuilder:
    """Accumulates records one at a time into a batch of at most ``max_bytes`` (records section,
    before compression)."""

    def __init__(
        self,
        producer: str = "",
        compression: int = 0,
        max_bytes: int = 1 << 20,
        base_sequence: int = -1,
        producer_id: int = -1,
        producer_epoch: int = -1,
    ) -> None:
        """``producer_id >= 0``: every batch built is idempotent (as :func:`build_batch`)."""
    record_count: int
    size_in_bytes: int  # bytes the batch would occupy uncompressed, identity block included
    def append(
        self,
        value: Buffer | None,
        key: Buffer | None = None,
        timestamp: int = -1,
        headers: Sequence[tuple[str, Buffer | None]] | None = None,
    ) -> bool:
        """Add a record; False (and nothing added) if it would overflow a non-empty batch.
        A timestamp < 0 means now."""
    def build(self, base_sequence: int | None = None, base_offset: int = 0) -> bytes:
        """The finished batch; the builder is then empty and reusable."""
    def reset(self) -> None: ...
