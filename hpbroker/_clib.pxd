# Shared C-level declarations for the compiled core: the record batch layout (docs/FORMAT.md)
# and the small C helpers under hpbroker/_csrc/.  Every number of the format is declared here,
# once; _core.pyx re-exports the public ones to Python.

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from cpython.buffer cimport PyObject_CheckBuffer
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec

cdef extern from "crc32c.h":
    uint32_t crc32c_update(uint32_t crc, const unsigned char *data, size_t n) nogil
    int crc32c_hardware() nogil
    uint32_t crc32c_update_sw(uint32_t crc, const unsigned char *data, size_t n) nogil

cdef extern from "byteorder.h":
    uint32_t load_u32le(const unsigned char *p) nogil
    int32_t load_i32le(const unsigned char *p) nogil
    int64_t load_i64le(const unsigned char *p) nogil
    void store_u32le(unsigned char *p, uint32_t v) nogil
    void store_i32le(unsigned char *p, int32_t v) nogil
    void store_i64le(unsigned char *p, int64_t v) nogil

cdef enum:
    MAGIC_V1 = 1               # the only format version so far
    C_LOG_OVERHEAD = 12          # base_offset + batch_length: bytes not counted by batch_length
    C_HEADER_SIZE = 56           # fixed header; the producer name (or the identity block) follows it
    C_IDENTITY_SIZE = 12         # producer identity block (attributes bit 3): producer_id, producer_epoch
    C_CRC_START = 20             # the CRC covers [C_CRC_START, end of batch)
    MAX_PRODUCER_NAME = 255    # producer name length is one byte

    # Field positions within a batch.
    P_BASE_OFFSET = 0          # i64, stamped by the broker, outside the CRC
    P_BATCH_LENGTH = 8         # i32, bytes after this field
    P_LEADER_EPOCH = 12        # i32, stamped by the broker, outside the CRC
    P_CRC = 16                 # u32, CRC32C of [C_CRC_START, end)
    P_MAGIC = 20               # u8
    P_ATTRIBUTES = 21          # u8, codec in bits 0-2
    P_PRODUCER_LEN = 22        # u8
    P_RESERVED = 23            # u8, zero
    P_LAST_OFFSET_DELTA = 24   # i32
    P_RECORD_COUNT = 28        # i32
    P_FIRST_TIMESTAMP = 32     # i64, ms since the epoch, timestamp of the first record
    P_MAX_TIMESTAMP = 40       # i64, largest record timestamp
    P_BASE_SEQUENCE = 48       # i64, producer sequence of the first record, -1 if none
    P_PRODUCER_ID = 56         # i64, only with ATTR_IDEMPOTENT_ (the identity block)
    P_PRODUCER_EPOCH = 64      # i32, only with ATTR_IDEMPOTENT_

    CODEC_NONE_ = 0
    CODEC_LZ4_ = 1
    CODEC_MASK_ = 0x07
    ATTR_IDEMPOTENT_ = 0x08    # attributes bit 3: the producer identity block follows the fixed header
    ATTR_UNUSED_ = 0xF0        # attributes bits 4-7: zero
    NO_PRODUCER_ID_ = -1       # producer_id and producer_epoch of a batch without the identity block


cdef inline Py_ssize_t batch_header_size(int attributes) noexcept nogil:
    """Bytes before the producer name: the fixed header, and the identity block when
    ``attributes`` has bit 3.  The name starts here, the records section ``producer_length``
    bytes later."""
    return C_HEADER_SIZE + C_IDENTITY_SIZE if attributes & ATTR_IDEMPOTENT_ else C_HEADER_SIZE


# ---------------------------------------------------------------------------------------------
# Primitives of the record encoding, shared by every compiled module that reads or writes records
# (inline: each module gets its own copy of the machine code, from this one source).

cdef inline int64_t now_ms() noexcept nogil:
    """Wall-clock time in ms since the epoch (record timestamps)."""
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <int64_t>ts.tv_sec * 1000 + ts.tv_nsec // 1000000


cdef inline int read_uvarint(const unsigned char** pp, const unsigned char* end, uint64_t* out) noexcept nogil:
    """Unsigned LEB128 at *pp; advances *pp.  -1 when it runs off ``end`` or exceeds 10 bytes."""
    cdef const unsigned char* p = pp[0]
    cdef uint64_t result = 0
    cdef int shift = 0
    cdef unsigned char b
    while p < end:
        b = p[0]
        p += 1
        result |= (<uint64_t>(b & 0x7F)) << shift
        if b < 0x80:
            pp[0] = p
            out[0] = result
            return 0
        shift += 7
        if shift > 63:
            return -1
    return -1


cdef inline int uvarint_size(uint64_t v) noexcept nogil:
    """Bytes of the unsigned LEB128 encoding of ``v`` (1 to 10)."""
    cdef int n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


cdef inline unsigned char* write_uvarint(unsigned char* p, uint64_t v) noexcept nogil:
    """Write ``v`` as unsigned LEB128 at ``p``; the byte after it."""
    while v >= 0x80:
        p[0] = <unsigned char>((v & 0x7F) | 0x80)
        v >>= 7
        p += 1
    p[0] = <unsigned char>v
    return p + 1


cdef inline uint64_t zigzag(int64_t v) noexcept nogil:
    """Signed to unsigned, small magnitudes to small numbers (0, -1, 1, -2 -> 0, 1, 2, 3)."""
    return (<uint64_t>v << 1) ^ <uint64_t>(v >> 63)


cdef inline int64_t unzigzag(uint64_t v) noexcept nogil:
    return <int64_t>(v >> 1) ^ -<int64_t>(v & 1)


cdef inline bint next_uvarint(const unsigned char** pp, const unsigned char* end, uint64_t* out) noexcept nogil:
    """:func:`read_uvarint` with the one-byte case (nearly every length in a record) inlined;
    True when a varint was read."""
    if pp[0] < end and pp[0][0] < 0x80:
        out[0] = pp[0][0]
        pp[0] += 1
        return True
    return read_uvarint(pp, end, out) == 0


# What read_record found wrong with a record (0: nothing); record_error words it.
cdef enum:
    RECORD_OK = 0
    RECORD_BAD_LENGTH = 1          # the length varint, or a length past the records section
    RECORD_BAD_PREFIX = 2          # timestamp delta, offset delta or key length unreadable
    RECORD_NEGATIVE_TIMESTAMP = 3
    RECORD_BAD_OFFSET_DELTA = 4    # not the record's index in the batch
    RECORD_FIRST_TIMESTAMP = 5     # the first record's delta is not 0
    RECORD_KEY_OVERRUNS = 6
    RECORD_VALUE_OVERRUNS = 7
    RECORD_BAD_HEADER_COUNT = 8


cdef struct RecordFields:
    # One record of a records section (docs/FORMAT.md), as read_record found it.
    const unsigned char* end       # the record's last byte + 1: where the next record starts
    int64_t timestamp_delta
    uint64_t offset_delta
    uint64_t key_field             # key_length as stored: 0 for a null key, else length + 1
    const unsigned char* key
    uint64_t value_field           # value_length as stored, likewise
    const unsigned char* value
    uint64_t header_count
    const unsigned char* headers   # the first header, right after header_count


cdef inline int read_record(const unsigned char** cur, const unsigned char* end, int32_t index,
                            int64_t first_timestamp, RecordFields* r) noexcept nogil:
    """Read record ``index`` at ``*cur`` up to its headers, checking its framing and prefix
    against the batch header; ``*cur`` moves to the next record.  RECORD_OK, or what is wrong
    (:func:`record_error`).  The one walk of record prefixes, for every decoder: the callers
    read the headers themselves and check that they end at ``r.end``."""
    cdef uint64_t length, raw
    cdef const unsigned char* q
    if not next_uvarint(cur, end, &length) or length > <uint64_t>(end - cur[0]):
        return RECORD_BAD_LENGTH
    q = cur[0]
    r.end = q + length
    cur[0] = r.end
    if not (next_uvarint(&q, r.end, &raw) and next_uvarint(&q, r.end, &r.offset_delta)
            and next_uvarint(&q, r.end, &r.key_field)):
        return RECORD_BAD_PREFIX
    r.timestamp_delta = unzigzag(raw)
    if first_timestamp + r.timestamp_delta < 0:
        return RECORD_NEGATIVE_TIMESTAMP
    if r.offset_delta != <uint64_t>index:
        return RECORD_BAD_OFFSET_DELTA
    if index == 0 and r.timestamp_delta != 0:
        return RECORD_FIRST_TIMESTAMP
    if r.key_field > <uint64_t>(r.end - q) + 1:
        return RECORD_KEY_OVERRUNS
    r.key = q
    if r.key_field:
        q += r.key_field - 1
    if not next_uvarint(&q, r.end, &r.value_field) or r.value_field > <uint64_t>(r.end - q) + 1:
        return RECORD_VALUE_OVERRUNS
    r.value = q
    if r.value_field:
        q += r.value_field - 1
    if not next_uvarint(&q, r.end, &r.header_count) or r.header_count > <uint64_t>(r.end - q):
        return RECORD_BAD_HEADER_COUNT
    r.headers = q
    return RECORD_OK


cdef inline str record_error(int code, int32_t index, int64_t first_timestamp, RecordFields* r):
    """Why read_record refused record ``index``: "record ..." for framing, "header: ..." where
    the record disagrees with the batch header."""
    if code == RECORD_BAD_LENGTH:
        return f"record {index}: length runs past the end of the records section"
    if code == RECORD_BAD_PREFIX:
        return f"record {index}: bad varint in its prefix"
    if code == RECORD_NEGATIVE_TIMESTAMP:
        return f"header: record {index} has a negative timestamp {first_timestamp + r.timestamp_delta}"
    if code == RECORD_BAD_OFFSET_DELTA:
        return f"header: record {index} has offset_delta {r.offset_delta}"
    if code == RECORD_FIRST_TIMESTAMP:
        return f"header: first record's timestamp differs from first_timestamp by {r.timestamp_delta}"
    if code == RECORD_KEY_OVERRUNS:
        return f"record {index}: key of {r.key_field - 1} bytes overruns the record"
    if code == RECORD_VALUE_OVERRUNS:
        return f"record {index}: value overruns the record"
    return f"record {index}: bad header count"


cdef inline bytes encode_headers(object headers):
    """The ``header_count`` varint and the headers, encoded, from ``[(str key, bytes-like value or
    None), ...]``: each key's varint length and UTF-8 bytes, each value's varint (length + 1, 0 for
    None) and bytes.  TypeError names what is not such a pair."""
    cdef bytearray out = bytearray()
    cdef unsigned char tmp[10]
    items = list(headers)
    out += (<char*>tmp)[:write_uvarint(tmp, len(items)) - tmp]
    for item in items:
        try:
            hkey, hvalue = item
        except (TypeError, ValueError):
            raise TypeError(f"headers must be (str key, bytes value) pairs, got {item!r}") from None
        if not isinstance(hkey, str):
            raise TypeError(f"header keys must be str, not {type(hkey).__name__}")
        k = hkey.encode("utf-8")
        out += (<char*>tmp)[:write_uvarint(tmp, len(k)) - tmp]
        out += k
        if hvalue is None:
            out.append(0)
            continue
        if not PyObject_CheckBuffer(hvalue):  # bytes(5) would be five zero bytes
            raise TypeError(f"header {hkey!r}: values must be bytes-like or None, not {type(hvalue).__name__}")
        v = bytes(hvalue)
        out += (<char*>tmp)[:write_uvarint(tmp, len(v) + 1) - tmp]
        out += v
    return bytes(out)
