/* Redis Cluster's hash slot of a key, as the server computes it: CRC16
 * (XMODEM) mod 16384, of the part between the first '{' and the next '}'
 * when that part is not empty. Pure: built with or without hiredis. */
#include <string.h>

#include "remote/remote.h"

static uint16_t crc16(const char *buf, size_t len) {
  uint16_t crc = 0;
  for (size_t i = 0; i < len; i++) {
    crc ^= (uint16_t)((unsigned char)buf[i] << 8);
    for (int b = 0; b < 8; b++) crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
  }
  return crc;
}

uint16_t kvt__remote_hash_slot(const char *key, size_t len) {
  const char *open = len ? memchr(key, '{', len) : NULL;
  if (open) {
    size_t start = (size_t)(open - key) + 1;
    const char *close = memchr(key + start, '}', len - start);
    if (close && close > key + start) return crc16(key + start, (size_t)(close - key - start)) & 16383u;
  }
  return crc16(key, len) & 16383u;
}
