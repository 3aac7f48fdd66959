/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78), as used by iSCSI, ext4 and Kafka.
 *
 * crc32c_update(crc, data, n) continues a CRC: start with 0, feed chunks in order, and the
 * result equals the CRC of the concatenation.  The check value of "123456789" is 0xE3069283.
 * On x86-64 CPUs with SSE4.2 the crc32 instruction is used, three chains at a time on long
 * buffers (about 25 GB/s on one core here); the choice is made once, at first call;
 * elsewhere a slicing-by-8 table does the work.  Both are pure C and safe to call without the GIL.
 */
#ifndef HPBROKER_CRC32C_H
#define HPBROKER_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t crc32c_update(uint32_t crc, const unsigned char *data, size_t n);

/* 1 when the hardware path is in use, 0 for the table path. */
int crc32c_hardware(void);

/* The table path regardless of the CPU, for tests that compare both paths. */
uint32_t crc32c_update_sw(uint32_t crc, const unsigned char *data, size_t n);

#endif
