/* Submission and completion of CUDA transfers.
 *
 * submit: pick a path (copy engines for large pieces, the SM kernel for
 * small ones, cuda_tuning.h), queue the copies on the lane's stream - a load
 * layer by layer with an event after each - record the done event, and hand
 * the transfer to the lane's completion thread. Nothing here allocates: run
 * scratch and the descriptor ring are set up when the lanes start.
 *
 * completion: one thread per lane sleeps on the oldest transfer's done event
 * (a stream completes in order) and calls done() with no lock held. It is a
 * thread of ours, not a cudaLaunchHostFunc callback, because done() may
 * submit the next transfer and CUDA calls are forbidden inside host funcs. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dev/cuda/cuda_internal.h"
#include "util/fault.h"

/* ---- completion ---------------------------------------------------- */

static void complete(cuda_lane *ln, cuda_xfer *cx) {
  kvt_dev_xfer *x = cx->x;
  int status = kvt__cuda_status(cudaEventSynchronize(cx->done_ev));
  int delay = kvt__fault_check(KVT_FAULT_DEV_DELAY_US, x->dir);
  if (delay > 0) usleep((useconds_t)delay);
  int f = kvt__fault_check(KVT_FAULT_DEV_COMPLETE, x->dir);
  if (f < 0) status = f;
  /* The kernel has read its descriptors: their ring entries are free. */
  atomic_store_explicit(&ln->ring_tail, cx->ring_end, memory_order_release);
  x->done(x, status); /* x may be resubmitted from here on: touch nothing */
}

static void *completion_main(void *arg) {
  cuda_lane *ln = arg;
  cudaSetDevice(ln->ctx->device);
  pthread_mutex_lock(&ln->lock);
  for (;;) {
    while (!ln->head && !ln->stop) pthread_cond_wait(&ln->cv, &ln->lock);
    cuda_xfer *cx = ln->head;
    if (!cx) break; /* stopped and drained */
    ln->head = cx->next;
    if (!ln->head) ln->tail = NULL;
    pthread_mutex_unlock(&ln->lock);
    complete(ln, cx);
    pthread_mutex_lock(&ln->lock);
  }
  pthread_mutex_unlock(&ln->lock);
  return NULL;
}

static void enqueue(cuda_lane *ln, cuda_xfer *cx) {
  cx->next = NULL;
  pthread_mutex_lock(&ln->lock);
  if (ln->tail) ln->tail->next = cx;
  else ln->head = cx;
  ln->tail = cx;
  pthread_cond_signal(&ln->cv);
  pthread_mutex_unlock(&ln->lock);
}

/* ---- lanes ----------------------------------------------------------- */

static int lane_alloc(cuda_ctx *c, cuda_lane *ln) {
  size_t n = KVT_CUDA_RUNS_PER_BATCH;
  ln->runs = calloc(n, sizeof *ln->runs);
  ln->b_dst = calloc(n, sizeof *ln->b_dst);
  ln->b_src = calloc(n, sizeof *ln->b_src);
  ln->b_size = calloc(n, sizeof *ln->b_size);
  if (!ln->runs || !ln->b_dst || !ln->b_src || !ln->b_size) return -ENOMEM;
  if (!c->kernel_ok) return 0;
  cudaError_t e = cudaHostAlloc((void **)&ln->ring,
                                KVT_CUDA_DESC_RING_ENTRIES * sizeof(kvt__cuda_block_desc),
                                cudaHostAllocMapped | cudaHostAllocPortable);
  if (e != cudaSuccess) { /* the kernel path is an optimisation: go without it */
    cudaGetLastError();
    ln->ring = NULL;
  }
  return 0;
}

int kvt__cuda_lanes_start(cuda_ctx *c) {
  for (int d = 0; d < 2; d++) {
    cuda_lane *ln = &c->lane[d];
    ln->dir = d;
    ln->ctx = c;
    pthread_mutex_init(&ln->submit_lock, NULL);
    pthread_mutex_init(&ln->lock, NULL);
    pthread_cond_init(&ln->cv, NULL);
    ln->inited = 1;
    int rc = lane_alloc(c, ln);
    if (rc) return rc;
    if (pthread_create(&ln->thread, NULL, completion_main, ln) != 0) return -EAGAIN;
    ln->started = 1;
  }
  return 0;
}

void kvt__cuda_lanes_stop(cuda_ctx *c) {
  for (int d = 0; d < 2; d++) {
    cuda_lane *ln = &c->lane[d];
    if (!ln->inited) continue;
    if (ln->started) {
      pthread_mutex_lock(&ln->lock);
      ln->stop = 1;
      pthread_cond_signal(&ln->cv);
      pthread_mutex_unlock(&ln->lock);
      pthread_join(ln->thread, NULL);
    }
    if (ln->ring) cudaFreeHost(ln->ring);
    free(ln->runs);
    free(ln->b_dst);
    free(ln->b_src);
    free(ln->b_size);
    pthread_mutex_destroy(&ln->submit_lock);
    pthread_mutex_destroy(&ln->lock);
    pthread_cond_destroy(&ln->cv);
    ln->inited = 0;
  }
}

/* ---- copy-engine paths ----------------------------------------------- */

#if KVT_CUDA_HAVE_BATCH
static cudaError_t batch_async(cuda_lane *ln, size_t k) {
  struct cudaMemcpyAttributes attr;
  memset(&attr, 0, sizeof attr);
  /* Stream order: a store must not read before the fence's wait is met. */
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t attr_idx = 0;
#if CUDART_VERSION >= 13000
  return cudaMemcpyBatchAsync(ln->b_dst, (const void *const *)ln->b_src, ln->b_size, k, &attr,
                              &attr_idx, 1, ln->stream);
#else
  size_t fail_idx = 0;
  return cudaMemcpyBatchAsync(ln->b_dst, (void **)ln->b_src, ln->b_size, k, &attr, &attr_idx, 1,
                              &fail_idx, ln->stream);
#endif
}
#endif

/* Queues runs[0, k) with the batch API when asked and accepted, else one
 * cudaMemcpyAsync per run. A driver older than the runtime refuses the
 * batch API: remember that and stay on per-run copies. *path says what was
 * used (tests and the bench check it: a batch that always falls back must
 * not be reported as the batch path). */
static cudaError_t issue_runs(cuda_ctx *c, cuda_lane *ln, size_t k, int *path) {
#if KVT_CUDA_HAVE_BATCH
  if (*path == KVT__CUDA_PATH_BATCH && atomic_load(&c->batch_ok)) {
    for (size_t i = 0; i < k; i++) {
      ln->b_dst[i] = ln->runs[i].dst;
      ln->b_src[i] = ln->runs[i].src;
      ln->b_size[i] = ln->runs[i].bytes;
    }
    cudaError_t e = batch_async(ln, k);
    if (e == cudaSuccess) return e;
    if (e != cudaErrorNotSupported && e != cudaErrorCallRequiresNewerDriver &&
        e != cudaErrorInvalidValue)
      return e;
    cudaGetLastError();
    if (e != cudaErrorInvalidValue) atomic_store(&c->batch_ok, 0);
  }
#endif
  *path = KVT__CUDA_PATH_MEMCPY;
  for (size_t i = 0; i < k; i++) {
    cudaError_t e = cudaMemcpyAsync(ln->runs[i].dst, ln->runs[i].src, ln->runs[i].bytes,
                                    cudaMemcpyDefault, ln->stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

/* The fault hook's submit site sits after the first group of copies is
 * queued, so that an injected failure exercises the drain of a partly
 * queued transfer, as a real mid-submit CUDA error would. */
static int mid_submit_fault(const kvt_dev_xfer *x) {
  int f = kvt__fault_check(KVT_FAULT_DEV_SUBMIT, x->dir);
  return f < 0 ? f : 0;
}

static int submit_runs(cuda_ctx *c, cuda_lane *ln, cuda_xfer *cx, const kvt__host_span *spans,
                       uint32_t n_spans) {
  kvt_dev_xfer *x = cx->x;
  kvt__coalesce_args a = {.layout = c->layout, .dir = x->dir,
                          .order = x->dir == KVT_XFER_H2D ? KVT__ORDER_BY_LAYER : KVT__ORDER_BY_BLOCK,
                          .n_blocks = x->n_blocks, .dev_slots = x->dev_slots,
                          .host_blocks = x->host_blocks, .spans = spans, .n_spans = n_spans};
  kvt__coalesce_iter it;
  int rc = kvt__coalesce_begin(&it, &a);
  if (rc) return rc;
  uint32_t done = 0, signalled = 0;
  int checked = 0;
  size_t k;
  while ((k = kvt__coalesce_next(&it, ln->runs, KVT_CUDA_RUNS_PER_BATCH, &done)) > 0) {
    rc = kvt__cuda_status(issue_runs(c, ln, k, &cx->path));
    if (!rc && !checked++) rc = mid_submit_fault(x);
    if (rc) return rc;
    for (; x->dir == KVT_XFER_H2D && signalled < done; signalled++) {
      rc = kvt__cuda_status(cudaEventRecord(cx->layer_ev[signalled], ln->stream));
      if (rc) return rc;
    }
  }
  if (!checked) rc = mid_submit_fault(x);
  for (; !rc && x->dir == KVT_XFER_H2D && signalled < c->layout->num_layers; signalled++)
    rc = kvt__cuda_status(cudaEventRecord(cx->layer_ev[signalled], ln->stream));
  return rc;
}

/* ---- kernel path ----------------------------------------------------- */

/* n contiguous ring entries, or NULL when the ring is full (the caller then
 * uses the copy engines). Under the lane's submit lock. */
static kvt__cuda_block_desc *ring_alloc(cuda_lane *ln, uint32_t n) {
  const uint64_t cap = KVT_CUDA_DESC_RING_ENTRIES;
  if (!ln->ring || n == 0 || n > cap) return NULL;
  uint64_t head = ln->ring_head, pos = head % cap;
  uint64_t skip = pos + n > cap ? cap - pos : 0;
  uint64_t tail = atomic_load_explicit(&ln->ring_tail, memory_order_acquire);
  if (head + skip + n - tail > cap) return NULL;
  ln->ring_head = head + skip + n;
  return ln->ring + (skip ? 0 : pos);
}

/* Fills the block descriptors if every host payload is pinned and mapped
 * (the kernel reads it at the same address) and the ring has room. */
static kvt__cuda_block_desc *kernel_descs(cuda_ctx *c, cuda_lane *ln, const kvt_dev_xfer *x,
                                          const kvt__host_span *spans, uint32_t n_spans, int *vec16) {
  uintptr_t align = 0;
  for (uint32_t i = 0; i < x->n_blocks; i++) {
    if (!kvt__cuda_host_is_pinned(spans, n_spans, x->host_blocks[i], c->block_bytes)) return NULL;
    if (x->dev_slots[i] >= c->layout->num_slots) return NULL; /* the coalescer reports it */
    align |= (uintptr_t)x->host_blocks[i];
  }
  kvt__cuda_block_desc *d = ring_alloc(ln, x->n_blocks);
  for (uint32_t i = 0; d && i < x->n_blocks; i++)
    d[i] = (kvt__cuda_block_desc){(uintptr_t)x->host_blocks[i], x->dev_slots[i], 0};
  *vec16 = c->segs_vec16 && (align & 15) == 0;
  return d;
}

static int submit_kernel(cuda_ctx *c, cuda_lane *ln, cuda_xfer *cx, const kvt__cuda_block_desc *d,
                         int vec16) {
  kvt_dev_xfer *x = cx->x;
  const kvt_layout *lay = c->layout;
  kvt__cuda_copy_args a = {.segs = c->dev_segs, .blocks = d, .n_blocks = x->n_blocks,
                           .spl = lay->segments_per_layer, .layer_first = 0,
                           .n_layers = lay->num_layers, .max_seg_bytes = c->max_seg_bytes,
                           .to_host = x->dir == KVT_XFER_D2H, .vec16 = vec16};
  if (x->dir == KVT_XFER_D2H) {
    int rc = kvt__cuda_status((cudaError_t)kvt__cuda_launch_copy(&a, c->max_ctas, ln->stream));
    return rc ? rc : mid_submit_fault(x);
  }
  a.n_layers = 1;
  for (uint32_t l = 0; l < lay->num_layers; l++) {
    a.layer_first = l;
    int rc = kvt__cuda_status((cudaError_t)kvt__cuda_launch_copy(&a, c->max_ctas, ln->stream));
    if (!rc) rc = kvt__cuda_status(cudaEventRecord(cx->layer_ev[l], ln->stream));
    if (!rc && l == 0) rc = mid_submit_fault(x);
    if (rc) return rc;
  }
  return 0;
}

/* ---- submit ---------------------------------------------------------- */

static int copy_engine_path(cuda_ctx *c, int forced) {
  if (forced == KVT__CUDA_PATH_MEMCPY) return KVT__CUDA_PATH_MEMCPY;
  return atomic_load(&c->batch_ok) ? KVT__CUDA_PATH_BATCH : KVT__CUDA_PATH_MEMCPY;
}

static int issue(cuda_ctx *c, cuda_lane *ln, cuda_xfer *cx) {
  kvt__host_span spans[KVT__CUDA_MAX_REGIONS];
  uint32_t n_spans = kvt__cuda_host_spans(c, spans, KVT__CUDA_MAX_REGIONS);
  int forced = atomic_load(&c->force_path);
  int want_kernel = c->kernel_ok && cx->x->n_blocks > 0 &&
                    (forced == KVT__CUDA_PATH_KERNEL ||
                     (forced == KVT__CUDA_PATH_AUTO &&
                      c->piece_bytes[cx->x->dir] < KVT_CUDA_KERNEL_MAX_PIECE_BYTES));
  if (want_kernel) {
    int vec16 = 0;
    const kvt__cuda_block_desc *d = kernel_descs(c, ln, cx->x, spans, n_spans, &vec16);
    if (d) {
      cx->path = KVT__CUDA_PATH_KERNEL;
      return submit_kernel(c, ln, cx, d, vec16);
    }
  }
  cx->path = copy_engine_path(c, forced);
  return submit_runs(c, ln, cx, spans, n_spans);
}

int kvt__cuda_submit(void *ctx, kvt_dev_xfer *x) {
  cuda_ctx *c = ctx;
  if (!c || !x || !x->backend_data || !x->done) return -EINVAL;
  if (x->dir != KVT_XFER_D2H && x->dir != KVT_XFER_H2D) return -EINVAL;
  if (!c->layout->segments || !c->dev_segs) return KVT_ELAYOUT;
  if (x->n_blocks && (!x->dev_slots || !x->host_blocks)) return -EINVAL;
  cuda_lane *ln = &c->lane[x->dir];
  cuda_xfer *cx = x->backend_data;
  int prev = kvt__cuda_enter(c); /* the engine's thread may have another current device */
  pthread_mutex_lock(&ln->submit_lock);
  uint64_t ring_mark = ln->ring_head;
  int rc = issue(c, ln, cx);
  if (!rc) rc = kvt__cuda_status(cudaEventRecord(cx->done_ev, ln->stream));
  if (rc) {
    /* done() will not be called, so nothing may still be copying into the
     * engine's memory when we return: drain what was queued. */
    cudaStreamSynchronize(ln->stream);
    cudaGetLastError();
    ln->ring_head = ring_mark;
    pthread_mutex_unlock(&ln->submit_lock);
    kvt__cuda_leave(c, prev);
    return rc;
  }
  cx->ring_end = ln->ring_head;
  enqueue(ln, cx); /* still under submit_lock: queue order == stream order */
  pthread_mutex_unlock(&ln->submit_lock);
  kvt__cuda_leave(c, prev);
  return 0;
}
