/* The size handshake of structs that only grow (Linux's
 * copy_struct_from_user is the model). A caller built against an older
 * header passes a smaller `size`, a newer one a larger. */
#ifndef KVT_UTIL_ABI_H
#define KVT_UTIL_ABI_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kvtier/kvtier.h"

#define KVT__STRUCT_GROWTH_MAX 4096u /* bytes a newer caller's struct may add */

/* Input struct: *dst holds the defaults; the caller's first src_size bytes
 * replace them. Smaller than the first version, or larger with a nonzero
 * byte this library does not know (a field it cannot honour): KVT_EVERSION. */
static inline int kvt__struct_in(void *dst, size_t dst_size, const void *src, size_t src_size,
                                 size_t min_size) {
  /* A size far past ours is garbage (an unset field), not a newer header:
   * refuse it before reading a byte of it. */
  if (src_size < min_size || src_size > dst_size + KVT__STRUCT_GROWTH_MAX) return KVT_EVERSION;
  for (size_t i = dst_size; i < src_size; i++)
    if (((const unsigned char *)src)[i]) return KVT_EVERSION;
  memcpy(dst, src, src_size < dst_size ? src_size : dst_size);
  *(uint32_t *)dst = (uint32_t)dst_size;
  return 0;
}

/* Output struct: the caller's `size` (its first field) says how much it can
 * take; at most that much of src is written and `size` becomes the bytes
 * written. Fields past it are left untouched. */
static inline int kvt__struct_out(void *dst, const void *src, size_t src_size, size_t min_size) {
  uint32_t have = *(const uint32_t *)dst;
  if (have < min_size) return KVT_EVERSION;
  size_t n = have < src_size ? have : src_size;
  memcpy(dst, src, n);
  *(uint32_t *)dst = (uint32_t)n;
  return 0;
}

#endif
