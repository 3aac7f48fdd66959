# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled core of the producer: records go into per-partition batches, one call at a time.

``Producer.send`` *is* :meth:`RecordAccumulator.send` (the producer subclasses this class, the
way pyzmq's sockets subclass their compiled backend), so a record's whole way in (topic lookup,
partition choice, timestamp, encoding into its partition's open batch) runs here without any
Python-level work; the producer's Python code runs once per batch or per request, never per record.

Who calls what:

- application threads: :meth:`send`, :meth:`send_many` (and the producer's flush/close); given
  a 2-D buffer of bytes, :meth:`send_many` encodes each row in place, holding the buffer for the
  whole call, so a chunk of fixed-size values costs no Python object per record;
- the producer's I/O thread: :meth:`drain` (take the batches that are due), :meth:`build_payload`
  (finish them into the bytes of a ProduceRequest), :meth:`finish` (account for completed batches),
  :meth:`take_expired` (take batches that waited too long to be drained, to fail them).

There is no lock: every method runs with the GIL held and never lets it go while it changes
shared state (the only calls that may release it, lz4 and the producer's blocking hooks, happen
on batches already detached, or before anything is touched).  Compiled code keeps the GIL until
it runs Python code, and *allocating* an object the garbage collector tracks (a list, a tuple, a
Batch) may start a collection whose finalizers and callbacks are Python code, during which any
other thread may run.  Hence the rule: **allocate first, then touch**.  A method allocates
every object it will need before it reads the shared state it is about to change, and from
that read to the last counter it updates it allocates nothing tracked and calls no Python code.
So :meth:`send` encodes the headers, borrows the value's and key's bytes and makes sure a spare
batch (with its waiter list) exists before it looks at the partition's open batch, then checks
``closed``, writes the record, adds its waiter and counts its bytes in one stretch; a new
topic's state is built complete (its random first partition drawn: ``os.urandom`` lets the GIL
go) before one ``dict.setdefault`` looks it up and stores it.

Batch buffers.  An open batch is one ``malloc``'d buffer: ``header_room`` bytes (the 56-byte fixed
header, the 12-byte producer identity block when the accumulator is idempotent, and the producer
name, written when the batch is finished) followed by its records, encoded exactly as
``docs/FORMAT.md`` says::

    [0, header_room)            header, identity block, producer name, filled by build_payload
    [header_room, length)       records: length, timestamp_delta (zigzag), offset_delta, key_length,
                                key, value_length, value, header_count, headers

so finishing a batch is one copy and one CRC.  ``batch_bytes`` bounds ``length`` (the batch as it
would be sent uncompressed).  Freed buffers go to a small pool, so a steady stream reuses the same
few buffers.

Sizes and flow control.  ``buffered_bytes`` counts the encoded records of every batch not yet
finished (open, closed, in flight, retrying); :meth:`send` calls the producer's
``_wait_for_room`` while it is at ``buffer_bytes`` or above, and the I/O thread lowers it in
:meth:`finish`.

Idempotence.  An idempotent accumulator (``idempotent=True``) stamps every batch with the producer
identity set by :meth:`RecordAccumulator.set_producer_identity` (attributes bit 3, FORMAT.md) and
numbers each partition's records from 0 for that identity: :meth:`RecordAccumulator.drain` gives a
batch the partition's next sequence and the current identity together, so the bytes a retry
resends are the bytes first sent.

Invariants:
- a partition's batches are drained in the order they were opened, and a muted partition (one
  with a request in flight or waiting to be retried) is not drained at all;
- a drained batch's ``base_sequence`` is its partition's next sequence for the identity it
  carries: sequences of one (producer_id, producer_epoch) and partition follow each other with
  no gap, from 0;
- every batch that ever held a record is in ``_unfinished`` (by ``batch_id``, which increases in
  the order batches are opened) until :meth:`finish` is called with it, and :meth:`take_all`
  returns every one of them that the producer does not hold in a request, so none can be left
  unsettled when the producer stops;
- once ``closed`` is set, no record is appended (:meth:`send` checks it at the point of no
  return, after any wait), but the I/O thread's own (:meth:`send_internal`), which it settles
  before it stops.
"""

from cpython.buffer cimport (PyBUF_RECORDS_RO, PyBUF_SIMPLE, PyBuffer_IsContiguous, PyBuffer_Release,
                             PyObject_CheckBuffer, PyObject_GetBuffer)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_CheckExact
from cpython.number cimport PyIndex_Check, PyNumber_Index
from cpython.object cimport PyObject
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy, memset
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from posix.unistd cimport write

from hpbroker._clib cimport *

import os as _os

import lz4.frame as _lz4frame

from hpbroker.errors import RecordTooLargeError, UnknownTopicOrPartitionError

# How keyless records are spread (the partitioner names of hpbroker.client.partitioner).
PARTITIONER_STICKY = 0  # fill one partition's batch, then move to the next partition
PARTITIONER_ROUND_ROBIN = 1  # each record to the next partition
PARTITIONER_CALLABLE = 2  # the application's function decides every record without partition=

cdef enum:
    INITIAL_BUFFER = 64 * 1024  # first allocation of a batch buffer; grows by doubling
    POOL_SIZE = 8  # free batch buffers kept for reuse
    # Bytes a record may need beyond its key, value and headers: five varints of at most 10
    # bytes.  Used only to decide when the exact (slower) size check is worth running.
    RECORD_OVERHEAD_MAX = 50
    # Payloads at least this large are finished (copy, CRC) without the GIL; below, letting it go
    # and taking it back costs more than the work.
    NOGIL_PAYLOAD_BYTES = 256 * 1024

cdef double _INFINITY = float("inf")
_VALUES_EXPECTED = ("values must be a sequence of bytes-like objects or a 2-D C-contiguous buffer "
                    "(rows are values)")


cdef inline double _monotonic_s() noexcept nogil:
    """The clock of Python's time.monotonic (CLOCK_MONOTONIC on Linux), in seconds."""
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9


cdef inline Py_ssize_t _body_size(int64_t delta, int32_t offset_delta, uint64_t kfield, Py_ssize_t klen,
                                  uint64_t vfield, Py_ssize_t vlen, Py_ssize_t hlen) noexcept nogil:
    """Bytes of a record after its ``length`` varint; ``kfield``/``vfield``: 0 for null, else
    length + 1; ``hlen``: bytes of the encoded headers, 0 for none (then one byte of count)."""
    return (uvarint_size(zigzag(delta)) + uvarint_size(<uint64_t>offset_delta) + uvarint_size(kfield)
            + klen + uvarint_size(vfield) + vlen + (hlen if hlen else 1))


cdef inline void _write_record(unsigned char* w, Py_ssize_t body, int64_t delta, int32_t offset_delta,
                               uint64_t kfield, const unsigned char* kptr, Py_ssize_t klen, uint64_t vfield,
                               const unsigned char* vptr, Py_ssize_t vlen, const char* headers,
                               Py_ssize_t hlen) noexcept nogil:
    """One record as FORMAT.md lays it out (see the module docstring), at ``w``."""
    w = write_uvarint(w, <uint64_t>body)
    w = write_uvarint(w, zigzag(delta))
    w = write_uvarint(w, <uint64_t>offset_delta)
    w = write_uvarint(w, kfield)
    if klen:
        memcpy(w, kptr, klen)
        w += klen
    w = write_uvarint(w, vfield)
    if vlen:
        memcpy(w, vptr, vlen)
        w += vlen
    if hlen:
        memcpy(w, headers, hlen)
    else:
        w[0] = 0


cdef enum:
    MAX_PARTITION_COUNT = 0x7FFFFFFF  # partitions a topic may have: a signed 32-bit count, as in Kafka


cdef inline int _check_partition_count(Py_ssize_t count, object topic) except -1:
    """Refuse a partition count the modulo of the key rule cannot take (0, or beyond 32 bits)."""
    if not 1 <= count <= MAX_PARTITION_COUNT:
        where = "" if topic is None else f"topic {topic!r}: "
        raise ValueError(f"{where}partition count {count} must be in [1, {MAX_PARTITION_COUNT}]")
    return 0


cdef object _as_timestamp(object timestamp):
    """A timestamp given as an int or int-like (``__index__``); a float would lose its fraction
    silently, a bool is no time."""
    if isinstance(timestamp, bool) or not PyIndex_Check(timestamp):
        raise TypeError(f"timestamp must be an int (ms since the epoch), not {type(timestamp).__name__}")
    return PyNumber_Index(timestamp)


def partition_for_key(key, Py_ssize_t partition_count):
    """CRC32C of the key's bytes, as an unsigned 32-bit number, modulo ``partition_count``:
    the partition of a keyed record (docs/CLIENT.md, "Partitioning").  ``partition_count``:
    1 to 2**31 - 1.  A None key is no key: keyless records are placed by the partitioner
    setting, so asking where one goes is a TypeError."""
    cdef const unsigned char[::1] view
    _check_partition_count(partition_count, None)
    if key is None:
        raise TypeError("None is no key: keyless records are spread by the partitioner setting, "
                        "not by the key rule")
    if isinstance(key, str):
        raise TypeError("record keys must be bytes-like, not str (encode it first)")
    view = key
    if view.shape[0] == 0:
        return 0
    return crc32c_update(0, &view[0], <size_t>view.shape[0]) % <uint32_t>partition_count


cdef inline int _borrow(object obj, Py_buffer* view, const unsigned char** ptr, Py_ssize_t* size,
                        str what) except -1:
    """Pointer and size of a bytes-like; 1 when ``view`` must be released."""
    if PyBytes_CheckExact(obj):
        ptr[0] = <const unsigned char*>PyBytes_AS_STRING(obj)
        size[0] = PyBytes_GET_SIZE(obj)
        return 0
    if isinstance(obj, str):
        raise TypeError(f"record {what}s must be bytes-like or None, not str (encode it first)")
    try:
        PyObject_GetBuffer(obj, view, PyBUF_SIMPLE)
    except TypeError:
        raise TypeError(f"record {what}s must be bytes-like or None, not {type(obj).__name__}") from None
    ptr[0] = <const unsigned char*>view.buf
    size[0] = view.len
    return 1


cdef list _key_list(object keys, Py_ssize_t n):
    """The keys of :meth:`RecordAccumulator.send_many` as a list (None: no keys), one per value."""
    cdef list key_list
    if keys is None:
        return None
    key_list = keys if type(keys) is list else list(keys)
    if PyList_GET_SIZE(key_list) != n:
        raise ValueError(f"{PyList_GET_SIZE(key_list)} keys for {n} values")
    return key_list


cdef int _rows_buffer(object values, Py_buffer* view) except -1:
    """1 when ``values`` is a 2-D C-contiguous buffer of 1-byte items, held in ``view`` (the
    caller releases it); 0 when it is to be read as a sequence of values, as any other buffer is
    (rows that are not back to back, items wider than a byte, numpy arrays of objects or of
    fixed-size bytes).  A bytes-like object itself (at most one dimension of plain bytes:
    ``bytes``, ``bytearray``, a memoryview or array of unsigned bytes) is neither: as a sequence it
    would give ints."""
    if type(values) is list or type(values) is tuple:
        return 0
    if isinstance(values, str):
        raise TypeError(f"{_VALUES_EXPECTED}, not str")
    if not PyObject_CheckBuffer(values):
        return 0
    try:
        PyObject_GetBuffer(values, view, PyBUF_RECORDS_RO)
    except (BufferError, TypeError, ValueError):
        return 0  # it cannot describe its items (format, shape, strides): read it as a sequence
    if view.ndim == 2 and view.itemsize == 1 and PyBuffer_IsContiguous(view, b"C"):
        return 1
    try:
        if view.ndim <= 1 and view.itemsize == 1 and (view.format == NULL
                                                      or <bytes>view.format in (b"B", b"b", b"c")):
            raise TypeError(f"{_VALUES_EXPECTED}, not {type(values).__name__}")
        return 0
    finally:
        PyBuffer_Release(view)


cdef struct _Finish:
    # One batch as build_payload writes it: its records section (the batch's own buffer, or its
    # lz4 frame) and the header fields.
    const unsigned char* section
    Py_ssize_t section_len
    int codec
    int32_t record_count
    int64_t first_timestamp
    int64_t max_timestamp
    int64_t base_sequence
    int64_t producer_id     # >= 0: attributes bit 3 and the identity block; NO_PRODUCER_ID_: neither
    int32_t producer_epoch
    uint32_t crc  # out


cdef void _finish_batches(unsigned char* out, _Finish* items, Py_ssize_t n, const unsigned char* name,
                          Py_ssize_t name_len) noexcept nogil:
    """Write ``n`` batches back to back at ``out``: fixed header, identity block (idempotent
    batches), producer name, records section (FORMAT.md), then the CRC of each."""
    cdef Py_ssize_t i, size, header_size, pos = 0
    cdef unsigned char* p
    for i in range(n):
        p = out + pos
        header_size = C_HEADER_SIZE
        if items[i].producer_id >= 0:
            header_size = C_HEADER_SIZE + C_IDENTITY_SIZE
        size = header_size + name_len + items[i].section_len
        memset(p, 0, C_HEADER_SIZE)
        store_i32le(p + P_BATCH_LENGTH, <int32_t>(size - C_LOG_OVERHEAD))
        p[P_MAGIC] = MAGIC_V1
        p[P_ATTRIBUTES] = <unsigned char>items[i].codec
        if items[i].producer_id >= 0:
            p[P_ATTRIBUTES] |= ATTR_IDEMPOTENT_
            store_i64le(p + P_PRODUCER_ID, items[i].producer_id)
            store_i32le(p + P_PRODUCER_EPOCH, items[i].producer_epoch)
        p[P_PRODUCER_LEN] = <unsigned char>name_len
        store_i32le(p + P_LAST_OFFSET_DELTA, items[i].record_count - 1)
        store_i32le(p + P_RECORD_COUNT, items[i].record_count)
        store_i64le(p + P_FIRST_TIMESTAMP, items[i].first_timestamp)
        store_i64le(p + P_MAX_TIMESTAMP, items[i].max_timestamp)
        store_i64le(p + P_BASE_SEQUENCE, items[i].base_sequence)
        if name_len:
            memcpy(p + header_size, name, name_len)
        memcpy(p + header_size + name_len, items[i].section, items[i].section_len)
        items[i].crc = crc32c_update(0, p + C_CRC_START, <size_t>(size - C_CRC_START))
        store_u32le(p + P_CRC, items[i].crc)
        pos += size


cdef list _window_counts(const unsigned char* records, const unsigned char* end, int64_t first_timestamp,
                        int64_t min_timestamp, int64_t max_timestamp, int32_t record_count, int64_t window_ms):
    """``[(window_start_ms, records)]`` of a batch's records (hpbroker.audit.events: a window
    starts at ``timestamp - timestamp mod window_ms``), in the order the windows first occur.
    A batch within one window (nearly all) is counted from its header fields; one that spans
    windows is walked record by record (length and timestamp delta of each)."""
    cdef int64_t start = min_timestamp - min_timestamp % window_ms
    cdef int64_t run_start, ts
    cdef Py_ssize_t run_count = 0
    cdef uint64_t length, delta
    cdef const unsigned char* p = records
    cdef const unsigned char* body
    cdef dict counts
    if max_timestamp - max_timestamp % window_ms == start:
        return [(start, record_count)]
    counts = {}
    run_start = -1
    while p < end:
        if read_uvarint(&p, end, &length) < 0:
            break
        body = p
        if read_uvarint(&p, end, &delta) < 0:
            break
        ts = first_timestamp + unzigzag(delta)
        ts -= ts % window_ms
        if ts != run_start:
            if run_count:
                counts[run_start] = counts.get(run_start, 0) + run_count
            run_start, run_count = ts, 0
        run_count += 1
        p = body + length
    if run_count:
        counts[run_start] = counts.get(run_start, 0) + run_count
    return list(counts.items())


cdef class PartitionQueue


cdef class Batch:
    """One batch of one partition: filling while open, then what the I/O thread needs to settle it
    (its records' count, who waits for which record, when it was opened).  Made by
    :func:`_new_batch` only, waiter list included, so that filling it allocates nothing tracked."""

    cdef unsigned char* buf
    cdef Py_ssize_t capacity
    cdef readonly Py_ssize_t length  # bytes used, header room included (the uncompressed batch size)
    cdef readonly int32_t record_count
    cdef readonly int64_t first_timestamp, max_timestamp, min_timestamp
    cdef readonly double created_s  # time.monotonic() when its first record arrived
    cdef readonly int64_t batch_id
    cdef readonly int64_t base_sequence  # set when drained
    cdef readonly int64_t producer_id  # set when drained: the identity it carries (-1: not idempotent)
    cdef readonly int32_t producer_epoch  # likewise
    cdef readonly uint32_t crc  # set by build_payload
    cdef readonly PartitionQueue queue  # the partition it belongs to (set when opened)
    # [(window_start_ms, records)] when the accumulator counts windows (set by build_payload)
    cdef readonly list window_counts
    # Delivery reports asked for: the future or callback of each, and (in C arrays, so that asking
    # creates no Python object per record) the record's index in the batch and its timestamp.
    cdef list waiter_objects
    cdef int32_t* waiter_index
    cdef int64_t* waiter_timestamp
    cdef Py_ssize_t waiter_capacity

    def __dealloc__(self):
        free(self.buf)
        free(self.waiter_index)
        free(self.waiter_timestamp)

    @property
    def waiters(self):
        """None, or ``[(index in batch, timestamp, future or callback)]`` of the records that asked."""
        cdef Py_ssize_t i
        if not self.waiter_objects:
            return None
        return [(self.waiter_index[i], self.waiter_timestamp[i], self.waiter_objects[i])
                for i in range(len(self.waiter_objects))]

    @property
    def waiter_count(self):
        return 0 if self.waiter_objects is None else len(self.waiter_objects)

    cdef int add_waiter(self, int32_t index, int64_t timestamp, object waiter) except -1:
        """Allocates nothing the garbage collector tracks (the list exists, growing it is not an
        allocation of an object): safe in the middle of appending a record."""
        cdef Py_ssize_t n = len(self.waiter_objects)
        cdef Py_ssize_t cap
        cdef int32_t* grown_index
        cdef int64_t* grown_timestamp
        if n == self.waiter_capacity:
            cap = 16 if n == 0 else 2 * n
            grown_index = <int32_t*>realloc(self.waiter_index, cap * sizeof(int32_t))
            if grown_index == NULL:
                raise MemoryError()
            self.waiter_index = grown_index
            grown_timestamp = <int64_t*>realloc(self.waiter_timestamp, cap * sizeof(int64_t))
            if grown_timestamp == NULL:
                raise MemoryError()
            self.waiter_timestamp = grown_timestamp
            self.waiter_capacity = cap
        self.waiter_index[n] = index
        self.waiter_timestamp[n] = timestamp
        self.waiter_objects.append(waiter)
        return 0

    def __repr__(self):
        return (f"Batch(id={self.batch_id}, records={self.record_count}, bytes={self.length}, "
                f"base_sequence={self.base_sequence}, producer_id={self.producer_id}, "
                f"producer_epoch={self.producer_epoch})")


cdef Batch _new_batch():
    """A batch to open later, with its (empty) waiter list: both allocated before a record needs it."""
    cdef Batch b = Batch.__new__(Batch)
    b.waiter_objects = []
    return b


cdef class PartitionQueue:
    """One partition's batches: the open one and the closed ones waiting to be sent, oldest first."""

    cdef readonly str topic
    cdef readonly int partition
    cdef Batch open
    cdef list closed
    cdef public bint muted  # a request of this partition is in flight or waiting for a retry
    cdef readonly int64_t next_sequence  # the base_sequence the next drained batch gets
    cdef TopicState topic_state

    def __repr__(self):
        return f"PartitionQueue({self.topic}-{self.partition}, closed={len(self.closed)}, muted={self.muted})"

    @property
    def empty(self):
        return self.open is None and not self.closed


cdef class TopicState:
    """A topic's partition queues, and where its keyless records go next."""

    cdef readonly str name
    cdef readonly Py_ssize_t partition_count
    cdef list partitions
    cdef Py_ssize_t next_partition  # sticky or round-robin cursor

    cdef inline Py_ssize_t check_partition(self, object partition) except -1:
        cdef Py_ssize_t p
        if not isinstance(partition, int):
            raise TypeError(f"partition must be an int, not {type(partition).__name__}")
        if not 0 <= partition < self.partition_count:
            raise UnknownTopicOrPartitionError(
                f"topic {self.name!r} has {self.partition_count} partitions (0..{self.partition_count - 1}), "
                f"no partition {partition}")
        p = partition
        return p


cdef class RecordAccumulator:
    """Per-partition batches behind :meth:`send` (module docstring).  Subclassed by ``Producer``,
    which supplies the hooks ``_topic_partition_count``, ``_wait_for_room`` and ``_raise_closed``."""

    cdef dict _topics
    cdef bytes _producer_name
    cdef readonly Py_ssize_t header_room
    cdef readonly bint idempotent
    cdef readonly int64_t producer_id  # what drained batches carry; -1 until set_producer_identity
    cdef readonly int32_t producer_epoch
    cdef readonly Py_ssize_t batch_bytes
    cdef readonly int codec
    cdef readonly double linger_s
    cdef readonly int64_t window_ms  # > 0: build_payload counts each batch's records per window
    cdef readonly int64_t buffered_bytes
    cdef readonly int64_t buffer_bytes
    cdef int64_t _last_batch_id
    cdef int64_t _flush_through  # batches with an id up to this are due now, linger or not
    cdef dict _unfinished  # batch_id -> Batch, every batch not yet finished
    cdef Batch _spare  # the next batch to open, allocated before a record touches anything
    cdef bint _wake_pending
    cdef int _wake_fd
    cdef readonly bint closed
    cdef int _partitioner_kind
    cdef object _partitioner
    cdef unsigned char* _pool[POOL_SIZE]
    cdef Py_ssize_t _pool_capacity[POOL_SIZE]
    cdef int _pool_count

    def __cinit__(self, *args, **kwargs):
        self._topics = {}
        self._unfinished = {}
        self._wake_fd = -1
        self._pool_count = 0

    def __init__(self, producer_name="", int codec=0, Py_ssize_t batch_bytes=1 << 20, double linger_ms=5,
                 int64_t buffer_bytes=32 << 20, partitioner=PARTITIONER_STICKY, int wake_fd=-1,
                 int64_t window_ms=0, bint idempotent=False):
        name = producer_name.encode("utf-8") if isinstance(producer_name, str) else bytes(producer_name)
        if len(name) > MAX_PRODUCER_NAME:
            raise ValueError(f"producer name is {len(name)} bytes of UTF-8; at most {MAX_PRODUCER_NAME} fit")
        if codec not in (CODEC_NONE_, CODEC_LZ4_):
            raise ValueError(f"unknown compression codec {codec} (0 none, 1 lz4)")
        header_room = C_HEADER_SIZE + (C_IDENTITY_SIZE if idempotent else 0) + len(name)
        if batch_bytes < header_room + 8 or batch_bytes > 0x7FFFFFFF:
            raise ValueError(f"batch_bytes {batch_bytes} must hold the {header_room}-byte header "
                             f"and a record, and be below 2 GiB")
        self._producer_name = name
        self.header_room = header_room
        self.idempotent = idempotent
        self.producer_id = NO_PRODUCER_ID_
        self.producer_epoch = NO_PRODUCER_ID_
        self.codec = codec
        self.batch_bytes = batch_bytes
        self.linger_s = linger_ms / 1000.0
        self.buffer_bytes = buffer_bytes
        if callable(partitioner):
            self._partitioner_kind, self._partitioner = PARTITIONER_CALLABLE, partitioner
        elif partitioner in (PARTITIONER_STICKY, PARTITIONER_ROUND_ROBIN):
            self._partitioner_kind = partitioner
        else:
            raise ValueError(f"unknown partitioner {partitioner!r}")
        self._wake_fd = wake_fd
        if window_ms < 0:
            raise ValueError(f"window_ms must be 0 (no window counts) or positive, got {window_ms}")
        self.window_ms = window_ms

    def __dealloc__(self):
        cdef int i
        for i in range(self._pool_count):
            free(self._pool[i])
        self._pool_count = 0

    # --- the application's side ---------------------------------------------------------------

    def send(self, topic, value, key=None, headers=None, timestamp=None, partition=None, callback=None):
        """Append one record to its partition's open batch and return None (no future, nothing kept).

        ``value``, ``key``: bytes-like or None.  ``headers``: ``[(str, bytes-like or None)]``.
        ``timestamp``: ms since the epoch, now if None.  ``partition``: overrides the partitioner.
        ``callback``: a ``concurrent.futures.Future`` to complete, or ``f(metadata, error)`` to call
        (on the producer's I/O thread) once the record is acknowledged or failed.  Raises TypeError,
        UnknownTopicOrPartitionError, RecordTooLargeError or ValueError for bad input, at once."""
        cdef PyObject* found
        cdef TopicState t
        cdef int64_t ts
        cdef Py_ssize_t p
        if self.closed:  # again in _append, after any wait: this one only saves the wait
            self._raise_closed()
        if self.buffered_bytes >= self.buffer_bytes:
            self._wait_for_room()
        found = PyDict_GetItem(self._topics, topic)
        t = self._new_topic(topic) if found == NULL else <TopicState>found
        if timestamp is None:
            ts = now_ms()
        else:
            ts = timestamp if PyLong_CheckExact(timestamp) else _as_timestamp(timestamp)
            if ts < 0:
                raise ValueError(f"timestamp {ts} is negative: milliseconds since the epoch expected")
        if partition is not None:
            p = t.check_partition(partition)
        else:
            p = self._choose(t, key)
        self._append(<PartitionQueue>PyList_GET_ITEM(t.partitions, p), value, key, ts, headers, callback,
                     partition is None and key is None and self._partitioner_kind == PARTITIONER_STICKY, False)

    def send_many(self, topic, values, keys=None, partition=None, timestamp=None):
        """Append every value of ``values``, in order; returns the count.  ``values``: a list or
        other sequence of bytes-like objects (or None), or one 2-D C-contiguous buffer of bytes
        (a numpy uint8 array of shape (n, size), a memoryview cast to that shape) whose row i is
        the value of record i: its records are encoded straight from the buffer, which is held
        until the call returns.  ``keys``: None or one key per value.  One timestamp (now,
        unless given) for them all."""
        cdef Py_buffer rows
        cdef list vals
        cdef list key_list
        cdef TopicState t
        cdef int64_t ts
        cdef Py_ssize_t i, n, p = -1
        cdef bint sticky = partition is None and self._partitioner_kind == PARTITIONER_STICKY
        if _rows_buffer(values, &rows):
            try:
                return self._send_rows(topic, &rows, keys, partition, timestamp, sticky)
            finally:
                PyBuffer_Release(&rows)
        vals = values if type(values) is list else list(values)
        n = PyList_GET_SIZE(vals)
        key_list = _key_list(keys, n)
        t = self._many_target(topic, partition, timestamp, &ts, &p)
        for i in range(n):
            if self.buffered_bytes >= self.buffer_bytes:
                self._wait_for_room()
            key = None if key_list is None else <object>PyList_GET_ITEM(key_list, i)
            self._append(<PartitionQueue>PyList_GET_ITEM(t.partitions, self._choose(t, key) if p < 0 else p),
                         <object>PyList_GET_ITEM(vals, i), key, ts, None, None, sticky and key is None, False)
        return n

    cdef Py_ssize_t _send_rows(self, object topic, Py_buffer* rows, object keys, object partition,
                               object timestamp, bint sticky) except -1:
        """:meth:`send_many` of a held 2-D buffer: row ``i`` is the value of record ``i``, appended
        from its place in the buffer (no Python object per record)."""
        cdef const unsigned char* row = <const unsigned char*>rows.buf
        cdef Py_ssize_t n = rows.shape[0], size = rows.shape[1]
        cdef Py_ssize_t i, p = -1
        cdef int64_t ts
        cdef PartitionQueue q
        cdef list key_list = _key_list(keys, n)
        cdef TopicState t = self._many_target(topic, partition, timestamp, &ts, &p)
        for i in range(n):
            if self.buffered_bytes >= self.buffer_bytes:
                self._wait_for_room()
            key = None if key_list is None else <object>PyList_GET_ITEM(key_list, i)
            q = <PartitionQueue>PyList_GET_ITEM(t.partitions, self._choose(t, key) if p < 0 else p)
            self._append_value(q, row, size, <uint64_t>size + 1, key, ts, NULL, 0, None,
                               sticky and key is None, False)
            row += size
        return n

    cdef TopicState _many_target(self, object topic, object partition, object timestamp, int64_t* ts,
                                 Py_ssize_t* p):
        """What every record of one :meth:`send_many` shares: its topic's state, the timestamp
        (``ts``) and the partition if given (``p``, else left at -1)."""
        cdef PyObject* found
        cdef TopicState t
        if self.closed:
            self._raise_closed()
        found = PyDict_GetItem(self._topics, topic)
        t = self._new_topic(topic) if found == NULL else <TopicState>found
        if timestamp is None:
            ts[0] = now_ms()
        else:
            ts[0] = timestamp if PyLong_CheckExact(timestamp) else _as_timestamp(timestamp)
        if ts[0] < 0:
            raise ValueError(f"timestamp {ts[0]} is negative: milliseconds since the epoch expected")
        if partition is not None:
            p[0] = t.check_partition(partition)
        return t

    def send_internal(self, str topic, Py_ssize_t partition, value, key, callback):
        """The producer I/O thread's own records (monitoring events): appended to ``partition``
        of a topic registered with :meth:`set_partition_count`, without waiting for buffer room
        and even after ``closed`` is set; the I/O thread settles them like any other before it
        stops (``take_all``).  Now as timestamp."""
        cdef PyObject* found = PyDict_GetItem(self._topics, topic)
        if found == NULL:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} is not registered with this accumulator")
        cdef TopicState t = <TopicState>found
        self._append(<PartitionQueue>PyList_GET_ITEM(t.partitions, t.check_partition(partition)), value, key,
                     now_ms(), None, callback, False, True)

    cdef TopicState _new_topic(self, object topic):
        """First record of a topic: learn its partition count (the producer asks the broker)."""
        if type(topic) is not str:
            raise TypeError(f"topic must be a str, not {type(topic).__name__}")
        count = self._topic_partition_count(topic)
        return self._register_topic(topic, count)

    cdef TopicState _register_topic(self, str topic, Py_ssize_t count):
        """The topic's state, made if new, with at least ``count`` partition queues.  Threads may
        race here (a first send from two threads; the I/O thread after a metadata refresh): the
        state is built complete before one ``setdefault`` looks and stores, and each queue is
        allocated before the count it takes is read (module docstring: allocate first)."""
        cdef TopicState t, fresh
        cdef PartitionQueue q
        _check_partition_count(count, topic)
        fresh = TopicState.__new__(TopicState)
        fresh.name = topic
        fresh.partitions = []
        fresh.next_partition = int.from_bytes(_os.urandom(4), "little") % count  # may let the GIL go
        t = <TopicState>self._topics.setdefault(topic, fresh)
        while t.partition_count < count:
            q = PartitionQueue.__new__(PartitionQueue)
            q.topic, q.closed, q.topic_state = topic, [], t
            if t.partition_count < count:  # still: nothing since the test let the GIL go
                q.partition = t.partition_count
                t.partitions.append(q)
                t.partition_count += 1
        return t

    def set_partition_count(self, str topic, Py_ssize_t count):
        """Record that ``topic`` has ``count`` partitions (more than before: add queues).  A
        count that shrank is ignored here; the I/O thread fails what cannot be delivered."""
        self._register_topic(topic, count)

    def partition_count(self, str topic):
        """Partitions known for ``topic``, or 0 if it was never used."""
        found = self._topics.get(topic)
        return 0 if found is None else (<TopicState>found).partition_count

    cdef Py_ssize_t _choose(self, TopicState t, object key) except -1:
        cdef Py_ssize_t p
        cdef const unsigned char* kptr = NULL
        cdef Py_ssize_t klen = 0
        cdef Py_buffer kbuf
        cdef int krel
        if self._partitioner_kind == PARTITIONER_CALLABLE:
            return t.check_partition(self._partitioner(t.name, key, t.partition_count))
        if key is None:
            p = t.next_partition
            if self._partitioner_kind == PARTITIONER_ROUND_ROBIN:
                t.next_partition = p + 1 if p + 1 < t.partition_count else 0
            return p
        krel = _borrow(key, &kbuf, &kptr, &klen, "key")
        p = crc32c_update(0, kptr, <size_t>klen) % <uint32_t>t.partition_count if klen else 0
        if krel:
            PyBuffer_Release(&kbuf)
        return p

    cdef int _append(self, PartitionQueue q, object value, object key, int64_t ts, object headers,
                     object waiter, bint sticky, bint internal) except -1:
        """:meth:`_append_value` of a value given as an object (bytes-like or None) and headers
        as pairs: encodes the headers and borrows the value's bytes for the time of the append."""
        cdef Py_buffer vbuf
        cdef const unsigned char* vptr = NULL
        cdef const char* hptr = NULL
        cdef Py_ssize_t vlen = 0, hlen = 0
        cdef int vrel = 0
        cdef bytes encoded_headers = None
        if headers:
            encoded_headers = encode_headers(headers)
            hlen = PyBytes_GET_SIZE(encoded_headers)
            hptr = PyBytes_AS_STRING(encoded_headers)
        if self.closed and not internal:  # before any complaint about the value (and again at the end)
            self._raise_closed()
        if value is None:
            return self._append_value(q, NULL, 0, 0, key, ts, hptr, hlen, waiter, sticky, internal)
        vrel = _borrow(value, &vbuf, &vptr, &vlen, "value")
        try:
            self._append_value(q, vptr, vlen, <uint64_t>vlen + 1, key, ts, hptr, hlen, waiter, sticky,
                               internal)
        finally:
            if vrel:
                PyBuffer_Release(&vbuf)
        return 0

    cdef int _append_value(self, PartitionQueue q, const unsigned char* vptr, Py_ssize_t vlen,
                           uint64_t vfield, object key, int64_t ts, const char* headers, Py_ssize_t hlen,
                           object waiter, bint sticky, bint internal) except -1:
        """Encode one record at the end of ``q``'s open batch, closing it first if it is full.
        The value is ``vlen`` bytes at ``vptr`` (``vfield``: 0 for a null value, else ``vlen + 1``),
        which the caller keeps valid (a borrowed buffer) until this returns; ``headers``: ``hlen``
        bytes already encoded (FORMAT.md), or none.  ``sticky``: the sticky rule chose ``q``; if
        the batch is full the record follows the rule to the next partition instead of opening
        the next batch here.  ``internal``: a record of the I/O thread's own
        (:meth:`send_internal`), appended even once ``closed`` is set.

        Allocate first, then touch (module docstring): the caller's objects (encoded headers,
        borrowed value), the key's buffer and the spare batch (with its waiter list) exist before
        ``closed`` and the open batch are looked at; from there to the last counter nothing lets
        the GIL go, so the I/O thread never sees the record half added, and no record is added
        once the producer is closed."""
        cdef Py_buffer kbuf
        cdef const unsigned char* kptr = NULL
        cdef Py_ssize_t klen = 0, body, total
        cdef uint64_t kfield = 0
        cdef int krel = 0
        cdef int64_t delta
        cdef Batch b
        if key is not None:
            krel = _borrow(key, &kbuf, &kptr, &klen, "key")
            kfield = <uint64_t>klen + 1
        try:
            while self._spare is None:  # the batch _open takes, if it must open one
                self._spare = _new_batch()
            if self.closed and not internal:
                self._raise_closed()
            if vlen + klen + hlen + RECORD_OVERHEAD_MAX > self.batch_bytes - self.header_room:
                self._check_record_fits(vlen, klen, hlen, vfield, kfield)
            b = q.open
            while b is not None:
                delta = ts - b.first_timestamp
                body = _body_size(delta, b.record_count, kfield, klen, vfield, vlen, hlen)
                total = uvarint_size(<uint64_t>body) + body
                if b.length + total <= self.batch_bytes:
                    break
                self._close(q)
                b = None
                if sticky:  # ends: a partition without an open batch takes the record
                    q = <PartitionQueue>PyList_GET_ITEM(q.topic_state.partitions, q.topic_state.next_partition)
                    b = q.open
            if b is None:
                b = self._open(q, ts)
                delta = 0
                body = _body_size(0, 0, kfield, klen, vfield, vlen, hlen)
                total = uvarint_size(<uint64_t>body) + body
            if b.length + total > b.capacity:
                self._grow(b, b.length + total)
            _write_record(b.buf + b.length, body, delta, b.record_count, kfield, kptr, klen, vfield, vptr, vlen,
                          headers, hlen)
            if waiter is not None:
                b.add_waiter(b.record_count, ts, waiter)
            b.length += total
            b.record_count += 1
            if ts > b.max_timestamp:
                b.max_timestamp = ts
            elif ts < b.min_timestamp:
                b.min_timestamp = ts
            self.buffered_bytes += total
        finally:
            if krel:
                PyBuffer_Release(&kbuf)
        return 0

    cdef int _check_record_fits(self, Py_ssize_t vlen, Py_ssize_t klen, Py_ssize_t hlen, uint64_t vfield,
                                uint64_t kfield) except -1:
        """Refuse a record that could not fit even alone in a batch (its size as a first record)."""
        cdef Py_ssize_t body = _body_size(0, 0, kfield, klen, vfield, vlen, hlen)
        cdef Py_ssize_t size = self.header_room + uvarint_size(<uint64_t>body) + body
        if size > self.batch_bytes:
            raise RecordTooLargeError(
                f"a record with a {klen}-byte key, a {vlen}-byte value and {hlen} bytes of headers makes a "
                f"{size}-byte batch on its own, over batch_bytes {self.batch_bytes}")
        return 0

    cdef Batch _open(self, PartitionQueue q, int64_t ts):
        """Open the spare as ``q``'s batch (allocates nothing: see _append)."""
        cdef Batch b = self._spare
        self._spare = None
        if self._pool_count:
            self._pool_count -= 1
            b.buf = self._pool[self._pool_count]
            b.capacity = self._pool_capacity[self._pool_count]
        else:
            self._grow(b, min(<Py_ssize_t>INITIAL_BUFFER, self.batch_bytes))
        b.length = self.header_room
        b.first_timestamp = b.max_timestamp = b.min_timestamp = ts
        b.created_s = _monotonic_s()
        b.base_sequence = -1
        b.producer_id = NO_PRODUCER_ID_
        b.producer_epoch = NO_PRODUCER_ID_
        self._last_batch_id += 1
        b.batch_id = self._last_batch_id
        b.queue = q
        self._unfinished[b.batch_id] = b
        q.open = b
        self._wake()
        return b

    cdef int _grow(self, Batch b, Py_ssize_t want) except -1:
        cdef Py_ssize_t cap = b.capacity or INITIAL_BUFFER
        cdef unsigned char* grown
        while cap < want:
            cap *= 2
        if cap > self.batch_bytes:
            cap = max(self.batch_bytes, want)
        grown = <unsigned char*>realloc(b.buf, cap)
        if grown == NULL:
            raise MemoryError(f"cannot grow a batch buffer to {cap} bytes")
        b.buf = grown
        b.capacity = cap
        return 0

    cdef void _close(self, PartitionQueue q, bint wake=True):
        """The open batch is complete: queue it, and send keyless records elsewhere next."""
        cdef TopicState t = q.topic_state
        q.closed.append(q.open)
        q.open = None
        if self._partitioner_kind == PARTITIONER_STICKY and t.next_partition == q.partition:
            t.next_partition = q.partition + 1 if q.partition + 1 < t.partition_count else 0
        if wake:
            self._wake()

    cdef inline void _wake(self):
        """Tell the I/O thread there is news (a batch opened or closed), once until it looks."""
        cdef char byte = 120  # "x"
        if not self._wake_pending and self._wake_fd >= 0:
            self._wake_pending = True
            write(self._wake_fd, &byte, 1)  # a non-blocking pipe: if it is full, a wake-up is pending anyway

    # --- the producer's side ------------------------------------------------------------------

    def wake(self):
        """Wake the I/O thread (from any thread), unless a wake-up is already pending."""
        self._wake()

    def set_wake_fd(self, int fd):
        """Where :meth:`wake` writes (-1: nowhere, once the I/O thread is gone)."""
        self._wake_fd = fd

    def woken(self):
        """The I/O thread saw the wake-up: the next news must wake it again.  Called before it
        looks at the accumulator, so nothing that happens afterwards goes unnoticed."""
        self._wake_pending = False

    def mark_flush(self):
        """Make every batch opened so far due now; the id of the newest one (0 if none)."""
        self._flush_through = self._last_batch_id
        self._wake()
        return self._last_batch_id

    def unfinished_through(self, int64_t batch_id):
        """Whether a batch with an id up to ``batch_id`` is not yet finished."""
        for other in self._unfinished:
            if <int64_t>other <= batch_id:
                return True
        return False

    @property
    def unfinished_batches(self):
        return len(self._unfinished)

    def close_for_sends(self):
        """From now on :meth:`send` raises (through ``_raise_closed``)."""
        self.closed = True
        self._flush_through = self._last_batch_id
        self._wake()

    def set_producer_identity(self, int64_t producer_id, int64_t producer_epoch):
        """The identity that batches drained from now on carry (an idempotent accumulator only),
        and every partition's next sequence back to 0: a new identity numbers its records afresh.

        The I/O thread calls it only while no batch of the old identity is left to drain or to
        resend (a retry resends its first bytes, old identity included), or the broker would see
        the old identity's sequences start again."""
        cdef TopicState t
        cdef PartitionQueue q
        if not self.idempotent:
            raise RuntimeError("set_producer_identity on an accumulator that is not idempotent")
        if producer_id < 0:
            raise ValueError(f"producer_id {producer_id} must be >= 0")
        if not 0 <= producer_epoch <= 0x7FFFFFFF:
            raise ValueError(f"producer_epoch {producer_epoch} must be in [0, 2**31 - 1]")
        for t in list(self._topics.values()):
            for q in t.partitions:
                q.next_sequence = 0
        self.producer_id = producer_id
        self.producer_epoch = <int32_t>producer_epoch

    def drain(self, double now_s, Py_ssize_t max_request_bytes):
        """The batches due now, per partition: ``(ready, next_due_s)``.

        ``ready`` lists ``(queue, batches)`` for every partition that is not muted and has a due
        batch: its closed batches, oldest first, then its open one if its linger time has passed
        or a flush asked for it, as many as fit in ``max_request_bytes`` (at least one).  They
        leave the accumulator and get their ``base_sequence`` (and, when idempotent, the producer
        identity).  ``next_due_s``: when the earliest open batch left behind becomes due
        (infinity if none).  RuntimeError when idempotent and no identity is set yet.
        """
        cdef list ready = []
        cdef double next_due = _INFINITY, due
        cdef TopicState t
        cdef PartitionQueue q
        cdef Batch b
        cdef list taken
        cdef Py_ssize_t size, i, n
        if self.idempotent and self.producer_id < 0:
            raise RuntimeError("an idempotent accumulator drains nothing before set_producer_identity")
        for t in list(self._topics.values()):  # a copy: a send may add a topic while this allocates
            for q in t.partitions:
                if q.muted or (q.open is None and not q.closed):
                    continue
                taken = []
                size = 0
                n = len(q.closed)
                i = 0
                while i < n:
                    b = <Batch>q.closed[i]
                    if taken and size + b.length > max_request_bytes:
                        break
                    taken.append(b)
                    size += b.length
                    i += 1
                del q.closed[:i]
                if i < n:
                    next_due = now_s  # more closed batches than one request takes
                b = q.open
                if i == n and b is not None:
                    due = b.created_s + self.linger_s
                    if ((due <= now_s or b.batch_id <= self._flush_through)
                            and (not taken or size + b.length <= max_request_bytes)):
                        self._close(q, False)
                        del q.closed[:]
                        taken.append(b)
                    elif due < next_due:
                        next_due = due
                if taken:
                    for b in taken:
                        b.base_sequence = q.next_sequence
                        b.producer_id = self.producer_id
                        b.producer_epoch = self.producer_epoch
                        q.next_sequence += b.record_count
                    ready.append((q, taken))
        return ready, next_due

    def take_expired(self, double cutoff_s):
        """The batches opened at or before ``cutoff_s`` (``time.monotonic()``) that are still
        queued, muted partitions included: they leave the accumulator without a sequence or an
        identity (never sent), for the caller to fail and then :meth:`finish`.  The producer
        calls it for batches that waited ``delivery_timeout_ms`` for a producer id.

        A partition's batches are opened in order, so the ones taken are its oldest and those
        left behind keep their order; its next sequence is untouched (nothing was numbered).
        Returns ``[(queue, batches)]``, each partition's batches oldest first."""
        cdef list expired = []
        cdef TopicState t
        cdef PartitionQueue q
        cdef Batch b
        cdef list taken
        cdef Py_ssize_t i, n
        for t in list(self._topics.values()):  # a copy: a send may add a topic while this allocates
            for q in t.partitions:
                if q.open is None and not q.closed:
                    continue
                taken = []  # allocated before q is read (module docstring: allocate first, then touch)
                n = len(q.closed)
                i = 0
                while i < n and (<Batch>q.closed[i]).created_s <= cutoff_s:
                    taken.append(q.closed[i])
                    i += 1
                del q.closed[:i]
                b = q.open
                if i == n and b is not None and b.created_s <= cutoff_s:
                    self._close(q, False)
                    del q.closed[:]
                    taken.append(b)
                if taken:
                    expired.append((q, taken))
        return expired

    def take_all(self):
        """Every unfinished batch (when the producer gives up, after settling the requests it
        holds): those still queued, muted partitions too, and any other that is not finished,
        such as one drained into a request that was never made.  Their buffers are freed.
        Returns ``[(queue, batches)]``, each partition's batches in the order they were opened."""
        cdef dict by_queue = {}
        cdef TopicState t
        cdef PartitionQueue q
        cdef Batch b
        for t in list(self._topics.values()):
            for q in t.partitions:
                if q.open is not None:
                    self._close(q, False)
                q.closed = []
        for _, b in sorted(self._unfinished.items()):  # by batch_id: the order they were opened
            self._recycle(b)
            by_queue.setdefault(b.queue, []).append(b)
        return list(by_queue.items())

    def build_payload(self, list batches):
        """The bytes of one ProduceRequest: ``batches`` (one partition's, drained, in order)
        finished as FORMAT.md says (header, producer name, records section lz4-compressed when
        the producer compresses and it helps), back to back.  Each batch's buffer goes back to
        the pool; the Batch objects keep what settling them needs (``crc``, counts, waiters).

        The copy and the CRCs of a large payload run without the GIL: the batches are detached
        from the accumulator and the result is not shared yet, so ``send`` may go on meanwhile."""
        cdef Py_ssize_t n = len(batches), total = 0, records_len, i
        cdef list sections = [None] * n  # keeps the compressed sections alive while the GIL is released
        cdef Batch b
        cdef _Finish* items = <_Finish*>malloc(max(n, 1) * sizeof(_Finish))
        cdef const unsigned char* name = <const unsigned char*>PyBytes_AS_STRING(self._producer_name)
        cdef Py_ssize_t name_len = len(self._producer_name)
        cdef unsigned char* out
        if items == NULL:
            raise MemoryError()
        try:
            for i in range(n):
                b = <Batch>batches[i]
                records_len = b.length - self.header_room
                items[i].section = b.buf + self.header_room
                items[i].section_len = records_len
                items[i].codec = CODEC_NONE_
                if self.codec == CODEC_LZ4_:
                    compressed = _lz4frame.compress(<unsigned char[:records_len]>(b.buf + self.header_room),
                                                    store_size=True)
                    if len(compressed) < records_len:  # incompressible data goes as it is
                        sections[i] = compressed
                        items[i].section = <const unsigned char*>PyBytes_AS_STRING(compressed)
                        items[i].section_len = len(compressed)
                        items[i].codec = CODEC_LZ4_
                if self.window_ms:
                    b.window_counts = _window_counts(b.buf + self.header_room, b.buf + b.length, b.first_timestamp,
                                                     b.min_timestamp, b.max_timestamp, b.record_count,
                                                     self.window_ms)
                items[i].record_count = b.record_count
                items[i].first_timestamp = b.first_timestamp
                items[i].max_timestamp = b.max_timestamp
                items[i].base_sequence = b.base_sequence
                items[i].producer_id = b.producer_id
                items[i].producer_epoch = b.producer_epoch
                total += self.header_room + items[i].section_len
            result = PyBytes_FromStringAndSize(NULL, total)
            out = <unsigned char*>PyBytes_AS_STRING(result)
            if total >= NOGIL_PAYLOAD_BYTES:
                with nogil:
                    _finish_batches(out, items, n, name, name_len)
            else:
                _finish_batches(out, items, n, name, name_len)
            for i in range(n):
                b = <Batch>batches[i]
                b.crc = items[i].crc
                self._recycle(b)
        finally:
            free(items)
        return result

    cdef void _recycle(self, Batch b):
        if b.buf == NULL:
            return
        if self._pool_count < POOL_SIZE:
            self._pool[self._pool_count] = b.buf
            self._pool_capacity[self._pool_count] = b.capacity
            self._pool_count += 1
        else:
            free(b.buf)
        b.buf = NULL
        b.capacity = 0

    def finish(self, list batches):
        """``batches`` are settled (acknowledged or failed): their bytes no longer count against
        ``buffer_bytes`` and they no longer hold up a flush."""
        cdef Batch b
        for b in batches:
            if self._unfinished.pop(b.batch_id, None) is not None:
                self.buffered_bytes -= b.length - self.header_room
            self._recycle(b)

    # --- hooks the producer overrides ---------------------------------------------------------

    def _topic_partition_count(self, topic):
        raise UnknownTopicOrPartitionError(f"topic {topic!r} is unknown to this accumulator")

    def _wait_for_room(self):
        pass

    def _raise_closed(self):
        raise RuntimeError("the accumulator is closed")
