/* CRC32C: a hardware path (SSE4.2 crc32 instruction) and a portable slicing-by-8 path.
 * See crc32c.h for the contract. */
#include "crc32c.h"

#include <string.h>

#define CRC32C_POLY 0x82F63B78u

static uint32_t table[8][256];
static int table_ready = 0;

static void build_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xFF];
    __atomic_store_n(&table_ready, 1, __ATOMIC_RELEASE);
}

static uint32_t crc32c_sw(uint32_t crc, const unsigned char *p, size_t n)
{
    if (!__atomic_load_n(&table_ready, __ATOMIC_ACQUIRE))
        build_table();
    while (n && ((uintptr_t)p & 7)) {
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xFF];
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        w = __builtin_bswap64(w);
#endif
        w ^= crc;
        crc = table[7][w & 0xFF] ^ table[6][(w >> 8) & 0xFF] ^ table[5][(w >> 16) & 0xFF] ^
              table[4][(w >> 24) & 0xFF] ^ table[3][(w >> 32) & 0xFF] ^ table[2][(w >> 40) & 0xFF] ^
              table[1][(w >> 48) & 0xFF] ^ table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xFF];
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_HW_PATH 1
#include <nmmintrin.h>

/* The crc32 instruction has a latency of 3 cycles but can start one per cycle, so one chain of
 * instructions runs at a third of the unit's speed.  Long buffers are therefore cut into three
 * consecutive blocks of equal length L, each CRC'd by its own chain (the second and third starting
 * from 0), and the results combined using linearity of the raw CRC state:
 *
 *     crc(A || B || C) = shift_L(shift_L(crc(A)) ^ crc0(B)) ^ crc0(C)
 *
 * where shift_L(s) is the state after feeding L zero bytes to state s, a linear map on 32 bits,
 * applied with four 256-entry tables built once from the images of the 32 basis vectors. */
#define LONG_BLOCK 8192
#define SHORT_BLOCK 256

static uint32_t shift_long[4][256], shift_short[4][256];
static int shift_ready = 0;

__attribute__((target("sse4.2"))) static uint32_t zeros_hw(uint32_t state, size_t n)
{
    uint64_t c = state;
    for (; n >= 8; n -= 8)
        c = _mm_crc32_u64(c, 0);
    for (; n; n--)
        c = _mm_crc32_u8((uint32_t)c, 0);
    return (uint32_t)c;
}

static void build_shift_table(uint32_t out[4][256], size_t n)
{
    uint32_t basis[32];
    for (int bit = 0; bit < 32; bit++)
        basis[bit] = zeros_hw(1u << bit, n);
    for (int k = 0; k < 4; k++)
        for (uint32_t v = 0; v < 256; v++) {
            uint32_t image = 0;
            for (int b = 0; b < 8; b++)
                if (v & (1u << b))
                    image ^= basis[8 * k + b];
            out[k][v] = image;
        }
}

static inline uint32_t apply_shift(uint32_t table[4][256], uint32_t s)
{
    return table[0][s & 0xFF] ^ table[1][(s >> 8) & 0xFF] ^ table[2][(s >> 16) & 0xFF] ^ table[3][s >> 24];
}

/* Three chains over blocks of `block` bytes; p must be 8-byte aligned, n >= 3 * block. */
__attribute__((target("sse4.2"))) static uint32_t three_way(uint32_t crc, const unsigned char **pp, size_t *np,
                                                             size_t block, uint32_t table[4][256])
{
    const unsigned char *p = *pp;
    size_t n = *np;
    while (n >= 3 * block) {
        uint64_t c0 = crc, c1 = 0, c2 = 0;
        const unsigned char *end = p + block;
        do {
            uint64_t w0, w1, w2;
            memcpy(&w0, p, 8);
            memcpy(&w1, p + block, 8);
            memcpy(&w2, p + 2 * block, 8);
            c0 = _mm_crc32_u64(c0, w0);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
            p += 8;
        } while (p < end);
        crc = apply_shift(table, apply_shift(table, (uint32_t)c0) ^ (uint32_t)c1) ^ (uint32_t)c2;
        p += 2 * block;
        n -= 3 * block;
    }
    *pp = p;
    *np = n;
    return crc;
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const unsigned char *p, size_t n)
{
    uint64_t c = crc;
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    if (n >= 3 * SHORT_BLOCK) {
        if (!__atomic_load_n(&shift_ready, __ATOMIC_ACQUIRE)) {
            /* Racing builders write identical values; readers wait for the release store. */
            build_shift_table(shift_long, LONG_BLOCK);
            build_shift_table(shift_short, SHORT_BLOCK);
            __atomic_store_n(&shift_ready, 1, __ATOMIC_RELEASE);
        }
        c = three_way((uint32_t)c, &p, &n, LONG_BLOCK, shift_long);
        c = three_way((uint32_t)c, &p, &n, SHORT_BLOCK, shift_short);
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        n -= 8;
    }
    while (n--)
        c = _mm_crc32_u8((uint32_t)c, *p++);
    return (uint32_t)c;
}
#endif

/* -1: not decided yet; 0: table; 1: hardware.  A benign race: every thread computes the same. */
static int use_hw = -1;

int crc32c_hardware(void)
{
    if (use_hw < 0) {
#ifdef HAVE_HW_PATH
        __builtin_cpu_init();
        use_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#else
        use_hw = 0;
#endif
    }
    return use_hw;
}

uint32_t crc32c_update(uint32_t crc, const unsigned char *data, size_t n)
{
    crc = ~crc;
#ifdef HAVE_HW_PATH
    if (crc32c_hardware())
        return ~crc32c_hw(crc, data, n);
#endif
    return ~crc32c_sw(crc, data, n);
}

/* Exposed for tests: force the table path to compare both. */
uint32_t crc32c_update_sw(uint32_t crc, const unsigned char *data, size_t n)
{
    return ~crc32c_sw(~crc, data, n);
}
