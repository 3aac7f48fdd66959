# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Record batches to columns: the compiled decoder behind the Spark data source (``hpbroker.spark``).

:class:`ColumnBuilder` walks whole batches (``docs/FORMAT.md``), checks them like
``hpbroker._core.decode_records`` does (framing, optionally the CRC, every record's fields, the
header's counts and timestamps), inflates lz4 sections, and appends the records of an offset
range to growing column buffers, laid out as Apache Arrow lays out its arrays:

==============  =====================================================================
column          buffers (little-endian)
==============  =====================================================================
``offset``      i64 per record
``timestamp``   i64 per record, ms since the epoch
``producer``    i32 offsets (n + 1) and UTF-8 data: the batch's producer name
``key``         i32 offsets (n + 1), data, validity bitmap (bit i set: not null)
``value``       the same as ``key``
``headers``     i32 list offsets (n + 1) into the headers of all records; per header a
                key (i32 offsets, UTF-8 data) and a value (i32 offsets, data, validity)
==============  =====================================================================

Nothing here is per record in Python: a batch costs one call into C for its records, and an lz4
section one call into the lz4 library.  :meth:`ColumnBuilder.take` hands the buffers out as
``bytearray`` objects (no copy) for ``hpbroker.spark.columns`` to wrap as ``pyarrow`` arrays;
this module imports neither pyarrow nor numpy.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING
from libc.stdint cimport INT32_MAX, int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

from hpbroker._clib cimport *

import lz4.frame as _lz4frame

from hpbroker._core import MAX_DECOMPRESSED_BYTES
from hpbroker.errors import CorruptRecordError

__all__ = ["COLUMNS", "ColumnBuilder"]

#: the columns a builder can fill, in the order of the record schema
COLUMNS = ("offset", "timestamp", "producer", "key", "value", "headers")

cdef enum:
    WANT_OFFSET = 1
    WANT_TIMESTAMP = 2
    WANT_PRODUCER = 4
    WANT_KEY = 8
    WANT_VALUE = 16
    WANT_HEADERS = 32


cdef class _Buffer:
    """A bytearray grown by doubling, of which ``used`` bytes are written; ``ptr`` is its start
    (valid until the buffer grows).

    Growing copies only the bytes written into a fresh bytearray, never the whole capacity (as a
    realloc would): capacity reserved for the worst case and never written costs no page of
    memory."""

    cdef bytearray data
    cdef Py_ssize_t used, capacity
    cdef unsigned char* ptr

    def __cinit__(self):
        self.data = bytearray()
        self.ptr = <unsigned char*>PyByteArray_AS_STRING(self.data)

    cdef inline int reserve(self, Py_ssize_t extra) except -1:
        """Room for ``extra`` bytes after the ``used`` ones."""
        if self.used + extra > self.capacity:
            self.grow(self.used, self.used + extra)
        return 0

    cdef int grow(self, Py_ssize_t filled, Py_ssize_t want) except -1:
        """A capacity of at least ``want`` bytes, keeping the first ``filled``."""
        cdef Py_ssize_t capacity = max(self.capacity * 2, 4096)
        cdef bytearray grown
        if want <= self.capacity:
            return 0
        while capacity < want:
            capacity *= 2
        grown = PyByteArray_FromStringAndSize(NULL, capacity)
        if filled:
            memcpy(PyByteArray_AS_STRING(grown), self.ptr, filled)
        self.data = grown
        self.capacity = capacity
        self.ptr = <unsigned char*>PyByteArray_AS_STRING(grown)
        return 0

    cdef bytearray take(self):
        """The written bytes (the bytearray itself, trimmed); the buffer starts empty again."""
        cdef bytearray out = self.data
        PyByteArray_Resize(out, self.used)
        self.data = bytearray()
        self.ptr = <unsigned char*>PyByteArray_AS_STRING(self.data)
        self.used = self.capacity = 0
        return out


cdef struct _Cursor:
    # Where a binary column's next item goes while a batch is decoded; its buffers learn of the
    # items only when the whole batch decoded (:meth:`_Binary.commit`), so a batch that fails
    # half-way leaves nothing behind.
    unsigned char* offsets     # the column's offsets buffer (i32 per item, after a leading 0)
    unsigned char* data
    unsigned char* validity    # NULL for a column without nulls
    Py_ssize_t length          # items
    Py_ssize_t data_used       # bytes of data
    Py_ssize_t null_count


cdef inline void _put(_Cursor* c, const unsigned char* src, Py_ssize_t n, bint valid) noexcept nogil:
    """Append one item (room was reserved); a null has ``valid`` False and ``n`` 0.  Every
    validity bit is written, set or cleared: bytes past a failed batch hold stale bits."""
    cdef Py_ssize_t i = c.length
    cdef unsigned char bit
    if n:
        memcpy(c.data + c.data_used, src, n)
        c.data_used += n
    c.length = i + 1
    store_i32le(c.offsets + 4 * (i + 1), <int32_t>c.data_used)
    if c.validity != NULL:
        bit = <unsigned char>(1 << (i & 7))
        if valid:
            c.validity[i >> 3] |= bit
        else:
            c.validity[i >> 3] &= <unsigned char>~bit
            c.null_count += 1


cdef class _Binary:
    """A binary (or UTF-8) column: i32 offsets, data and, when ``nullable``, a validity bitmap."""

    cdef _Buffer offsets, data, validity
    cdef Py_ssize_t length, null_count
    cdef bint nullable

    def __cinit__(self, bint nullable):
        self.offsets, self.data, self.validity = _Buffer(), _Buffer(), _Buffer()
        self.nullable = nullable
        self._start()

    cdef void _start(self):
        self.offsets.reserve(4)
        store_i32le(self.offsets.ptr, 0)
        self.offsets.used = 4
        self.length = self.null_count = 0

    cdef int reserve(self, Py_ssize_t items, Py_ssize_t nbytes) except -1:
        if self.data.used + nbytes > INT32_MAX:
            raise OverflowError(f"a column of {self.data.used + nbytes} bytes overflows Arrow's 32-bit "
                                "offsets: take() the columns more often")
        self.offsets.reserve(4 * items)
        self.data.reserve(nbytes)
        if self.nullable:
            self.validity.reserve(items // 8 + 2)
        return 0

    cdef int grow(self, _Cursor* c, Py_ssize_t items, Py_ssize_t nbytes) except -1:
        """Room for ``items`` more items of ``nbytes`` after what ``c`` appended (mid-batch), and
        ``c`` pointed at the grown buffers."""
        if c.data_used + nbytes > INT32_MAX:
            raise OverflowError(f"a column of {c.data_used + nbytes} bytes overflows Arrow's 32-bit "
                                "offsets: take() the columns more often")
        self.offsets.grow(4 * (c.length + 1), 4 * (c.length + 1 + items))
        self.data.grow(c.data_used, c.data_used + nbytes)
        if self.nullable:
            self.validity.grow((c.length + 7) // 8, (c.length + items) // 8 + 2)
        c.offsets = self.offsets.ptr
        c.data = self.data.ptr
        c.validity = self.validity.ptr if self.nullable else NULL
        return 0

    cdef void cursor(self, _Cursor* c):
        """Point ``c`` at the end of the column (after :meth:`reserve`)."""
        c.offsets = self.offsets.ptr
        c.data = self.data.ptr
        c.validity = self.validity.ptr if self.nullable else NULL
        c.length = self.length
        c.data_used = self.data.used
        c.null_count = self.null_count

    cdef void commit(self, _Cursor* c):
        """The items ``c`` appended belong to the column now."""
        self.length = c.length
        self.null_count = c.null_count
        self.offsets.used = 4 * (c.length + 1)
        self.data.used = c.data_used
        if self.nullable:
            self.validity.used = (c.length + 7) // 8

    cdef dict take(self, str name):
        out = {name + "_offsets": self.offsets.take(), name + "_data": self.data.take()}
        if self.nullable:
            out[name + "_validity"] = self.validity.take()
            out[name + "_nulls"] = self.null_count
        self._start()
        return out


cdef struct _Out:
    # Every column's write position while one batch is decoded.
    int wants
    unsigned char* offset      # next i64 of the offset column
    unsigned char* timestamp   # next i64 of the timestamp column
    unsigned char* headers     # next i32 of the headers' list offsets
    Py_ssize_t kept            # records appended
    _Cursor producer, key, value, header_key, header_value


cdef struct _Header:
    int64_t base_offset
    int32_t record_count
    int64_t first_timestamp
    int64_t max_timestamp
    int codec
    int producer_len
    Py_ssize_t header_size     # where the producer name starts: 56, or 68 with the identity block
    Py_ssize_t size


cdef class ColumnBuilder:
    """Appends the records of whole batches to column buffers (see the module docstring).

    ``columns`` names the columns to fill (:data:`COLUMNS`; all by default): a column left out
    costs nothing.  :meth:`add` stops at a batch boundary once ``max_records`` records or
    ``max_bytes`` bytes of producer names, keys, values and headers are held, so a caller takes
    them in bounded pieces (and Arrow's 32-bit offsets never overflow).  Single thread.
    """

    cdef int wants
    cdef readonly Py_ssize_t max_records, max_bytes
    cdef readonly Py_ssize_t count
    cdef readonly int64_t next_offset
    cdef _Buffer offset_column, timestamp_column, header_offsets
    cdef _Binary producers, keys, values, header_keys, header_values
    cdef bytes producer_raw, producer_utf8

    def __cinit__(self, columns=COLUMNS, Py_ssize_t max_records=1 << 20, Py_ssize_t max_bytes=128 << 20):
        wanted = set(columns)
        unknown = wanted - set(COLUMNS)
        if unknown:
            raise ValueError(f"unknown columns {sorted(unknown)}; known: {', '.join(COLUMNS)}")
        if max_records < 1 or not 0 < max_bytes <= INT32_MAX // 2:
            raise ValueError(f"max_records must be >= 1 and max_bytes in [1, {INT32_MAX // 2}], got "
                             f"{max_records} and {max_bytes}")
        self.wants = sum(1 << i for i, name in enumerate(COLUMNS) if name in wanted)
        self.max_records, self.max_bytes = max_records, max_bytes
        self.offset_column, self.timestamp_column, self.header_offsets = _Buffer(), _Buffer(), _Buffer()
        self.producers = _Binary(False)
        self.keys, self.values = _Binary(True), _Binary(True)
        self.header_keys, self.header_values = _Binary(False), _Binary(True)
        self.producer_raw = self.producer_utf8 = b""
        self.next_offset = -1
        self._start_headers()

    cdef void _start_headers(self):
        self.header_offsets.reserve(4)
        store_i32le(self.header_offsets.ptr, 0)
        self.header_offsets.used = 4

    @property
    def columns(self):
        """The columns this builder fills, in schema order."""
        return tuple(name for i, name in enumerate(COLUMNS) if self.wants & (1 << i))

    @property
    def data_bytes(self):
        """Bytes of producer names, keys, values and headers held (what ``max_bytes`` bounds, so
        no column's 32-bit offsets overflow)."""
        return (self.producers.data.used + self.keys.data.used + self.values.data.used
                + self.header_keys.data.used + self.header_values.data.used)

    @property
    def full(self):
        """Whether :meth:`add` would stop before the next batch."""
        return self.count > 0 and (self.count >= self.max_records or self.data_bytes >= self.max_bytes)

    def add(self, buf, Py_ssize_t position=0, int64_t start_offset=0, int64_t end_offset=0x7FFFFFFFFFFFFFFF,
            *, bint verify_crc=True):
        """Decode the whole batches of ``buf`` from ``position`` on, appending their records whose
        offsets lie in ``[start_offset, end_offset)`` (the others are checked, not kept); stops
        early, at a batch boundary, when the builder is :attr:`full`.  Returns the position after
        the last batch decoded.  A batch wholly outside the range is framed (and CRC-checked)
        only; the records of a batch partly inside are all checked.  Raises CorruptRecordError naming the position and base offset of
        a batch that is cut off, fails its CRC (``verify_crc``) or whose records do not decode."""
        cdef const unsigned char[::1] view = buf
        cdef Py_ssize_t n = view.shape[0]
        cdef _Header h
        if position < 0 or position > n:
            raise ValueError(f"position {position} outside a buffer of {n} bytes")
        while position < n and not self.full:
            msg = self._header(&view[0] + position, n - position, verify_crc, &h)
            if msg is None:
                msg = self._batch(&view[0] + position, &h, start_offset, end_offset)
            if msg is not None:
                base = h.base_offset if n - position >= C_HEADER_SIZE else -1
                raise CorruptRecordError(f"batch at position {position} (base offset {base}): {msg}")
            position += h.size
        return position

    cdef object _header(self, const unsigned char* p, Py_ssize_t avail, bint verify_crc, _Header* h):
        """Framing (and the CRC): None, or why the batch at ``p`` cannot be decoded."""
        cdef int32_t batch_length
        cdef uint32_t crc
        h.base_offset = -1
        if avail < C_HEADER_SIZE:
            return f"batch header needs {C_HEADER_SIZE} bytes, only {avail} available"
        h.base_offset = load_i64le(p + P_BASE_OFFSET)
        batch_length = load_i32le(p + P_BATCH_LENGTH)
        if batch_length < C_HEADER_SIZE - C_LOG_OVERHEAD:
            return f"batch_length {batch_length} is below the minimum {C_HEADER_SIZE - C_LOG_OVERHEAD}"
        if p[P_MAGIC] != MAGIC_V1:
            return f"unknown magic {p[P_MAGIC]} (expected {MAGIC_V1})"
        h.size = C_LOG_OVERHEAD + <Py_ssize_t>batch_length
        if avail < h.size:
            return f"batch of {h.size} bytes is cut off after {avail} bytes"
        h.producer_len = p[P_PRODUCER_LEN]
        h.header_size = batch_header_size(p[P_ATTRIBUTES])
        if h.header_size + h.producer_len > h.size:
            return (f"producer name of {h.producer_len} bytes after a {h.header_size}-byte header overruns a "
                    f"batch of {h.size} bytes")
        if verify_crc:
            with nogil:
                crc = crc32c_update(0, p + C_CRC_START, <size_t>(h.size - C_CRC_START))
            if crc != load_u32le(p + P_CRC):
                return f"CRC mismatch: stored 0x{load_u32le(p + P_CRC):08x}, computed 0x{crc:08x}"
        h.codec = p[P_ATTRIBUTES] & CODEC_MASK_
        h.record_count = load_i32le(p + P_RECORD_COUNT)
        h.first_timestamp = load_i64le(p + P_FIRST_TIMESTAMP)
        h.max_timestamp = load_i64le(p + P_MAX_TIMESTAMP)
        if h.record_count < 1 or p[P_ATTRIBUTES] & ATTR_UNUSED_ or h.codec > CODEC_LZ4_:
            return f"record_count {h.record_count}, attributes 0x{p[P_ATTRIBUTES]:02x} are not decodable"
        if load_i32le(p + P_LAST_OFFSET_DELTA) != h.record_count - 1:
            return f"last_offset_delta {load_i32le(p + P_LAST_OFFSET_DELTA)} does not match record_count " \
                   f"{h.record_count}"
        return None

    cdef object _batch(self, const unsigned char* p, _Header* h, int64_t start_offset, int64_t end_offset):
        """Append the batch's records in the range; None, or why its records do not decode."""
        cdef const unsigned char* cur = p + h.header_size + h.producer_len
        cdef const unsigned char* end = p + h.size
        cdef int64_t last_offset = h.base_offset + h.record_count - 1
        cdef Py_ssize_t section_len
        cdef const unsigned char* name
        cdef _Out out
        self.next_offset = last_offset + 1
        if last_offset < start_offset or h.base_offset >= end_offset:
            return None  # nothing of it is wanted; its framing (and CRC) was checked
        section = None
        if h.codec == CODEC_LZ4_:
            try:
                decompressor = _lz4frame.LZ4FrameDecompressor()
                section = decompressor.decompress((<const char*>cur)[:end - cur],
                                                  max_length=MAX_DECOMPRESSED_BYTES)
                if not decompressor.eof:
                    raise ValueError(f"frame incomplete or inflates past {MAX_DECOMPRESSED_BYTES} bytes")
                if decompressor.unused_data:
                    raise ValueError(f"{len(decompressor.unused_data)} bytes after the lz4 frame")
            except Exception as e:
                return f"records section does not decode: {e}"
            cur = <const unsigned char*>PyBytes_AS_STRING(section)
            end = cur + len(section)
        section_len = end - cur
        name = self._producer(p, h)
        self._reserve(h.record_count, section_len, len(self.producer_utf8))
        self._open(&out)
        msg = _walk(cur, end, h, start_offset, end_offset, name, len(self.producer_utf8), &out,
                    self.header_keys, self.header_values)
        if msg is None:
            self._commit(&out)
        return msg

    cdef const unsigned char* _producer(self, const unsigned char* p, _Header* h):
        """The batch's producer name as UTF-8 (invalid bytes replaced, as ``_core`` does), cached
        across the batches of one producer."""
        raw = (<const char*>p)[h.header_size:h.header_size + h.producer_len]
        if raw != self.producer_raw:
            self.producer_raw = raw
            self.producer_utf8 = raw.decode("utf-8", "replace").encode("utf-8")
        return <const unsigned char*>PyBytes_AS_STRING(self.producer_utf8)

    cdef int _reserve(self, Py_ssize_t records, Py_ssize_t section_len, Py_ssize_t name_len) except -1:
        """Room for ``records`` more records from a section of ``section_len`` bytes (keys and
        values cannot take more).  Headers, rare, grow their columns as they come."""
        cdef int w = self.wants
        if w & WANT_OFFSET:
            self.offset_column.reserve(8 * records)
        if w & WANT_TIMESTAMP:
            self.timestamp_column.reserve(8 * records)
        if w & WANT_PRODUCER:
            self.producers.reserve(records, records * name_len)
        if w & WANT_KEY:
            self.keys.reserve(records, section_len)
        if w & WANT_VALUE:
            self.values.reserve(records, section_len)
        if w & WANT_HEADERS:
            self.header_offsets.reserve(4 * records)
        return 0

    cdef void _open(self, _Out* out):
        out.wants = self.wants
        out.offset = self.offset_column.ptr + self.offset_column.used
        out.timestamp = self.timestamp_column.ptr + self.timestamp_column.used
        out.headers = self.header_offsets.ptr + self.header_offsets.used
        out.kept = 0
        self.producers.cursor(&out.producer)
        self.keys.cursor(&out.key)
        self.values.cursor(&out.value)
        self.header_keys.cursor(&out.header_key)
        self.header_values.cursor(&out.header_value)

    cdef void _commit(self, _Out* out):
        cdef int w = self.wants
        if w & WANT_OFFSET:
            self.offset_column.used += 8 * out.kept
        if w & WANT_TIMESTAMP:
            self.timestamp_column.used += 8 * out.kept
        if w & WANT_PRODUCER:
            self.producers.commit(&out.producer)
        if w & WANT_KEY:
            self.keys.commit(&out.key)
        if w & WANT_VALUE:
            self.values.commit(&out.value)
        if w & WANT_HEADERS:
            self.header_offsets.used += 4 * out.kept
            self.header_keys.commit(&out.header_key)
            self.header_values.commit(&out.header_value)
        self.count += out.kept

    def take(self):
        """The records added so far, as a dict of buffers (the builder starts empty again):
        ``count``, ``columns``, then per column filled ``offset`` and ``timestamp`` (i64 each),
        ``producer_offsets``/``_data``, ``key_offsets``/``_data``/``_validity``/``_nulls`` (and
        the same for ``value``), ``headers_offsets`` with ``header_key_*`` and
        ``header_value_*``.  The buffers are bytearrays nobody else holds."""
        cdef int w = self.wants
        out = {"count": self.count, "columns": self.columns}
        if w & WANT_OFFSET:
            out["offset"] = self.offset_column.take()
        if w & WANT_TIMESTAMP:
            out["timestamp"] = self.timestamp_column.take()
        if w & WANT_PRODUCER:
            out.update(self.producers.take("producer"))
        if w & WANT_KEY:
            out.update(self.keys.take("key"))
        if w & WANT_VALUE:
            out.update(self.values.take("value"))
        if w & WANT_HEADERS:
            out["headers_offsets"] = self.header_offsets.take()
            out["header_count"] = self.header_keys.length
            out.update(self.header_keys.take("header_key"))
            out.update(self.header_values.take("header_value"))
            self._start_headers()
        self.count = 0
        return out


cdef object _walk(const unsigned char* cur, const unsigned char* end, _Header* h, int64_t start_offset,
                  int64_t end_offset, const unsigned char* name, Py_ssize_t name_len, _Out* out,
                  _Binary header_keys, _Binary header_values):
    """The record walk of ``_core._walk_batch`` (the same ``read_record`` of ``_clib.pxd``, the
    same header checks and words), appending the records in ``[start_offset, end_offset)`` to
    ``out`` instead of building objects.  None, or why the records do not decode."""
    cdef const unsigned char* rec_end
    cdef const unsigned char* q
    cdef const unsigned char* key_ptr
    cdef const unsigned char* value_ptr
    cdef uint64_t key_len, value_len, header_count
    cdef RecordFields r
    cdef int code
    cdef int64_t ts_delta, max_delta = 0, offset
    cdef int32_t i
    cdef int w = out.wants
    cdef bint keep
    for i in range(h.record_count):
        code = read_record(&cur, end, i, h.first_timestamp, &r)
        if code != RECORD_OK:
            return record_error(code, i, h.first_timestamp, &r)
        ts_delta = r.timestamp_delta
        if ts_delta > max_delta:
            max_delta = ts_delta
        rec_end, q, header_count = r.end, r.headers, r.header_count
        key_ptr, key_len, value_ptr, value_len = r.key, r.key_field, r.value, r.value_field
        offset = h.base_offset + i
        keep = start_offset <= offset < end_offset
        if header_count:
            msg = _headers(&q, rec_end, i, header_count, out if keep and w & WANT_HEADERS else NULL,
                           header_keys, header_values)
            if msg is not None:
                return msg
        if q != rec_end:
            return f"record {i}: {rec_end - q} unparsed bytes inside the record"
        if not keep:
            continue
        if w & WANT_OFFSET:
            store_i64le(out.offset + 8 * out.kept, offset)
        if w & WANT_TIMESTAMP:
            store_i64le(out.timestamp + 8 * out.kept, h.first_timestamp + ts_delta)
        if w & WANT_KEY:
            _put(&out.key, key_ptr, key_len - 1 if key_len else 0, key_len != 0)
        if w & WANT_VALUE:
            _put(&out.value, value_ptr, value_len - 1 if value_len else 0, value_len != 0)
        if w & WANT_HEADERS:
            store_i32le(out.headers + 4 * out.kept, <int32_t>out.header_key.length)
        out.kept += 1
    if cur != end:
        return f"{end - cur} bytes left after record {h.record_count - 1} of the records section"
    if h.first_timestamp + max_delta != h.max_timestamp:
        return f"header: max_timestamp {h.max_timestamp} but records reach {h.first_timestamp + max_delta}"
    if w & WANT_PRODUCER:
        _repeat(&out.producer, name, name_len, out.kept)
    return None


cdef void _repeat(_Cursor* c, const unsigned char* src, Py_ssize_t n, Py_ssize_t times) noexcept nogil:
    """Append ``times`` copies of the same item (a batch's producer name, for each of its
    records): the data by doubling copies, the offsets in one loop."""
    cdef Py_ssize_t k, done, start = c.data_used, total = n * times
    cdef unsigned char* data = c.data + start
    if times <= 0:
        return
    if n:
        memcpy(data, src, n)
        done = n
        while done < total:
            k = done if 2 * done <= total else total - done
            memcpy(data + done, data, k)
            done += k
    for k in range(times):
        store_i32le(c.offsets + 4 * (c.length + 1 + k), <int32_t>(start + n * (k + 1)))
    c.length += times
    c.data_used += total


cdef object _headers(const unsigned char** pcur, const unsigned char* rec_end, int32_t i,
                     uint64_t header_count, _Out* out, _Binary keys, _Binary values):
    """Check a record's headers, appending them to ``out`` (growing the columns ``keys`` and
    ``values``) unless it is NULL; None, or what is wrong (``_core``'s words)."""
    cdef const unsigned char* cur = pcur[0]
    cdef uint64_t j, hk_len, hv_len
    for j in range(header_count):
        if not next_uvarint(&cur, rec_end, &hk_len) or hk_len > <uint64_t>(rec_end - cur):
            return f"record {i}: header {j} key overruns the record"
        try:
            (<const char*>cur)[:hk_len].decode("utf-8")
        except UnicodeDecodeError:
            return f"record {i}: header {j} key is not UTF-8"
        if out != NULL:
            keys.grow(&out.header_key, 1, <Py_ssize_t>hk_len)
            _put(&out.header_key, cur, <Py_ssize_t>hk_len, True)
        cur += hk_len
        if not next_uvarint(&cur, rec_end, &hv_len) or hv_len > <uint64_t>(rec_end - cur) + 1:
            return f"record {i}: header {j} value overruns the record"
        if out != NULL:
            values.grow(&out.header_value, 1, <Py_ssize_t>(hv_len - 1 if hv_len else 0))
            _put(&out.header_value, cur, <Py_ssize_t>(hv_len - 1 if hv_len else 0), hv_len != 0)
        if hv_len:
            cur += hv_len - 1
    pcur[0] = cur
    return None
