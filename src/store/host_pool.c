#include "store/host_pool.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels answer EINVAL */
#endif

/* Faults every page in now, so the first stores into the pool copy at memory
 * speed instead of spending their time in the page-fault handler. */
static void prefault(char *base, size_t bytes) {
  if (madvise(base, bytes, MADV_POPULATE_WRITE) == 0) return;
  long page = sysconf(_SC_PAGESIZE);
  if (page <= 0) page = 4096;
  /* The pool is fresh anonymous memory: writing a zero changes nothing. */
  for (size_t off = 0; off < bytes; off += (size_t)page) ((volatile char *)base)[off] = 0;
}

int kvt__host_pool_init(kvt__host_pool *p, kvt__dev *dev, uint64_t n_slots, size_t slot_bytes,
                        int want_mlock) {
  memset(p, 0, sizeof *p);
  p->n_slots = n_slots;
  p->slot_bytes = slot_bytes;
  if (!n_slots || !slot_bytes) return 0; /* no tier, or metadata only */
  if (slot_bytes > SIZE_MAX / n_slots) return -EOVERFLOW;
  p->bytes = slot_bytes * n_slots;
  void *base = NULL;
  int rc = kvt__dev_host_alloc(dev, p->bytes, &base, &p->pinned);
  if (rc < 0) {
    p->bytes = 0;
    return rc;
  }
  p->base = base;
  /* Pageable memory can be swapped out under a copy; mlock when asked (it
   * faults the pages in as well). */
  if (!p->pinned && want_mlock && mlock(p->base, p->bytes) == 0) p->mlocked = 1;
  if (!p->pinned && !p->mlocked) prefault(p->base, p->bytes);
  return 0;
}

void kvt__host_pool_fini(kvt__host_pool *p, kvt__dev *dev) {
  if (p->base) {
    if (p->mlocked) munlock(p->base, p->bytes);
    kvt__dev_host_free(dev, p->base, p->bytes);
  }
  memset(p, 0, sizeof *p);
}
