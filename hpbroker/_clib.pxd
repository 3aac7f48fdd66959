# Shared C-level declarations for the compiled core: the record batch layout (docs/FORMAT.md)
# and the small C helpers under hpbroker/_csrc/.  Every number of the format is declared here,
# once; _core.pyx re-exports the public ones to Python.

from libc.stdint cimport int32_t, int64_t, uint32_t

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
    C_HEADER_SIZE = 56           # fixed header; the producer name follows it
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

    CODEC_NONE_ = 0
    CODEC_LZ4_ = 1
    CODEC_MASK_ = 0x07
