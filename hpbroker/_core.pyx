# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled core: record batches as bytes, in and out.

Only byte-crunching lives here: building a batch from many records, walking the batches of a
buffer (framing, CRC32C, the longest valid prefix), decoding records, and lz4 for the records
section.  No I/O, no sockets, no state beyond the objects returned.  The byte layout is
``docs/FORMAT.md``; its numbers are declared once, in ``_clib.pxd``.

Batch layout (all integers little-endian)::

    offset size field               notes
     0     8   base_offset  i64     stamped by the broker; outside the CRC
     8     4   batch_length i32     bytes after this field (whole batch = 12 + batch_length)
    12     4   leader_epoch i32     stamped by the broker; outside the CRC
    16     4   crc          u32     CRC32C of bytes [20, end of batch)
    20     1   magic        u8      1
    21     1   attributes   u8      bits 0-2 codec: 0 none, 1 lz4 frame; bit 3 idempotent; bits 4-7 zero
    22     1   producer_len u8      bytes of the producer name
    23     1   reserved     u8      zero
    24     4   last_offset_delta i32   record_count - 1
    28     4   record_count i32     >= 1
    32     8   first_timestamp i64  ms since the epoch; the first record's timestamp
    40     8   max_timestamp i64    largest record timestamp
    48     8   base_sequence i64    producer's sequence number of the first record, or -1
    56     h   only with attributes bit 3 (h = 12, else 0), the producer identity block:
    56     8     producer_id i64    >= 0, issued by the broker (InitProducerId)
    64     4     producer_epoch i32 >= 0
    56+h   n   producer name, UTF-8
    56+h+n ... records section (an lz4 frame of it when the codec is lz4)

With bit 3, ``base_sequence`` is the sequence of the first record on this partition for this
(producer_id, producer_epoch), from 0, and must stay >= 0 over the whole batch.  Without it the
bytes are exactly those of a batch before the block existed.

Record (varints are unsigned LEB128; ``zz`` marks zigzag-encoded signed ones)::

    length        varint   bytes of the record after this field
    ts_delta      zz       timestamp - first_timestamp
    offset_delta  varint   the record's index in the batch
    key_len       varint   0 = null key, else key length + 1
    key           bytes
    value_len     varint   0 = null value, else value length + 1
    value         bytes
    header_count  varint
    headers       header_count x (key_len varint, key UTF-8, value_len varint (0 = null, else
                  length + 1), value bytes)
"""

cimport cython
from cpython cimport array
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_CheckBuffer, PyObject_GetBuffer
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from libc.stdint cimport INT64_MAX, INT64_MIN, int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy, memset

from hpbroker._clib cimport *

import array as _pyarray

import lz4.frame as _lz4frame

from hpbroker.errors import CorruptRecordError, InvalidRecordError, RecordTooLargeError

MAGIC = MAGIC_V1
CODEC_NONE = CODEC_NONE_
CODEC_LZ4 = CODEC_LZ4_
CODEC_MASK = CODEC_MASK_
LOG_OVERHEAD = C_LOG_OVERHEAD
HEADER_SIZE = C_HEADER_SIZE
PRODUCER_IDENTITY_SIZE = C_IDENTITY_SIZE
ATTR_IDEMPOTENT = ATTR_IDEMPOTENT_
NO_PRODUCER_ID = NO_PRODUCER_ID_
CRC_START = C_CRC_START
MAX_PRODUCER_NAME_BYTES = MAX_PRODUCER_NAME
BASE_OFFSET_POSITION = P_BASE_OFFSET
LEADER_EPOCH_POSITION = P_LEADER_EPOCH
# A compressed records section may not inflate past this: it bounds what one hostile batch costs.
MAX_DECOMPRESSED_BYTES = 1 << 28

# Outcome codes of the C-level checks; 2-4 equal the HPBrokerError wire codes.
cdef enum:
    ST_OK = 0
    ST_INCOMPLETE = -1
    ST_CORRUPT = 2
    ST_INVALID = 3
    ST_TOO_LARGE = 4

_ERROR_CLASSES = {ST_CORRUPT: CorruptRecordError, ST_INVALID: InvalidRecordError, ST_TOO_LARGE: RecordTooLargeError}
_EMPTY = ()


def crc32c(data, uint32_t crc=0):
    """CRC32C (Castagnoli) of ``data``, continuing from ``crc``."""
    cdef const unsigned char[::1] view = data
    cdef Py_ssize_t n = view.shape[0]
    if n == 0:
        return crc
    with nogil:
        crc = crc32c_update(crc, &view[0], <size_t>n)
    return crc


def _crc32c_table(data, uint32_t crc=0):
    """The portable table path, whatever the CPU: for tests that compare both paths."""
    cdef const unsigned char[::1] view = data
    if view.shape[0] == 0:
        return crc
    return crc32c_update_sw(crc, &view[0], <size_t>view.shape[0])


def crc32c_hardware_accelerated():
    """True when CRC32C runs on the CPU's crc32 instruction."""
    return bool(crc32c_hardware())


# Varints, zigzag and the clock: hpbroker/_clib.pxd (shared with the producer's accumulator).


# ---------------------------------------------------------------------------------------------
# Headers

cdef struct Header:
    int64_t base_offset
    int32_t batch_length
    int32_t leader_epoch
    uint32_t crc
    int magic
    int attributes
    int producer_len
    int reserved
    int32_t last_offset_delta
    int32_t record_count
    int64_t first_timestamp
    int64_t max_timestamp
    int64_t base_sequence
    int64_t producer_id        # NO_PRODUCER_ID_ without bit 3, or when the block lies past ``avail``
    int32_t producer_epoch     # likewise
    bint identity_present      # bit 3 clear, or the block was within reach
    Py_ssize_t header_size     # where the producer name starts: 56, or 68 with bit 3
    Py_ssize_t size


cdef inline void _load_header(const unsigned char* p, Py_ssize_t avail, Header* h) noexcept nogil:
    """The fixed header, and the identity block when bit 3 has one and it is within ``avail``."""
    h.base_offset = load_i64le(p + P_BASE_OFFSET)
    h.batch_length = load_i32le(p + P_BATCH_LENGTH)
    h.leader_epoch = load_i32le(p + P_LEADER_EPOCH)
    h.crc = load_u32le(p + P_CRC)
    h.magic = p[P_MAGIC]
    h.attributes = p[P_ATTRIBUTES]
    h.producer_len = p[P_PRODUCER_LEN]
    h.reserved = p[P_RESERVED]
    h.last_offset_delta = load_i32le(p + P_LAST_OFFSET_DELTA)
    h.record_count = load_i32le(p + P_RECORD_COUNT)
    h.first_timestamp = load_i64le(p + P_FIRST_TIMESTAMP)
    h.max_timestamp = load_i64le(p + P_MAX_TIMESTAMP)
    h.base_sequence = load_i64le(p + P_BASE_SEQUENCE)
    h.size = C_LOG_OVERHEAD + <Py_ssize_t>h.batch_length
    h.header_size = batch_header_size(h.attributes)
    h.producer_id = NO_PRODUCER_ID_
    h.producer_epoch = NO_PRODUCER_ID_
    h.identity_present = True
    if h.attributes & ATTR_IDEMPOTENT_:
        h.identity_present = avail >= C_HEADER_SIZE + C_IDENTITY_SIZE
        if h.identity_present:
            h.producer_id = load_i64le(p + P_PRODUCER_ID)
            h.producer_epoch = load_i32le(p + P_PRODUCER_EPOCH)


cdef object _parse_header(const unsigned char* p, Py_ssize_t avail, Header* h, int64_t max_batch_bytes, int* code):
    """Framing of the fixed header only: lengths and magic.  None, or why not (``code`` set)."""
    cdef int32_t batch_length
    if avail < C_LOG_OVERHEAD:
        code[0] = ST_INCOMPLETE
        return f"batch header needs {C_LOG_OVERHEAD} bytes for its length, only {avail} available"
    batch_length = load_i32le(p + P_BATCH_LENGTH)
    if batch_length < C_HEADER_SIZE - C_LOG_OVERHEAD:
        code[0] = ST_CORRUPT
        return f"batch_length {batch_length} is below the minimum {C_HEADER_SIZE - C_LOG_OVERHEAD}"
    if avail > P_MAGIC and p[P_MAGIC] != MAGIC_V1:
        code[0] = ST_CORRUPT
        return f"unknown magic {p[P_MAGIC]} (expected {MAGIC_V1})"
    if C_LOG_OVERHEAD + <int64_t>batch_length > max_batch_bytes:
        code[0] = ST_TOO_LARGE
        return f"batch of {C_LOG_OVERHEAD + <int64_t>batch_length} bytes exceeds the limit of {max_batch_bytes} bytes"
    if avail < C_HEADER_SIZE:
        code[0] = ST_INCOMPLETE
        return f"batch header needs {C_HEADER_SIZE} bytes, only {avail} available"
    _load_header(p, avail, h)
    code[0] = ST_OK
    return None


cdef object _check_batch(const unsigned char* p, Py_ssize_t avail, Header* h, int64_t max_batch_bytes, bint deep, int* code):
    """Everything that can be checked without decoding records, then (``deep``) the records.

    Order matters: framing, then CRC (corrupt bytes), then header consistency (a producer's bug).
    """
    cdef uint32_t actual
    msg = _parse_header(p, avail, h, max_batch_bytes, code)
    if msg is not None:
        return msg
    if avail < h.size:
        code[0] = ST_INCOMPLETE
        return f"batch of {h.size} bytes is cut off after {avail} bytes"
    if h.header_size + h.producer_len > h.size:
        code[0] = ST_CORRUPT
        return _overrun_message(h)
    with nogil:
        actual = crc32c_update(0, p + C_CRC_START, <size_t>(h.size - C_CRC_START))
    if actual != h.crc:
        code[0] = ST_CORRUPT
        return f"CRC mismatch: stored 0x{h.crc:08x}, computed 0x{actual:08x}"
    code[0] = ST_INVALID
    if h.attributes & ATTR_UNUSED_ or (h.attributes & CODEC_MASK_) > CODEC_LZ4_:
        return f"unsupported attributes 0x{h.attributes:02x} (codec {h.attributes & CODEC_MASK_})"
    if h.reserved != 0:
        return f"reserved byte is {h.reserved}, expected 0"
    if h.record_count < 1:
        return f"record_count {h.record_count} must be at least 1"
    if h.last_offset_delta != h.record_count - 1:
        return f"last_offset_delta {h.last_offset_delta} does not match record_count {h.record_count}"
    if h.attributes & ATTR_IDEMPOTENT_:
        msg = _check_identity(h)
        if msg is not None:
            return msg
    if h.first_timestamp < 0:
        return f"first_timestamp {h.first_timestamp} is negative: every record carries a timestamp"
    if h.max_timestamp < h.first_timestamp:
        return f"max_timestamp {h.max_timestamp} is below first_timestamp {h.first_timestamp}"
    if deep:
        msg = _walk_batch(p, h, None)
        if msg is not None:
            # The CRC matched, so these bytes are what the producer built: its bug, not corruption.
            code[0] = ST_INVALID
            return msg
    code[0] = ST_OK
    return None


cdef str _overrun_message(Header* h):
    """Why the name does not fit: framing (FORMAT.md "Validation", step 2)."""
    if h.attributes & ATTR_IDEMPOTENT_:
        return (f"producer identity block and producer name of {h.producer_len} bytes (attributes "
                f"0x{h.attributes:02x}: {h.header_size + h.producer_len} header bytes) overrun a batch of "
                f"{h.size} bytes")
    return f"producer name of {h.producer_len} bytes overruns a batch of {h.size} bytes"


cdef object _check_identity(Header* h):
    """The identity block and the sequence range of an idempotent batch (FORMAT.md "Validation",
    step 4): None, or what is wrong.  ``last_offset_delta`` is already known to be >= 0."""
    if h.producer_id < 0:
        return f"producer_id {h.producer_id} is negative in an idempotent batch (attributes bit 3)"
    if h.producer_epoch < 0:
        return f"producer_epoch {h.producer_epoch} is negative in an idempotent batch (attributes bit 3)"
    if h.base_sequence < 0:
        return f"base_sequence {h.base_sequence} is negative in an idempotent batch (attributes bit 3)"
    if h.base_sequence > INT64_MAX - h.last_offset_delta:
        return (f"sequence range overflows: base_sequence {h.base_sequence} + last_offset_delta "
                f"{h.last_offset_delta} exceeds 2**63 - 1")
    return None


cdef object _producer_name(const unsigned char* p, Header* h):
    if h.producer_len == 0:
        return ""
    return p[h.header_size:h.header_size + h.producer_len].decode("utf-8", "replace")


cdef class BatchHeader:
    """The fixed header of one batch (see the module docstring for the layout)."""

    cdef readonly int64_t base_offset, leader_epoch, crc, first_timestamp, max_timestamp, base_sequence
    cdef readonly int64_t batch_length, last_offset_delta, record_count, size
    cdef readonly int magic, attributes, producer_length
    cdef readonly object producer, producer_id, producer_epoch

    @property
    def compression(self):
        return self.attributes & CODEC_MASK_

    @property
    def idempotent(self):
        """Attributes bit 3: the batch carries the producer identity block."""
        return bool(self.attributes & ATTR_IDEMPOTENT_)

    @property
    def header_size(self):
        """Bytes before the producer name: 56, or 68 with the identity block."""
        return batch_header_size(self.attributes)

    @property
    def last_offset(self):
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self):
        return self.base_offset + self.last_offset_delta + 1

    @property
    def records_position(self):
        return batch_header_size(self.attributes) + self.producer_length

    def __repr__(self):
        return (f"BatchHeader(base_offset={self.base_offset}, record_count={self.record_count}, "
                f"size={self.size}, crc=0x{self.crc:08x}, codec={self.compression}, "
                f"first_timestamp={self.first_timestamp}, max_timestamp={self.max_timestamp}, "
                f"producer={self.producer!r}, producer_id={self.producer_id}, "
                f"producer_epoch={self.producer_epoch}, base_sequence={self.base_sequence})")


cdef BatchHeader _header_object(const unsigned char* p, Py_ssize_t avail, Header* h):
    cdef BatchHeader out = BatchHeader.__new__(BatchHeader)
    out.base_offset = h.base_offset
    out.batch_length = h.batch_length
    out.leader_epoch = h.leader_epoch
    out.crc = h.crc
    out.magic = h.magic
    out.attributes = h.attributes
    out.producer_length = h.producer_len
    out.last_offset_delta = h.last_offset_delta
    out.record_count = h.record_count
    out.first_timestamp = h.first_timestamp
    out.max_timestamp = h.max_timestamp
    out.base_sequence = h.base_sequence
    out.size = h.size
    out.producer = _producer_name(p, h) if avail >= h.header_size + h.producer_len else None
    out.producer_id = h.producer_id if h.identity_present else None
    out.producer_epoch = h.producer_epoch if h.identity_present else None
    return out


def read_header(buf, Py_ssize_t position=0):
    """Parse the header of the batch at ``position`` (lengths and magic checked; CRC not).

    Needs at least ``C_HEADER_SIZE`` bytes there; ``producer`` is None when the name lies past the
    end of ``buf``, and ``producer_id`` and ``producer_epoch`` are None when the identity block of
    an idempotent batch does.  Raises CorruptRecordError for short or impossible headers.
    """
    cdef const unsigned char[::1] view = buf
    cdef Py_ssize_t n = view.shape[0]
    cdef Header h
    cdef int code = 0
    if position < 0 or position > n:
        raise ValueError(f"position {position} outside a buffer of {n} bytes")
    if n == position:
        raise CorruptRecordError(f"no batch header at position {position}: buffer ends there")
    msg = _parse_header(&view[0] + position, n - position, &h, 0x7FFFFFFFFFFF, &code)
    if msg is not None:
        raise CorruptRecordError(f"batch at position {position}: {msg}")
    return _header_object(&view[0] + position, n - position, &h)


def stamp_batch(buf, Py_ssize_t position, int64_t base_offset, int32_t leader_epoch=0):
    """Write ``base_offset`` and ``leader_epoch`` into the writable batch at ``position``.

    Both fields lie outside the CRC, so the batch stays valid without recomputing it.
    """
    cdef unsigned char[::1] view = buf
    if position < 0 or position + P_CRC > view.shape[0]:
        raise ValueError(f"no batch header at position {position} of a {view.shape[0]}-byte buffer")
    store_i64le(&view[0] + position + P_BASE_OFFSET, base_offset)
    store_i32le(&view[0] + position + P_LEADER_EPOCH, leader_epoch)


# ---------------------------------------------------------------------------------------------
# Records

@cython.freelist(1024)
@cython.no_gc
cdef class Record:
    """One decoded record; ``producer`` is the name its batch carries, ``sequence`` -1 if none.

    ``topic`` and ``partition`` say where a consumer fetched it from (None and -1 when decoded
    without them): the client hands these objects to applications as they are.

    Not tracked by the cyclic garbage collector: its fields are bytes, str, ints and a tuple of
    (str, bytes) pairs, which cannot lead back to it, and a consumer creates millions of them a
    second (tracking them tripled the cost of a decoded record, in gen-0 collections)."""

    cdef readonly int64_t offset, timestamp, sequence, partition
    cdef readonly object key, value, headers, producer, topic

    def __repr__(self):
        where = "" if self.topic is None else f"topic={self.topic!r}, partition={self.partition}, "
        return (f"Record({where}offset={self.offset}, timestamp={self.timestamp}, key={self.key!r}, "
                f"value={self.value!r}, headers={self.headers!r}, producer={self.producer!r}, "
                f"sequence={self.sequence})")

    def __eq__(self, other):
        if not isinstance(other, Record):
            return NotImplemented
        return self._astuple() == (<Record>other)._astuple()

    def __hash__(self):
        return hash(self._astuple())

    def _astuple(self):
        return (self.offset, self.timestamp, self.key, self.value, self.headers, self.producer, self.sequence,
                self.topic, self.partition)

    def __reduce__(self):
        return (_make_record, self._astuple())


def _make_record(offset, timestamp, key, value, headers, producer, sequence, topic=None, partition=-1):
    cdef Record r = Record.__new__(Record)
    r.offset, r.timestamp, r.key, r.value = offset, timestamp, key, value
    r.headers, r.producer, r.sequence = headers, producer, sequence
    r.topic, r.partition = topic, partition
    return r


cdef object _records_section(const unsigned char* p, Header* h):
    """The records section of a checked batch, decompressed when needed; None if lz4 fails."""
    cdef Py_ssize_t start = h.header_size + h.producer_len
    if h.attributes & CODEC_MASK_ == CODEC_NONE_:
        return None
    section = PyBytes_FromStringAndSize(<const char*>p + start, h.size - start)
    try:
        decompressor = _lz4frame.LZ4FrameDecompressor()
        plain = decompressor.decompress(section, max_length=MAX_DECOMPRESSED_BYTES)
        if not decompressor.eof:
            raise ValueError(f"frame incomplete or inflates past {MAX_DECOMPRESSED_BYTES} bytes")
        if decompressor.unused_data:
            raise ValueError(f"{len(decompressor.unused_data)} bytes after the lz4 frame")
    except Exception as e:
        return e
    return plain


cdef bint _records_look_valid(const unsigned char* cur, const unsigned char* end, int32_t count,
                              int64_t min_timestamp_delta, int64_t max_timestamp_delta) noexcept nogil:
    """The check of :func:`_walk_batch` for header-less records, without building anything.

    True when every rule holds; False when a rule fails *or* a record has headers, and the
    caller then runs the full walk, which handles headers and words the error.  The next record
    is located from the length field alone (``cur = rec_end``), so the CPU can check one
    record's fields while it already loads the next record's length.
    """
    cdef const unsigned char* rec_end
    cdef const unsigned char* q
    cdef uint64_t length, raw = 0, offset_delta = 0, key_len = 0, value_len = 0, header_count = 0
    cdef int64_t ts_delta, max_delta = 0
    cdef int32_t i
    cdef bint ok = True
    for i in range(count):
        if not next_uvarint(&cur, end, &length) or length > <uint64_t>(end - cur):
            return False
        q = cur
        rec_end = cur + length
        cur = rec_end
        ok &= (next_uvarint(&q, rec_end, &raw) and next_uvarint(&q, rec_end, &offset_delta)
               and next_uvarint(&q, rec_end, &key_len))
        ts_delta = unzigzag(raw)
        ok &= offset_delta == <uint64_t>i and (i != 0 or ts_delta == 0) and ts_delta >= min_timestamp_delta
        if ts_delta > max_delta:
            max_delta = ts_delta
        ok &= key_len <= <uint64_t>(rec_end - q) + 1
        if not ok:
            return False
        if key_len:
            q += key_len - 1
        ok &= next_uvarint(&q, rec_end, &value_len) and value_len <= <uint64_t>(rec_end - q) + 1
        if not ok:
            return False
        if value_len:
            q += value_len - 1
        ok &= next_uvarint(&q, rec_end, &header_count) and header_count == 0 and q == rec_end
    return ok and cur == end and max_delta == max_timestamp_delta


cdef object _walk_batch(const unsigned char* p, Header* h, list out, object topic=None,
                        int64_t partition=-1, int64_t min_offset=INT64_MIN):
    """Decode (``out`` not None) or just check every record of a CRC-checked batch.

    Returns None, or why the records disagree with the framing ("record ...") or with the
    header ("header ...").  Appends Record objects to ``out``, tagged with ``topic`` and
    ``partition``, for the records at ``min_offset`` and after (every record is still checked).
    """
    cdef const unsigned char* cur
    cdef const unsigned char* end
    cdef const unsigned char* rec_end
    cdef const unsigned char* q
    cdef RecordFields r
    cdef int code
    cdef uint64_t hk_len, hv_len
    cdef int64_t ts_delta, max_delta = 0
    cdef int32_t i
    cdef uint64_t j
    cdef bint fast_ok
    cdef Record rec
    cdef object key, value, headers, hkey, hvalue
    section = _records_section(p, h)
    if section is None:
        cur = p + h.header_size + h.producer_len
        end = p + h.size
    elif isinstance(section, Exception):
        return f"records section does not decompress: {section}"
    else:
        cur = <const unsigned char*>PyBytes_AS_STRING(section)
        end = cur + PyBytes_GET_SIZE(section)
    if out is None:
        with nogil:
            fast_ok = _records_look_valid(cur, end, h.record_count, -h.first_timestamp,
                                          h.max_timestamp - h.first_timestamp)
        if fast_ok:
            return None
    producer = _producer_name(p, h) if out is not None else None
    for i in range(h.record_count):
        code = read_record(&cur, end, i, h.first_timestamp, &r)
        if code != RECORD_OK:
            return record_error(code, i, h.first_timestamp, &r)
        ts_delta = r.timestamp_delta
        if ts_delta > max_delta:
            max_delta = ts_delta
        key = value = None
        if out is not None:
            if r.key_field:
                key = PyBytes_FromStringAndSize(<const char*>r.key, r.key_field - 1)
            if r.value_field:
                value = PyBytes_FromStringAndSize(<const char*>r.value, r.value_field - 1)
        q = r.headers
        rec_end = r.end
        headers = _EMPTY
        if r.header_count:
            hlist = []
            for j in range(r.header_count):
                if read_uvarint(&q, rec_end, &hk_len) < 0 or hk_len > <uint64_t>(rec_end - q):
                    return f"record {i}: header {j} key overruns the record"
                try:
                    hkey = (<const char*>q)[:hk_len].decode("utf-8")
                except UnicodeDecodeError:
                    return f"record {i}: header {j} key is not UTF-8"
                q += hk_len
                if read_uvarint(&q, rec_end, &hv_len) < 0 or hv_len > <uint64_t>(rec_end - q) + 1:
                    return f"record {i}: header {j} value overruns the record"
                hvalue = None if hv_len == 0 else PyBytes_FromStringAndSize(<const char*>q, hv_len - 1)
                if hv_len:
                    q += hv_len - 1
                hlist.append((hkey, hvalue))
            headers = tuple(hlist)
        if q != rec_end:
            return f"record {i}: {rec_end - q} unparsed bytes inside the record"
        if out is not None and h.base_offset + i >= min_offset:
            rec = Record.__new__(Record)
            rec.offset = h.base_offset + i
            rec.timestamp = h.first_timestamp + ts_delta
            rec.sequence = h.base_sequence + i if h.base_sequence >= 0 else -1
            rec.key = key
            rec.value = value
            rec.headers = headers
            rec.producer = producer
            rec.topic = topic
            rec.partition = partition
            out.append(rec)
    if cur != end:
        return f"{end - cur} bytes left after record {h.record_count - 1} of the records section"
    if h.first_timestamp + max_delta != h.max_timestamp:
        return f"header: max_timestamp {h.max_timestamp} but records reach {h.first_timestamp + max_delta}"
    return None


cdef Py_ssize_t _decode_one(const unsigned char* p, Py_ssize_t avail, Py_ssize_t position, bint verify_crc, list out,
                            object topic=None, int64_t partition=-1, int64_t min_offset=INT64_MIN) except -1:
    """Decode the batch at ``p`` into ``out``; returns its size.  Raises on any defect."""
    cdef Header h
    cdef int code = 0
    cdef uint32_t actual
    msg = _parse_header(p, avail, &h, 0x7FFFFFFFFFFF, &code)
    if msg is None and avail < h.size:
        msg = f"batch of {h.size} bytes is cut off after {avail} bytes"
    if msg is None and h.header_size + h.producer_len > h.size:
        msg = _overrun_message(&h)
    if msg is None and verify_crc:
        actual = crc32c_update(0, p + C_CRC_START, <size_t>(h.size - C_CRC_START))
        if actual != h.crc:
            msg = f"CRC mismatch: stored 0x{h.crc:08x}, computed 0x{actual:08x}"
    if msg is None and (h.record_count < 1 or (h.attributes & CODEC_MASK_) > CODEC_LZ4_):
        msg = f"record_count {h.record_count}, attributes 0x{h.attributes:02x} are not decodable"
    if msg is None:
        msg = _walk_batch(p, &h, out, topic, partition, min_offset)
    if msg is not None:
        raise CorruptRecordError(f"batch at position {position} (base offset {h.base_offset if avail >= C_HEADER_SIZE else -1}): {msg}")
    return h.size


def decode_records(buf, *, bint verify_crc=True, topic=None, int64_t partition=-1,
                   int64_t min_offset=INT64_MIN):
    """Every record of the whole batches in ``buf``, in order.  Raises CorruptRecordError.

    A consumer passes ``topic`` and ``partition`` (carried by every record) and its fetch offset
    as ``min_offset``: a fetch starts at the batch holding that offset, and the records before it
    are checked but not returned."""
    cdef const unsigned char[::1] view = buf
    cdef Py_ssize_t n = view.shape[0], pos = 0
    cdef list out = []
    while pos < n:
        pos += _decode_one(&view[0] + pos, n - pos, pos, verify_crc, out, topic, partition, min_offset)
    return out


cdef class RecordIterator:
    """Iterates the records of a buffer of batches, decoding one batch at a time."""

    cdef const unsigned char[::1] view
    cdef Py_ssize_t position, index
    cdef list batch
    cdef bint verify_crc

    def __iter__(self):
        return self

    def __next__(self):
        cdef Py_ssize_t n = self.view.shape[0]
        while self.index >= len(self.batch):
            if self.position >= n:
                raise StopIteration
            self.batch = []
            self.index = 0
            self.position += _decode_one(&self.view[0] + self.position, n - self.position,
                                         self.position, self.verify_crc, self.batch)
        self.index += 1
        return self.batch[self.index - 1]


def iter_records(buf, *, bint verify_crc=True):
    """Like :func:`decode_records`, one batch at a time."""
    cdef RecordIterator it = RecordIterator.__new__(RecordIterator)
    if len(memoryview(buf)) == 0:
        return iter(())
    it.view = buf
    it.batch = []
    it.verify_crc = verify_crc
    return it


# ---------------------------------------------------------------------------------------------
# Scanning

cdef class ScanResult:
    """The longest valid prefix of a buffer of batches, and one entry per valid batch."""

    cdef readonly Py_ssize_t valid_bytes, batch_count, record_count, idempotent_batches
    cdef readonly int64_t next_offset, max_timestamp
    cdef readonly bint incomplete
    cdef readonly object error
    cdef readonly int error_code
    cdef readonly array.array positions, sizes, base_offsets, last_offset_deltas, max_timestamps
    cdef readonly array.array producer_ids, producer_epochs, base_sequences

    def __repr__(self):
        return (f"ScanResult(valid_bytes={self.valid_bytes}, batch_count={self.batch_count}, "
                f"record_count={self.record_count}, next_offset={self.next_offset}, "
                f"incomplete={self.incomplete}, error={self.error!r})")


cdef inline void _push(array.array a, Py_ssize_t i, int64_t v):
    if i >= len(a):
        array.resize_smart(a, i + 1)
    a.data.as_longlongs[i] = v


cdef array.array _int64_array():
    return array.array("q")


def scan_batches(buf, Py_ssize_t start=0, *, int64_t expected_offset=-1,
                 int64_t max_batch_bytes=0x7FFFFFFF, bint deep=False):
    """Walk ``buf[start:]`` batch by batch and return the longest valid prefix (never raises
    for bad data; see ``_core.pyi``)."""
    cdef const unsigned char[::1] view = buf
    cdef Py_ssize_t n = view.shape[0], pos = start, count = 0
    cdef Header h
    cdef int code = 0
    cdef ScanResult r = ScanResult.__new__(ScanResult)
    if start < 0 or start > n:
        raise ValueError(f"start {start} outside a buffer of {n} bytes")
    r.positions, r.sizes, r.base_offsets = _int64_array(), _int64_array(), _int64_array()
    r.last_offset_deltas, r.max_timestamps = _int64_array(), _int64_array()
    r.producer_ids, r.producer_epochs, r.base_sequences = _int64_array(), _int64_array(), _int64_array()
    r.max_timestamp = -1
    r.next_offset = expected_offset
    r.error = None
    while pos < n:
        msg = _check_batch(&view[0] + pos, n - pos, &h, max_batch_bytes, deep, &code)
        if msg is None and expected_offset >= 0 and h.base_offset != expected_offset:
            code = ST_CORRUPT
            msg = f"base offset {h.base_offset}, expected {expected_offset}"
        if msg is not None:
            r.incomplete = code == ST_INCOMPLETE
            r.error_code = ST_CORRUPT if code == ST_INCOMPLETE else code
            r.error = f"batch at position {pos}: {msg}"
            break
        _push(r.positions, count, pos)
        _push(r.sizes, count, h.size)
        _push(r.base_offsets, count, h.base_offset)
        _push(r.last_offset_deltas, count, h.last_offset_delta)
        _push(r.max_timestamps, count, h.max_timestamp)
        _push(r.producer_ids, count, h.producer_id)
        _push(r.producer_epochs, count, h.producer_epoch)
        _push(r.base_sequences, count, h.base_sequence)
        if h.attributes & ATTR_IDEMPOTENT_:
            r.idempotent_batches += 1
        count += 1
        r.record_count += h.record_count
        r.next_offset = h.base_offset + h.last_offset_delta + 1
        if expected_offset >= 0:
            expected_offset = r.next_offset
        if h.max_timestamp > r.max_timestamp:
            r.max_timestamp = h.max_timestamp
        pos += h.size
    r.batch_count = count
    r.valid_bytes = pos - start
    for a in (r.positions, r.sizes, r.base_offsets, r.last_offset_deltas, r.max_timestamps,
              r.producer_ids, r.producer_epochs, r.base_sequences):
        array.resize(a, count)
    return r


def validate_batches(buf, *, int64_t max_batch_bytes=0x7FFFFFFF):
    """Deep-validate that ``buf`` holds whole valid batches and nothing else; raise otherwise."""
    if len(memoryview(buf)) == 0:
        raise CorruptRecordError("empty record set: expected at least one batch")
    cdef ScanResult r = scan_batches(buf, 0, max_batch_bytes=max_batch_bytes, deep=True)
    if r.error is not None:
        raise _ERROR_CLASSES[r.error_code](r.error)
    return r


# ---------------------------------------------------------------------------------------------
# Building

cdef inline int _borrow(object obj, Py_buffer* view, const unsigned char** ptr, Py_ssize_t* size) except -1:
    """Pointer and size of a bytes-like; returns 1 when ``view`` must be released."""
    if PyBytes_CheckExact(obj):
        ptr[0] = <const unsigned char*>PyBytes_AS_STRING(obj)
        size[0] = PyBytes_GET_SIZE(obj)
        return 0
    if isinstance(obj, str):
        raise TypeError("record keys and values must be bytes-like or None, not str (encode it first)")
    PyObject_GetBuffer(obj, view, PyBUF_SIMPLE)
    ptr[0] = <const unsigned char*>view.buf
    size[0] = view.len
    return 1


cdef int _check_identity_args(int64_t producer_id, int64_t producer_epoch) except -1:
    """A producer identity to build with: none (-1, -1), or an id >= 0 with an epoch in [0, 2**31 - 1]."""
    if producer_id == NO_PRODUCER_ID_:
        if producer_epoch != NO_PRODUCER_ID_:
            raise ValueError(f"producer_epoch {producer_epoch} without a producer_id: give both or neither")
        return 0
    if producer_id < 0:
        raise ValueError(f"producer_id {producer_id} must be >= 0 (or -1: not idempotent)")
    if not 0 <= producer_epoch <= 0x7FFFFFFF:
        raise ValueError(f"producer_epoch {producer_epoch} must be in [0, 2**31 - 1] with producer_id {producer_id}")
    return 0


cdef class BatchBuilder:
    """Accumulates records into one batch (see ``_core.pyi``).  Not thread-safe."""

    cdef unsigned char* buf
    cdef Py_ssize_t capacity, length, max_bytes
    cdef readonly int32_t record_count
    cdef int64_t first_timestamp, max_timestamp, base_sequence, producer_id
    cdef int32_t producer_epoch
    cdef Py_ssize_t header_size  # 56, or 68 with the identity block
    cdef bytes producer_bytes
    cdef int compression

    def __cinit__(self, producer="", int compression=0, Py_ssize_t max_bytes=1 << 20, int64_t base_sequence=-1,
                  int64_t producer_id=NO_PRODUCER_ID_, int64_t producer_epoch=NO_PRODUCER_ID_):
        name = producer.encode("utf-8") if isinstance(producer, str) else bytes(producer)
        if len(name) > MAX_PRODUCER_NAME:
            raise ValueError(f"producer name is {len(name)} bytes; at most {MAX_PRODUCER_NAME} fit")
        if compression not in (CODEC_NONE_, CODEC_LZ4_):
            raise ValueError(f"unknown compression codec {compression} (0 none, 1 lz4)")
        _check_identity_args(producer_id, producer_epoch)
        self.header_size = C_HEADER_SIZE + C_IDENTITY_SIZE if producer_id >= 0 else C_HEADER_SIZE
        if max_bytes < self.header_size:
            raise ValueError(f"max_bytes {max_bytes} is below the {self.header_size}-byte header")
        self.producer_bytes = name
        self.compression = compression
        self.max_bytes = max_bytes
        self.base_sequence = base_sequence
        self.producer_id = producer_id
        self.producer_epoch = <int32_t>producer_epoch

    def __dealloc__(self):
        free(self.buf)

    @property
    def size_in_bytes(self):
        return self.header_size + len(self.producer_bytes) + self.length

    cdef int _reserve(self, Py_ssize_t extra) except -1:
        cdef Py_ssize_t want = self.length + extra, cap = self.capacity or 4096
        cdef unsigned char* grown
        if want <= self.capacity:
            return 0
        while cap < want:
            cap *= 2
        grown = <unsigned char*>realloc(self.buf, cap)
        if grown == NULL:
            raise MemoryError(f"cannot grow a batch buffer to {cap} bytes")
        self.buf = grown
        self.capacity = cap
        return 0

    cdef int _append(self, object value, object key, int64_t timestamp, object headers, bint check_room) except -1:
        """Encode one record at the end; 0 when it did not fit (and nothing changed), else 1."""
        cdef Py_buffer vbuf, kbuf
        cdef const unsigned char* vptr = NULL
        cdef const unsigned char* kptr = NULL
        cdef Py_ssize_t vlen = 0, klen = 0, body, total
        cdef int vrel = 0, krel = 0
        cdef int64_t delta
        cdef unsigned char* w
        cdef bytes encoded_headers = b""
        if timestamp < 0:
            timestamp = now_ms()
        if self.record_count == 0:
            self.first_timestamp = timestamp
            self.max_timestamp = timestamp
        delta = timestamp - self.first_timestamp
        if headers:
            encoded_headers = encode_headers(headers)
        try:
            if value is not None:
                vrel = _borrow(value, &vbuf, &vptr, &vlen)
            if key is not None:
                krel = _borrow(key, &kbuf, &kptr, &klen)
            body = (uvarint_size(zigzag(delta)) + uvarint_size(self.record_count)
                    + uvarint_size(klen + 1 if key is not None else 0) + klen
                    + uvarint_size(vlen + 1 if value is not None else 0) + vlen
                    + (len(encoded_headers) if headers else 1))
            total = uvarint_size(body) + body
            if check_room and self.record_count > 0 and self.size_in_bytes + total > self.max_bytes:
                return 0
            self._reserve(total)
            w = self.buf + self.length
            w = write_uvarint(w, body)
            w = write_uvarint(w, zigzag(delta))
            w = write_uvarint(w, self.record_count)
            w = write_uvarint(w, klen + 1 if key is not None else 0)
            if klen:
                memcpy(w, kptr, klen)
                w += klen
            w = write_uvarint(w, vlen + 1 if value is not None else 0)
            if vlen:
                memcpy(w, vptr, vlen)
                w += vlen
            if headers:
                memcpy(w, PyBytes_AS_STRING(encoded_headers), len(encoded_headers))
                w += len(encoded_headers)
            else:
                w[0] = 0
                w += 1
        finally:
            if vrel:
                PyBuffer_Release(&vbuf)
            if krel:
                PyBuffer_Release(&kbuf)
        self.length += total
        self.record_count += 1
        if timestamp > self.max_timestamp:
            self.max_timestamp = timestamp
        return 1

    def append(self, value, key=None, int64_t timestamp=-1, headers=None):
        """Add a record; False (nothing added) when it would overflow a non-empty batch."""
        return self._append(value, key, timestamp, headers, True) == 1

    def reset(self):
        self.length = 0
        self.record_count = 0

    def build(self, base_sequence=None, int64_t base_offset=0):
        """The finished batch as bytes; the builder is empty afterwards."""
        if self.record_count == 0:
            raise ValueError("cannot build an empty batch: append at least one record")
        if base_sequence is not None:
            self.base_sequence = base_sequence
        self._check_sequence()  # before the records are dropped: the caller may build again
        try:
            return self._finish(base_offset)
        finally:
            self.reset()

    cdef int _check_sequence(self) except -1:
        """An idempotent batch's sequence range must be valid (FORMAT.md "Validation", step 4)."""
        if self.producer_id >= 0 and not 0 <= self.base_sequence <= INT64_MAX - (self.record_count - 1):
            raise ValueError(f"base_sequence {self.base_sequence} of an idempotent batch of {self.record_count} "
                             "records must be >= 0, and its last sequence at most 2**63 - 1")
        return 0

    cdef bytes _finish(self, int64_t base_offset):
        cdef Py_ssize_t name_len = len(self.producer_bytes)
        cdef Py_ssize_t start = self.header_size + name_len, section_len = self.length
        cdef object compressed = None
        cdef unsigned char* out
        self._check_sequence()
        if self.compression == CODEC_LZ4_:
            compressed = _lz4frame.compress(<unsigned char[:self.length]>self.buf, store_size=True)
            section_len = len(compressed)
        if start + section_len - C_LOG_OVERHEAD > 0x7FFFFFFF:
            raise RecordTooLargeError(f"batch of {start + section_len} bytes cannot be framed")
        result = PyBytes_FromStringAndSize(NULL, start + section_len)
        out = <unsigned char*>PyBytes_AS_STRING(result)
        memset(out, 0, C_HEADER_SIZE)
        store_i64le(out + P_BASE_OFFSET, base_offset)
        store_i32le(out + P_BATCH_LENGTH, <int32_t>(start + section_len - C_LOG_OVERHEAD))
        out[P_MAGIC] = MAGIC_V1
        out[P_ATTRIBUTES] = <unsigned char>(self.compression | (ATTR_IDEMPOTENT_ if self.producer_id >= 0 else 0))
        out[P_PRODUCER_LEN] = <unsigned char>name_len
        store_i32le(out + P_LAST_OFFSET_DELTA, self.record_count - 1)
        store_i32le(out + P_RECORD_COUNT, self.record_count)
        store_i64le(out + P_FIRST_TIMESTAMP, self.first_timestamp)
        store_i64le(out + P_MAX_TIMESTAMP, self.max_timestamp)
        store_i64le(out + P_BASE_SEQUENCE, self.base_sequence)
        if self.producer_id >= 0:
            store_i64le(out + P_PRODUCER_ID, self.producer_id)
            store_i32le(out + P_PRODUCER_EPOCH, self.producer_epoch)
        if name_len:
            memcpy(out + self.header_size, PyBytes_AS_STRING(self.producer_bytes), name_len)
        if compressed is None:
            memcpy(out + start, self.buf, self.length)
        else:
            memcpy(out + start, PyBytes_AS_STRING(compressed), section_len)
        with nogil:
            store_u32le(out + P_CRC, crc32c_update(0, out + C_CRC_START, <size_t>(start + section_len - C_CRC_START)))
        return result


def build_batch(values, *, keys=None, timestamps=None, headers=None, producer="",
                int64_t base_sequence=-1, int compression=0, int64_t base_offset=0,
                int64_t producer_id=NO_PRODUCER_ID_, int64_t producer_epoch=NO_PRODUCER_ID_):
    """One batch holding ``values`` (see ``_core.pyi``)."""
    cdef list vals = values if type(values) is list else list(values)
    cdef Py_ssize_t n = PyList_GET_SIZE(vals), i
    cdef int64_t ts = -1
    cdef bint per_record_ts = False
    cdef BatchBuilder b
    if n == 0:
        raise ValueError("a batch needs at least one record")
    if keys is not None and len(keys) != n:
        raise ValueError(f"{len(keys)} keys for {n} values")
    if headers is not None and len(headers) != n:
        raise ValueError(f"{len(headers)} header lists for {n} values")
    if timestamps is None:
        ts = now_ms()
    elif isinstance(timestamps, int):
        ts = timestamps
        if ts < 0:
            raise ValueError(f"timestamp {ts} is negative")
    else:
        per_record_ts = True
        if len(timestamps) != n:
            raise ValueError(f"{len(timestamps)} timestamps for {n} values")
    b = BatchBuilder(producer, compression, 0x7FFFFFFF, base_sequence, producer_id, producer_epoch)
    for i in range(n):
        if per_record_ts:
            ts = timestamps[i]
            if ts < 0:
                raise ValueError(f"timestamp {ts} of record {i} is negative")
        b._append(<object>PyList_GET_ITEM(vals, i), None if keys is None else keys[i], ts,
                  None if headers is None else headers[i], False)
    return b._finish(base_offset)
