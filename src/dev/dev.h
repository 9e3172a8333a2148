/* The engine's only way to a device backend: one-line wrappers that also
 * host the fault-injection hooks (SQLite os.c style). */
#ifndef KVT_DEV_DEV_H
#define KVT_DEV_DEV_H

#include "kvtier/backend.h"

typedef struct kvt__dev {
  const kvt_dev_backend *be;
  void *ctx;
} kvt__dev;

int kvt__dev_open(kvt__dev *d, const kvt_dev_backend *be, const kvt_dev_open_args *args);
void kvt__dev_close(kvt__dev *d);
int kvt__dev_host_alloc(kvt__dev *d, size_t bytes, void **ptr, int *pinned);
void kvt__dev_host_free(kvt__dev *d, void *ptr, size_t bytes);
int kvt__dev_xfer_prepare(kvt__dev *d, kvt_dev_xfer *x);
void kvt__dev_xfer_release(kvt__dev *d, kvt_dev_xfer *x);
int kvt__dev_submit(kvt__dev *d, kvt_dev_xfer *x);
int kvt__dev_layer_ready(kvt__dev *d, kvt_dev_xfer *x, uint32_t layer);
int kvt__dev_wait_layer(kvt__dev *d, kvt_dev_xfer *x, uint32_t layer, void *stream);
int kvt__dev_fence(kvt__dev *d, void *stream);

/* Page-aligned pageable memory, shared by backends that cannot pin. */
int kvt__host_mem_alloc(size_t bytes, void **ptr);
void kvt__host_mem_free(void *ptr, size_t bytes);

#endif
