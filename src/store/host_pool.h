/* The host tier's memory: one slab of fixed-size slots, allocated once at
 * layout registration through the device backend (pinned where it can),
 * optionally mlock'ed when it is not pinned, and faulted in there and then
 * when it is neither, so no copy pays for first-touch page faults. A slot
 * holds one block record image (store/record.h), so a spill or fetch is a
 * single aligned I/O. */
#ifndef KVT_STORE_HOST_POOL_H
#define KVT_STORE_HOST_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "dev/dev.h"

typedef struct kvt__host_pool {
  char *base;
  size_t bytes, slot_bytes;
  uint64_t n_slots;
  int pinned, mlocked;
} kvt__host_pool;

int kvt__host_pool_init(kvt__host_pool *p, kvt__dev *dev, uint64_t n_slots, size_t slot_bytes,
                        int want_mlock);
void kvt__host_pool_fini(kvt__host_pool *p, kvt__dev *dev);

static inline void *kvt__host_slot(const kvt__host_pool *p, uint32_t slot) {
  return p->base + (size_t)slot * p->slot_bytes;
}

#endif
