#include "dev/dev.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "util/fault.h"

int kvt__dev_open(kvt__dev *d, const kvt_dev_backend *be, const kvt_dev_open_args *args) {
  d->be = be;
  d->ctx = NULL;
  if (!be) return KVT_ENODEV;
  if (be->version < 1 || be->version > KVT_DEV_BACKEND_VERSION) return KVT_EVERSION;
  return be->open(args, &d->ctx);
}

void kvt__dev_close(kvt__dev *d) {
  if (d->be && d->ctx) d->be->close(d->ctx);
  d->ctx = NULL;
}

int kvt__dev_host_alloc(kvt__dev *d, size_t bytes, void **ptr, int *pinned) {
  int f = kvt__fault_check(KVT_FAULT_HOST_ALLOC, (int64_t)bytes);
  if (f < 0) return f;
  return d->be->host_alloc(d->ctx, bytes, ptr, pinned);
}

void kvt__dev_host_free(kvt__dev *d, void *ptr, size_t bytes) {
  if (ptr) d->be->host_free(d->ctx, ptr, bytes);
}

int kvt__dev_xfer_prepare(kvt__dev *d, kvt_dev_xfer *x) { return d->be->xfer_prepare(d->ctx, x); }

void kvt__dev_xfer_release(kvt__dev *d, kvt_dev_xfer *x) { d->be->xfer_release(d->ctx, x); }

int kvt__dev_submit(kvt__dev *d, kvt_dev_xfer *x) {
  int f = kvt__fault_check(KVT_FAULT_DEV_SUBMIT, x->dir);
  if (f < 0) return f;
  return d->be->submit(d->ctx, x);
}

int kvt__dev_layer_ready(kvt__dev *d, kvt_dev_xfer *x, uint32_t layer) {
  return d->be->layer_ready(d->ctx, x, layer);
}

int kvt__dev_wait_layer(kvt__dev *d, kvt_dev_xfer *x, uint32_t layer, void *stream) {
  return d->be->wait_layer(d->ctx, x, layer, stream);
}

int kvt__dev_fence(kvt__dev *d, void *stream) { return d->be->fence(d->ctx, stream); }

int kvt__host_mem_alloc(size_t bytes, void **ptr) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return -errno;
  /* Huge pages turn a record into a few physically contiguous segments
   * instead of one per 4 KiB page; block devices pay per segment (one
   * descriptor each, and a request is split past max_segments), so O_DIRECT
   * reads into 4 KiB pages can run at a third of the disk's speed
   * (`kvtier-bench micro --only disk` measures both). Only a hint. */
  if (bytes >= ((size_t)2 << 20)) madvise(p, bytes, MADV_HUGEPAGE);
  *ptr = p;
  return 0;
}

void kvt__host_mem_free(void *ptr, size_t bytes) {
  if (ptr) munmap(ptr, bytes);
}

#ifndef KVT_HAVE_CUDA
/* Built without the CUDA toolkit: there is no CUDA backend to offer. */
const kvt_dev_backend *kvt_dev_backend_cuda(void) { return NULL; }
#endif
