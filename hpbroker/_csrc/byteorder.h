/* Little-endian loads and stores at any alignment: every multi-byte field of the record batch
 * format (docs/FORMAT.md) is little-endian.  memcpy compiles to a single move on x86-64. */
#ifndef HPBROKER_BYTEORDER_H
#define HPBROKER_BYTEORDER_H

#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define HPB_LE16(x) __builtin_bswap16(x)
#define HPB_LE32(x) __builtin_bswap32(x)
#define HPB_LE64(x) __builtin_bswap64(x)
#else
#define HPB_LE16(x) (x)
#define HPB_LE32(x) (x)
#define HPB_LE64(x) (x)
#endif

static inline uint32_t load_u32le(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return HPB_LE32(v); }
static inline int32_t load_i32le(const unsigned char *p) { return (int32_t)load_u32le(p); }
static inline int64_t load_i64le(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return (int64_t)HPB_LE64(v); }
static inline void store_u32le(unsigned char *p, uint32_t v) { v = HPB_LE32(v); memcpy(p, &v, 4); }
static inline void store_i32le(unsigned char *p, int32_t v) { store_u32le(p, (uint32_t)v); }
static inline void store_i64le(unsigned char *p, int64_t v) { uint64_t u = HPB_LE64((uint64_t)v); memcpy(p, &u, 8); }

#endif
